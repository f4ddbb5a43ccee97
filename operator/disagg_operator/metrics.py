"""Prometheus metrics of the operator, on a registry of their own; `serve` exposes /metrics.

The reconciler and the API client report into one `OperatorMetrics`; nothing here knows kopf
or the reconciler's types, so the series stay plain counts of what those parts did. Only the
replica that holds the kopf peering reconciles: a standby replica's counts stay at zero.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.process_collector import ProcessCollector

PASS_RESULTS = ("applied", "noop", "blocked", "error")
"""How a reconcile pass ended: it applied at least one child; it had nothing to apply; the model
cannot be realized now (Degraded, retried later); it raised (an API error, a bug)."""

READY_STATES = ("true", "false", "unknown")
"""Values of the `ready` label: the model's Ready condition, lower-cased."""

_PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class OperatorMetrics:
    """Every series the operator exports; names start with ``disagg_operator_``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        ProcessCollector(registry=reg)
        self.passes = Counter(
            "disagg_operator_reconcile_passes",
            "Reconcile passes by result (applied, noop, blocked, error).",
            ["result"],
            registry=reg,
        )
        self.pass_seconds = Histogram(
            "disagg_operator_reconcile_duration_seconds",
            "Duration of one reconcile pass of one model.",
            buckets=_PASS_BUCKETS,
            registry=reg,
        )
        self.child_applies = Counter(
            "disagg_operator_child_applies",
            "Children applied, by kind and action: create (missing, also after a deletion by "
            "hand), update (the spec changed), repair (a field changed by hand: drift repair).",
            ["kind", "action"],
            registry=reg,
        )
        self.models = Gauge(
            "disagg_operator_models",
            "Models this replica reconciled, by their Ready condition (true, false, unknown).",
            ["ready"],
            registry=reg,
        )
        self.api_errors = Counter(
            "disagg_operator_api_errors",
            "Failed requests of the operator's own API client (applies, status patches, reads) "
            "by method and HTTP status code ('connection' when no answer came).",
            ["method", "code"],
            registry=reg,
        )
        for result in PASS_RESULTS:
            self.passes.labels(result)
        for state in READY_STATES:
            self.models.labels(state)
        self._ready: dict[str, str] = {}
        self._lock = threading.Lock()

    def pass_finished(self, result: str, seconds: float) -> None:
        """Count one reconcile pass and its duration."""
        self.passes.labels(result).inc()
        self.pass_seconds.observe(seconds)

    def child_applied(self, kind: str, action: str) -> None:
        """Count one child applied (create, update or repair)."""
        self.child_applies.labels(kind, action).inc()

    def api_error(self, method: str, code: str) -> None:
        """Count one failed API request."""
        self.api_errors.labels(method, code).inc()

    def model_ready(self, uid: str, ready: str) -> None:
        """Record a model's Ready condition status ("True", "False" or "Unknown")."""
        with self._lock:
            self._ready[uid] = ready.lower()
            self._count_models()

    def forget_model(self, uid: str) -> None:
        """A model was deleted: stop counting it."""
        with self._lock:
            if self._ready.pop(uid, None) is not None:
                self._count_models()

    def _count_models(self) -> None:
        for state in READY_STATES:
            self.models.labels(state).set(sum(1 for s in self._ready.values() if s == state))


def serve(metrics: OperatorMetrics, port: int, address: str = "0.0.0.0") -> WSGIServer:
    """Serve `metrics` at http://address:port/metrics from a daemon thread; shut it down after."""
    server, _ = start_http_server(port, addr=address, registry=metrics.registry)
    return server
