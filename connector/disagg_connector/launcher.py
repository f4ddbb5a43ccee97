"""``disagg serve``: check the rendered connector config, set the environment, exec vLLM.

The operator renders ``disagg serve --role R --config F -- <its vLLM args> [-- <extraArgs>]``:
the arguments after the first ``--`` are the operator's own and pass as given; a second ``--``
starts the role's ``extraArgs``, which vLLM's own parser reads before the server starts, refusing
any that sets an option the operator manages (:data:`disagg_contract.MANAGED_VLLM_FLAGS`).

Every rank of a multi-node server runs it too, with its group's leader address and revision:
the launcher resolves the leader's address to the leader pod's IPs and gives vLLM the group's
engine id (:func:`launch_config.group_engine_id`); a headless worker gets ``vllm serve``
instead of the API server.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from disagg_connector.launch_config import (
    LaunchConfigError,
    check_config,
    check_group_names,
    group_engine_id,
    serving_env,
)
from disagg_connector.vllm_facts import kv_transfer_config_keys, vllm_package_dir
from disagg_connector.vllm_options import managed_option, server_parser
from disagg_connector.vllm_version import installed_vllm_version
from disagg_connector.weights import WeightsUnavailable, check_source
from disagg_contract import (
    EXTRA_ARGS_MARKER,
    KV_TRANSFER_CONFIG_FLAG,
    MANAGED_VLLM_FLAGS,
    POD_IP_ENV,
    TERMINATION_MESSAGE_PATH,
    Role,
)

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
CLI_MODULE = "vllm.entrypoints.cli.main"
"""vLLM's ``vllm`` command, whose ``serve --headless`` runs a multi-node server's worker ranks."""
WEIGHTS_EXIT_CODE = 3
"""The exit status of a server whose weights' source cannot be read (2: a config it refuses)."""
LEADER_ATTEMPTS = 150
LEADER_RETRY_S = 2.0
"""A rank resolves its group leader's address this many times, this far apart, before giving up:
the leader's record appears once the leader pod has an IP, which may come after a worker's."""

Resolver = Callable[[str], Sequence[str]]


@dataclass(frozen=True)
class GroupRank:
    """One rank of a multi-node server: its group's leader address and template revision
    (as the kubelet expanded them), and whether it is a headless worker or the leader."""

    leader_address: str
    revision: str
    headless_worker: bool


def resolve_addresses(name: str) -> list[str]:
    """The IP addresses (v4 and v6) the cluster's DNS gives for ``name``."""
    return sorted({str(info[4][0]) for info in socket.getaddrinfo(name, None)})


def leader_ips(
    address: str,
    own_ip: str | None = None,
    *,
    resolve: Resolver = resolve_addresses,
    attempts: int = LEADER_ATTEMPTS,
    retry_s: float = LEADER_RETRY_S,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """The group leader's IPs, retried until ``address`` resolves (and, on the leader itself,
    to its own ``own_ip``, so that it never takes a record of its group's previous leader)."""
    reason = "no attempt"
    for attempt in range(attempts):
        if attempt:
            sleep(retry_s)
        try:
            found = sorted(set(resolve(address)))
        except OSError as exc:
            reason = str(exc)
            continue
        if found and (own_ip is None or own_ip in found):
            return found
        reason = f"it resolves to {found or 'nothing'}" + (f", not {own_ip}" if own_ip else "")
    raise LaunchConfigError(
        f"the group leader's address {address!r} did not resolve"
        f"{f' to this pod IP {own_ip}' if own_ip else ''} in {attempts} attempts "
        f"{retry_s:g}s apart ({reason}): is the group's leader pod running, with the "
        "LeaderWorkerSet's headless Service of its group?"
    )


def rank_engine_id(
    rank: GroupRank, environ: Mapping[str, str], resolve: Resolver = resolve_addresses
) -> str:
    """This rank's group engine id; the leader checks the address against its own pod IP."""
    check_group_names(rank.leader_address, rank.revision)
    own_ip = None
    if not rank.headless_worker:
        own_ip = environ.get(POD_IP_ENV)
        if not own_ip:
            raise LaunchConfigError(
                f"{POD_IP_ENV} is not set: a multi-node server's leader needs its pod IP "
                "(status.podIP) there to build its group's engine id"
            )
    ips = leader_ips(rank.leader_address, own_ip, resolve=resolve)
    return group_engine_id(rank.leader_address, rank.revision, ips)


def split_vllm_args(vllm_args: Sequence[str]) -> tuple[list[str], list[str]]:
    """The operator's vLLM arguments and the role's extra arguments (after the marker)."""
    if EXTRA_ARGS_MARKER not in vllm_args:
        return list(vllm_args), []
    marker = list(vllm_args).index(EXTRA_ARGS_MARKER)
    return list(vllm_args[:marker]), list(vllm_args[marker + 1 :])


def check_extra_args(
    parser: argparse.ArgumentParser, role: Role, extra_args: Sequence[str]
) -> None:
    """Refuse extra arguments that ``parser`` (vLLM's) reads into an option the operator sets."""
    found = managed_option(parser, extra_args, MANAGED_VLLM_FLAGS)
    if found is not None:
        spelled, flags = found
        raise LaunchConfigError(
            f"spec.{role.value}.extraArgs: vLLM reads `{spelled}` as {'/'.join(flags)}, which "
            f"the operator sets; {MANAGED_VLLM_FLAGS[flags[0]]}"
        )


def vllm_command(
    vllm_args: Sequence[str], config: dict[str, object], headless: bool = False
) -> list[str]:
    """The vLLM OpenAI server command line (``vllm serve`` for a headless worker) with the
    connector config appended."""
    entry = [CLI_MODULE, "serve"] if headless else [API_SERVER_MODULE]
    return [
        sys.executable,
        "-m",
        *entry,
        *vllm_args,
        KV_TRANSFER_CONFIG_FLAG,
        json.dumps(config, separators=(",", ":")),
    ]


def prepare(
    role: Role,
    config_path: Path,
    vllm_args: Sequence[str],
    engine_id: str | None = None,
    headless: bool = False,
) -> tuple[list[str], dict[str, str]]:
    """Validate everything and return the command and environment to exec (the config with
    ``engine_id``, when given; ``vllm serve`` when ``headless``)."""
    version = installed_vllm_version()
    package_dir = vllm_package_dir()
    if version is None or package_dir is None:
        raise LaunchConfigError("vLLM is not installed in this Python environment")
    try:
        raw = json.loads(config_path.read_text())
    except OSError as exc:
        raise LaunchConfigError(f"{config_path}: cannot read the connector config: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise LaunchConfigError(f"{config_path}: not valid JSON: {exc}") from exc
    config = check_config(
        raw,
        role,
        accepted_keys=kv_transfer_config_keys(package_dir),
        vllm_version=version,
        source=str(config_path),
    )
    if engine_id is not None:
        config = {**config, "engine_id": engine_id}
    own_args, extra_args = split_vllm_args(vllm_args)
    if extra_args:
        try:
            parser = server_parser(API_SERVER_MODULE)
        except (LookupError, ImportError, AttributeError) as exc:
            raise LaunchConfigError(
                f"cannot build vLLM {version}'s argument parser to check spec.{role.value}."
                f"extraArgs: {exc}"
            ) from exc
        check_extra_args(parser, role, extra_args)
    command = vllm_command([*own_args, *extra_args], config, headless)
    return command, serving_env(os.environ, config)


def write_termination_message(path: Path, message: str) -> None:
    """Leave `message` where the kubelet reads the container's termination message: the file
    the kubelet mounts into every container; outside one it is absent and nothing is written."""
    if path.exists():
        path.write_text(message)


def serve(
    role: Role, config_path: Path, vllm_args: Sequence[str], rank: GroupRank | None = None
) -> int:
    """Exec the vLLM server (one rank of a multi-node server's group, with ``rank``); return 2
    with a message when the config cannot be served, 3 with a termination message naming the
    field to fix when the weights' source cannot be read (:mod:`weights`)."""
    try:
        engine_id = rank_engine_id(rank, os.environ) if rank is not None else None
        headless = rank is not None and rank.headless_worker
        command, env = prepare(role, config_path, vllm_args, engine_id, headless)
    except LaunchConfigError as exc:
        print(f"disagg serve: {exc}", file=sys.stderr)
        return 2
    try:
        check_source(split_vllm_args(vllm_args)[0], os.environ)
    except WeightsUnavailable as exc:
        print(f"disagg serve: {exc.termination_message}", file=sys.stderr)
        write_termination_message(Path(TERMINATION_MESSAGE_PATH), exc.termination_message)
        return WEIGHTS_EXIT_CODE
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, env)
