"""The serving package's `disagg` subcommand: `serve`, the serving image's entry point."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from disagg_connector.launcher import GroupRank


def register(subparsers: Any) -> None:
    """Add the connector package's subcommands to the ``disagg`` parser."""
    _register_serve(subparsers)


def _register_serve(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run a vLLM prefill or decode server with the disagg connector",
        description="Check the connector config rendered by the operator against the "
        "installed vLLM, set the NIXL side-channel and EFA environment, then exec the "
        "vLLM OpenAI server. Arguments after '--' go to vLLM as given; a second '--' starts a "
        "role's extraArgs, refused where vLLM's parser reads one as an option the operator sets.",
    )
    parser.add_argument("--role", required=True, choices=["prefill", "decode"])
    parser.add_argument(
        "--config",
        required=True,
        type=Path,
        help="the --kv-transfer-config JSON for this role (e.g. /etc/disagg/prefill.json)",
    )
    group = parser.add_argument_group(
        "multi-node servers",
        "every rank of a group gets the NIXL engine id <leader address>/<revision>/<leader "
        "pod IPs>, the leader's address resolved by the cluster's DNS",
    )
    group.add_argument("--leader-address", help="the group leader's DNS name")
    group.add_argument("--group-revision", help="the group's template revision")
    group.add_argument(
        "--headless-worker",
        action="store_true",
        help="run a worker rank (vllm serve --headless) instead of the leader's API server",
    )
    parser.add_argument(
        "vllm_args", nargs=argparse.REMAINDER, help="-- then vLLM arguments [-- extra arguments]"
    )
    parser.set_defaults(func=_run_serve)


def group_rank(args: argparse.Namespace) -> GroupRank | None:
    """The multi-node rank the arguments name, or None for a single-pod server."""
    from disagg_connector.launcher import GroupRank

    given = (args.leader_address, args.group_revision)
    if given == (None, None) and not args.headless_worker:
        return None
    if None in given:
        raise SystemExit(
            "disagg serve: a multi-node rank needs both --leader-address and --group-revision"
        )
    return GroupRank(args.leader_address, args.group_revision, args.headless_worker)


def _run_serve(args: argparse.Namespace) -> int:
    from disagg_connector.launcher import serve
    from disagg_contract import Role

    vllm_args = list(args.vllm_args)
    if vllm_args[:1] == ["--"]:
        vllm_args = vllm_args[1:]
    return serve(Role(args.role), args.config, vllm_args, group_rank(args))
