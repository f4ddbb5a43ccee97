"""The operator package's `disagg` subcommands: `render` and `operator`."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Add the operator's subcommands to the `disagg` parser."""
    parser = subparsers.add_parser(
        "render",
        help="print the Kubernetes objects a DisaggregatedModel becomes",
        description="Validate DisaggregatedModel YAML and print its child objects as YAML "
        "(for review and GitOps diffs), or a one-line-per-object summary.",
    )
    parser.add_argument("-f", "--file", required=True, help="DisaggregatedModel YAML ('-': stdin)")
    parser.add_argument(
        "--summary", action="store_true", help="print a table of kind, name and key facts"
    )
    parser.set_defaults(func=run_render)

    operator = subparsers.add_parser(
        "operator",
        help="run the operator (kopf) against the current kubeconfig or in-cluster",
        description="Reconcile DisaggregatedModels: apply their children with server-side "
        "apply, keep status current, repair drift.",
    )
    from disagg_operator.options import add_arguments

    add_arguments(operator)
    operator.set_defaults(func=run_operator)


def run_render(args: argparse.Namespace) -> int:
    """Render every DisaggregatedModel in a file; invalid specs exit 1 naming each field."""
    import yaml

    from disagg_operator.errors import SpecError
    from disagg_operator.loading import load_file
    from disagg_operator.render import render
    from disagg_operator.summary import summary_table

    try:
        resources = load_file(args.file)
        manifests = [
            manifest
            for resource in resources
            for manifest in render(
                resource.metadata.name, resource.metadata.namespace, resource.spec
            )
        ]
    except SpecError as exc:
        for problem in exc.problems:
            print(f"error: {args.file}: {problem}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.summary:
        sys.stdout.write(summary_table(manifests))
    else:
        sys.stdout.write(yaml.safe_dump_all(manifests, sort_keys=False))
    return 0


def run_operator(args: argparse.Namespace) -> int:
    """Run the kopf operator until it is stopped."""
    from disagg_operator.runner import run

    return run(args)
