"""An operator upgrade renders the previous release's models as that release did: every
example the previous release shipped, rendered by its own sources (`disagg render` from the
archived tree) and by this checkout's, gives the same children, so the new operator's apply
changes nothing and rolls no pod.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from previous_release import archive, files, imported_from, run_disagg

ENGINE_KINDS = ("StatefulSet", "LeaderWorkerSet")
EXAMPLES = [p for p in files(Path("examples")) if p.suffix == ".yaml"]


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's sources and examples."""
    tree = archive(tmp_path_factory.mktemp("previous"), Path("examples"))
    assert imported_from(tree).is_relative_to(tree), "the archived sources are not imported"
    return tree


def _children(tree: Path | None, example: Path) -> dict[str, dict[str, Any]]:
    """`disagg render -f example` from `tree` (this checkout when None), by `Kind/name`."""
    docs = yaml.safe_load_all(run_disagg(tree, "render", "-f", str(example)))
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def test_the_previous_release_shipped_examples() -> None:
    assert EXAMPLES, "no example to upgrade"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.stem)
def test_previous_examples_render_the_same_children(previous: Path, path: Path) -> None:
    example = previous / path
    before = _children(previous, example)
    after = _children(None, example)
    assert sorted(after) == sorted(before)
    assert [k for k in before if k.split("/")[0] in ENGINE_KINDS], "no engine workload"
    for key, was in before.items():
        assert after[key] == was, f"{key} renders differently"
