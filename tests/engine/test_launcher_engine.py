"""``disagg serve`` in the engine environment refuses configs vLLM would not serve right, and
extra arguments that vLLM's own parser reads as a flag the operator sets."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from disagg.rig.engine import ENGINE_VENV, ServerSpec

pytestmark = pytest.mark.engine


def serve(
    config: dict[str, object],
    tmp_path: Path,
    env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "decode.json"
    path.write_text(json.dumps(config))
    extra = ["--", *extra_args] if extra_args else []
    return subprocess.run(
        [str(ENGINE_VENV / "bin" / "disagg"), "serve", "--role", "decode", "--config", str(path),
         "--", "--model", "unused", *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )  # fmt: skip


def rendered() -> dict[str, object]:
    return ServerSpec("decode", "decode", 0, 0, 0).kv_transfer_config()


def test_unknown_key_is_refused_before_vllm_starts(tmp_path: Path) -> None:
    result = serve({**rendered(), "kv_rank": 1}, tmp_path)
    assert result.returncode == 2
    assert "key 'kv_rank' is not accepted by vLLM 0.32.0" in result.stderr


def test_old_vllm_is_refused_with_its_version(tmp_path: Path) -> None:
    fake = tmp_path / "site"
    package = fake / "vllm"
    (package / "config").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    installed = ENGINE_VENV.glob("lib/python*/site-packages/vllm/config/kv_transfer.py")
    (package / "config" / "kv_transfer.py").write_text(next(installed).read_text())
    info = fake / "vllm-0.31.0.dist-info"
    info.mkdir()
    info.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.31.0\n")
    result = serve(rendered(), tmp_path, env={"PYTHONPATH": str(fake), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert "vLLM 0.31.0 is too old for bidirectional KV transfer" in result.stderr


def test_extra_args_setting_a_managed_flag_are_refused_before_vllm_starts(tmp_path: Path) -> None:
    result = serve(rendered(), tmp_path, extra_args=("--enforce-eager", "--max_model_len=10"))
    assert result.returncode == 2
    assert (
        "disagg serve: spec.decode.extraArgs: vLLM reads `--max_model_len=10` as --max-model-len, "
        "which the operator sets; set spec.model.maxModelLen instead"
    ) in result.stderr
