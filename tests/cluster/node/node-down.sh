#!/usr/bin/env bash
# Stop the real node and remove what it set up on the machine: its pods' containers, kube-proxy,
# the kubelet, containerd and the shims it started, their mounts, the network namespace (with
# the bridge and the veth link, which takes the host's routes along), the cgroups and the Node
# object. Keeps the runtime's images ($NODE_STATE/containerd) for the next node-up. Idempotent.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"

ctr=("$NODE_BIN/ctr" --address "$NODE_RUN/containerd.sock" -n k8s.io)

# stop PID...: SIGTERM, then SIGKILL what still runs after 20 s.
stop() {
    local pid deadline=$(($(date +%s) + 20))
    (($#)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    for pid in "$@"; do
        while kill -0 "$pid" 2>/dev/null && (($(date +%s) < deadline)); do sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
    done
}

owner=$(cat "$NODE_OWNER" 2>/dev/null || true)
if [[ -n "$owner" && "$owner" != "$CLUSTER_STATE" ]] && node_pid kubelet >/dev/null; then
    echo "node-down: the real node runs for the cluster in $owner; left alone" >&2
    exit 0
fi

stopped=()
for name in kube-proxy kubelet; do
    if pid=$(node_pid "$name" "$NODE_BIN"); then
        stop "$pid"
        stopped+=("$name")
    fi
done

if pid=$(node_pid containerd "$NODE_BIN"); then
    # The pods' containers and sandboxes go with the node (the kubelet is already stopped).
    tasks=$("${ctr[@]}" tasks ls -q 2>/dev/null || true)
    for task in $tasks; do "${ctr[@]}" tasks kill -a -s SIGKILL "$task" >/dev/null 2>&1 || true; done
    for task in $tasks; do
        for _ in $(seq 50); do
            "${ctr[@]}" tasks delete -f "$task" >/dev/null 2>&1 && break
            sleep 0.2
        done
    done
    for container in $("${ctr[@]}" containers ls -q 2>/dev/null || true); do
        "${ctr[@]}" containers delete "$container" >/dev/null 2>&1 || true
    done
    stop "$pid"
    stopped+=(containerd)
fi
# Shims outlive containerd; each names the socket it serves.
shims=()
for exe in /proc/[0-9]*/exe; do
    [[ "$(readlink "$exe" 2>/dev/null)" == "$NODE_BIN/containerd-shim-runc-v2" ]] || continue
    pid=${exe#/proc/}
    shims+=("${pid%/exe}")
done
stop "${shims[@]}"

# Mounts the node left (container rootfs, pod volumes, sandbox netns and shm), deepest first.
mounts=$(findmnt -rn -o TARGET | grep -E "^($NODE_STATE|$NODE_RUN)/" | sort -r || true)
for target in $mounts; do umount -l "$target" 2>/dev/null || true; done

if ip netns list | grep -qx "$NODE_NETNS\( .*\)\?"; then
    ip netns delete "$NODE_NETNS"
fi
ip link delete "$NODE_HOST_LINK" 2>/dev/null || true

for root in /sys/fs/cgroup/*/disagg-node; do
    [[ -d "$root" ]] && find "$root" -depth -type d -exec rmdir {} + 2>/dev/null || true
done

if [[ "$owner" == "$CLUSTER_STATE" && -s "$CLUSTER_KUBECONFIG" ]]; then
    "$CLUSTER_BIN/kubectl" --kubeconfig "$CLUSTER_KUBECONFIG" delete node "$NODE_NAME" \
        --ignore-not-found --wait=false --request-timeout=5s >/dev/null 2>&1 || true
fi
rm -rf --one-file-system "$NODE_RUN" "$NODE_STATE/kubelet"
((${#stopped[@]})) && echo "node-down: stopped ${stopped[*]}" || true
