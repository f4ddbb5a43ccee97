#!/usr/bin/env bash
# Start the metrics pipeline of the running local cluster (cluster-up.sh), replacing one that
# runs already: Prometheus and prometheus-adapter (build-metrics.sh) as host processes, like the
# control plane's components, and the adapter registered as the APIService
# v1beta1.custom.metrics.k8s.io, so the cluster's HorizontalPodAutoscalers read the custom
# metrics deploy/prometheus-adapter/rules.yaml serves.
#   - Prometheus (127.0.0.1) runs deploy/prometheus/prometheus.yml (the job `disagg`, the
#     equivalent of the PodMonitors, discovering pods through the cluster's kubeconfig; the
#     chart's alerting rules) every $METRICS_SCRAPE_INTERVAL (2s by default), plus a job
#     `targets` reading $METRICS_STATE/targets/*.json (file service discovery): targets a test
#     names itself, such as stand-ins for pods that run nothing (kwok's);
#   - the adapter listens on $METRICS_HOST_IP (an address on the host's loopback device) with a
#     certificate made here, re-lists Prometheus's series every $METRICS_RELIST_INTERVAL (5s);
#   - a Service without selector in namespace disagg-metrics and its EndpointSlice name that
#     address (the API server routes to an APIService's endpoints: cluster-up.sh).
# Prints KEY=value lines on stdout: PROMETHEUS_URL, METRICS_TARGETS (the folder of the job
# `targets`). Stopped by metrics-down.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

REPO="$(cd "$CLUSTER_SRC/../.." && pwd)"
NAMESPACE=disagg-metrics
SERVICE=prometheus-adapter
interval=${METRICS_SCRAPE_INTERVAL:-2s}
relist=${METRICS_RELIST_INTERVAL:-5s}
kubectl=("$CLUSTER_BIN/kubectl" --kubeconfig "$CLUSTER_KUBECONFIG")
start=$(date +%s)

"$METRICS_SRC/build-metrics.sh" >&2
"$METRICS_SRC/metrics-down.sh" >&2
mkdir -p "$METRICS_STATE"/{data,certs,targets,logs}

if ! ip -4 -o addr show dev lo | grep -q " $METRICS_HOST_IP/"; then
    if [[ $(id -u) -ne 0 ]]; then
        echo "metrics-up: adding $METRICS_HOST_IP to the loopback device needs root" >&2
        exit 1
    fi
    ip addr add "$METRICS_HOST_IP/32" dev lo
fi

free_port() { # free_port ADDRESS
    python3 -c 'import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])' "$1"
}
prometheus_port=$(free_port 127.0.0.1)
adapter_port=$(free_port "$METRICS_HOST_IP")
prometheus_url="http://127.0.0.1:$prometheus_port"

WAIT_LOGS="$METRICS_STATE/logs"

# The scrape config from deploy/prometheus: shorter intervals, the cluster's kubeconfig for pod
# discovery, its rule file by absolute path; then the job `targets`.
config="$METRICS_STATE/prometheus.yml"
sed -e "s#^\(  scrape_interval:\).*#\1 $interval\n  scrape_timeout: $interval#" \
    -e "s#^\(  evaluation_interval:\).*#\1 $interval#" \
    -e "s#^  - \.\./\.\./#  - $REPO/#" \
    -e "s#^\(      - role: pod\)\$#\1\n        kubeconfig_file: $CLUSTER_KUBECONFIG#" \
    "$REPO/deploy/prometheus/prometheus.yml" >"$config"
cat >>"$config" <<YAML
  - job_name: targets
    file_sd_configs:
      - files: ["$METRICS_STATE/targets/*.json"]
        refresh_interval: $interval
YAML
grep -q "kubeconfig_file: $CLUSTER_KUBECONFIG" "$config"
"$METRICS_BIN/promtool" check config "$config" >&2

# Host processes outliving this script: no inherited descriptors (cluster-up's and the heavy
# job's locks, fds 8 and 9).
setsid "$METRICS_BIN/prometheus" --config.file="$config" --storage.tsdb.path="$METRICS_STATE/data" \
    --web.listen-address="127.0.0.1:$prometheus_port" \
    </dev/null >"$METRICS_STATE/logs/prometheus.log" 2>&1 8>&- 9>&- &
echo $! >"$METRICS_STATE/prometheus.pid"
wait_for Prometheus 60 curl -sf "$prometheus_url/-/ready"

certs="$METRICS_STATE/certs"
openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=$SERVICE.$NAMESPACE.svc" \
    -addext "subjectAltName=DNS:$SERVICE.$NAMESPACE.svc,IP:$METRICS_HOST_IP" \
    -keyout "$certs/tls.key" -out "$certs/tls.crt" 2>/dev/null
setsid "$METRICS_BIN/prometheus-adapter" --config="$REPO/deploy/prometheus-adapter/rules.yaml" \
    --prometheus-url="$prometheus_url/" --metrics-relist-interval="$relist" \
    --bind-address="$METRICS_HOST_IP" --secure-port="$adapter_port" \
    --tls-cert-file="$certs/tls.crt" --tls-private-key-file="$certs/tls.key" \
    --lister-kubeconfig="$CLUSTER_KUBECONFIG" --authentication-kubeconfig="$CLUSTER_KUBECONFIG" \
    --authorization-kubeconfig="$CLUSTER_KUBECONFIG" \
    </dev/null >"$METRICS_STATE/logs/prometheus-adapter.log" 2>&1 8>&- 9>&- &
echo $! >"$METRICS_STATE/prometheus-adapter.pid"
wait_for prometheus-adapter 60 curl -sfk "https://$METRICS_HOST_IP:$adapter_port/healthz"

ca=$(base64 -w0 <"$certs/tls.crt")
"${kubectl[@]}" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Namespace
metadata: {name: $NAMESPACE}
---
apiVersion: v1
kind: Service
metadata: {name: $SERVICE, namespace: $NAMESPACE}
spec:
  ports: [{name: https, port: 443, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: $SERVICE
  namespace: $NAMESPACE
  labels:
    kubernetes.io/service-name: $SERVICE
    endpointslice.kubernetes.io/managed-by: metrics-up.disagg.dev
addressType: IPv4
endpoints: [{addresses: ["$METRICS_HOST_IP"]}]
ports: [{name: https, port: $adapter_port, protocol: TCP}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1beta1.custom.metrics.k8s.io}
spec:
  group: custom.metrics.k8s.io
  version: v1beta1
  service: {name: $SERVICE, namespace: $NAMESPACE, port: 443}
  caBundle: $ca
  groupPriorityMinimum: 100
  versionPriority: 100
YAML
wait_for "the APIService v1beta1.custom.metrics.k8s.io" 60 "${kubectl[@]}" wait \
    --for=condition=Available apiservice v1beta1.custom.metrics.k8s.io --timeout=5s
wait_for custom.metrics.k8s.io 30 "${kubectl[@]}" get --raw /apis/custom.metrics.k8s.io/v1beta1

echo "metrics-up: Prometheus $prometheus_url, prometheus-adapter $METRICS_HOST_IP:$adapter_port," \
    "ready in $(($(date +%s) - start)) s" >&2
echo "PROMETHEUS_URL=$prometheus_url"
echo "METRICS_TARGETS=$METRICS_STATE/targets"
