#!/usr/bin/env bash
# Paths and pinned versions of the local control plane, derived from go/go.mod.
# Source it from the other scripts; run it to print KEY=value lines (read by kube.py).
CLUSTER_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CLUSTER_GO="$CLUSTER_SRC/go"
DISAGG_CACHE="${DISAGG_CACHE:-$HOME/.cache/disagg}"

# gomod_version MODULE [GO_MOD]: the version GO_MOD (default: the control plane's) requires.
gomod_version() {
    awk -v m="$1" '{ sub(/^require[ \t]+/, "") } $1 == m && $2 ~ /^v/ { print $2; exit }' \
        "${2:-$CLUSTER_GO/go.mod}"
}

KUBE_VERSION="$(gomod_version k8s.io/kubernetes)"
ETCD_VERSION="$(gomod_version go.etcd.io/etcd/server/v3)"
KWOK_VERSION="$(gomod_version sigs.k8s.io/kwok)"
HELM_VERSION="$(gomod_version helm.sh/helm/v3)"
CLUSTER_BIN="$DISAGG_CACHE/k8s-$KUBE_VERSION/bin"
# DISAGG_CLUSTER_NAME=x runs a second, separate cluster (state in $DISAGG_CACHE/cluster-x).
CLUSTER_NAME="${DISAGG_CLUSTER_NAME:-disagg}"
CLUSTER_STATE="$DISAGG_CACHE/cluster${DISAGG_CLUSTER_NAME:+-$DISAGG_CLUSTER_NAME}"
CLUSTER_KUBECONFIG="$CLUSTER_STATE/kubeconfig"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok kwokctl helm)
# The LeaderWorkerSet controller (lws/): its own pinned module, binary and state; cluster-up
# starts it beside the control plane (lws-up.sh) with its CRD and webhooks.
LWS_GO="$CLUSTER_SRC/lws"
LWS_VERSION="$(gomod_version sigs.k8s.io/lws "$LWS_GO/go.mod")"
LWS_BIN="$DISAGG_CACHE/lws-$LWS_VERSION/bin"
LWS_STATE="$CLUSTER_STATE/lws"
# The real node (node/): kubelet and kube-proxy from the control plane's Kubernetes release,
# containerd and the CNI plugins from their own pinned modules, runc from Debian.
# DISAGG_REAL_NODE=1 makes cluster-up start it beside the fake nodes.
NODE_SRC="$CLUSTER_SRC/node"
NODE_GO="$NODE_SRC/go"
NODE_KUBE_VERSION="$(gomod_version k8s.io/kubernetes "$NODE_GO/kubelet/go.mod")"
CONTAINERD_VERSION="$(gomod_version github.com/containerd/containerd/v2 "$NODE_GO/containerd/go.mod")"
CNI_PLUGINS_VERSION="$(gomod_version github.com/containernetworking/plugins "$NODE_GO/cni/go.mod")"
NODE_BIN="$DISAGG_CACHE/node-$KUBE_VERSION/bin"
NODE_BINARIES=(kubelet kube-proxy containerd containerd-shim-runc-v2 ctr bridge host-local loopback
    portmap)
# One real node per machine (its network namespace has a fixed name): its state (the runtime's
# images, the kubelet's root, certificates, logs) lives beside the clusters, its runtime state
# in /run, shared by every cache on the machine; $NODE_OWNER names the cluster state it runs
# for, so no other cache's scripts stop it or remove its runtime state.
NODE_STATE="$DISAGG_CACHE/node"
NODE_RUN=/run/disagg-node
NODE_OWNER="$NODE_RUN/cluster"
# recorded_pid PIDFILE BINARY: the process PIDFILE records while it still runs BINARY (a
# pattern: */NAME matches any cache's binary of that name).
recorded_pid() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == $2 ]] && echo "$pid"
}
# node_pid NAME [BIN]: the recorded process of a node component while it still runs BIN/NAME,
# by default a binary named NAME from whichever cache.
node_pid() { recorded_pid "$NODE_RUN/$1.pid" "${2:-*}/$1"; }
# wait_for WHAT SECONDS COMMAND...: poll COMMAND (its output discarded) once a second until it
# succeeds; past SECONDS, exit naming WHAT, the time since $start and the logs in $WAIT_LOGS.
wait_for() {
    local what=$1 deadline=$(($(date +%s) + $2))
    shift 2
    until "$@" >/dev/null 2>&1; do
        if (($(date +%s) > deadline)); then
            echo "$(basename "$0" .sh): $what not ready after $(($(date +%s) - start)) s;" \
                "logs: $WAIT_LOGS" >&2
            exit 1
        fi
        sleep 1
    done
}
NODE_NAME=real-cpu-0
# The node runs in its own network namespace, linked to the host by one veth pair; pods sit on
# a bridge inside it. Nothing routes from there to an outside interface (the host does not
# forward, the namespace has no default route): pod and Service traffic stays on this machine.
NODE_NETNS=disagg-node
NODE_HOST_LINK=disagg-n0
NODE_HOST_IP=10.89.0.1
NODE_IP=10.89.0.2
NODE_LINK_PREFIX=30
# first_host CIDR: the range's first address (the bridge's, the `kubernetes` Service's).
first_host() {
    local base=${1%/*}
    echo "${base%.*}.$((${base##*.} + 1))"
}
POD_CIDR=10.88.0.0/24
POD_GATEWAY=$(first_host "$POD_CIDR")
# The API server's Service range (its --service-cluster-ip-range; kwok gives its fake pods
# addresses in 10.0.0.0/24, the API server's default range, so the real node uses another).
SERVICE_CIDR=10.96.0.0/24
KUBERNETES_SERVICE_IP=$(first_host "$SERVICE_CIDR")
# Pods tolerate this taint to run on the real node; nothing else lands there.
NODE_TAINT=disagg.dev/real-node=true:NoSchedule
# The images' buildah storage and base rootfs (node/images.sh), shared by every cluster.
IMAGE_STATE="$DISAGG_CACHE/images"
REAL_NODE="${DISAGG_REAL_NODE:-0}"

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    for var in KUBE_VERSION ETCD_VERSION KWOK_VERSION HELM_VERSION LWS_VERSION CLUSTER_BIN LWS_BIN CLUSTER_NAME \
        CLUSTER_STATE CLUSTER_KUBECONFIG CONTAINERD_VERSION CNI_PLUGINS_VERSION NODE_BIN \
        NODE_STATE NODE_RUN NODE_OWNER NODE_NAME NODE_NETNS NODE_HOST_IP NODE_IP POD_CIDR SERVICE_CIDR NODE_TAINT IMAGE_STATE REAL_NODE; do
        echo "$var=${!var}"
    done
fi
