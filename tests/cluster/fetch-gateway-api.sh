#!/usr/bin/env bash
# Fetch the Gateway API's standard-install CRDs from its pinned Go module (gateway-api/) into
# $GATEWAY_API_CRDS, for the cluster tests of the router's HTTPRoute: the module's zip from the
# Go module proxy, checked against go.sum, and of it only the CustomResourceDefinitions under
# config/crd/standard (not the ValidatingAdmissionPolicy beside them, which would outlive the
# CRDs the tests remove). Skipped when the cache already holds them for the same pin. Prints
# the CRD directory last.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
source "$CLUSTER_SRC/go-build.sh"

key="gateway-api=$GATEWAY_API_VERSION go.sum=$(file_key "$GATEWAY_API_GO/go.sum")"
(
    exit_if_built gateway-api "$GATEWAY_API_CRDS" "$key" gateway.networking.k8s.io_httproutes.yaml
    export GOTOOLCHAIN=local GOFLAGS=-mod=readonly
    go -C "$GATEWAY_API_GO" mod download sigs.k8s.io/gateway-api
    module=$(go -C "$GATEWAY_API_GO" list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)
    tmp="$GATEWAY_API_CRDS.tmp"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    grep -l '^kind: CustomResourceDefinition$' "$module"/config/crd/standard/*.yaml |
        xargs cp -t "$tmp"
    chmod -R u+w "$tmp"
    echo "$key" >"$tmp/.stamp"
    rm -rf "$GATEWAY_API_CRDS"
    mv "$tmp" "$GATEWAY_API_CRDS"
    echo "gateway-api: CRDs of $GATEWAY_API_VERSION in $GATEWAY_API_CRDS"
) >&2
echo "$GATEWAY_API_CRDS"
