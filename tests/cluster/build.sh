#!/usr/bin/env bash
# Build the local control plane (kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl, etcd, kwok, kwokctl, helm) from the pinned Go modules into $CLUSTER_BIN.
# Skipped when the cache already holds binaries built for the same pins.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
source "$CLUSTER_SRC/go-build.sh"

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

key="kubernetes=$KUBE_VERSION etcd=$ETCD_VERSION kwok=$KWOK_VERSION helm=$HELM_VERSION"
key+=" go.sum=$(file_key "$CLUSTER_GO/go.sum") ldflags=$(file_key - <<<"$ldflags")"
exit_if_built cluster-bin "$CLUSTER_BIN" "$key" "${BINARIES[@]}"

go_build_start cluster-bin "$CLUSTER_BIN" "$key" "$CLUSTER_GO"
cd "$CLUSTER_GO"
# One go build shares the compile work of the common packages across all binaries.
go build -p 2 -trimpath -ldflags "$ldflags" -o "$GO_BUILD_TMP/" $(go list tool) ./cmd/etcd
go_build_done
