#!/usr/bin/env bash
# Source it: heavy_lock takes /tmp/disagg-heavy.lock (the lock every heavy job of this machine
# shares) on fd 9, waiting for it, unless one of this process's ancestors already holds it
# (`flock /tmp/disagg-heavy.lock make test-e2e`): waiting then would wait for ourselves.
HEAVY_LOCK=${HEAVY_LOCK:-/tmp/disagg-heavy.lock}

heavy_lock() {
    exec 9>"$HEAVY_LOCK"
    local inode holders pid
    inode=$(stat -c %i "$HEAVY_LOCK")
    # /proc/locks: "N: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE ..."; waiters carry "->".
    holders=" $(awk -v inode=":$inode" '$2 != "->" && $6 ~ inode"$" { print $5 }' /proc/locks) "
    pid=$$
    while ((pid > 1)); do
        [[ "$holders" == *" $pid "* ]] && return 0
        pid=$(ps -o ppid= -p "$pid" | tr -d ' ') || break
    done
    flock 9
}
