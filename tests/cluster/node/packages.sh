#!/usr/bin/env bash
# Install the Debian packages the real node and its images need when the machine lacks them
# (CI machines start fresh): runc, nftables (kube-proxy's nftables mode), iptables (kubelet's
# probes of it), mmdebstrap and buildah (the images), uidmap (buildah's user namespaces).
set -euo pipefail

PACKAGES=(runc nftables iptables mmdebstrap buildah uidmap)

missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
        missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "node: installing Debian packages: ${missing[*]}" >&2
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >&2
fi
