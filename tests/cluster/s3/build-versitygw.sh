#!/usr/bin/env bash
# Build versitygw, the S3-compatible server the tests put the demo model's weights into (its
# POSIX backend: one directory per bucket), from its Go module pinned in ../go/versitygw
# (verified against its go.sum) into $VERSITYGW_BIN. Skipped when the cache holds a binary built
# for the same pin. Why versitygw: a real S3 server (SigV4, ListObjectsV2, ranged GETs, errors as
# AWS names them) in one static binary with a small dependency tree; MinIO and SeaweedFS pull
# several times as many modules. Measured on this 2-core machine (shared): modules ready in
# 11 s (go get), compiled in 116 s (cold Go build cache).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
source "$CLUSTER_SRC/go-build.sh"

ldflags="-s -w -X main.Version=$VERSITYGW_VERSION -X main.Build=disagg -X main.BuildTime="
key="versitygw=$VERSITYGW_VERSION go.sum=$(file_key "$VERSITYGW_GO/go.sum")"
key+=" ldflags=$(file_key - <<<"$ldflags")"
exit_if_built versitygw-bin "$VERSITYGW_BIN" "$key" versitygw

go_build_start versitygw-bin "$VERSITYGW_BIN" "$key" "$VERSITYGW_GO"
nice -n 19 go -C "$VERSITYGW_GO" build -p 2 -trimpath -ldflags "$ldflags" \
    -o "$GO_BUILD_TMP/versitygw" "$(go -C "$VERSITYGW_GO" list tool)"
go_build_step versitygw
go_build_done
