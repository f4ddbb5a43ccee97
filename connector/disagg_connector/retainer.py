"""Decode's side of reuse: retain finished turns' KV as leases, and free it when it is due.

(Prefill holds its offers to decode in a :class:`Retainer` too, without leases: its table
only answers decode's claims, and vLLM's own lease on prefill's blocks frees them.)

A finished request's KV is retained only when the router asked for it (``RETAIN_KEY``, turns
of a conversation), decode can sign the offer and the engine is not shutting down; every other
request frees its blocks at once. Each retention is a lease in a
:class:`~disagg_connector.retention.RetentionTable`, served on the lease port (see
:mod:`lease_service`): the router renews and releases it, prefill claims it before reading.
Memory pressure (a waiting request asked about again, a preemption) releases the least
recently made ones. Once the engine is shutting down (SIGTERM: its pod is leaving), decode
retains nothing more and releases what it holds, so that vLLM's drain ends when the requests
in flight do, not when the last lease lapses.

Pure logic, no vLLM: the facade in :mod:`scheduler` turns what the table says is due into
vLLM's own freeing path (the retention's deadline in the worker moves to now).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from disagg_connector.lease_service import LeaseService
from disagg_connector.retention import FreeReason, RetentionTable
from disagg_contract import LEASE_CLAIM_PATH, LEASE_RELEASE_PATH

logger = logging.getLogger(f"vllm.{__name__}")

GRANTED = "granted"
"""The ``outcome`` of a granted claim (the others are :class:`ClaimRefusal` values)."""
LEASE_CLOSE_REASONS = ("deadline", "bound")
"""Why decode's lease port closed a connection: its call was not done within the call timeout,
or it came while the port held its most connections."""


class RetentionRecorder(Protocol):
    """Where the retainer counts what it did (the connector's stats)."""

    def record_free(self, reason: FreeReason) -> None: ...

    def record_claim(self, outcome: str) -> None: ...

    def record_retained(self, requests: int, blocks: int) -> None: ...

    def record_lease_connections_closed(self, reason: str, count: int) -> None: ...


class Retainer:
    """Decode's retentions: kept when asked, freed when released, lapsed or needed."""

    def __init__(
        self,
        table: RetentionTable,
        block_size: int,
        wake: Callable[[], None] | None = None,
    ) -> None:
        """``wake`` ends an idle engine step's wait (a release makes blocks due)."""
        self.table = table
        self.block_size = block_size
        self._wake = wake
        self.service: LeaseService | None = None
        self._asked: dict[str, int] = {}
        self._pressure_blocks = 0
        self._freeing_for_pressure: set[str] = set()
        self._released_for_shutdown = False
        self._claim_answers: collections.deque[str] = collections.deque()
        self._retained_seen = (0, 0)
        self._closed_seen = (0, 0)

    def serve(self, host: str, port: int, credential: str | None) -> None:
        """Start the lease service on ``host:port``."""
        self.service = LeaseService(self.table, host, port, credential, self._count_call)
        self.service.start()

    def stop(self) -> None:
        """Stop the lease service."""
        if self.service is not None:
            self.service.stop()

    def lease_key(self) -> dict[str, Any]:
        """What an offer says of the lease service: where it listens and the lease term."""
        assert self.service is not None
        return {"port": self.service.port, "term_s": self.table.lease_term_s}

    def _count_call(self, path: str, result: dict[str, Any]) -> None:
        """Count decode's answer to a claim, and wake an idle wait on a release.

        Called on the lease service's thread (a deque's append is atomic).
        """
        if path == LEASE_CLAIM_PATH:
            self._claim_answers.append(GRANTED if result["granted"] else str(result["reason"]))
        elif path == LEASE_RELEASE_PATH and result["released"] and self._wake is not None:
            self._wake()

    def asked(self, request_id: str, num_tokens: int, num_computed_tokens: int) -> None:
        """vLLM asks how much a waiting request can load; asked again means it found no room,
        and retained KV makes way for it."""
        asks = self._asked.get(request_id, 0) + 1
        self._asked[request_id] = asks
        if asks > 1:
            missing = num_tokens - num_computed_tokens
            self._pressure_blocks = max(self._pressure_blocks, -(-missing // self.block_size))

    def allocated(self, request_id: str) -> None:
        """The request got its blocks: it no longer asks for room."""
        self._asked.pop(request_id, None)

    def retain(self, request_id: str, offer_id: str, num_blocks: int, cap_s: float) -> None:
        """Hold a finished request's blocks, signed as ``offer_id``, for at most ``cap_s``."""
        self._asked.pop(request_id, None)
        self.table.retain(request_id, offer_id, num_blocks, cap_s)

    def finished(self, request_id: str) -> None:
        """A request ended without being retained."""
        self._asked.pop(request_id, None)

    def freed(self, request_ids: Iterable[str], recorder: RetentionRecorder) -> None:
        """vLLM's worker freed these requests' blocks (read, capped or freed by the table)."""
        for request_id in request_ids:
            self._freeing_for_pressure.discard(request_id)
            if reason := self.table.forget(request_id):
                recorder.record_free(reason)

    def forget(self, request_ids: Iterable[str]) -> None:
        """vLLM's worker freed these requests' blocks; nothing to count (prefill's offers)."""
        for request_id in request_ids:
            self.table.forget(request_id)

    def due(self, preempted: bool, shutting_down: bool, recorder: RetentionRecorder) -> list[str]:
        """The retentions to free this step, making room first if live requests wait."""
        if shutting_down:
            self._release_for_shutdown()
        if preempted:
            self._pressure_blocks = max(self._pressure_blocks, 1)
        if self._pressure_blocks and not self._freeing_for_pressure:
            self.table.release_for_pressure(self._pressure_blocks)
        self._pressure_blocks = 0
        due: list[str] = []
        for request_id, reason in self.table.take_due():
            due.append(request_id)
            recorder.record_free(reason)
            if reason is FreeReason.PRESSURE:
                self._freeing_for_pressure.add(request_id)
        return due

    def _release_for_shutdown(self) -> None:
        """Engine shutting down: release every retention (logged once)."""
        if not self._released_for_shutdown:
            self._released_for_shutdown = True
            logger.info(
                "Engine shutting down: releasing the %d retained requests' KV (%d blocks); "
                "their conversations recompute on another decode",
                len(self.table),
                self.table.held_blocks(),
            )
        self.table.release_all(FreeReason.SHUTDOWN)

    def report(self, recorder: RetentionRecorder) -> None:
        """Count the claims answered, the lease port's connections closed at a limit and the
        retentions held since the last report."""
        self.report_service(recorder)
        retained = (len(self.table), self.table.held_blocks())
        if retained != self._retained_seen:
            self._retained_seen = retained
            recorder.record_retained(*retained)

    def report_service(self, recorder: RetentionRecorder) -> None:
        """Count the claims answered and the lease port's connections closed at a limit since
        the last report (prefill's offers to decode are no retentions: only this)."""
        while self._claim_answers:
            recorder.record_claim(self._claim_answers.popleft())
        if self.service is not None:
            stats = self.service.connection_stats()
            closed = (stats.closed_on_deadline, stats.refused_at_bound)
            for reason, now, before in zip(
                LEASE_CLOSE_REASONS, closed, self._closed_seen, strict=True
            ):
                if now > before:
                    recorder.record_lease_connections_closed(reason, now - before)
            self._closed_seen = closed
