"""The project's images, each named once: by the title its Dockerfile labels it with."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ("operator/Dockerfile", "connector/router.Dockerfile", "connector/Dockerfile")


def title(dockerfile: str) -> str:
    """The image's name: its Dockerfile's org.opencontainers.image.title label."""
    text = (ROOT / dockerfile).read_text()
    match = re.search(r'org\.opencontainers\.image\.title="([^"]+)"', text)
    assert match, f"{dockerfile} has no org.opencontainers.image.title label"
    return match.group(1)


def stages(dockerfile: str) -> set[str]:
    """The named build stages (`FROM ... AS <stage>`) of a Dockerfile."""
    text = (ROOT / dockerfile).read_text()
    return set(re.findall(r"^FROM \S+ AS (\S+)$", text, flags=re.MULTILINE))


IMAGES = {title(dockerfile): dockerfile for dockerfile in DOCKERFILES}
"""Image name -> its Dockerfile."""
