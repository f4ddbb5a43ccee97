#!/usr/bin/env bash
# Build the LeaderWorkerSet controller from its pinned Go module (lws/) into $LWS_BIN, with the
# CRDs of the same release beside it (crds/). Skipped when the cache already holds a build for
# the same pin.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
source "$CLUSTER_SRC/go-build.sh"

key="lws=$LWS_VERSION go.sum=$(file_key "$LWS_GO/go.sum")"
exit_if_built lws-bin "$LWS_BIN" "$key" lws-controller crds

go_build_start lws-bin "$LWS_BIN" "$key" "$LWS_GO"
cd "$LWS_GO"
go build -p 2 -trimpath -ldflags "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION" \
    -o "$GO_BUILD_TMP/lws-controller" sigs.k8s.io/lws/cmd
mkdir "$GO_BUILD_TMP/crds"
cp "$(go list -m -f '{{.Dir}}' sigs.k8s.io/lws)"/config/crd/bases/*.yaml "$GO_BUILD_TMP/crds/"
chmod -R u+w "$GO_BUILD_TMP"
go_build_done
