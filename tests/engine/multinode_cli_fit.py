"""vLLM's own server parser against the multi-node commands the operator renders.

Run by the engine venv's interpreter (``test_render_multinode_fit.py``), with the serving
image's vLLM sources ahead on the path for that release: for every LeaderWorkerSet of every
example, the leader's ``disagg serve`` command goes through the launcher's ``prepare`` (its
config from the rendered ConfigMap) and the server command it builds is parsed and validated
as the server's ``main`` does; the worker's ``vllm serve`` arguments are parsed by the same
parser (``vllm serve`` builds its subcommand parser with the same ``make_arg_parser``). The
kubelet's ``$(VAR)`` expansion is done first, with the values the LeaderWorkerSet webhook
injects. Each command must also read back as the multi-node shape the operator meant.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_cli_fit import command_problems, serve_parser  # noqa: E402

LEADER_ADDRESS = "m-prefill-0.m-prefill-0.ns"
"""An LWS_LEADER_ADDRESS of the shape the LeaderWorkerSet webhook injects."""


def expand(args: list[str], worker_index: int) -> list[str]:
    """The kubelet's `$(VAR)` expansion of the LeaderWorkerSet's variables."""
    values = {"LWS_LEADER_ADDRESS": LEADER_ADDRESS, "LWS_WORKER_INDEX": str(worker_index)}
    out = []
    for arg in args:
        for name, value in values.items():
            arg = arg.replace(f"$({name})", value)
        out.append(arg)
    return out


def groups() -> Iterator[tuple[str, Mapping[str, Any], dict[str, str]]]:
    """Every LeaderWorkerSet of every example, with the example's ConfigMap files."""
    from disagg_operator.loading import load_file
    from disagg_operator.render import render

    for example in sorted((REPO / "examples").glob("*.yaml")):
        for model in load_file(example):
            manifests = render(model.metadata.name, "default", model.spec)
            files = {
                key: text
                for m in manifests
                if m["kind"] == "ConfigMap"
                for key, text in m["data"].items()
            }
            for m in manifests:
                if m["kind"] == "LeaderWorkerSet":
                    yield f"{example.name} {m['metadata']['name']}", m, files


def shape_problems(where: str, namespace: Any, size: int, rank: int) -> list[str]:
    """The parsed multi-node options against what the operator meant for this rank."""
    want = {"nnodes": size, "node_rank": rank, "master_addr": LEADER_ADDRESS,
            "headless": rank > 0}  # fmt: skip
    return [
        f"{where} rank {rank}: vLLM reads {key} as {getattr(namespace, key)!r}, not {value!r}"
        for key, value in want.items()
        if getattr(namespace, key) != value
    ]


def problems() -> tuple[int, list[str]]:
    """(groups checked, problems found)."""
    from disagg.cli import build_parser
    from disagg_connector.launch_config import LaunchConfigError
    from disagg_connector.launcher import prepare
    from disagg_contract import Role

    serve = serve_parser()
    disagg = build_parser()
    found: list[str] = []
    checked = 0
    with tempfile.TemporaryDirectory() as scratch:
        for where, lws, files in groups():
            checked += 1
            group = lws["spec"]["leaderWorkerTemplate"]
            size = group["size"]
            (leader,) = group["leaderTemplate"]["spec"]["containers"]
            parsed = disagg.parse_args(leader["command"][1:])
            config_text = files[Path(parsed.config).name]
            config_path = Path(scratch) / Path(parsed.config).name
            config_path.write_text(config_text)
            config = json.loads(config_text)
            vllm_args = expand(leader["command"][leader["command"].index("--") + 1 :], 0)
            try:
                command, _ = prepare(Role(parsed.role), config_path, vllm_args)
            except LaunchConfigError as exc:
                found.append(f"{where} leader: {exc}")
                continue
            found += [f"{where} leader: {p}" for p in command_problems(serve, command[3:], config)]
            found += shape_problems(where, serve.parse(command[3:]), size, 0)
            (worker,) = group["workerTemplate"]["spec"]["containers"]
            if worker["command"][:2] != ["vllm", "serve"]:
                found.append(f"{where} worker: not `vllm serve`: {worker['command'][:2]}")
                continue
            for rank in range(1, size):
                args = expand(worker["command"][2:], rank)
                found += [f"{where} worker: {p}" for p in command_problems(serve, args, config)]
                found += shape_problems(where, serve.parse(args), size, rank)
    return checked, found


def worker_problems(args: list[str], size: int, rank: int) -> list[str]:
    """One worker's arguments (after `vllm serve`) as the check above reads them."""
    serve = serve_parser()
    found = command_problems(serve, args)
    return found or shape_problems("given", serve.parse(args), size, rank)


if __name__ == "__main__":
    import vllm

    if len(sys.argv) > 2:  # OUT SIZE RANK ARG...: check one worker command line
        size, rank = int(sys.argv[2]), int(sys.argv[3])
        report = {"problems": worker_problems(sys.argv[4:], size, rank)}
    else:
        groups_checked, found = problems()
        report = {"vllm": vllm.__version__, "groups": groups_checked, "problems": found}
    Path(sys.argv[1]).write_text(json.dumps(report, indent=1))
