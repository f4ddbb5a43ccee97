#!/usr/bin/env bash
# Build Perses, the dashboard server that renders the chart's Grafana dashboard for the
# screenshot in docs (dashboard-screenshot.sh), into $PERSES_DIR: bin/perses (the server with its
# UI embedded) and plugins/ (the pinned UI modules of perses-plugins/). Grafana itself is AGPL,
# and neither the Go module proxy nor the npm registry here serves it; Perses is Apache-2.0.
#   - sources: the Go module github.com/perses/perses pinned in ../go/perses (verified against
#     its go.sum); the UI is built from the module's ui/ with npm ci (its package-lock.json) and
#     embedded by go build, as upstream's `make build` does;
#   - plugins: the npm packages of perses-plugins/package-lock.json. They carry the plugins' UI
#     modules but not the CUE schemas that upstream's release archives add (the server validates
#     a stored dashboard against them), so each plugin kind gets an open schema (any spec).
# Skipped when the cache was built for the same pins. A few minutes on two cores (about two with
# warm npm and Go caches), under nice and ionice and without the heavy-job lock.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
source "$CLUSTER_SRC/go-build.sh"

PLUGINS_SRC="$METRICS_SRC/perses-plugins"
common=github.com/prometheus/common/version
ldflags="-s -w -X $common.Version=${PERSES_VERSION#v} -X $common.Branch=HEAD"
ldflags+=" -X $common.BuildUser=disagg -X $common.Revision= -X $common.BuildDate="
export NODE_OPTIONS="${NODE_OPTIONS:---max-old-space-size=6144}"
# Turborepo (the UI's build runner) reports usage to its vendor unless told not to.
export TURBO_TELEMETRY_DISABLED=1 DO_NOT_TRACK=1
slow=(nice -n 19 ionice -c3)

key="perses=$PERSES_VERSION go.sum=$(file_key "$PERSES_GO/go.sum")"
key+=" plugins=$(file_key "$PLUGINS_SRC/package-lock.json")"
key+=" script=$(file_key "${BASH_SOURCE[0]}")"
exit_if_built perses "$PERSES_DIR" "$key" bin/perses plugins

export CGO_ENABLED=0 GOTOOLCHAIN=local
for tool in go node npm; do
    command -v "$tool" >/dev/null || { echo "perses: needs $tool on PATH" >&2; exit 1; }
done
start=$(date +%s)
step() { echo "perses: $1 at $(($(date +%s) - start)) s"; }
tmp="$PERSES_DIR.tmp"
rm -rf "$tmp"
mkdir -p "$tmp/bin" "$tmp/plugins"

# The module's source, checked against ../go/perses/go.sum, copied writable: the build writes
# ui/node_modules, ui/app/dist and ui/embed.go into it.
go -C "$PERSES_GO" mod download github.com/perses/perses
cp -r "$(go -C "$PERSES_GO" list -m -f '{{.Dir}}' github.com/perses/perses)" "$tmp/src"
chmod -R u+w "$tmp/src"
step "sources of $PERSES_VERSION ready"

(cd "$tmp/src/ui" && "${slow[@]}" npm ci --no-audit --no-fund --loglevel=error)
step "UI dependencies installed"
(cd "$tmp/src/ui" && "${slow[@]}" npx turbo run build --filter=@perses-dev/app... \
    --log-order=grouped --output-logs=errors-only)
step "UI built"
(cd "$tmp/src" && bash scripts/compress_assets.sh >/dev/null)
"${slow[@]}" go -C "$tmp/src" build -p 2 -trimpath -ldflags "$ldflags" -o "$tmp/bin/perses" \
    ./cmd/perses
step "server built"

# The plugins: each npm package's directory (package.json, mf-manifest.json, __mf/) as one
# plugin folder, plus an open CUE schema for each plugin kind its package.json declares (but
# Explore: the server loads no schema for that kind).
cp "$PLUGINS_SRC/package.json" "$PLUGINS_SRC/package-lock.json" "$PLUGINS_SRC/.npmrc" "$tmp/"
(cd "$tmp" && npm ci --no-audit --no-fund --loglevel=error --ignore-scripts)
for package in "$tmp"/node_modules/@perses-dev/*-plugin; do
    plugin="$tmp/plugins/$(basename "$package")"
    cp -r "$package" "$plugin"
    python3 - "$plugin" <<'PY'
import json, pathlib, sys

plugin = pathlib.Path(sys.argv[1])
perses = json.loads((plugin / "package.json").read_text())["perses"]
root = plugin / (perses.get("schemasPath") or "schemas")
for entry in perses["plugins"]:
    if entry["kind"] == "Explore":
        continue
    name = entry["spec"]["name"]
    folder = root / "disagg-open" / name
    folder.mkdir(parents=True)
    (folder / "model.cue").write_text(f'package model\n\nkind: "{name}"\nspec: {{...}}\n')
PY
done
rm -rf "$tmp/src" "$tmp/node_modules" "$tmp"/package*.json "$tmp/.npmrc"
step "plugins installed"
echo "$key" >"$tmp/.stamp"
rm -rf "$PERSES_DIR"
mv "$tmp" "$PERSES_DIR"
echo "perses: built in $(($(date +%s) - start)) s into $PERSES_DIR" \
    "($(du -sh "$PERSES_DIR" | cut -f1))"
