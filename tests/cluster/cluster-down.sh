#!/usr/bin/env bash
# Stop the real node if it runs for this cluster (node/node-down.sh), the LeaderWorkerSet
# controller, then the local control plane; remove its state and kubeconfig.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

export KWOK_WORKDIR="$CLUSTER_STATE/kwok"
if [[ -s "$NODE_OWNER" || -e "/run/netns/$NODE_NETNS" ]]; then
    "$NODE_SRC/node-down.sh"
fi
if [[ -s "$LWS_STATE/pid" ]]; then
    kill "$(cat "$LWS_STATE/pid")" 2>/dev/null || true
fi
rm -rf "$LWS_STATE"
if [[ -d "$KWOK_WORKDIR/clusters/$CLUSTER_NAME" ]]; then
    "$CLUSTER_BIN/kwokctl" --name "$CLUSTER_NAME" delete cluster
fi
rm -f "$CLUSTER_KUBECONFIG"
echo "cluster-down: $CLUSTER_NAME removed"
