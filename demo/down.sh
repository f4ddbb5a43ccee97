#!/usr/bin/env bash
# `make demo-down`: stop what `make demo` started (the local operator, a local 1P1D run still
# going) and delete the demo cluster with everything in it. `--operator-only` stops the local
# operator and nothing else (demo.sh restarts it that way).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export DISAGG_CLUSTER_NAME=${DISAGG_CLUSTER_NAME:-demo}
source tests/cluster/env.sh
STATE="$DISAGG_CACHE/demo"

stop_pid_file() {
    local file=$1 pid
    [[ -f "$file" ]] || return 0
    pid=$(cat "$file")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
        echo "demo-down: stopped $(basename "$file" .pid) (pid $pid)"
    fi
    rm -f "$file"
}

if [[ "${1:-}" == --operator-only ]]; then
    stop_pid_file "$STATE/operator.pid"
    exit 0
fi
stop_pid_file "$STATE/local_pd.pid"
stop_pid_file "$STATE/operator.pid"
bash tests/cluster/cluster-down.sh
# The demo's own cluster state (never the shared one of the cluster tests).
[[ -n "$DISAGG_CLUSTER_NAME" ]] && rm -rf "$CLUSTER_STATE"
rm -rf "$STATE"
echo "demo-down: done"
