"""The release an operator upgrade starts from, built from git, for the upgrade tests.

No release is tagged yet and the chart has carried its first version since it was added, so
`PREVIOUS_RELEASE` is the commit from which the operator keeps the rule "an operator upgrade
rolls no engine pod" (prefill's lease port left out of its pod template for that reason). Once
a release is tagged, it names the tag of the release before the one being prepared; the
upgrade tests then check that release against this checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PREVIOUS_RELEASE = "37edc7d5dde1cbc18f83ef1b8f4a9478044a31bb"
"""The git ref of the release an upgrade starts from (see the module docstring)."""
SOURCES = (Path("operator"), Path("connector"), Path("tools"))
"""Where the packages live in a checkout (pyproject's package roots)."""
DISAGG = Path(sys.executable).parent / "disagg"


def archive(dest: Path, *paths: Path) -> Path:
    """Write `paths` (and the package sources) of the previous release under `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    wanted = [str(p) for p in (*SOURCES, *paths)]
    proc = subprocess.run(
        ["git", "-C", str(REPO), "archive", PREVIOUS_RELEASE, *wanted],
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, (
        f"git archive {PREVIOUS_RELEASE}: {proc.stderr.decode().strip()} (the upgrade tests "
        "need the repository's history: a full clone, not a shallow one)"
    )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=proc.stdout, check=True)
    return dest


def files(folder: Path) -> list[Path]:
    """The paths of the files in `folder` at the previous release (from git, nothing written)."""
    proc = subprocess.run(
        ["git", "-C", str(REPO), "ls-tree", "--name-only", f"{PREVIOUS_RELEASE}:{folder}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"git ls-tree {PREVIOUS_RELEASE}: {proc.stderr.strip()}"
    return [folder / name for name in proc.stdout.split()]


def pythonpath(tree: Path) -> list[Path]:
    """The package roots of an archived tree, to put ahead of the installed packages."""
    return [tree / source for source in SOURCES]


def run_disagg(tree: Path | None, *args: str) -> str:
    """`disagg <args>` from the archived `tree`'s sources (this checkout's when None)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath(tree))
    proc = subprocess.run(
        [str(DISAGG), *args], capture_output=True, text=True, env=env, check=False, timeout=120
    )
    assert proc.returncode == 0, f"disagg {' '.join(args)}: {proc.stderr.strip()}"
    return proc.stdout


def imported_from(tree: Path) -> Path:
    """Where the operator package is imported from with `tree`'s sources first."""
    env = {"PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath(tree))}
    proc = subprocess.run(
        [sys.executable, "-c", "import disagg_operator; print(disagg_operator.__file__)"],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    return Path(proc.stdout.strip())
