#!/usr/bin/env bash
# dashboard-screenshot.sh PROMETHEUS_URL OUT.png: a PNG of the chart's Grafana dashboard
# (charts/disagg-operator/files/grafana/disagg.json) as Perses renders it with the series of the
# Prometheus at PROMETHEUS_URL (e.g. metrics-up.sh's, while the e2e run's pipeline still runs).
#   - Perses (build-perses.sh) starts on a free loopback port with a temporary home: a file
#     database, a copy of the plugins; hack/grafana_to_perses.py translates the dashboard, and
#     the project and the dashboard (holding its Prometheus datasource, proxied by the server) go
#     in through Perses's API;
#   - Debian's chromium (headless; installed when missing) loads the dashboard over the last
#     $SCREENSHOT_RANGE (15m) with every namespace and model selected, in a window
#     $SCREENSHOT_WIDTH (1600) pixels wide and as tall as the dashboard's grid, and writes
#     OUT.png (Perses has no kiosk mode: its header and the dashboard's toolbar show too);
#   - Perses stops and its home is removed on exit, whatever happened.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

if [[ $# -ne 2 ]]; then
    echo "usage: $(basename "$0") PROMETHEUS_URL OUT.png" >&2
    exit 2
fi
prometheus_url=${1%/}
out=$(realpath -m "$2")
range=${SCREENSHOT_RANGE:-15m}
width=${SCREENSHOT_WIDTH:-1600}
REPO="$(cd "$CLUSTER_SRC/../.." && pwd)"
DASHBOARD="$REPO/charts/disagg-operator/files/grafana/disagg.json"
if ! command -v chromium >/dev/null 2>&1; then
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >&2
fi
if ! curl -sf --max-time 10 "$prometheus_url/-/ready" >/dev/null; then
    echo "dashboard-screenshot: no ready Prometheus at $prometheus_url (PROMETHEUS_URL)" >&2
    exit 1
fi
start=$(date +%s)

"$METRICS_SRC/build-perses.sh" >&2

home=$(mktemp -d -t disagg-perses.XXXXXX)
WAIT_LOGS="$home/perses.log"
perses_pid=
cleanup() {
    if [[ -n "$perses_pid" ]]; then
        kill "$perses_pid" 2>/dev/null || true
        wait "$perses_pid" 2>/dev/null || true
    fi
    rm -rf "$home"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
perses_url="http://127.0.0.1:$port"
# The server writes plugin-modules.json into its plugin folder: a copy keeps the cache as built.
cp -r "$PERSES_DIR/plugins" "$home/plugins"
mkdir -p "$home/db" "$home/plugins-archive" "$home/resources"
cat >"$home/config.yaml" <<YAML
security:
  readonly: false
  enable_auth: false
  cookie:
    secure: false
database:
  file:
    folder: $home/db
    extension: json
plugin:
  path: $home/plugins
  archive_path: $home/plugins-archive
YAML
"$PERSES_DIR/bin/perses" --config "$home/config.yaml" --web.listen-address "127.0.0.1:$port" \
    </dev/null >"$home/perses.log" 2>&1 &
perses_pid=$!
wait_for Perses 60 curl -sf "$perses_url/api/v1/health"

python3 "$REPO/hack/grafana_to_perses.py" "$DASHBOARD" "$home/resources" \
    --prometheus-url "$prometheus_url"
post() { # post PATH FILE: create a resource through the API; a refusal prints the server's reason
    local status
    status=$(curl -s --max-time 30 -o "$home/reply" -w '%{http_code}' -X POST \
        -H 'Content-Type: application/json' --data-binary "@$2" "$perses_url$1")
    if [[ "$status" != 2* ]]; then
        echo "dashboard-screenshot: POST $1 ($(basename "$2")): HTTP $status:" \
            "$(cat "$home/reply")" >&2
        exit 1
    fi
}
post /api/v1/projects "$home/resources/project.json"
post /api/v1/projects/disagg/dashboards "$home/resources/dashboard.json"
name=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["metadata"]["name"])' \
    "$home/resources/dashboard.json")

# The window's height: the dashboard's grid rows (30 px each, 10 px gaps in Perses's grid),
# plus each section's title bar and the page's header and toolbar.
height=$(python3 - "$home/resources/dashboard.json" <<'PY'
import json, sys

layouts = json.load(open(sys.argv[1]))["spec"]["layouts"]
rows = sum(max((i["y"] + i["height"] for i in l["spec"]["items"]), default=0) for l in layouts)
print(rows * 40 + len(layouts) * 60 + 260)
PY
)
mkdir -p "$(dirname "$out")"
rm -f "$out"
url="$perses_url/projects/disagg/dashboards/$name?start=$range&refresh=0s"
url+="&var-namespace=%24__all&var-model=%24__all"
TZ=UTC timeout 180 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --user-data-dir="$home/chromium" --window-size="$width,$height" \
    --virtual-time-budget=30000 --run-all-compositor-stages-before-draw \
    --screenshot="$out" "$url" >"$home/chromium.log" 2>&1 || {
    echo "dashboard-screenshot: chromium failed: $(tail -5 "$home/chromium.log")" >&2
    exit 1
}
[[ -s "$out" ]] || { echo "dashboard-screenshot: chromium wrote no $out" >&2; exit 1; }
if grep -q 'level=error' "$home/perses.log"; then
    echo "dashboard-screenshot: Perses logged errors:" >&2
    grep 'level=error' "$home/perses.log" | tail -5 >&2
fi
echo "dashboard-screenshot: $out (${width}x$height, last $range of $prometheus_url)" \
    "in $(($(date +%s) - start)) s" >&2
