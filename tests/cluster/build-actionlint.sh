#!/usr/bin/env bash
# Build actionlint from its pinned Go module (actionlint/) into $ACTIONLINT_BIN, for the unit
# test that lints .github/workflows/. Skipped when the cache already holds a build for the same
# pin. Prints the binary's path last.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
source "$CLUSTER_SRC/go-build.sh"

ACTIONLINT_GO="$CLUSTER_SRC/actionlint"
ACTIONLINT_VERSION="$(gomod_version github.com/rhysd/actionlint "$ACTIONLINT_GO/go.mod")"
ACTIONLINT_BIN="$DISAGG_CACHE/actionlint-$ACTIONLINT_VERSION/bin"

key="actionlint=$ACTIONLINT_VERSION go.sum=$(file_key "$ACTIONLINT_GO/go.sum")"
(
    exit_if_built actionlint "$ACTIONLINT_BIN" "$key" actionlint
    go_build_start actionlint "$ACTIONLINT_BIN" "$key" "$ACTIONLINT_GO"
    go -C "$ACTIONLINT_GO" build -p 2 -trimpath \
        -ldflags "-s -w -X github.com/rhysd/actionlint.version=$ACTIONLINT_VERSION" \
        -o "$GO_BUILD_TMP/actionlint" github.com/rhysd/actionlint/cmd/actionlint
    go_build_done
) >&2
echo "$ACTIONLINT_BIN/actionlint"
