"""Committed files generated from code: print them, write them, or check they are current."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_mode_arguments(parser: argparse.ArgumentParser, path: Path) -> None:
    """Add the mutually exclusive ``--write`` and ``--check`` flags for the file at ``path``."""
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"write {path.name}")
    mode.add_argument("--check", action="store_true", help="exit 1 when the file is stale")


def print_write_or_check(text: str, path: Path, args: argparse.Namespace, make_target: str) -> int:
    """Write ``text`` to ``path`` (--write), compare them (--check: 1 when stale), or print it."""
    if args.write:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    elif args.check:
        if not path.is_file() or path.read_text() != text:
            print(f"{path} is stale: run `make {make_target}`", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


def value_constraints(schema: dict[str, Any]) -> list[str]:
    """A JSON schema's allowed values in words: its enum and its numeric range."""
    parts = []
    if "enum" in schema:
        parts.append("one of " + ", ".join(f"`{value}`" for value in schema["enum"]))
    if "minimum" in schema and "maximum" in schema:
        parts.append(f"{schema['minimum']}..{schema['maximum']}")
    elif "minimum" in schema:
        parts.append(f">= {schema['minimum']}")
    return parts
