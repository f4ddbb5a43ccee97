#!/usr/bin/env bash
# Build the real node's binaries into $NODE_BIN: kubelet and kube-proxy (the control plane's
# Kubernetes release), containerd with its runc shim and ctr, and the CNI plugins (bridge,
# host-local, loopback, portmap), each from its pinned module under go/, after packages.sh
# installed the Debian packages (runc...). Skipped when the cache already holds binaries built
# for the same pins.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"
source "$CLUSTER_SRC/go-build.sh"

if [[ "$NODE_KUBE_VERSION" != "$KUBE_VERSION" ]]; then
    echo "node-bin: $NODE_GO/kubelet/go.mod pins k8s.io/kubernetes $NODE_KUBE_VERSION but the" \
        "control plane runs $KUBE_VERSION; make them equal" >&2
    exit 1
fi

"$NODE_SRC/packages.sh"

minor="${KUBE_VERSION#v1.}"
minor="${minor%%.*}"
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kube_ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit="
done
ctrd=github.com/containerd/containerd/v2/version
containerd_ldflags="-s -w -X $ctrd.Version=$CONTAINERD_VERSION -X $ctrd.Revision="
cni_ldflags="-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION"

key="kubernetes=$KUBE_VERSION containerd=$CONTAINERD_VERSION cni-plugins=$CNI_PLUGINS_VERSION"
for module in kubelet containerd cni; do
    key+=" $module.sum=$(file_key "$NODE_GO/$module/go.sum")"
done
key+=" ldflags=$(file_key - <<<"$kube_ldflags $containerd_ldflags $cni_ldflags")"
exit_if_built node-bin "$NODE_BIN" "$key" "${NODE_BINARIES[@]}"

go_build_start node-bin "$NODE_BIN" "$key" "$NODE_GO"/{kubelet,containerd,cni}
build() {
    local module=$1 ldflags=$2
    shift 2
    go -C "$NODE_GO/$module" build -p 2 -trimpath -ldflags "$ldflags" "$@" -o "$GO_BUILD_TMP/" \
        $(go -C "$NODE_GO/$module" list tool)
    go_build_step "$module"
}
build kubelet "$kube_ldflags"
# no_btrfs: the btrfs snapshotter needs cgo; the node uses overlayfs.
build containerd "$containerd_ldflags" -tags "urfave_cli_no_docs no_btrfs"
build cni "$cni_ldflags"
go_build_done
