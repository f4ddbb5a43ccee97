"""The README's table of the CUDA serving image states what its last inspection recorded
(docs/images/serving-cuda.json, written by tests/image/test_serving_cuda.py)."""

from __future__ import annotations

import json
import re

from dmodel_samples import REPO

FIGURES = "docs/images/serving-cuda.json"
ROW = re.compile(r"^\| ([^|]+?) \| ([^|]+?) \|$")


def _table(text: str) -> dict[str, str]:
    """The rows of the README table whose header names the figures file."""
    lines = text.splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith("|") and FIGURES in line]
    rows = {}
    for line in lines[start + 2 :]:
        match = ROW.match(line)
        if match is None:
            break
        rows[match.group(1)] = match.group(2)
    return rows


def test_readme_states_the_recorded_figures() -> None:
    figures = json.loads((REPO / FIGURES).read_text())
    assert figures, f"{FIGURES} is empty"
    assert _table((REPO / "README.md").read_text()) == figures


def test_a_changed_figure_is_caught() -> None:
    text = (REPO / "README.md").read_text()
    figures = json.loads((REPO / FIGURES).read_text())
    changed = text.replace(f"| size | {figures['size']} |", "| size | 1 GB |")
    assert _table(changed) != figures
