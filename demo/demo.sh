#!/usr/bin/env bash
# `make demo`: the operator's own pods on a local cluster with a real CPU node. The images are
# built from the project's Dockerfiles (buildah, no daemon), the operator chart runs the
# operator from its image, examples/demo-cpu.yaml becomes real prefill, decode and router pods
# on the real node, and a multi-turn TTFT run ON vs OFF goes through the router Service.
# Nothing serves outside the cluster. Idempotent (reuses the images, the cluster, the release
# and the model); `make demo-down` undoes it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# A cluster of its own, so the demo never touches the one the cluster tests use.
export DISAGG_CLUSTER_NAME=${DISAGG_CLUSTER_NAME:-demo} DISAGG_REAL_NODE=1
source tests/cluster/env.sh
BIN=${VENV_BIN:-$ROOT/.venv/bin}
HEAVY_LOCK=${HEAVY_LOCK:-/tmp/disagg-heavy.lock}
STATE="$DISAGG_CACHE/demo"
RELEASE=disagg-operator
OPERATOR_NS=disagg-system
MODEL=demo-cpu
MODEL_NS=demo
READY_TIMEOUT=${DISAGG_DEMO_READY_TIMEOUT:-1200s}
mkdir -p "$STATE"
kubectl() { "$CLUSTER_BIN/kubectl" "$@"; }
helm() { "$CLUSTER_BIN/helm" "$@"; }
step() { printf '\n==> %s\n' "$*"; }
images_sh() { bash tests/cluster/node/images.sh "$@"; }
image_of() { sed -n "s/^$1=//p" <<<"$IMAGES"; }

step "1/7 Images: a Debian base (mmdebstrap), then operator/Dockerfile, connector/router.Dockerfile" \
    "and connector/Dockerfile's CPU flavor built on it with buildah (cached when unchanged)"
images_sh build
IMAGES=$(images_sh env)
printf '%s\n' "$IMAGES"

step "2/7 Local control plane (built from pinned Go modules), kwok's fake p5en nodes and one" \
    "real CPU node (containerd, kubelet, kube-proxy in a network namespace); images loaded into it"
KUBECONFIG=$(bash tests/cluster/cluster-up.sh | tail -n 1)
export KUBECONFIG
images_sh import
kubectl get nodes -o wide -L node.kubernetes.io/instance-type

step "3/7 helm install charts/disagg-operator: the operator as its own pod, from its image, on the" \
    "real node"
operator=$(image_of OPERATOR_IMAGE)
# The namespaces it serves exist first: the chart gives it a Role in each.
for namespace in "$MODEL_NS" inference; do
    kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
done
helm upgrade --install "$RELEASE" charts/disagg-operator --namespace "$OPERATOR_NS" \
    --create-namespace --wait --timeout 5m \
    --set image.repository="${operator%:*}" --set image.tag="${operator##*:}" \
    --set image.pullPolicy=Never --set "watch.namespaces={$MODEL_NS,inference}" \
    --set nodeSelector.type=real --set "tolerations[0].key=${NODE_TAINT%%=*}" \
    --set "tolerations[0].operator=Exists" >"$STATE/helm.log"
helm list --namespace "$OPERATOR_NS"
kubectl -n "$OPERATOR_NS" get pods -o wide

step "4/7 Apply the DisaggregatedModels: examples/demo-cpu.yaml (real pods) and" \
    "examples/qwen3-32b-p5en.yaml (on the fake p5en nodes)"
"$BIN/python" demo/model.py examples/demo-cpu.yaml --serving-image "$(image_of SERVING_IMAGE)" \
    --router-image "$(image_of ROUTER_IMAGE)" |
    kubectl apply -f -
# The Qwen example reads a model cache PVC and a Hugging Face token Secret: give it both
# (a PersistentVolume bound to the claim, a placeholder token) so its pods can be scheduled.
kubectl apply -f demo/qwen-prereqs.yaml >/dev/null
kubectl apply -f examples/qwen3-32b-p5en.yaml
echo "waiting for $MODEL's pods to pass their /health probes (vLLM starts on CPU: a few minutes)"
if ! kubectl -n "$MODEL_NS" wait --for=condition=Ready "dmodel/$MODEL" --timeout "$READY_TIMEOUT"; then
    kubectl -n "$MODEL_NS" get pods -o wide
    kubectl -n "$MODEL_NS" logs "statefulset/$MODEL-prefill" --tail 40 || true
    exit 1
fi
kubectl -n inference wait --for=condition=Ready dmodel/qwen3-32b --timeout 180s
kubectl get dmodel -A
kubectl -n "$MODEL_NS" get pods -o wide

step "5/7 disagg serve in the prefill pod, starting vLLM with the operator's config"
kubectl -n "$MODEL_NS" logs "$MODEL-prefill-0" | grep -m 3 -E 'disagg serve|kv_transfer_config|vLLM API server' || true
for role in prefill decode; do
    echo "$role.json: $(kubectl -n "$MODEL_NS" get configmap "$MODEL-connector" \
        -o "jsonpath={.data.$role\.json}")"
done

step "6/7 The router pod found the engines through their EndpointSlices"
kubectl -n "$MODEL_NS" get endpointslices -l "kubernetes.io/service-name in ($MODEL-prefill,$MODEL-decode)"
router_ip=$(kubectl -n "$MODEL_NS" get pods -l "app.kubernetes.io/instance=$MODEL,app.kubernetes.io/component=router" \
    -o jsonpath='{.items[0].status.podIP}')
echo "the router pod's replicas (its /metrics, from the host: pod IPs route to the node):"
curl -fsS --max-time 10 "http://$router_ip:8000/metrics" | grep '^disagg_router_replica_healthy'

step "7/7 Multi-turn TTFT ON vs OFF through the router Service (kubectl port-forward to 127.0.0.1)"
prefill_ip=$(kubectl -n "$MODEL_NS" get pod "$MODEL-prefill-0" -o jsonpath='{.status.podIP}')
echo "(waits for $HEAVY_LOCK if another heavy job runs; ~5 min on 2 cores)"
flock "$HEAVY_LOCK" "$BIN/python" demo/through_router.py --kubectl "$CLUSTER_BIN/kubectl" --namespace "$MODEL_NS" \
    --service "$MODEL-router" --prefill "http://$prefill_ip:8000" --out "$STATE/bench"
echo
echo "Cluster, operator and model keep running: KUBECONFIG=$KUBECONFIG kubectl -n $MODEL_NS get pods -o wide"
echo "Figures and JSON: $STATE/bench   Clean up: make demo-down"
