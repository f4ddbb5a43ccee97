"""The chart README is generated from the chart's schema and values, and current."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from gen_chart_readme import CHART, README_PATH, main, readme_markdown


def _keys(schema: dict[str, Any], prefix: str = "") -> list[str]:
    """Every value's dotted key, groups and their members."""
    out = []
    for name, prop in schema.get("properties", {}).items():
        out.append(prefix + name)
        out.extend(_keys(prop, f"{prefix}{name}."))
    return out


def test_chart_readme_is_current() -> None:
    assert README_PATH.read_text() == readme_markdown(), "chart README stale: make chart-readme"
    assert main(["--check"]) == 0


def test_check_fails_when_the_schema_changes_and_write_repairs_it(tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    schema_path = chart / "values.schema.json"
    schema = json.loads(schema_path.read_text())
    schema["properties"]["logging"]["properties"]["level"]["description"] = "How much to log."
    schema_path.write_text(json.dumps(schema))
    assert main(["--check", "--chart", str(chart)]) == 1
    assert main(["--write", "--chart", str(chart)]) == 0
    assert main(["--check", "--chart", str(chart)]) == 0
    assert '| `logging.level` | string | `"info"` |' in (chart / "README.md").read_text()


def test_every_schema_value_has_a_row_with_its_default() -> None:
    text = readme_markdown()
    schema = json.loads((CHART / "values.schema.json").read_text())
    for key in _keys(schema):
        assert f"| `{key}` |" in text, key
    for row in (
        "| `replicaCount` | integer | `1` | 0..10 |",
        '| `image.pullPolicy` | string | `"IfNotPresent"` | one of `Always`, `IfNotPresent`,',
        "| `watch.namespaces` | []string | `[]` | unique items |",
    ):
        assert row in text
