#!/usr/bin/env bash
# Paths and pinned versions of the local metrics pipeline (Prometheus, promtool,
# prometheus-adapter) and of the Prometheus Operator, derived from ../go/prometheus/go.mod,
# ../go/prometheus-adapter/go.mod and ../go/prometheus-operator/go.mod.
# Source it from the other scripts; run it to print KEY=value lines (read by the tests).
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"

METRICS_SRC="$CLUSTER_SRC/metrics"
PROMETHEUS_GO="$CLUSTER_GO/prometheus"
ADAPTER_GO="$CLUSTER_GO/prometheus-adapter"
PROMETHEUS_MODULE_VERSION="$(gomod_version github.com/prometheus/prometheus "$PROMETHEUS_GO/go.mod")"
# Prometheus 3.x is tagged v0.3MM.P in Go (v0.316.0 is Prometheus 3.16.0).
_v="${PROMETHEUS_MODULE_VERSION#v0.}"
PROMETHEUS_VERSION="${_v:0:1}.$((10#${_v:1:2})).${_v#*.}"
unset _v
ADAPTER_VERSION="$(gomod_version sigs.k8s.io/prometheus-adapter "$ADAPTER_GO/go.mod")"
METRICS_BIN="$DISAGG_CACHE/metrics-v$PROMETHEUS_VERSION-$ADAPTER_VERSION/bin"
METRICS_BINARIES=(prometheus promtool prometheus-adapter)
PROMETHEUS_OPERATOR_GO="$CLUSTER_GO/prometheus-operator"
PROMETHEUS_OPERATOR_VERSION="$(gomod_version github.com/prometheus-operator/prometheus-operator \
    "$PROMETHEUS_OPERATOR_GO/go.mod")"
PROMETHEUS_OPERATOR_BIN="$DISAGG_CACHE/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION/bin"
# The running pipeline of one cluster (metrics-up.sh): Prometheus and prometheus-adapter as host
# processes, their configuration, certificates, data and logs.
METRICS_STATE="$CLUSTER_STATE/metrics"
# The adapter listens on this address, on the host's loopback device: the API server dials an
# APIService's endpoint itself, and an EndpointSlice refuses loopback-range (127/8) addresses.
METRICS_HOST_IP=10.89.1.1
# Perses (../go/perses, build-perses.sh): server with its embedded UI and the pinned plugins of
# perses-plugins/, rendering the chart's Grafana dashboard for dashboard-screenshot.sh.
PERSES_GO="$CLUSTER_GO/perses"
PERSES_VERSION="$(gomod_version github.com/perses/perses "$PERSES_GO/go.mod")"
PERSES_DIR="$DISAGG_CACHE/perses-$PERSES_VERSION"

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    for var in PROMETHEUS_MODULE_VERSION PROMETHEUS_VERSION ADAPTER_VERSION METRICS_BIN METRICS_STATE \
        METRICS_HOST_IP PROMETHEUS_OPERATOR_VERSION PROMETHEUS_OPERATOR_BIN PERSES_VERSION \
        PERSES_DIR; do
        echo "$var=${!var}"
    done
fi
