#!/usr/bin/env bash
# Run the LeaderWorkerSet controller against the local control plane, or reuse it when it
# already serves this cluster: install its CRDs, start the controller (a host process, like
# the control plane's components; no leader election, webhooks on 127.0.0.1 with a
# certificate made here) and register its webhooks by URL. The pod webhooks select only the
# pods of a LeaderWorkerSet, so the other tests' pods never wait on it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

"$CLUSTER_SRC/build-lws.sh" >&2
kubectl=("$CLUSTER_BIN/kubectl" --kubeconfig "$CLUSTER_KUBECONFIG")
mkdir -p "$LWS_STATE/certs"
pidfile="$LWS_STATE/pid"

running() {
    [[ -s "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null &&
        [[ "$(cat "$LWS_STATE/cluster" 2>/dev/null)" == "$(cat "$CLUSTER_KUBECONFIG")" ]]
}

"${kubectl[@]}" apply --server-side -f "$LWS_BIN/crds" >/dev/null
"${kubectl[@]}" wait --for=condition=Established crd --all --timeout=60s >/dev/null

if running; then
    echo "lws-up: reusing controller $(cat "$pidfile")" >&2
    exit 0
fi
if [[ -s "$pidfile" ]]; then
    kill "$(cat "$pidfile")" 2>/dev/null || true
fi

# A free port for the webhook server (one cluster's controller per port).
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
certs="$LWS_STATE/certs"
openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=lws-webhook" \
    -addext "subjectAltName=IP:127.0.0.1" -keyout "$certs/tls.key" -out "$certs/tls.crt" \
    2>/dev/null
cat >"$LWS_STATE/config.yaml" <<YAML
apiVersion: config.lws.x-k8s.io/v1alpha1
kind: Configuration
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
webhook:
  host: 127.0.0.1
  port: $port
  certDir: $certs
metrics:
  bindAddress: "0"
health:
  healthProbeBindAddress: "0"
YAML

ca=$(base64 -w0 <"$certs/tls.crt")
hook() { # hook NAME PATH RESOURCE GROUP OPERATIONS [pod-selector]
    cat <<YAML
- name: $1
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  clientConfig: {url: "https://127.0.0.1:$port$2", caBundle: "$ca"}
  rules: [{apiGroups: ["$4"], apiVersions: [v1], operations: [$5], resources: [$3]}]
YAML
    if [[ "${6:-}" == pods ]]; then
        echo "  objectSelector: {matchExpressions: [{key: leaderworkerset.sigs.k8s.io/name, operator: Exists}]}"
    fi
}
webhooks() { # webhooks KIND NAME VERB POD-OPERATIONS: the controller's LeaderWorkerSet and pod hooks
    local prefix=${3:0:1}
    echo "apiVersion: admissionregistration.k8s.io/v1"
    echo "kind: $1"
    echo "metadata: {name: $2}"
    echo "webhooks:"
    hook "${prefix}leaderworkerset.kb.io" "/$3-leaderworkerset-x-k8s-io-v1-leaderworkerset" \
        leaderworkersets leaderworkerset.x-k8s.io "CREATE, UPDATE"
    hook "${prefix}pod.kb.io" "/$3--v1-pod" pods "" "$4" pods
}
{
    webhooks MutatingWebhookConfiguration disagg-lws-mutating mutate CREATE
    echo "---"
    webhooks ValidatingWebhookConfiguration disagg-lws-validating validate "CREATE, UPDATE"
} >"$LWS_STATE/webhooks.yaml"

# The controller outlives this script (cluster-down.sh stops it): no inherited locks.
KUBECONFIG="$CLUSTER_KUBECONFIG" ENABLE_WEBHOOKS=true setsid "$LWS_BIN/lws-controller" \
    --config "$LWS_STATE/config.yaml" >"$LWS_STATE/controller.log" 2>&1 8>&- 9>&- </dev/null &
echo $! >"$pidfile"
cat "$CLUSTER_KUBECONFIG" >"$LWS_STATE/cluster"

deadline=$(($(date +%s) + 60))
until curl -sk "https://127.0.0.1:$port/" -o /dev/null; do
    if ! kill -0 "$(cat "$pidfile")" 2>/dev/null || (($(date +%s) > deadline)); then
        echo "lws-up: controller not serving; log: $LWS_STATE/controller.log" >&2
        tail -20 "$LWS_STATE/controller.log" >&2
        exit 1
    fi
    sleep 1
done
"${kubectl[@]}" apply -f "$LWS_STATE/webhooks.yaml" >/dev/null
echo "lws-up: controller $(cat "$pidfile") serving webhooks on 127.0.0.1:$port" >&2
