#!/usr/bin/env bash
# Start the local control plane (kwokctl, binary runtime, binaries from build.sh) or reuse it
# when it already runs; register the fake nodes; print the kubeconfig path on the last line.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

"$CLUSTER_SRC/build.sh" >&2

export KWOK_WORKDIR="$CLUSTER_STATE/kwok" KWOK_KUBECTL_BINARY="$CLUSTER_BIN/kubectl"
kwokctl=("$CLUSTER_BIN/kwokctl" --name "$CLUSTER_NAME")
kubectl=("$CLUSTER_BIN/kubectl" --kubeconfig "$CLUSTER_KUBECONFIG")
start=$(date +%s)
mkdir -p "$CLUSTER_STATE"

api_ready() {
    [[ -s "$CLUSTER_KUBECONFIG" ]] && "${kubectl[@]}" get --raw /readyz >/dev/null 2>&1
}

create() {
    "${kwokctl[@]}" create cluster --runtime binary \
        --kube-apiserver-binary "$CLUSTER_BIN/kube-apiserver" \
        --kube-controller-manager-binary "$CLUSTER_BIN/kube-controller-manager" \
        --kube-scheduler-binary "$CLUSTER_BIN/kube-scheduler" \
        --etcd-binary "$CLUSTER_BIN/etcd" \
        --kwok-controller-binary "$CLUSTER_BIN/kwok" \
        --kubeconfig "$CLUSTER_KUBECONFIG" --wait 60s
}

# leader_fresh NAME: the component holds its leader lease and renewed it in the last 30 s.
leader_fresh() {
    local renew
    renew=$("${kubectl[@]}" -n kube-system get lease "$1" -o jsonpath='{.spec.renewTime}' 2>/dev/null) || return 1
    [[ -n "$renew" ]] && (($(date -d "$renew" +%s) > $(date +%s) - 30))
}

if api_ready; then
    echo "cluster-up: reusing running cluster $CLUSTER_NAME" >&2
elif [[ -d "$KWOK_WORKDIR/clusters/$CLUSTER_NAME" ]]; then
    echo "cluster-up: restarting stopped cluster $CLUSTER_NAME" >&2
    if ! { "${kwokctl[@]}" start cluster --wait 60s >&2 && api_ready; }; then
        echo "cluster-up: restart failed; recreating $CLUSTER_NAME" >&2
        "${kwokctl[@]}" delete cluster >&2 || true
        create >&2
    fi
else
    echo "cluster-up: creating cluster $CLUSTER_NAME ($KUBE_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION)" >&2
    create >&2
fi

"$CLUSTER_SRC/nodes.sh" | "${kubectl[@]}" apply -f - >&2

deadline=$(($(date +%s) + 60))
until leader_fresh kube-controller-manager && leader_fresh kube-scheduler &&
    "${kubectl[@]}" wait --for=condition=Ready node --all --timeout=5s >/dev/null 2>&1 &&
    "${kubectl[@]}" -n default get serviceaccount default >/dev/null 2>&1; do
    if (($(date +%s) > deadline)); then
        echo "cluster-up: controller-manager, scheduler or nodes not ready after 60 s;" \
            "logs: $KWOK_WORKDIR/clusters/$CLUSTER_NAME/logs" >&2
        exit 1
    fi
    sleep 1
done

echo "cluster-up: ready in $(($(date +%s) - start)) s; export KUBECONFIG=$CLUSTER_KUBECONFIG" >&2
echo "$CLUSTER_KUBECONFIG"
