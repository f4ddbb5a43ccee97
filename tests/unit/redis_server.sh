#!/usr/bin/env bash
# Start a throwaway redis-server on 127.0.0.1:PORT in the foreground (no persistence),
# installing the Debian package first if the machine lacks it (CI machines start fresh).
# Usage: tests/unit/redis_server.sh PORT
set -euo pipefail
PORT=${1:?usage: redis_server.sh PORT}
if ! command -v redis-server >/dev/null 2>&1; then
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >&2
fi
exec redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --protected-mode yes
