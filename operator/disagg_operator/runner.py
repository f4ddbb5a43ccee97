"""`disagg operator`: run the kopf operator against the current kubeconfig (or in-cluster)."""

from __future__ import annotations

import argparse
import logging
import re
import sys

import kopf

from disagg_operator import handlers
from disagg_operator.metrics import OperatorMetrics, serve
from disagg_operator.options import options_from_args

LOG_FORMATS = {
    "plain": kopf.LogFormat.PLAIN,
    "full": kopf.LogFormat.FULL,
    "json": kopf.LogFormat.JSON,
}

QUIET_HANDLERS = re.compile(r"Handler '(\w+_changed|forget_deleted)' succeeded\.")


class _QuietWatchHandlers(logging.Filter):
    """Drop kopf's per-event "succeeded" lines of the watch handlers (one per pod change)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not QUIET_HANDLERS.fullmatch(record.getMessage())


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT; exit 0 after a clean stop (2 when the metrics port is taken)."""
    options = options_from_args(args)
    metrics = OperatorMetrics()
    server = None
    if options.metrics_port:
        try:
            server = serve(metrics, options.metrics_port)
        except OSError as exc:
            print(f"error: --metrics-port {options.metrics_port}: {exc}", file=sys.stderr)
            return 2
    kopf.configure(
        debug=args.log_level == "debug",
        quiet=args.log_level == "warning",
        log_format=LOG_FORMATS[args.log_format],
        log_prefix=True,
    )
    logging.getLogger("kopf.objects").addFilter(_QuietWatchHandlers())
    assert handlers.reconcile is not None  # the handlers are registered on import
    try:
        kopf.run(
            clusterwide=options.clusterwide,
            namespaces=options.namespaces,
            standalone=options.standalone,
            peering_name=options.peering,
            priority=options.priority,
            liveness_endpoint=args.liveness,
            memo=kopf.Memo(options=options, metrics=metrics),
        )
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    return 0
