#!/usr/bin/env bash
# Paths and the pinned version of the local S3 server (versitygw, ../go/versitygw/go.mod).
# Source it from the other scripts; run it to print KEY=value lines (read by the tests).
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"

VERSITYGW_GO="$CLUSTER_GO/versitygw"
VERSITYGW_VERSION="$(gomod_version github.com/versity/versitygw "$VERSITYGW_GO/go.mod")"
VERSITYGW_BIN="$DISAGG_CACHE/versitygw-$VERSITYGW_VERSION/bin"

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    for var in VERSITYGW_VERSION VERSITYGW_BIN; do
        echo "$var=${!var}"
    done
fi
