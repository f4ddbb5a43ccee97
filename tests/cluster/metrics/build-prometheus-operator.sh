#!/usr/bin/env bash
# Build the Prometheus Operator from its pinned Go module (../go/prometheus-operator) into
# $PROMETHEUS_OPERATOR_BIN, for the e2e test that has a stock-style Prometheus select the models'
# PodMonitors and the operator chart's ServiceMonitor. Skipped when the cache already holds a
# binary built for the same pin.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
source "$CLUSTER_SRC/go-build.sh"

ldflags=$(prometheus_ldflags "${PROMETHEUS_OPERATOR_VERSION#v}")

key="prometheus-operator=$PROMETHEUS_OPERATOR_VERSION"
key+=" go.sum=$(file_key "$PROMETHEUS_OPERATOR_GO/go.sum") ldflags=$(file_key - <<<"$ldflags")"
exit_if_built prometheus-operator-bin "$PROMETHEUS_OPERATOR_BIN" "$key" prometheus-operator

go_build_start prometheus-operator-bin "$PROMETHEUS_OPERATOR_BIN" "$key" "$PROMETHEUS_OPERATOR_GO"
go -C "$PROMETHEUS_OPERATOR_GO" build -p 2 -trimpath -ldflags "$ldflags" \
    -o "$GO_BUILD_TMP/prometheus-operator" $(go -C "$PROMETHEUS_OPERATOR_GO" list tool)
go_build_step prometheus-operator
go_build_done
