#!/usr/bin/env bash
# Paths and pinned versions of the local control plane, derived from go/go.mod.
# Source it from the other scripts; run it to print KEY=value lines (read by kube.py).
CLUSTER_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CLUSTER_GO="$CLUSTER_SRC/go"
DISAGG_CACHE="${DISAGG_CACHE:-$HOME/.cache/disagg}"

gomod_version() {
    awk -v m="$1" '{ sub(/^require[ \t]+/, "") } $1 == m && $2 ~ /^v/ { print $2; exit }' \
        "$CLUSTER_GO/go.mod"
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

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    for var in KUBE_VERSION ETCD_VERSION KWOK_VERSION HELM_VERSION CLUSTER_BIN CLUSTER_NAME \
        CLUSTER_STATE CLUSTER_KUBECONFIG; do
        echo "$var=${!var}"
    done
fi
