"""How one operator process runs: the `disagg operator` flags (no kopf import here, so
building the `disagg` parser stays light)."""

from __future__ import annotations

import argparse
import secrets
from dataclasses import dataclass

PERSISTENCE_PREFIX = "disagg.dev"
DEFAULT_PEERING = "disagg-operator"
DEFAULT_REUSE_INTERVAL_S = 60.0
"""How often the operator reads the routers' reuse summaries into status, by default."""
REUSE_URL_FIELDS = ("namespace", "name", "service", "port")
"""The placeholders a `--reuse-url` template may use."""


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
    reuse_interval_s: float = DEFAULT_REUSE_INTERVAL_S
    """How often the routers' reuse summaries are read into status; 0 reads none."""
    reuse_url: str = ""
    """Where a model's reuse summary is read (a template); empty: each ready router pod's IP."""

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


def _interval(text: str) -> float:
    """A non-negative number of seconds (0: off)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (0 for none)")
    return seconds


def _url_template(text: str) -> str:
    """A URL template using only the known placeholders (empty: the default source)."""
    if not text:
        return text
    try:
        text.format(**{name: "x" for name in REUSE_URL_FIELDS})
    except (KeyError, IndexError, ValueError) as exc:
        fields = ", ".join(f"{{{name}}}" for name in REUSE_URL_FIELDS)
        raise argparse.ArgumentTypeError(
            f"{text!r}: {exc!r}; the placeholders are {fields}"
        ) from None
    if not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL")
    return text


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
    parser.add_argument(
        "--reuse-interval",
        type=_interval,
        default=DEFAULT_REUSE_INTERVAL_S,
        metavar="SECONDS",
        help="read each bidirectional model's router reuse summaries into status.reuse this "
        f"often (default {DEFAULT_REUSE_INTERVAL_S:g}; 0: never)",
    )
    parser.add_argument(
        "--reuse-url",
        type=_url_template,
        default="",
        metavar="TEMPLATE",
        help="read a model's reuse summary here instead of from each ready router pod by IP: "
        "a URL with {namespace}, {name}, {service} and {port} filled in, e.g. "
        "http://{service}.{namespace}.svc:{port} (the router Service by DNS: one replica)",
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
        reuse_interval_s=args.reuse_interval,
        reuse_url=args.reuse_url,
    )
