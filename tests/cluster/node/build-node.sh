#!/usr/bin/env bash
# Build the real node's binaries into $NODE_BIN: kubelet and kube-proxy (the control plane's
# Kubernetes release), containerd with its runc shim and ctr, and the CNI plugins (bridge,
# host-local, loopback, portmap), each from its pinned module under go/, after packages.sh
# installed the Debian packages (runc...). Skipped when the cache already holds binaries built
# for the same pins.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"

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

stamp="$NODE_BIN/.stamp"
key="kubernetes=$KUBE_VERSION containerd=$CONTAINERD_VERSION cni-plugins=$CNI_PLUGINS_VERSION"
for module in kubelet containerd cni; do
    key+=" $module.sum=$(sha256sum "$NODE_GO/$module/go.sum" | cut -c1-12)"
done
key+=" ldflags=$(sha256sum <<<"$kube_ldflags $containerd_ldflags $cni_ldflags" | cut -c1-12)"

have_all() {
    [[ -f "$stamp" && "$(cat "$stamp")" == "$key" ]] || return 1
    for b in "${NODE_BINARIES[@]}"; do [[ -x "$NODE_BIN/$b" ]] || return 1; done
}

if have_all; then
    echo "node-bin: cached in $NODE_BIN ($key)"
    exit 0
fi

export CGO_ENABLED=0 GOTOOLCHAIN=local
start=$(date +%s)
echo "node-bin: downloading Go modules"
for module in kubelet containerd cni; do
    go -C "$NODE_GO/$module" mod download
done
echo "node-bin: modules ready in $(($(date +%s) - start)) s"
tmp="$NODE_BIN.tmp"
rm -rf "$tmp"
mkdir -p "$tmp"
echo "node-bin: building $key (waits for /tmp/disagg-heavy.lock)"
source "$NODE_SRC/heavy-lock.sh"
heavy_lock
compile=$(date +%s)
build() {
    local module=$1 ldflags=$2
    shift 2
    go -C "$NODE_GO/$module" build -p 2 -trimpath -ldflags "$ldflags" "$@" -o "$tmp/" \
        $(go -C "$NODE_GO/$module" list tool)
    echo "node-bin: $module built at $(($(date +%s) - compile)) s"
}
build kubelet "$kube_ldflags"
# no_btrfs: the btrfs snapshotter needs cgo; the node uses overlayfs.
build containerd "$containerd_ldflags" -tags "urfave_cli_no_docs no_btrfs"
build cni "$cni_ldflags"
flock -u 9
echo "$key" >"$tmp/.stamp"
rm -rf "$NODE_BIN"
mv "$tmp" "$NODE_BIN"
echo "node-bin: compiled in $(($(date +%s) - compile)) s; total $(($(date +%s) - start)) s" \
    "(including the wait for the heavy lock) into $NODE_BIN"
