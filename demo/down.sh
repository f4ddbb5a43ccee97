#!/usr/bin/env bash
# `make demo-down`: delete the demo cluster with everything in it (the operator release, the
# models' pods, the real node's containers, mounts and network namespace). The images stay
# cached (~/.cache/disagg/images, and loaded in the node's containerd) for the next `make demo`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export DISAGG_CLUSTER_NAME=${DISAGG_CLUSTER_NAME:-demo}
source tests/cluster/env.sh
STATE="$DISAGG_CACHE/demo"

bash tests/cluster/cluster-down.sh
# The demo's own cluster state (never the shared one of the cluster tests).
[[ -n "$DISAGG_CLUSTER_NAME" ]] && rm -rf "$CLUSTER_STATE"
rm -rf "$STATE"
echo "demo-down: done"
