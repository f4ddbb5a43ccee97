#!/usr/bin/env bash
# Unpack the Python sources of the vLLM release the serving image ships (connector/Dockerfile's
# VLLM_IMAGE tag) into the cache, for tests/engine/test_vllm_fit.py. That release is a CUDA
# wheel: it cannot run an engine here, but its Python modules import beside the engine venv's
# packages. Its native libraries (*.so, ~660 MB) are left out; the wheel (~340 MB) is downloaded
# once and removed after unpacking. Skipped when the tree for that version exists.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${DISAGG_CACHE:-$HOME/.cache/disagg}
VENV=${ENGINE_VENV:-$CACHE/engine-venv}
VERSION=$(sed -n 's|^ARG VLLM_IMAGE=vllm/vllm-openai:v\([0-9][0-9.]*\)$|\1|p' \
    "$REPO_ROOT/connector/Dockerfile")
if [[ -z "$VERSION" ]]; then
    echo "setup_serving_vllm.sh: no 'ARG VLLM_IMAGE=vllm/vllm-openai:vX.Y.Z' in connector/Dockerfile" >&2
    exit 1
fi
TREE="$CACHE/vllm-$VERSION-python"
STAMP="$TREE/.unpacked"
[[ -f "$STAMP" ]] && exit 0

started=$(date +%s)
WHEELS=$(mktemp -d)
trap 'rm -rf "$WHEELS"' EXIT
"$VENV/bin/python" -m pip --disable-pip-version-check download --quiet --no-deps \
    --only-binary :all: -d "$WHEELS" "vllm==$VERSION"
rm -rf "$TREE"
"$VENV/bin/python" - "$TREE" "$WHEELS"/vllm-*.whl <<'PY'
import sys
import zipfile

tree, wheel = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as archive:
    archive.extractall(tree, [name for name in archive.namelist() if not name.endswith(".so")])
PY
touch "$STAMP"
echo "vLLM $VERSION Python sources unpacked into $TREE in $(( $(date +%s) - started )) s"
