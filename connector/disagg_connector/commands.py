"""The serving package's `disagg` subcommand: `serve`, the serving image's entry point."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


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
    parser.add_argument(
        "--engine-id",
        help="the NIXL engine id of a multi-node server's group, set in the config (its "
        "headless workers get the same one from the operator)",
    )
    parser.add_argument(
        "vllm_args", nargs=argparse.REMAINDER, help="-- then vLLM arguments [-- extra arguments]"
    )
    parser.set_defaults(func=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    from disagg_connector.launcher import serve
    from disagg_contract import Role

    vllm_args = list(args.vllm_args)
    if vllm_args[:1] == ["--"]:
        vllm_args = vllm_args[1:]
    return serve(Role(args.role), args.config, vllm_args, args.engine_id)
