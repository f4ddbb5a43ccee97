"""How one operator process runs: the `disagg operator` flags (no kopf import here, so
building the `disagg` parser stays light)."""

from __future__ import annotations

import argparse
import secrets
from dataclasses import dataclass

PERSISTENCE_PREFIX = "disagg.dev"
DEFAULT_PEERING = "disagg-operator"


@dataclass(frozen=True)
class OperatorOptions:
    """The operator's run options."""

    namespaces: tuple[str, ...] = ()
    """Watched namespaces; empty means all namespaces."""
    peering: str = DEFAULT_PEERING
    standalone: bool = False
    priority: int = 0
    retry_delay_s: float = 15.0
    """How long a model that cannot be realized (e.g. a missing Secret) waits between tries."""
    metrics_port: int = 0
    """Port of the Prometheus /metrics endpoint; 0 serves none."""

    @property
    def clusterwide(self) -> bool:
        """Whether the operator watches every namespace."""
        return not self.namespaces


LOG_FORMATS = ("plain", "full", "json")
LOG_LEVELS = ("debug", "info", "warning")


def _port(text: str) -> int:
    """A TCP port number, or 0 (off)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: give 1-65535, or 0 for none")
    return port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The operator's command-line flags."""
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="watch this namespace (repeat for several)",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    parser.add_argument(
        "--peering",
        default=DEFAULT_PEERING,
        help="kopf peering name: replicas sharing it never act at the same time "
        f"(default {DEFAULT_PEERING}; created at start)",
    )
    parser.add_argument(
        "--standalone", action="store_true", help="no peering (one replica, or a dev run)"
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=None,
        help="peering priority; the highest acts, the others pause (default: random)",
    )
    parser.add_argument(
        "--liveness",
        metavar="URL",
        default=None,
        help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument(
        "--metrics-port",
        type=_port,
        default=0,
        metavar="PORT",
        help="serve Prometheus metrics at http://0.0.0.0:PORT/metrics (default 0: none)",
    )
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="plain")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    parser.add_argument(
        "--retry-delay",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="wait between tries of a model that cannot be realized yet (default 15)",
    )


def options_from_args(args: argparse.Namespace) -> OperatorOptions:
    """The run options of parsed flags (a random peering priority unless one is given)."""
    return OperatorOptions(
        namespaces=tuple(args.namespace),
        peering=args.peering,
        standalone=args.standalone,
        priority=args.priority if args.priority is not None else 1 + secrets.randbelow(10**9),
        retry_delay_s=args.retry_delay,
        metrics_port=args.metrics_port,
    )
