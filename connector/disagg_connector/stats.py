"""Connector stats and Prometheus metrics: NIXL's, plus verified-prefix reuse and offer verdicts.

The counts ride in vLLM's connector stats, so they show up in the periodic
``KV Transfer metrics:`` log line of the server and as Prometheus metrics: tokens reused and
rejected (prefill), every offer an engine was asked to read by direction and verdict
(``vllm:disagg_kv_offers_total{direction=..., verdict=...}``), refusals included, and on decode
the retentions it holds, why it freed each one and how it answered claims.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override
from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import (
    NixlKVConnectorStats,
    NixlPromMetrics,
)
from vllm.v1.metrics.utils import create_metric_per_engine

from disagg_connector.offer_form import Direction
from disagg_connector.read_cost import Choice, Estimates
from disagg_connector.retainer import GRANTED, LEASE_CLOSE_REASONS
from disagg_connector.retention import ClaimRefusal, FreeReason
from disagg_connector.reuse_plan import Verdict

REUSED_TOKENS = "disagg_reused_tokens"
REJECTED_TOKENS = "disagg_rejected_tokens"
OFFER_VERDICTS = "disagg_offer_verdicts"
RETENTION_FREES = "disagg_retention_frees"
CLAIM_ANSWERS = "disagg_claim_answers"
RETAINED = "disagg_retained"
READ_DECISIONS = "disagg_read_decisions"
COST_ESTIMATES = "disagg_cost_estimates"
LEASE_CONNECTIONS_CLOSED = "disagg_lease_connections_closed"
_REUSE_KEYS = (
    REUSED_TOKENS,
    REJECTED_TOKENS,
    OFFER_VERDICTS,
    RETENTION_FREES,
    CLAIM_ANSWERS,
    RETAINED,
    READ_DECISIONS,
    COST_ESTIMATES,
    LEASE_CONNECTIONS_CLOSED,
)
ESTIMATE_NAMES = ("read_fixed_seconds", "read_tokens_per_second", "compute_tokens_per_second")
"""The ``estimate`` labels of prefill's cost estimates, in :class:`Estimates` field order."""


class DisaggKVConnectorStats(NixlKVConnectorStats):
    """NIXL transfer stats plus tokens pulled from decode and tokens refused by verification."""

    @override
    def reset(self) -> None:
        super().reset()
        for key in _REUSE_KEYS:
            self.data[key] = []

    def record_reuse(self, reused_tokens: int, rejected_tokens: int) -> None:
        """Record one D->P offer: tokens pulled and tokens recomputed instead."""
        self.data[REUSED_TOKENS].append(reused_tokens)
        self.data[REJECTED_TOKENS].append(rejected_tokens)

    def record_verdict(self, direction: Direction, verdict: Verdict) -> None:
        """Record what became of one offer this engine was asked to read."""
        self.data[OFFER_VERDICTS].append(f"{direction.value}:{verdict.value}")

    def record_free(self, reason: FreeReason) -> None:
        """Record why decode stopped holding one retention."""
        self.data[RETENTION_FREES].append(reason.value)

    def record_claim(self, outcome: str) -> None:
        """Record decode's answer to one claim: ``granted`` or the refusal."""
        self.data[CLAIM_ANSWERS].append(outcome)

    def record_retained(self, requests: int, blocks: int) -> None:
        """Record what decode's retentions hold now (the last record wins)."""
        self.data[RETAINED].append([requests, blocks])

    def record_lease_connections_closed(self, reason: str, count: int) -> None:
        """Record ``count`` connections the lease port closed for ``reason`` (a limit)."""
        self.data[LEASE_CONNECTIONS_CLOSED].extend([reason] * count)

    def record_decision(self, choice: Choice) -> None:
        """Record one measured read-or-recompute decision of prefill."""
        self.data[READ_DECISIONS].append(choice.value)

    def record_estimates(self, estimates: Estimates) -> None:
        """Record prefill's current cost estimates (the last record wins; None: unmeasured)."""
        self.data[COST_ESTIMATES].append(
            [estimates.read_fixed_s, estimates.read_tokens_per_s, estimates.compute_tokens_per_s]
        )

    @override
    def is_empty(self) -> bool:
        return bool(super().is_empty()) and not any(self.data.get(k) for k in _REUSE_KEYS)

    @override
    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        if not other.is_empty():
            for key, values in other.data.items():
                self.data.setdefault(key, []).extend(values)
        return self

    @override
    def reduce(self) -> dict[str, int | float]:
        reduced: dict[str, int | float] = super().reduce()
        reduced["Num D->P offers"] = len(self.data.get(REUSED_TOKENS, []))
        reduced["D->P reused tokens"] = sum(self.data.get(REUSED_TOKENS, []))
        reduced["D->P rejected tokens"] = sum(self.data.get(REJECTED_TOKENS, []))
        for label in sorted(set(self.data.get(OFFER_VERDICTS, []))):
            reduced[f"Offers {label}"] = self.data[OFFER_VERDICTS].count(label)
        for label in sorted(set(self.data.get(RETENTION_FREES, []))):
            reduced[f"Retentions freed ({label})"] = self.data[RETENTION_FREES].count(label)
        for label in sorted(set(self.data.get(CLAIM_ANSWERS, []))):
            reduced[f"Claims {label}"] = self.data[CLAIM_ANSWERS].count(label)
        if self.data.get(RETAINED):
            reduced["Retained requests"], reduced["Retained blocks"] = self.data[RETAINED][-1]
        for label in sorted(set(self.data.get(LEASE_CONNECTIONS_CLOSED, []))):
            count = self.data[LEASE_CONNECTIONS_CLOSED].count(label)
            reduced[f"Lease connections closed ({label})"] = count
        for label in sorted(set(self.data.get(READ_DECISIONS, []))):
            reduced[f"Read decisions ({label})"] = self.data[READ_DECISIONS].count(label)
        if self.data.get(COST_ESTIMATES):
            for name, value in zip(ESTIMATE_NAMES, self.data[COST_ESTIMATES][-1], strict=True):
                if value is not None:
                    reduced[f"Estimated {name.replace('_', ' ')}"] = round(value, 6)
        return reduced


class DisaggPromMetrics(NixlPromMetrics):
    """NIXL's Prometheus metrics plus D->P token counters and offer verdict counters.

    Every (direction, verdict), free reason and claim outcome series exists from the start
    at zero, so a refusal shows as a counter that moved.
    """

    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.reuse_counters = {
            REUSED_TOKENS: create_metric_per_engine(
                self._counter_cls(
                    name="vllm:disagg_kv_reused_tokens",
                    documentation="Tokens of decode's retained KV pulled by prefill (D->P) "
                    "after prefix verification.",
                    labelnames=labelnames,
                ),
                self.per_engine_labelvalues,
            ),
            REJECTED_TOKENS: create_metric_per_engine(
                self._counter_cls(
                    name="vllm:disagg_kv_rejected_tokens",
                    documentation="Tokens of decode's retained KV offered to prefill but "
                    "recomputed: they failed prefix verification or the offer expired.",
                    labelnames=labelnames,
                ),
                self.per_engine_labelvalues,
            ),
        }
        offers = self._counter_cls(
            name="vllm:disagg_kv_offers",
            documentation="Offers of another engine's KV this engine was asked to read, by "
            "direction and verdict (verified, cut or refused, and why).",
            labelnames=[*labelnames, "direction", "verdict"],
        )
        self.offer_counters = {
            engine_idx: {
                f"{direction.value}:{verdict.value}": offers.labels(
                    *labelvalues, direction.value, verdict.value
                )
                for direction in Direction
                for verdict in Verdict
            }
            for engine_idx, labelvalues in self.per_engine_labelvalues.items()
        }

        frees = self._counter_cls(
            name="vllm:disagg_kv_retention_frees",
            documentation="Retentions of finished requests' KV decode stopped holding, by reason "
            "(read, released by the router, lease lapsed, memory pressure, capped, shutdown).",
            labelnames=[*labelnames, "reason"],
        )
        claims = self._counter_cls(
            name="vllm:disagg_kv_claims",
            documentation="Claims prefill made on decode's retained KV before a read, by "
            "decode's answer (granted, or why refused).",
            labelnames=[*labelnames, "outcome"],
        )
        retained = {
            name: self._gauge_cls(
                name=f"vllm:disagg_kv_retained_{name}",
                documentation=f"{name.capitalize()} of finished requests' KV decode retains "
                "for D->P reads now.",
                labelnames=labelnames,
                multiprocess_mode="mostrecent",
            )
            for name in ("requests", "blocks")
        }
        lease_closed = self._counter_cls(
            name="vllm:disagg_lease_connections_closed",
            documentation="Connections decode's lease port closed at a limit: the call not done "
            "within its timeout (deadline) or the port at its most connections (bound).",
            labelnames=[*labelnames, "reason"],
        )
        decisions = self._counter_cls(
            name="vllm:disagg_kv_read_decisions",
            documentation="Prefill's measured read-or-recompute decisions on decode's verified "
            "KV, by choice (read: cheaper than computing; recompute: computing is cheaper; "
            "unmeasured: no estimate yet, read; probe: read to re-measure the link).",
            labelnames=[*labelnames, "choice"],
        )
        estimates = self._gauge_cls(
            name="vllm:disagg_kv_cost_estimate",
            documentation="Prefill's running cost estimates behind its read decisions: a D->P "
            "read's fixed seconds and tokens per second, and compute tokens per second.",
            labelnames=[*labelnames, "estimate"],
            multiprocess_mode="mostrecent",
        )
        self.retention_series: dict[int, dict[str, Any]] = {
            engine_idx: {
                **{
                    f"{RETENTION_FREES}:{reason.value}": frees.labels(*values, reason.value)
                    for reason in FreeReason
                },
                **{
                    f"{CLAIM_ANSWERS}:{outcome}": claims.labels(*values, outcome)
                    for outcome in (GRANTED, *ClaimRefusal)
                },
                **{f"{RETAINED}:{name}": gauge.labels(*values) for name, gauge in retained.items()},
                **{
                    f"{LEASE_CONNECTIONS_CLOSED}:{reason}": lease_closed.labels(*values, reason)
                    for reason in LEASE_CLOSE_REASONS
                },
                **{
                    f"{READ_DECISIONS}:{choice.value}": decisions.labels(*values, choice.value)
                    for choice in Choice
                },
                **{
                    f"{COST_ESTIMATES}:{name}": estimates.labels(*values, name)
                    for name in ESTIMATE_NAMES
                },
            }
            for engine_idx, values in self.per_engine_labelvalues.items()
        }

    @override
    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        super().observe(transfer_stats_data, engine_idx)
        retention = self.retention_series[engine_idx]
        for key in (RETENTION_FREES, CLAIM_ANSWERS, READ_DECISIONS, LEASE_CONNECTIONS_CLOSED):
            for label in transfer_stats_data.get(key, ()):
                if (counter := retention.get(f"{key}:{label}")) is not None:
                    counter.inc()
        if snapshots := transfer_stats_data.get(RETAINED):
            requests, blocks = snapshots[-1]
            retention[f"{RETAINED}:requests"].set(requests)
            retention[f"{RETAINED}:blocks"].set(blocks)
        if snapshots := transfer_stats_data.get(COST_ESTIMATES):
            for name, value in zip(ESTIMATE_NAMES, snapshots[-1], strict=True):
                if value is not None:
                    retention[f"{COST_ESTIMATES}:{name}"].set(value)
        for key, counter in self.reuse_counters.items():
            for value in transfer_stats_data.get(key, ()):
                counter[engine_idx].inc(value)
        for label in transfer_stats_data.get(OFFER_VERDICTS, ()):
            series = self.offer_counters[engine_idx].get(label)
            if series is not None:
                series.inc()
