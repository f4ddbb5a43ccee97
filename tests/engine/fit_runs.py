"""Running a fit script (vllm_fit.py, multinode_cli_fit.py) in the engine venv, as the tests do."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from disagg.rig.engine import ENGINE_VENV
from vllm_cli_fit import PLATFORM_ENV

HERE = Path(__file__).resolve().parent


def fit_report(script: str, tmp_path: Path, pythonpath: Path | None, *args: str) -> dict[str, Any]:
    """Run ``script`` in the engine venv, with ``pythonpath`` ahead of its vLLM if given: its JSON
    report."""
    env = {**os.environ, **PLATFORM_ENV}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    out = tmp_path / "fit.json"
    result = subprocess.run(
        [str(ENGINE_VENV / "bin" / "python"), str(HERE / script), str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report: dict[str, Any] = json.loads(out.read_text())
    return report
