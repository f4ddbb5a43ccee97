#!/usr/bin/env bash
# Start the local control plane (kwokctl, binary runtime, binaries from build.sh) or reuse it
# when it already runs; register the fake nodes, and with DISAGG_REAL_NODE=1 start the real
# node beside them (node/node-up.sh); start the LeaderWorkerSet controller (lws-up.sh); print
# the kubeconfig path on the last line. A running cluster created without extra_args' flags
# (the aggregation layer, long leader leases) is replaced.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

"$CLUSTER_SRC/build.sh" >&2

export KWOK_WORKDIR="$CLUSTER_STATE/kwok" KWOK_KUBECTL_BINARY="$CLUSTER_BIN/kubectl"
kwokctl=("$CLUSTER_BIN/kwokctl" --name "$CLUSTER_NAME")
kubectl=("$CLUSTER_BIN/kubectl" --kubeconfig "$CLUSTER_KUBECONFIG")
mkdir -p "$CLUSTER_STATE"
# One cluster-up at a time (test sessions of several users may start together).
exec 8>"$CLUSTER_STATE/up.lock"
flock 8
start=$(date +%s)

api_ready() {
    [[ -s "$CLUSTER_KUBECONFIG" ]] && "${kubectl[@]}" get --raw /readyz >/dev/null 2>&1
}

# The components' extra flags, printed as kwokctl --extra-args:
#   - the API server serves the aggregation layer (an APIService served by a process beside
#     the cluster, such as prometheus-adapter's custom.metrics.k8s.io, metrics/metrics-up.sh):
#     it trusts kwokctl's CA for the front-proxy client certificate it already presents (the
#     admin certificate, CN kwok-admin) and the user and groups that certificate forwards, and
#     it dials an APIService's endpoints itself (nothing on the host routes the fake nodes'
#     Service IPs);
#   - the controller-manager and the scheduler keep their leader lease through minutes of
#     starved cores: each exits when it misses the renew deadline (10 s by default), and the
#     real node's engines can hold both cores that long; nothing restarts them, so a lost lease
#     would leave the cluster without controllers (no ServiceAccounts, no namespace deletion).
#   kwokctl v0.8.0 files a flag under the patch at the flag's own position in the list (its
#   mutationComponentPatches), so the first flag of each component comes first, in order.
LEADER_ELECTION_ARGS=(leader-elect-lease-duration=300s leader-elect-renew-deadline=280s
    leader-elect-retry-period=2s)
extra_args() {
    local pki="$KWOK_WORKDIR/clusters/$CLUSTER_NAME/pki" arg
    local apiserver=("requestheader-client-ca-file=$pki/ca.crt" requestheader-allowed-names=kwok-admin
        requestheader-username-headers=X-Remote-User requestheader-group-headers=X-Remote-Group
        requestheader-extra-headers-prefix=X-Remote-Extra- enable-aggregator-routing=true)
    local -a flags=("kube-apiserver=${apiserver[0]}"
        "kube-controller-manager=${LEADER_ELECTION_ARGS[0]}"
        "kube-scheduler=${LEADER_ELECTION_ARGS[0]}")
    for arg in "${apiserver[@]:1}"; do
        flags+=("kube-apiserver=$arg")
    done
    for arg in "${LEADER_ELECTION_ARGS[@]:1}"; do
        flags+=("kube-controller-manager=$arg" "kube-scheduler=$arg")
    done
    printf -- '--extra-args=%s\n' "${flags[@]}"
}

# Whether the cluster's components were created with extra_args (kwok.yaml holds them).
current() {
    local kwok_yaml="$KWOK_WORKDIR/clusters/$CLUSTER_NAME/kwok.yaml"
    grep -q -- "--enable-aggregator-routing=true" "$kwok_yaml" 2>/dev/null &&
        grep -q -- "--${LEADER_ELECTION_ARGS[1]}" "$kwok_yaml"
}

# The components kwokctl starts outlive this script: they must not inherit the lock (fd 8).
# With the real node, kwokctl also reads node/kwokctl-config.sh's settings.
create() {
    local config=() extra
    mapfile -t extra < <(extra_args)
    if [[ "$REAL_NODE" == 1 ]]; then
        "$NODE_SRC/kwokctl-config.sh" >"$CLUSTER_STATE/kwokctl-real-node.yaml"
        config=(--config "$CLUSTER_STATE/kwokctl-real-node.yaml")
    fi
    "${kwokctl[@]}" "${config[@]}" create cluster --runtime binary 8>&- "${extra[@]}" \
        --kube-apiserver-binary "$CLUSTER_BIN/kube-apiserver" \
        --kube-controller-manager-binary "$CLUSTER_BIN/kube-controller-manager" \
        --kube-scheduler-binary "$CLUSTER_BIN/kube-scheduler" \
        --etcd-binary "$CLUSTER_BIN/etcd" \
        --kwok-controller-binary "$CLUSTER_BIN/kwok" \
        --node-lease-duration-seconds 20 \
        --kubeconfig "$CLUSTER_KUBECONFIG" --wait 60s
}

# Count the leases renewed at or after $since, i.e. held by live components (a stopped
# cluster leaves its leases behind until they expire).
fresh_leases() {
    local namespace=$1 since=$2 renewed=0 t
    shift 2
    for t in $("${kubectl[@]}" -n "$namespace" get lease "$@" \
        -o jsonpath='{range .items[*]}{.spec.renewTime}{" "}{end}' 2>/dev/null); do
        (($(date -d "$t" +%s) >= since)) && renewed=$((renewed + 1))
    done
    echo "$renewed"
}

# Ready: controller-manager and scheduler lead, kwok holds every node's lease, the nodes are
# Ready and the controller-manager created the default ServiceAccount.
cluster_ready() {
    local since=$1 nodes
    nodes=$("${kubectl[@]}" get nodes -l type=kwok -o name | wc -l)
    (($(fresh_leases kube-system "$since" kube-controller-manager kube-scheduler) == 2)) &&
        (($(fresh_leases kube-node-lease "$since") >= nodes)) &&
        "${kubectl[@]}" wait --for=condition=Ready node --all --timeout=5s >/dev/null 2>&1 &&
        "${kubectl[@]}" -n default get serviceaccount default >/dev/null 2>&1
}

if api_ready && current; then
    echo "cluster-up: reusing running cluster $CLUSTER_NAME" >&2
    since=$((start - 60))
else
    if [[ -d "$KWOK_WORKDIR/clusters/$CLUSTER_NAME" ]]; then
        # A stopped cluster restarts slower than a new one starts (its components wait for
        # the old leases to expire) and the tests need none of its state: replace it, and a
        # running one created without extra_args' flags (an older cluster-up's).
        if api_ready; then
            echo "cluster-up: replacing cluster $CLUSTER_NAME, created without today's flags" >&2
        else
            echo "cluster-up: replacing stopped cluster $CLUSTER_NAME" >&2
        fi
        "${kwokctl[@]}" delete cluster 8>&- >&2
    fi
    echo "cluster-up: creating cluster $CLUSTER_NAME ($KUBE_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION)" >&2
    since=$start
    create >&2
fi

"$CLUSTER_SRC/nodes.sh" | "${kubectl[@]}" apply -f - >/dev/null
if [[ "$REAL_NODE" == 1 ]]; then
    "$NODE_SRC/node-up.sh" >&2
fi

deadline=$((start + 120))
until cluster_ready "$since"; do
    if (($(date +%s) > deadline)); then
        echo "cluster-up: not ready after $((deadline - start)) s;" \
            "logs: $KWOK_WORKDIR/clusters/$CLUSTER_NAME/logs" >&2
        exit 1
    fi
    sleep 1
done

"$CLUSTER_SRC/lws-up.sh" 8>&-

echo "cluster-up: ready in $(($(date +%s) - start)) s; export KUBECONFIG=$CLUSTER_KUBECONFIG" >&2
echo "$CLUSTER_KUBECONFIG"
