"""Which settings command-line arguments write, as vLLM's own server parser reads them.

vLLM's parser reads one option in many spellings: ``_`` for ``-``, ``--flag=value``, dotted keys
of a JSON option (``--kv-transfer-config.kv_role x``), argparse's unique abbreviations (``-t``
for ``-tp``) and the options of a ``--config`` YAML file. ``disagg serve`` copies none of these
rules: it builds the parser the server module runs (:func:`server_parser`) and looks at which
settings the arguments write (:func:`managed_option`). Building it imports vLLM and torch, so
the launcher builds it only when a role has extra arguments to check.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import io
from collections.abc import Iterable, Sequence
from pathlib import Path

PARSER_PARTS = ("FlexibleArgumentParser", "make_arg_parser")
"""What the server's ``main`` imports to build its argument parser."""


def module_tree(module_name: str) -> ast.Module:
    """A module's parsed source, read without importing the module (its imports are heavy)."""
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        raise LookupError(f"module {module_name} is gone")
    return ast.parse(Path(spec.origin).read_text())


def imported_names(nodes: Iterable[ast.AST], module_name: str) -> dict[str, str]:
    """The absolute module of each name ``from ... import``-ed under ``nodes`` of a module."""
    spec = importlib.util.find_spec(module_name)
    package = spec.parent if spec is not None else ""
    return {
        alias.asname or alias.name: importlib.util.resolve_name(
            "." * node.level + (node.module or ""), package
        )
        for top in nodes
        for node in ast.walk(top)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def server_parser_modules(server_module: str) -> dict[str, str]:
    """Where ``python -m server_module`` imports its parser's parts (:data:`PARSER_PARTS`) from.

    Followed through the module's ``__main__`` block into the ``main`` it runs, so the parser is
    the one that runs, wherever a vLLM release moves it (0.32 and 0.33 differ).
    """
    main_blocks = [
        node
        for node in module_tree(server_module).body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
    ]
    entry = imported_names(main_blocks, server_module)
    if "main" not in entry:
        raise LookupError(f"python -m {server_module} no longer runs an imported main()")
    mains = [
        node
        for node in module_tree(entry["main"]).body
        if isinstance(node, ast.FunctionDef) and node.name == "main"
    ]
    names = imported_names(mains, entry["main"])
    missing = [name for name in PARSER_PARTS if name not in names]
    if missing:
        raise LookupError(f"{entry['main']}.main no longer imports {', '.join(missing)}")
    return {name: names[name] for name in PARSER_PARTS}


def server_parser(server_module: str) -> argparse.ArgumentParser:
    """The argument parser ``python -m server_module`` parses its command line with."""
    parts = {
        name: getattr(importlib.import_module(module), name)
        for name, module in server_parser_modules(server_module).items()
    }
    parser: argparse.ArgumentParser = parts["make_arg_parser"](
        parts["FlexibleArgumentParser"](prog=server_module)
    )
    return parser


_UNSET = object()


def _written(
    parser: argparse.ArgumentParser, args: Sequence[str], dests: Iterable[str]
) -> set[str]:
    """Which of ``dests`` parsing ``args`` writes, even where the parser then refuses ``args``.

    Each destination starts out as a marker, so argparse leaves its default unset and any action
    that writes it (to whatever value) shows. The parser's refusals (an unknown or ambiguous
    option, a bad value, a missing ``--config`` file) stop it, and the server refuses the same
    arguments in its own words when it runs; its messages and help are kept off the terminal.
    """
    marked = dict.fromkeys(dests, _UNSET)
    namespace = argparse.Namespace(**marked)
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
        contextlib.suppress(Exception, SystemExit),
    ):
        parser.parse_args(list(args), namespace)
    return {dest for dest in marked if getattr(namespace, dest) is not _UNSET}


def managed_option(
    parser: argparse.ArgumentParser, args: Sequence[str], flags: Iterable[str]
) -> tuple[str, list[str]] | None:
    """The first of ``args`` that ``parser`` reads into a setting one of ``flags`` names.

    Returns the arguments that write it (the option and its value, as given) and the ``flags``
    naming that setting; None when ``args`` write none. The shortest prefix of ``args`` that
    writes one ends at it, and the shortest tail of that prefix that still writes it starts
    there, so any spelling and any ``--config`` file is blamed as given.
    """
    by_dest: dict[str, list[str]] = {}
    for flag in flags:
        action = parser._option_string_actions.get(flag)
        if action is not None:
            by_dest.setdefault(action.dest, []).append(flag)
    if not _written(parser, args, by_dest):
        return None
    end = next(k for k in range(1, len(args) + 1) if _written(parser, args[:k], by_dest))
    start = next(s for s in range(end - 1, -1, -1) if _written(parser, args[s:end], by_dest))
    dest = next(d for d in by_dest if d in _written(parser, args[:end], by_dest))
    return " ".join(args[start:end]), by_dest[dest]
