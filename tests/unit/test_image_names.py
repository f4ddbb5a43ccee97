"""Each image has one name: the title its Dockerfile labels it with. Every image reference in
the repository (examples, GitOps, docs, the CRD's text, the local build) uses that name."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from image_names import DOCKERFILES, IMAGES, ROOT, stages, title

RETIRED = ("disagg-vllm",)
"""Names the serving image no longer goes by."""
LOCAL_ONLY = {"disagg-base", "disagg-pause"}
"""What tests/cluster/node/images.sh builds for the real node itself: the Debian base the
Dockerfiles build on and the pod sandbox; no Dockerfile of the project's."""
REFERENCE = re.compile(r"\b(?:ghcr\.io/[\w.-]+|localhost)/(disagg-[a-z0-9]+(?:-[a-z0-9]+)*)")
CPU_FLAVOR = "-cpu"
"""The local build's suffix for the CPU flavor of an image (or of one of its stages)."""


def _tracked_text() -> dict[str, str]:
    """Every file git tracks (and every new one it does not ignore) that reads as text."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    texts = {}
    for name in listed:
        path = ROOT / name
        if path.is_file() and path != Path(__file__):
            try:
                texts[name] = path.read_text()
            except UnicodeDecodeError:
                continue
    return texts


def _known(name: str) -> bool:
    """An image's name, its CPU flavor, a stage of its Dockerfile, or the node's own."""
    base = name.removesuffix(CPU_FLAVOR)
    if base in IMAGES or name in LOCAL_ONLY:
        return True
    return any(
        base.startswith(f"{image}-") and base[len(image) + 1 :] in stages(dockerfile)
        for image, dockerfile in IMAGES.items()
    )


def test_the_three_images_have_three_names() -> None:
    assert sorted(IMAGES) == ["disagg-operator", "disagg-router", "disagg-serving"]


def test_no_file_uses_a_retired_name() -> None:
    found = [
        f"{name}:{number}"
        for name, text in _tracked_text().items()
        for number, line in enumerate(text.splitlines(), start=1)
        if any(old in line for old in RETIRED)
    ]
    assert found == [], f"retired image names (use {sorted(IMAGES)}): {found}"


def test_every_image_reference_names_a_built_image() -> None:
    references = {
        (name, match.group(1))
        for name, text in _tracked_text().items()
        for match in REFERENCE.finditer(text)
    }
    assert any(image == "disagg-serving" for _, image in references)
    unknown = sorted(f"{name}: {image}" for name, image in references if not _known(image))
    assert unknown == [], unknown


def test_the_local_build_names_each_dockerfile_by_its_title() -> None:
    script = (ROOT / "tests/cluster/node/images.sh").read_text()
    calls = re.findall(r"image_tag ([a-z-]+) (\S+Dockerfile)", script)
    assert sorted({dockerfile for _, dockerfile in calls}) == sorted(DOCKERFILES)
    for name, dockerfile in calls:
        assert f"disagg-{name}".removesuffix(CPU_FLAVOR) == title(dockerfile), dockerfile
