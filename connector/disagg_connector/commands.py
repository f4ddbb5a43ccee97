"""Subcommands of ``disagg`` that belong to the connector package (heavy imports stay lazy)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    """Add the connector package's subcommands to the ``disagg`` parser."""
    _register_serve(subparsers)
    _register_router(subparsers)
    _register_plan(subparsers)
    _register_bench(subparsers)


def _register_serve(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run a vLLM prefill or decode server with the disagg connector",
        description="Check the connector config rendered by the operator against the "
        "installed vLLM, set the NIXL side-channel and EFA environment, then exec the "
        "vLLM OpenAI server. Arguments after '--' go to vLLM.",
    )
    parser.add_argument("--role", required=True, choices=["prefill", "decode"])
    parser.add_argument(
        "--config",
        required=True,
        type=Path,
        help="the --kv-transfer-config JSON for this role (e.g. /etc/disagg/prefill.json)",
    )
    parser.add_argument("vllm_args", nargs=argparse.REMAINDER, help="-- then vLLM arguments")
    parser.set_defaults(func=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    from disagg_connector.launch_config import Role
    from disagg_connector.launcher import serve

    vllm_args = list(args.vllm_args)
    if vllm_args[:1] == ["--"]:
        vllm_args = vllm_args[1:]
    return serve(Role(args.role), args.config, vllm_args)


def _register_router(subparsers: Any) -> None:
    from disagg_connector.router.options import add_router_arguments

    parser = subparsers.add_parser(
        "router",
        help="KV-cache-aware prefill/decode router (OpenAI API)",
        description="Route OpenAI requests through prefill then decode, reusing each "
        "conversation's decode KV on its next turn.",
    )
    add_router_arguments(parser)
    parser.set_defaults(func=_run_router)


def _run_router(args: argparse.Namespace) -> int:
    from disagg_connector.router.config import ConfigError
    from disagg_connector.router.options import config_from_args

    try:
        config = config_from_args(args)
    except ConfigError as exc:
        raise SystemExit(f"disagg router: {exc}") from None
    from disagg_connector.router.server import run

    return run(config)


def _register_plan(subparsers: Any) -> None:
    from disagg_connector.plan.cli import add_arguments, run

    parser = subparsers.add_parser(
        "plan",
        help="predict TTFT with and without KV reuse for a model, GPU and fabric",
        description="Capacity model: predicted TTFT off/on, KV transfer time and its physical "
        "floor per prompt length, and a suggested recomputeThresholdTokens. Pure Python.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def _register_bench(subparsers: Any) -> None:
    from disagg_connector.bench.cli import add_arguments, run

    parser = subparsers.add_parser(
        "bench",
        help="multi-turn TTFT benchmark, KV reuse ON vs OFF, with figures",
        description="Drive multi-turn conversations through a router with a prompt-length "
        "sweep, once with bidirectional KV reuse (ON) and once without (OFF); record TTFT, "
        "prefill duration and D->P transfer time per request; write JSON, two PNG figures and "
        "a summary table. Or plot vLLM's multi-turn benchmark stats (--from-vllm-stats).",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)
