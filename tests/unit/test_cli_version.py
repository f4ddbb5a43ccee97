"""`disagg --version` reports pyproject's version through the installed metadata, and says so
plainly when the distribution is not installed; the repository carries the Apache-2.0 text its
metadata names."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
"""The digest of the standard text as the ASF publishes it (apache.org/licenses/LICENSE-2.0.txt)."""


def _disagg(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=cwd,
        env=env,
    )
    return result.stdout.strip()


def test_version_is_pyprojects(tmp_path: Path) -> None:
    assert _disagg("-m", "disagg", "--version", cwd=tmp_path) == f"disagg {PYPROJECT['version']}"


def test_version_without_installed_metadata_says_so(tmp_path: Path) -> None:
    """`-S` leaves site-packages (and the editable install's metadata) off the path; the sources
    come from PYTHONPATH and the working directory holds no egg-info."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools")}
    out = _disagg("-S", "-m", "disagg", "--version", cwd=tmp_path, env=env)
    assert out == "disagg unknown (the disagg distribution is not installed: pip install -e .)"


def test_license_is_the_standard_apache_2_text() -> None:
    assert PYPROJECT["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_SHA256
