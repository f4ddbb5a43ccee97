#!/usr/bin/env bash
# Source it: the steps every build of pinned Go modules into the cache shares (build.sh,
# build-lws.sh, node/build-node.sh, metrics/build-metrics.sh). A build is keyed by its pins and
# skipped when its directory was built for the same key; otherwise it compiles into a sibling
# .tmp directory under the machine's heavy-job lock and replaces the cached one only once every
# binary is built, so an interrupted build never leaves a half-filled cache behind.
source "$(dirname "${BASH_SOURCE[0]}")/node/heavy-lock.sh"

# file_key FILE: the short digest a build key names an input file by.
file_key() { sha256sum "$1" | cut -c1-12; }

# prometheus_ldflags VERSION: the -ldflags of a Prometheus project's binary, its
# github.com/prometheus/common/version fields set as an upstream release sets them.
prometheus_ldflags() {
    local common=github.com/prometheus/common/version
    echo "-s -w -X $common.Version=$1 -X $common.Revision= -X $common.Branch=HEAD" \
        "-X $common.BuildUser=disagg -X $common.BuildDate="
}

# exit_if_built TOOL DIR KEY ENTRY...: end the calling build when DIR was built for KEY and
# holds every ENTRY.
exit_if_built() {
    local tool=$1 dir=$2 key=$3 entry
    shift 3
    [[ -f "$dir/.stamp" && "$(cat "$dir/.stamp")" == "$key" ]] || return 0
    for entry in "$@"; do [[ -e "$dir/$entry" ]] || return 0; done
    echo "$tool: cached in $dir ($key)"
    exit 0
}

# go_build_start TOOL DIR KEY MODULE_DIR...: check Go, download the modules, make the build
# directory ($GO_BUILD_TMP) and take the heavy-job lock. Sets GO_BUILD_* for go_build_done.
go_build_start() {
    GO_BUILD_TOOL=$1 GO_BUILD_DIR=$2 GO_BUILD_KEY=$3
    shift 3
    export CGO_ENABLED=0 GOTOOLCHAIN=local
    if ! go version 2>/dev/null | grep -qE 'go1\.(2[6-9]|[3-9][0-9])'; then
        echo "$GO_BUILD_TOOL: needs Go >= 1.26 on PATH (found: $(go version 2>&1 | tail -1))" >&2
        exit 1
    fi
    GO_BUILD_START=$(date +%s)
    echo "$GO_BUILD_TOOL: downloading Go modules"
    local module
    for module in "$@"; do go -C "$module" mod download; done
    echo "$GO_BUILD_TOOL: modules ready in $(($(date +%s) - GO_BUILD_START)) s"
    GO_BUILD_TMP="$GO_BUILD_DIR.tmp"
    rm -rf "$GO_BUILD_TMP"
    mkdir -p "$GO_BUILD_TMP"
    echo "$GO_BUILD_TOOL: building $GO_BUILD_KEY (waits for $HEAVY_LOCK)"
    heavy_lock
    GO_BUILD_COMPILE=$(date +%s)
}

# go_build_step WHAT: log how far into the compile WHAT was built.
go_build_step() {
    echo "$GO_BUILD_TOOL: $1 built at $(($(date +%s) - GO_BUILD_COMPILE)) s"
}

# go_build_done: release the lock, stamp the build and put it in place of the cached one.
go_build_done() {
    flock -u 9
    echo "$GO_BUILD_KEY" >"$GO_BUILD_TMP/.stamp"
    rm -rf "$GO_BUILD_DIR"
    mv "$GO_BUILD_TMP" "$GO_BUILD_DIR"
    echo "$GO_BUILD_TOOL: compiled in $(($(date +%s) - GO_BUILD_COMPILE)) s;" \
        "total $(($(date +%s) - GO_BUILD_START)) s (including the wait for the heavy lock)" \
        "into $GO_BUILD_DIR"
}
