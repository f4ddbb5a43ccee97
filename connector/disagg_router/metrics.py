"""Prometheus metrics of the router, on a registry of their own (one per app)."""

from __future__ import annotations

from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from disagg_contract import ReadReport, ReleaseReason, ReuseSummary
from disagg_router.replicas import ReplicaPool

GONE = "gone"
"""The release label of a lease decode no longer held when the router renewed it."""
RELEASE_LABELS = (*(reason.value for reason in ReleaseReason), GONE)
OFFER_TOKEN_KINDS: tuple[Literal["offered", "verified", "diverged"], ...] = (
    "offered",
    "verified",
    "diverged",
)
"""The kind label of ``disagg_router_offer_tokens``: the counts of prefill's read reports."""
STORE_OPERATIONS = ("begin_turn", "commit", "restore", "drop", "forget")
"""The operation label of a failed store call (exported at zero from the start, so that an
alert on the counter's increase sees the first failure)."""

_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0
)  # fmt: skip


class RouterMetrics:
    """Every series the router exports; names start with ``disagg_router_``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.requests = Counter(
            "disagg_router_requests",
            "Client requests by endpoint and outcome (refused for want of a client key: outcome "
            "unauthorized, endpoint other for paths that are not generation endpoints; beyond "
            "--max-concurrent-requests: outcome overloaded).",
            ["endpoint", "outcome"],
            registry=reg,
        )
        self.lookups = Counter(
            "disagg_router_conversation_lookups",
            "Conversation cache lookups by result (hit, miss, expired, stale, no_key; draining: "
            "the entry's decode replica is leaving, the turn recomputes on another).",
            ["result"],
            registry=reg,
        )
        self.prompt_tokens = Counter(
            "disagg_router_prompt_tokens",
            "Prompt tokens prefill reused (prefix cache or D->P read) or recomputed.",
            ["kind"],
            registry=reg,
        )
        self.prefill_seconds = Histogram(
            "disagg_router_prefill_duration_seconds",
            "Prefill request duration.",
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.ttft_seconds = Histogram(
            "disagg_router_ttft_seconds",
            "Time from the client request to the first streamed byte of the answer.",
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.e2e_seconds = Histogram(
            "disagg_router_e2e_latency_seconds",
            "Time from the client request to the end of the answer.",
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.upstream_errors = Counter(
            "disagg_router_upstream_errors",
            "Failed engine calls by role, replica and kind of failure.",
            ["role", "replica", "kind"],
            registry=reg,
        )
        self.prefill_retries = Counter(
            "disagg_router_prefill_retries",
            "Prefill calls retried on another replica.",
            registry=reg,
        )
        self.decode_affinity = Counter(
            "disagg_router_decode_affinity",
            "Decode replica choices by affinity result (kept, overloaded, unhealthy, gone, none; "
            "draining: the conversation moved off a decode replica that is leaving).",
            ["result"],
            registry=reg,
        )
        self.prefill_affinity = Counter(
            "disagg_router_prefill_affinity",
            "Prefill replica choices for conversation turns by affinity result (as decode's; "
            "none also for a turn with no previous prefill, or with --prefill-routing "
            "least-loaded).",
            ["result"],
            registry=reg,
        )
        self.pd_saved_tokens = Counter(
            "disagg_router_pd_saved_tokens",
            "Estimated prompt tokens decode did not pull from prefill thanks to affinity.",
            registry=reg,
        )
        self.pd_saved_bytes = Counter(
            "disagg_router_pd_saved_bytes",
            "pd_saved_tokens times --kv-bytes-per-token (0 when that is unset).",
            registry=reg,
        )
        self.store_errors = Counter(
            "disagg_router_store_errors",
            "Conversation store operations that failed, by operation: begin_turn (the turn ran "
            "without reuse), commit (the next turn recomputes), restore, drop, forget.",
            ["operation"],
            registry=reg,
        )
        self.header_timeouts = Counter(
            "disagg_router_header_timeouts",
            "Connections closed (408) because a request's line and headers did not arrive "
            "within --header-timeout.",
            registry=reg,
        )
        self.in_flight = Gauge(
            "disagg_router_requests_in_flight",
            "Generation requests holding one of the --max-concurrent-requests slots.",
            registry=reg,
        )
        self.outstanding = Gauge(
            "disagg_router_replica_outstanding",
            "Requests in flight per replica.",
            ["role", "replica"],
            registry=reg,
        )
        self.healthy = Gauge(
            "disagg_router_replica_healthy",
            "1 if the replica passed its last health check.",
            ["role", "replica"],
            registry=reg,
        )
        self.draining = Gauge(
            "disagg_router_replica_draining",
            "1 if the replica's endpoint is terminating: it finishes its requests in flight and "
            "takes no new one (it is not health-checked meanwhile).",
            ["role", "replica"],
            registry=reg,
        )

        self.reuse_turns = Counter(
            "disagg_router_reuse_turns",
            "Conversation turns (with a conversation id) whose prefill answered, by result: hit "
            "when prefill was offered decode's KV and reported cached prompt tokens, else miss.",
            ["result"],
            registry=reg,
        )
        self.offer_tokens = Counter(
            "disagg_router_offer_tokens",
            "Tokens of decode's offers on conversation turns, as prefill reported them, by kind: "
            "offered (the history decode held), verified (whole blocks whose digest matched the "
            "turn's prompt) and diverged (lost to a history that differs from decode's: an edited "
            "message or an answer sent back changed).",
            ["kind"],
            registry=reg,
        )
        self.reuse_prompt_tokens = Counter(
            "disagg_router_reuse_prompt_tokens",
            "Prompt tokens of conversation turns that prefill reused (prefix cache or D->P read) "
            "or recomputed (disagg_router_prompt_tokens counts every turn).",
            ["kind"],
            registry=reg,
        )
        self.leases_held = Gauge(
            "disagg_router_leases_held",
            "Decode retentions (leases) this router holds and renews for its conversations.",
            registry=reg,
        )
        self.lease_releases = Counter(
            "disagg_router_lease_releases",
            "Leases this router dropped, by reason (superseded, evicted, lapsed, idle, closed, "
            "drained; gone: decode no longer held it at a renewal).",
            ["reason"],
            registry=reg,
        )
        self.lease_call_failures = Counter(
            "disagg_router_lease_call_failures",
            "Calls to decode's lease service that failed, by call (renew, release) and kind "
            "(connect, timeout, transport, http_<status>, bad_reply); no turn waits for them.",
            ["call", "kind"],
            registry=reg,
        )
        for result in ("hit", "miss"):
            self.reuse_turns.labels(result)
        for kind in ("reused", "recomputed"):
            self.reuse_prompt_tokens.labels(kind)
        for kind in OFFER_TOKEN_KINDS:
            self.offer_tokens.labels(kind)
        for label in RELEASE_LABELS:
            self.lease_releases.labels(label)
        for operation in STORE_OPERATIONS:
            self.store_errors.labels(operation)
        self._turns = self._hits = self._reused = self._recomputed = 0
        self._offer_tokens = dict.fromkeys(OFFER_TOKEN_KINDS, 0)
        self._released = dict.fromkeys(RELEASE_LABELS, 0)

    def reuse_turn(self, hit: bool, reused: int, recomputed: int) -> None:
        """Count a conversation turn whose prefill answered."""
        self.reuse_turns.labels("hit" if hit else "miss").inc()
        self.reuse_prompt_tokens.labels("reused").inc(reused)
        self.reuse_prompt_tokens.labels("recomputed").inc(recomputed)
        self._turns += 1
        self._hits += hit
        self._reused += reused
        self._recomputed += recomputed

    def offer_read(self, report: ReadReport) -> None:
        """Count prefill's report of the offer a conversation turn carried."""
        for kind in OFFER_TOKEN_KINDS:
            self.offer_tokens.labels(kind).inc(report[kind])
            self._offer_tokens[kind] += report[kind]

    def lease_released(self, reason: str) -> None:
        """Count a lease dropped for ``reason`` (a ``ReleaseReason`` value or ``GONE``)."""
        self.lease_releases.labels(reason).inc()
        self._released[reason] += 1

    def reuse_summary(self, leases_held: int) -> ReuseSummary:
        """The reuse counters since start, as the operator reads them."""
        return ReuseSummary(
            turns=self._turns,
            hits=self._hits,
            reused_tokens=self._reused,
            recomputed_tokens=self._recomputed,
            leases_held=leases_held,
            released=dict(self._released),
            store_errors=int(_total(self.store_errors)),
            offered_tokens=self._offer_tokens["offered"],
            verified_tokens=self._offer_tokens["verified"],
            diverged_tokens=self._offer_tokens["diverged"],
        )

    def render(self, pools: tuple[ReplicaPool, ...]) -> bytes:
        """Refresh the replica gauges and return the text exposition."""
        for gauge in (self.outstanding, self.healthy, self.draining):
            gauge.clear()
        for pool in pools:
            for replica in pool.members():
                labels = (pool.role.value, replica.url)
                self.outstanding.labels(*labels).set(replica.outstanding)
                self.healthy.labels(*labels).set(1 if replica.healthy else 0)
                self.draining.labels(*labels).set(1 if replica.draining else 0)
        return generate_latest(self.registry)


def _total(counter: Counter) -> float:
    """A counter's value summed over its labels (the callers count through the counter)."""
    return sum(
        sample.value
        for family in counter.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    )
