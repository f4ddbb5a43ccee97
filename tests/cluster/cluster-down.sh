#!/usr/bin/env bash
# Stop the real node if it runs for this cluster (node/node-down.sh), then the local control
# plane; remove its state and kubeconfig.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

export KWOK_WORKDIR="$CLUSTER_STATE/kwok"
if [[ -s "$NODE_STATE/cluster" || -e "/run/netns/$NODE_NETNS" ]]; then
    "$NODE_SRC/node-down.sh"
fi
if [[ -d "$KWOK_WORKDIR/clusters/$CLUSTER_NAME" ]]; then
    "$CLUSTER_BIN/kwokctl" --name "$CLUSTER_NAME" delete cluster
fi
rm -f "$CLUSTER_KUBECONFIG"
echo "cluster-down: $CLUSTER_NAME removed"
