#!/usr/bin/env bash
# Build Prometheus and promtool (Prometheus 3.x) and prometheus-adapter from their pinned Go
# modules (../go/prometheus, ../go/prometheus-adapter) into $METRICS_BIN. Skipped when the cache
# already holds binaries built for the same pins. Prometheus keeps only the kubernetes, file and
# http service discoveries (its plugins' build tags) and no embedded web UI (the API serves).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
source "$CLUSTER_SRC/go-build.sh"

prom_ldflags=$(prometheus_ldflags "$PROMETHEUS_VERSION")
prom_tags=remove_all_sd,enable_kubernetes_sd
adapter_ldflags="-s -w"

key="prometheus=$PROMETHEUS_MODULE_VERSION prometheus-adapter=$ADAPTER_VERSION tags=$prom_tags"
for module in "$PROMETHEUS_GO" "$ADAPTER_GO"; do
    key+=" $(basename "$module").sum=$(file_key "$module/go.sum")"
done
key+=" ldflags=$(file_key - <<<"$prom_ldflags $adapter_ldflags")"
exit_if_built metrics-bin "$METRICS_BIN" "$key" "${METRICS_BINARIES[@]}"

go_build_start metrics-bin "$METRICS_BIN" "$key" "$PROMETHEUS_GO" "$ADAPTER_GO"
# One go build per module shares the compile work of its common packages across its binaries.
go -C "$PROMETHEUS_GO" build -p 2 -trimpath -tags "$prom_tags" -ldflags "$prom_ldflags" \
    -o "$GO_BUILD_TMP/" $(go -C "$PROMETHEUS_GO" list tool)
go_build_step "prometheus, promtool"
go -C "$ADAPTER_GO" build -p 2 -trimpath -ldflags "$adapter_ldflags" \
    -o "$GO_BUILD_TMP/prometheus-adapter" $(go -C "$ADAPTER_GO" list tool)
go_build_step prometheus-adapter
go_build_done
