"""The router package's `disagg` subcommand: `router` (heavy imports stay lazy)."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    """Add `disagg router` to the `disagg` parser."""
    from disagg_router.options import add_router_arguments

    parser = subparsers.add_parser(
        "router",
        help="KV-cache-aware prefill/decode router (OpenAI API)",
        description="Route OpenAI requests through prefill then decode, reusing each "
        "conversation's decode KV on its next turn.",
    )
    add_router_arguments(parser)
    parser.set_defaults(func=_run_router)


def _run_router(args: argparse.Namespace) -> int:
    from disagg_router.config import ConfigError
    from disagg_router.options import config_from_args

    try:
        config = config_from_args(args)
    except ConfigError as exc:
        raise SystemExit(f"disagg router: {exc}") from None
    from disagg_router.server import run

    try:
        return run(config)
    except ConfigError as exc:  # a key file named by the config, read as the app is built
        raise SystemExit(f"disagg router: {exc}") from None
