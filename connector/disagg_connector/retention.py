"""Decode's retained KV as leases: held while the router renews them, claimed once by a reader.

Decode retains a finished turn's blocks only when the router asks for it, and then only while
the retention pays:

- a lease: the retention lives ``lease_term_s`` past its last renewal (the router renews the
  leases of open conversations and releases the others), and never past the hard cap (the
  decoder TTL) counted from when it was made; without a lease term the cap alone applies
  (the fixed timer);
- live traffic first: under memory pressure the least recently made retentions are freed (a
  retention is made when its conversation's turn ends, so this is the least recently used);
- a claim: before prefill reads, it claims the retention; decode grants one reader per
  retention and, from the last grant, keeps the blocks for the hold it granted (at most
  ``hold_s``, never past the cap) whatever else happens, so a read that prefill starts within
  its trust window (half the hold, measured on prefill's own clock from before it asked) never
  sees freed blocks. A retention that was released, lapsed, freed, claimed by another reader
  or too close to its cap is refused, and prefill recomputes.

Pure logic, no vLLM, safe to call from the lease service's thread and the scheduler's loop.
All times are this process's ``time.perf_counter()``, the clock vLLM's worker frees blocks by.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass


class FreeReason(enum.StrEnum):
    """Why decode stopped holding a retention (the ``reason`` label of its release counter)."""

    READ = "read"
    """Prefill read it (or told decode it will not): vLLM's worker freed the blocks."""
    RELEASED = "released"
    """The router released it (superseded, evicted, lapsed, idle or closed)."""
    LEASE_LAPSED = "lease-lapsed"
    """No renewal within the lease term (a router that stopped renewing, or a lost entry)."""
    PRESSURE = "pressure"
    """Freed for live requests that needed decode's memory."""
    CAPPED = "capped"
    """The decoder TTL, the hard cap of one retention, ran out."""
    SHUTDOWN = "shutdown"
    """Decode is shutting down (its pod is leaving): no turn will read it again."""


class ClaimRefusal(enum.StrEnum):
    """Why a claim was refused (the ``outcome`` label of the claim counter besides granted)."""

    UNKNOWN = "unknown"
    """Decode holds no such retention: never made, already read or freed."""
    RELEASED = "released"
    """Released (by the router, the lease or memory pressure); the blocks go at the hold's end."""
    CLAIMED = "claimed"
    """Another reader claimed it first: an offer is read once."""
    EXPIRING = "expiring"
    """The hard cap comes before the shortest hold would end."""


@dataclass
class Retention:
    """One finished request's blocks decode keeps for a D->P read."""

    request_id: str
    offer_id: str
    num_blocks: int
    made_at: float
    renewed_at: float
    cap_at: float
    claimant: str | None = None
    hold_until: float = 0.0
    released: FreeReason | None = None


@dataclass(frozen=True)
class Grant:
    """The answer to a claim."""

    granted: bool
    refusal: ClaimRefusal | None = None
    hold_s: float = 0.0
    """How long decode holds the blocks past the grant (a granted claim only)."""


class RetentionTable:
    """Every retention decode holds, with its lease, its claim and what to free next."""

    def __init__(
        self,
        lease_term_s: float | None,
        hold_s: float,
        clock: Callable[[], float],
        min_hold_s: float = 0.0,
    ) -> None:
        """``lease_term_s`` None: no leases, a retention lives until read or capped.

        ``hold_s`` is the longest hold a claim gets, ``min_hold_s`` the shortest.
        """
        self.lease_term_s = lease_term_s
        self.hold_s = hold_s
        self.min_hold_s = min_hold_s
        self._clock = clock
        self._lock = threading.Lock()
        self._retained: dict[str, Retention] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._retained)

    def held_blocks(self) -> int:
        """Blocks the retentions hold now."""
        with self._lock:
            return sum(retention.num_blocks for retention in self._retained.values())

    def retain(self, request_id: str, offer_id: str, num_blocks: int, cap_s: float) -> None:
        """Start holding a finished request's blocks, for at most ``cap_s`` seconds."""
        now = self._clock()
        with self._lock:
            self._retained[request_id] = Retention(
                request_id, offer_id, num_blocks, made_at=now, renewed_at=now, cap_at=now + cap_s
            )

    def renew(self, request_id: str, offer_id: str) -> bool:
        """Extend a lease; False when decode no longer holds it (the router drops it)."""
        with self._lock:
            retention = self._find(request_id, offer_id)
            if retention is None or retention.released is not None:
                return False
            retention.renewed_at = self._clock()
            return True

    def release(self, request_id: str, offer_id: str) -> bool:
        """Release a retention the router will not offer again; False if not held."""
        with self._lock:
            retention = self._find(request_id, offer_id)
            if retention is None or retention.released is not None:
                return False
            retention.released = FreeReason.RELEASED
            return True

    def claim(self, request_id: str, offer_id: str, claimant: str) -> Grant:
        """Grant ``claimant`` the read of a held retention, or say why not."""
        now = self._clock()
        with self._lock:
            retention = self._find(request_id, offer_id)
            if retention is None:
                return Grant(False, ClaimRefusal.UNKNOWN)
            if retention.claimant not in (None, claimant):
                return Grant(False, ClaimRefusal.CLAIMED)
            if retention.released is not None or self._lapsed(retention, now):
                return Grant(False, ClaimRefusal.RELEASED)
            hold_s = min(self.hold_s, retention.cap_at - now)
            if hold_s < max(self.min_hold_s, 1e-9):
                return Grant(False, ClaimRefusal.EXPIRING)
            retention.claimant = claimant
            retention.hold_until = now + hold_s
            return Grant(True, hold_s=hold_s)

    def release_for_pressure(self, blocks_needed: int) -> None:
        """Release the least recently made unheld retentions until ``blocks_needed`` go.

        Renewals do not count as use: the router renews every open conversation alike.
        """
        now = self._clock()
        with self._lock:
            candidates = sorted(
                (
                    retention
                    for retention in self._retained.values()
                    if retention.released is None and retention.hold_until <= now
                ),
                key=lambda retention: retention.made_at,
            )
            released = 0
            for retention in candidates:
                if released >= blocks_needed:
                    break
                retention.released = FreeReason.PRESSURE
                released += retention.num_blocks

    def release_all(self, reason: FreeReason) -> None:
        """Release every retention still held; a claim's hold still keeps its blocks."""
        with self._lock:
            for retention in self._retained.values():
                if retention.released is None:
                    retention.released = reason

    def seconds_until_due(self) -> float | None:
        """How long until the next retention may come due by itself (None: none will)."""
        now = self._clock()
        deadlines = []
        with self._lock:
            for retention in self._retained.values():
                if retention.released is not None:
                    deadlines.append(retention.hold_until)
                elif self.lease_term_s is not None:
                    deadlines.append(
                        max(retention.renewed_at + self.lease_term_s, retention.hold_until)
                    )
        return max(min(deadlines) - now, 0.0) if deadlines else None

    def take_due(self) -> list[tuple[str, FreeReason]]:
        """The retentions to free now (released or lapsed, and past any claim's hold)."""
        now = self._clock()
        due: list[tuple[str, FreeReason]] = []
        with self._lock:
            for retention in list(self._retained.values()):
                reason = retention.released
                if reason is None and self._lapsed(retention, now):
                    reason = FreeReason.LEASE_LAPSED
                if reason is not None and retention.hold_until <= now:
                    del self._retained[retention.request_id]
                    due.append((retention.request_id, reason))
        return due

    def forget(self, request_id: str) -> FreeReason | None:
        """vLLM freed the blocks (read, or the cap): why, or None if freed by this table."""
        now = self._clock()
        with self._lock:
            retention = self._retained.pop(request_id, None)
        if retention is None:
            return None
        return FreeReason.CAPPED if retention.cap_at <= now else FreeReason.READ

    def _find(self, request_id: str, offer_id: str) -> Retention | None:
        retention = self._retained.get(request_id)
        if retention is None or retention.offer_id != offer_id:
            return None
        return retention

    def _lapsed(self, retention: Retention, now: float) -> bool:
        if self.lease_term_s is None:
            return False
        return now >= retention.renewed_at + self.lease_term_s
