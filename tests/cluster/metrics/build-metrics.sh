#!/usr/bin/env bash
# Build Prometheus and promtool (Prometheus 3.x) and prometheus-adapter from their pinned Go
# modules (../go/prometheus, ../go/prometheus-adapter) into $METRICS_BIN. Skipped when the cache
# already holds binaries built for the same pins. Prometheus keeps only the kubernetes, file and
# http service discoveries (its plugins' build tags) and no embedded web UI (the API serves).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

common=github.com/prometheus/common/version
prom_ldflags="-s -w -X $common.Version=$PROMETHEUS_VERSION -X $common.Revision="
prom_ldflags+=" -X $common.Branch=HEAD -X $common.BuildUser=disagg -X $common.BuildDate="
prom_tags=remove_all_sd,enable_kubernetes_sd
adapter_ldflags="-s -w"

stamp="$METRICS_BIN/.stamp"
key="prometheus=$PROMETHEUS_MODULE_VERSION prometheus-adapter=$ADAPTER_VERSION tags=$prom_tags"
for module in "$PROMETHEUS_GO" "$ADAPTER_GO"; do
    key+=" $(basename "$module").sum=$(sha256sum "$module/go.sum" | cut -c1-12)"
done
key+=" ldflags=$(sha256sum <<<"$prom_ldflags $adapter_ldflags" | cut -c1-12)"

have_all() {
    [[ -f "$stamp" && "$(cat "$stamp")" == "$key" ]] || return 1
    for b in "${METRICS_BINARIES[@]}"; do [[ -x "$METRICS_BIN/$b" ]] || return 1; done
}

if have_all; then
    echo "metrics-bin: cached in $METRICS_BIN ($key)"
    exit 0
fi

export CGO_ENABLED=0 GOTOOLCHAIN=local
if ! go version 2>/dev/null | grep -qE 'go1\.(2[6-9]|[3-9][0-9])'; then
    echo "metrics-bin: needs Go >= 1.26 on PATH (found: $(go version 2>&1 | tail -1))" >&2
    exit 1
fi

start=$(date +%s)
echo "metrics-bin: downloading Go modules"
go -C "$PROMETHEUS_GO" mod download
go -C "$ADAPTER_GO" mod download
echo "metrics-bin: modules ready in $(($(date +%s) - start)) s"
tmp="$METRICS_BIN.tmp"
rm -rf "$tmp"
mkdir -p "$tmp"
echo "metrics-bin: building $key (waits for /tmp/disagg-heavy.lock)"
source "$CLUSTER_SRC/node/heavy-lock.sh"
heavy_lock
compile=$(date +%s)
# One go build per module shares the compile work of its common packages across its binaries.
go -C "$PROMETHEUS_GO" build -p 2 -trimpath -tags "$prom_tags" -ldflags "$prom_ldflags" \
    -o "$tmp/" $(go -C "$PROMETHEUS_GO" list tool)
echo "metrics-bin: prometheus, promtool built at $(($(date +%s) - compile)) s"
go -C "$ADAPTER_GO" build -p 2 -trimpath -ldflags "$adapter_ldflags" \
    -o "$tmp/prometheus-adapter" $(go -C "$ADAPTER_GO" list tool)
echo "metrics-bin: prometheus-adapter built at $(($(date +%s) - compile)) s"
flock -u 9
echo "$key" >"$tmp/.stamp"
rm -rf "$METRICS_BIN"
mv "$tmp" "$METRICS_BIN"
echo "metrics-bin: compiled in $(($(date +%s) - compile)) s; total $(($(date +%s) - start)) s" \
    "(including the wait for the heavy lock) into $METRICS_BIN"
