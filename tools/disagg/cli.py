"""The `disagg` command line: one entry point, subcommands registered by each package.

Each package exposes ``register(subparsers)`` in its ``commands`` module; a subcommand sets
``func`` on its parser and imports its heavy dependencies only when it runs, so
``disagg serve`` never imports kopf and ``disagg render`` never imports vLLM.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence

COMMAND_MODULES = (
    "disagg_connector.commands",
    "disagg_router.commands",
    "disagg_operator.commands",
    "disagg.commands",
)

DISTRIBUTION = "disagg"
"""The distribution whose metadata carries the version (pyproject.toml's `version`)."""


def version() -> str:
    """The installed distribution's version; a source tree that was never installed says so."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return f"unknown (the {DISTRIBUTION} distribution is not installed: pip install -e .)"


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every package's subcommands."""
    parser = argparse.ArgumentParser(
        prog="disagg",
        description="Prefill/decode disaggregated vLLM with bidirectional KV transfer.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name not in (module_name, module_name.split(".")[0]):
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand and return its exit status."""
    args = build_parser().parse_args(argv)
    status: int = args.func(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
