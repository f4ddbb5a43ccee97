#!/usr/bin/env bash
# Build the local control plane (kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl, etcd, kwok, kwokctl, helm) from the pinned Go modules into $CLUSTER_BIN.
# Skipped when the cache already holds binaries built for the same pins.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

minor="${KUBE_VERSION#v1.}"
minor="${minor%%.*}"
cb=k8s.io/component-base/version
cg=k8s.io/client-go/pkg/version
ldflags="-s -w"
for pkg in "$cb" "$cg"; do
    ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit="
done
ldflags+=" -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
ldflags+=" -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${KUBE_VERSION#v}"
ldflags+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$minor"
done

stamp="$CLUSTER_BIN/.stamp"
key="kubernetes=$KUBE_VERSION etcd=$ETCD_VERSION kwok=$KWOK_VERSION helm=$HELM_VERSION"
key+=" go.sum=$(sha256sum "$CLUSTER_GO/go.sum" | cut -c1-12)"
key+=" ldflags=$(sha256sum <<<"$ldflags" | cut -c1-12)"

have_all() {
    [[ -f "$stamp" && "$(cat "$stamp")" == "$key" ]] || return 1
    for b in "${BINARIES[@]}"; do [[ -x "$CLUSTER_BIN/$b" ]] || return 1; done
}

if have_all; then
    echo "cluster-bin: cached in $CLUSTER_BIN ($key)"
    exit 0
fi

export CGO_ENABLED=0 GOTOOLCHAIN=local
if ! go version 2>/dev/null | grep -qE 'go1\.(2[6-9]|[3-9][0-9])'; then
    echo "cluster-bin: needs Go >= 1.26 on PATH (found: $(go version 2>&1 | tail -1))" >&2
    exit 1
fi

cd "$CLUSTER_GO"
start=$(date +%s)
echo "cluster-bin: downloading Go modules"
go mod download
echo "cluster-bin: modules ready in $(($(date +%s) - start)) s"
tmp="$CLUSTER_BIN.tmp"
rm -rf "$tmp"
mkdir -p "$tmp"
echo "cluster-bin: building $key (waits for /tmp/disagg-heavy.lock)"
exec 9>/tmp/disagg-heavy.lock
flock 9
compile=$(date +%s)
# One go build shares the compile work of the common packages across all binaries.
go build -p 2 -trimpath -ldflags "$ldflags" -o "$tmp/" $(go list tool) ./cmd/etcd
flock -u 9
echo "$key" >"$tmp/.stamp"
rm -rf "$CLUSTER_BIN"
mv "$tmp" "$CLUSTER_BIN"
echo "cluster-bin: compiled in $(($(date +%s) - compile)) s; total $(($(date +%s) - start)) s" \
    "(including the wait for the heavy lock) into $CLUSTER_BIN"
