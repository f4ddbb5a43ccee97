"""vLLM's own server parser against the multi-node commands the operator renders.

Run by the engine venv's interpreter (``test_render_multinode_fit.py``), with the serving
image's vLLM sources ahead on the path for that release: for every LeaderWorkerSet of every
example, the leader's and the worker's ``disagg serve`` commands go through the launcher (its
engine id from the group's leader address, resolved by a stand-in for the cluster's DNS, then
``prepare`` with the config from the rendered ConfigMap) and the server command each builds
(the API server's, ``vllm serve --headless`` for a worker) is parsed and validated as the
server's ``main`` does (``vllm serve`` builds its subcommand parser with the same
``make_arg_parser``). The kubelet's ``$(VAR)`` expansion is done first, with the values the
LeaderWorkerSet webhook and controller give each pod, for two groups of each LeaderWorkerSet
and a recreated incarnation of the first (same names and revision, a new leader pod IP). Each
command must also read back as the multi-node shape the operator meant, and every rank of an
incarnation with the one engine id (``kv_transfer_config.engine_id``) no other has.
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
INCARNATIONS = ((0, "10.0.3.7"), (1, "10.0.5.12"), (0, "10.0.9.40"))
"""Group incarnations checked per LeaderWorkerSet, as (group index, leader pod IP): two groups
(as with replicas 2) and the first one recreated after a pod failure; their ids must differ."""
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
    from disagg_connector.commands import group_rank
    from disagg_connector.launch_config import LaunchConfigError
    from disagg_connector.launcher import API_SERVER_MODULE, CLI_MODULE, prepare, rank_engine_id
    from disagg_contract import POD_IP_ENV, Role

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
            for incarnation, (group, leader_ip) in enumerate(INCARNATIONS):
                where = f"{name} group {group} incarnation {incarnation}"
                address = leader_address(lws["metadata"]["name"], group)

                def dns(host: str, address: str = address, ip: str = leader_ip) -> list[str]:
                    """Stand-in for the cluster's DNS: the leader's record of this incarnation."""
                    return [ip] if host == address else []

                ids = engine_ids[where] = []
                ranks = [(0, leader, API_SERVER_MODULE)]
                ranks += [(rank, worker, CLI_MODULE) for rank in range(1, size)]
                for rank, container, module in ranks:
                    args = expand(container["command"], rank, address)
                    parsed = disagg.parse_args(args[1:])
                    vllm_args = args[args.index("--") + 1 :]
                    config_text = files[Path(parsed.config).name]
                    config_path = Path(scratch) / Path(parsed.config).name
                    config_path.write_text(config_text)
                    config = json.loads(config_text)
                    group_of_rank = group_rank(parsed)
                    if group_of_rank is None:
                        found.append(f"{where} rank {rank}: no multi-node group: {args}")
                        continue
                    try:
                        environ = {POD_IP_ENV: leader_ip} if rank == 0 else {}
                        engine_id = rank_engine_id(group_of_rank, environ, dns)
                        command, _ = prepare(
                            Role(parsed.role), config_path, vllm_args, engine_id,
                            group_of_rank.headless_worker,
                        )  # fmt: skip
                    except LaunchConfigError as exc:
                        found.append(f"{where} rank {rank}: {exc}")
                        continue
                    entry = [module, "serve"] if rank else [module]
                    if command[2 : 2 + len(entry)] != entry:
                        found.append(f"{where} rank {rank}: not {entry}: {command[:4]}")
                        continue
                    server_args = command[2 + len(entry) :]
                    found += [f"{where} rank {rank}: {p}" for p in
                              command_problems(serve, server_args, config)]  # fmt: skip
                    found += shape_problems(where, serve.parse(server_args), size, rank, address)
                    ids.append(serve.parse(server_args).kv_transfer_config.engine_id)
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
