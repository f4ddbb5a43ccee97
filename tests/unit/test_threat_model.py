"""docs/threat-model.md: every test it cites exists, and every message table is complete.

The threat model's tables claim, per message and threat, a defence and the tests that show it.
This check keeps those claims from rotting: a cited ``tests/...py::name`` must name a test
function of that file (a parametrized id such as ``name[case]`` counts as ``name``), no table
cell may be empty, each message table must have a row for every threat, and each of its
"Shown by" cells must cite a test or say "accepted risk". A gap being closed may be marked
``OPEN (#28)`` (its defence cell saying what is being built) only while ``OPEN_ALLOWED`` is
true; issue #28's gaps are closed, so it is false and an open cell, or the mark anywhere in
the document, fails.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from dmodel_samples import REPO

DOC = REPO / "docs" / "threat-model.md"
HEADER = ("Threat", "Defence", "Shown by")
"""The columns of a message table."""
THREATS = ("Forge", "Alter", "Replay", "Bind", "Delay", "Flood")
"""What each message table has at least one row for (a row's threat starts with one)."""
OPEN = "OPEN (#28)"
OPEN_ALLOWED = False
"""Whether a cell may still be open: false, as issue #28's defences and tests are cited."""
ACCEPTED = "accepted risk"
CITATION = re.compile(r"`(tests/[\w/.-]+\.py)::(\w+)(?:\[[^\]`]*\])?`")


@dataclass(frozen=True)
class Table:
    """One markdown table: the section it is in, its header and its rows, by line."""

    section: str
    line: int
    header: tuple[str, ...]
    rows: tuple[tuple[int, tuple[str, ...]], ...]


def _cells(line: str) -> tuple[str, ...]:
    return tuple(cell.strip() for cell in line.strip().strip("|").split("|"))


def _is_separator(line: str) -> bool:
    return set(line.replace("|", "").strip()) <= {"-", ":", " "} and "-" in line


def tables(text: str) -> list[Table]:
    """Every table of ``text`` with the heading it stands under."""
    found: list[Table] = []
    section, header, start = "", None, 0
    rows: list[tuple[int, tuple[str, ...]]] = []
    for number, line in enumerate([*text.splitlines(), ""], start=1):
        if line.startswith("|"):
            if header is None:
                header, start = _cells(line), number
            elif not _is_separator(line):
                rows.append((number, _cells(line)))
            continue
        if header is not None:
            found.append(Table(section, start, header, tuple(rows)))
            header, rows = None, []
        if line.startswith("#"):
            section = line.lstrip("#").strip()
    return found


def defined_functions(path: Path) -> set[str]:
    """The names of the functions and methods defined in the Python file at ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def citation_problems(text: str, root: Path) -> list[str]:
    """Each cited ``path::name`` whose file or test function does not exist under ``root``."""
    problems: list[str] = []
    known: dict[str, set[str] | None] = {}
    for path, name in dict.fromkeys(CITATION.findall(text)):
        if path not in known:
            file = root / path
            known[path] = defined_functions(file) if file.is_file() else None
        names = known[path]
        if names is None:
            problems.append(f"{path}::{name}: no such file")
        elif name not in names:
            problems.append(f"{path}::{name}: no such test function in {path}")
    return problems


def _row_problems(number: int, cells: tuple[str, ...], open_allowed: bool) -> list[str]:
    threat, defence, shown_by = cells
    where = f"line {number} ({threat})"
    problems: list[str] = []
    is_open = OPEN in shown_by
    if not (CITATION.search(shown_by) or ACCEPTED in shown_by or is_open):
        problems.append(f"{where}: 'Shown by' cites no test, says no '{ACCEPTED}' nor '{OPEN}'")
    if is_open and not re.search(re.escape(OPEN) + r": \w", defence):
        problems.append(f"{where}: an open row's defence must say '{OPEN}: <what is built>'")
    if (is_open or OPEN in defence) and not open_allowed:
        problems.append(f"{where}: still {OPEN}: cite the test that shows the defence")
    return problems


def table_problems(text: str, open_allowed: bool) -> list[str]:
    """Empty cells, misshapen rows, and message tables missing a threat or evidence."""
    problems: list[str] = []
    for table in tables(text):
        for number, cells in table.rows:
            if len(cells) != len(table.header):
                header = len(table.header)
                problems.append(f"line {number}: {len(cells)} cells, the header has {header}")
            elif not all(cells):
                problems.append(f"line {number}: an empty cell")
            elif table.header == HEADER:
                problems.extend(_row_problems(number, cells, open_allowed))
        if table.header != HEADER:
            continue
        threats = [cells[0] for _, cells in table.rows]
        for threat in THREATS:
            if not any(cell.startswith(threat) for cell in threats):
                problems.append(f"{table.section} (line {table.line}): no row for {threat}")
    return problems


def section_problems(text: str) -> list[str]:
    """Message sections whose text does not say who may send the message."""
    problems: list[str] = []
    for section in re.split(r"\n(?=## )", text):
        title = section.splitlines()[0]
        if "| Threat |" in section and "Who may send it" not in section:
            problems.append(f"{title}: does not say who may send it")
    return problems


def problems_of(text: str, root: Path, open_allowed: bool) -> list[str]:
    """Everything wrong with a threat model ``text`` whose citations resolve under ``root``."""
    return [
        *citation_problems(text, root),
        *table_problems(text, open_allowed),
        *section_problems(text),
    ]


def test_the_threat_model_cites_existing_tests_and_fills_every_cell() -> None:
    text = DOC.read_text()
    assert len(tables(text)) >= 13, "one table per message"
    assert len(CITATION.findall(text)) >= 100
    assert problems_of(text, REPO, OPEN_ALLOWED) == []
    assert OPEN_ALLOWED or OPEN not in text, f"{OPEN} is left in the prose"


SAMPLE_TESTS = """
import pytest

@pytest.mark.parametrize("x", [1, 2])
def test_exists(x):
    assert x

class TestGroup:
    async def test_method(self):
        assert True
"""

SAMPLE_ROWS = """\
| Forge | signatures | `tests/unit/test_sample.py::test_exists[1]` |
| Alter | a class method | `tests/unit/test_sample.py::test_method` |
| Replay | OPEN (#28): single use | OPEN (#28) |
| Bind | none needed | accepted risk: nothing to bind |
| Delay | timeouts | `tests/unit/test_sample.py::test_exists` |
| Flood | bounds | `tests/unit/test_sample.py::test_exists` |
"""


def _sample(rows: str = SAMPLE_ROWS, who: str = "Who may send it: the router.") -> str:
    return (
        f"# Threat model\n\n## 1. A message\n\n{who}\n\n"
        "| Threat | Defence | Shown by |\n|---|---|---|\n"
        f"{rows}\n## Other\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    )


def _root(tmp_path: Path) -> Path:
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "test_sample.py").write_text(SAMPLE_TESTS)
    return tmp_path


def test_a_complete_sample_has_no_problem(tmp_path: Path) -> None:
    root = _root(tmp_path)
    assert problems_of(_sample(), root, open_allowed=True) == []
    (table, other) = tables(_sample())
    assert (table.section, table.header, len(table.rows)) == ("1. A message", HEADER, 6)
    assert (other.section, other.rows) == ("Other", ((20, ("1", "2")),))


def test_missing_tests_and_files_are_named(tmp_path: Path) -> None:
    root = _root(tmp_path)
    rows = SAMPLE_ROWS.replace("test_method", "test_renamed").replace(
        "tests/unit/test_sample.py::test_exists`", "tests/unit/test_gone.py::test_exists`"
    )
    assert problems_of(_sample(rows), root, open_allowed=True) == [
        "tests/unit/test_sample.py::test_renamed: no such test function in "
        "tests/unit/test_sample.py",
        "tests/unit/test_gone.py::test_exists: no such file",
    ]


def test_empty_cells_missing_threats_and_missing_evidence_are_named(tmp_path: Path) -> None:
    root = _root(tmp_path)
    rows = SAMPLE_ROWS.replace("| bounds |", "|  |").replace("Replay", "Repeat")
    rows = rows.replace("accepted risk: nothing to bind", "nothing to bind")
    assert problems_of(_sample(rows), root, open_allowed=True) == [
        "line 12 (Bind): 'Shown by' cites no test, says no 'accepted risk' nor 'OPEN (#28)'",
        "line 14: an empty cell",
        "1. A message (line 7): no row for Replay",
    ]
    short = SAMPLE_ROWS.replace("| Flood | bounds |", "| Flood |")
    assert problems_of(_sample(short), root, open_allowed=True) == [
        "line 14: 2 cells, the header has 3"
    ]


def test_open_cells_say_what_is_built_and_fail_once_no_longer_allowed(tmp_path: Path) -> None:
    root = _root(tmp_path)
    assert problems_of(_sample(), root, open_allowed=False) == [
        "line 11 (Replay): still OPEN (#28): cite the test that shows the defence"
    ]
    vague = SAMPLE_ROWS.replace("OPEN (#28): single use", "to be done")
    assert problems_of(_sample(vague), root, open_allowed=True) == [
        "line 11 (Replay): an open row's defence must say 'OPEN (#28): <what is built>'"
    ]


def test_a_message_section_must_say_who_may_send_it(tmp_path: Path) -> None:
    root = _root(tmp_path)
    assert problems_of(_sample(who="Anyone."), root, open_allowed=True) == [
        "## 1. A message: does not say who may send it"
    ]
