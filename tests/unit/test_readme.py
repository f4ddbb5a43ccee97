"""The README: its configuration reference is generated and current; its example is real."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dmodel_samples import REPO
from gen_reference import README_PATH, main, reference_markdown, updated_readme


def test_config_reference_is_current() -> None:
    text = README_PATH.read_text()
    assert updated_readme(text) == text, "README config reference is stale: run `make crds`"
    assert main(["--check"]) == 0


def test_check_fails_on_a_stale_readme(tmp_path: Path) -> None:
    stale = tmp_path / "README.md"
    stale.write_text(README_PATH.read_text().replace("`spec.efa.provider`", "`spec.efa.x`"))
    assert main(["--check", "--readme", str(stale)]) == 1
    assert main(["--write", "--readme", str(stale)]) == 0
    assert main(["--check", "--readme", str(stale)]) == 0


def test_reference_lists_every_spec_leaf_with_its_default() -> None:
    table = reference_markdown()
    for row in (
        "| `spec.kvTransfer.decoderKvBlocksTtlSeconds` | integer | `480` | 60..86400 |",
        "| `spec.kvTransfer.backend` | string |  | one of `LIBFABRIC`, `UCX` |",
        '| `spec.efa.hugepages2Mi` | quantity | `"5120Mi"` |',
        "| `spec.model.name` | string |  | required |",
    ):
        assert row in table
    assert "- `spec.router.conversationTtlSeconds`: must be less than" in table


def test_updated_readme_needs_the_markers() -> None:
    with pytest.raises(ValueError, match="markers"):
        updated_readme("# no markers here\n")


def test_readme_example_is_the_example_file() -> None:
    text = README_PATH.read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)
    assert (REPO / "examples/qwen3-32b-p5en.yaml").read_text() in blocks


def test_readme_has_the_architecture_diagram_and_both_commands() -> None:
    text = README_PATH.read_text()
    assert "```mermaid" in text
    assert "make demo" in text and "make test" in text
