"""vLLM's own server parser against the multi-node commands the operator renders.

Run by the engine venv's interpreter (``test_render_multinode_fit.py``), with the serving
image's vLLM sources ahead on the path for that release: for every LeaderWorkerSet of every
example, the leader's ``disagg serve`` command goes through the launcher's ``prepare`` (its
config from the rendered ConfigMap) and the server command it builds is parsed and validated
as the server's ``main`` does; the worker's ``vllm serve`` arguments are parsed by the same
parser (``vllm serve`` builds its subcommand parser with the same ``make_arg_parser``). The
kubelet's ``$(VAR)`` expansion is done first, with the values the LeaderWorkerSet webhook and
controller give each pod, for two groups of each LeaderWorkerSet. Each command must also read
back as the multi-node shape the operator meant, and every rank of a group with the one engine
id (``kv_transfer_config.engine_id``) no other group has.
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
NAMESPACE = "default"
GROUPS_PER_SET = 2
"""Groups checked per LeaderWorkerSet (as with replicas 2): their engine ids must differ."""
REVISION = "6d5f8b7c9"
"""A `template-revision-hash` label value, the same on every pod of a group."""


def leader_address(lws: str, group: int) -> str:
    """LWS_LEADER_ADDRESS as the webhook builds it with the UniquePerReplica subdomain policy."""
    return f"{lws}-{group}.{lws}-{group}.{NAMESPACE}"


def expand(args: list[str], worker_index: int, address: str = LEADER_ADDRESS) -> list[str]:
    """The kubelet's `$(VAR)` expansion of the variables a LeaderWorkerSet pod has."""
    values = {
        "LWS_LEADER_ADDRESS": address,
        "LWS_WORKER_INDEX": str(worker_index),
        "DISAGG_LWS_REVISION": REVISION,
    }
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
            manifests = render(model.metadata.name, NAMESPACE, model.spec)
            files = {
                key: text
                for m in manifests
                if m["kind"] == "ConfigMap"
                for key, text in m["data"].items()
            }
            for m in manifests:
                if m["kind"] == "LeaderWorkerSet":
                    yield f"{example.name} {m['metadata']['name']}", m, files


def shape_problems(
    where: str, namespace: Any, size: int, rank: int, address: str = LEADER_ADDRESS
) -> list[str]:
    """The parsed multi-node options against what the operator meant for this rank."""
    want = {"nnodes": size, "node_rank": rank, "master_addr": address,
            "headless": rank > 0}  # fmt: skip
    return [
        f"{where} rank {rank}: vLLM reads {key} as {getattr(namespace, key)!r}, not {value!r}"
        for key, value in want.items()
        if getattr(namespace, key) != value
    ]


def problems() -> tuple[dict[str, list[str | None]], list[str]]:
    """(each group checked with its ranks' engine ids, leader first; problems found)."""
    from disagg.cli import build_parser
    from disagg_connector.launch_config import LaunchConfigError
    from disagg_connector.launcher import prepare
    from disagg_contract import Role

    serve = serve_parser()
    disagg = build_parser()
    found: list[str] = []
    engine_ids: dict[str, list[str | None]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, lws, files in groups():
            template = lws["spec"]["leaderWorkerTemplate"]
            size = template["size"]
            (leader,) = template["leaderTemplate"]["spec"]["containers"]
            (worker,) = template["workerTemplate"]["spec"]["containers"]
            parsed = disagg.parse_args(leader["command"][1:])
            config_text = files[Path(parsed.config).name]
            config_path = Path(scratch) / Path(parsed.config).name
            config_path.write_text(config_text)
            config = json.loads(config_text)
            for group in range(GROUPS_PER_SET):
                where = f"{name} group {group}"
                address = leader_address(lws["metadata"]["name"], group)
                vllm_args = expand(leader["command"][leader["command"].index("--") + 1 :], 0,
                                   address)  # fmt: skip
                (engine_id,) = expand([parsed.engine_id], 0, address)
                try:
                    command, _ = prepare(Role(parsed.role), config_path, vllm_args, engine_id)
                except LaunchConfigError as exc:
                    found.append(f"{where} leader: {exc}")
                    continue
                found += [f"{where} leader: {p}" for p in
                          command_problems(serve, command[3:], config)]  # fmt: skip
                found += shape_problems(where, serve.parse(command[3:]), size, 0, address)
                ids = engine_ids[where] = [serve.parse(command[3:]).kv_transfer_config.engine_id]
                if worker["command"][:2] != ["vllm", "serve"]:
                    found.append(f"{where} worker: not `vllm serve`: {worker['command'][:2]}")
                    continue
                for rank in range(1, size):
                    args = expand(worker["command"][2:], rank, address)
                    found += [f"{where} worker: {p}" for p in
                              command_problems(serve, args, config)]  # fmt: skip
                    found += shape_problems(where, serve.parse(args), size, rank, address)
                    ids.append(serve.parse(args).kv_transfer_config.engine_id)
    return engine_ids, found


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
        engine_ids, found = problems()
        report = {"vllm": vllm.__version__, "engine_ids": engine_ids, "problems": found}
    Path(sys.argv[1]).write_text(json.dumps(report, indent=1))
