#!/usr/bin/env bash
# Stop the local control plane and remove its state and kubeconfig.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

export KWOK_WORKDIR="$CLUSTER_STATE/kwok"
if [[ -d "$KWOK_WORKDIR/clusters/$CLUSTER_NAME" ]]; then
    "$CLUSTER_BIN/kwokctl" --name "$CLUSTER_NAME" delete cluster
fi
rm -f "$CLUSTER_KUBECONFIG"
echo "cluster-down: $CLUSTER_NAME removed"
