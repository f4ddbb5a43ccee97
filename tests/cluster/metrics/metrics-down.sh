#!/usr/bin/env bash
# Stop the metrics pipeline metrics-up.sh started for the local cluster: the APIService first
# (an unavailable one fails every client's discovery of the cluster's API groups), its Service
# and namespace, then the recorded Prometheus and prometheus-adapter processes while they still
# run this cache's binaries. The address on the loopback device stays (other caches' adapters
# may listen on it).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

kubectl=("$CLUSTER_BIN/kubectl" --kubeconfig "$CLUSTER_KUBECONFIG")
if [[ -s "$CLUSTER_KUBECONFIG" ]] && "${kubectl[@]}" get --raw /readyz >/dev/null 2>&1; then
    "${kubectl[@]}" delete apiservice v1beta1.custom.metrics.k8s.io --ignore-not-found >/dev/null
    "${kubectl[@]}" delete namespace disagg-metrics --ignore-not-found --timeout=60s >/dev/null
fi

for name in prometheus-adapter prometheus; do
    pidfile="$METRICS_STATE/$name.pid"
    if pid=$(recorded_pid "$pidfile" "$METRICS_BIN/$name"); then
        kill "$pid"
        for _ in $(seq 30); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 1
        done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
done
rm -rf "$METRICS_STATE/data" "$METRICS_STATE/targets"
