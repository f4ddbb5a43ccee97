"""Routing strategies: which replica of a pool serves a turn, behind one interface.

Decode's prefix cache holds the conversation so far, and so does prefill's when it keeps one
(vLLM's default): the replica of the previous turn is kept while it stays healthy, is not
draining and is not much busier than the others (``ConversationAffinity``), and reads from
decode cover what that prefill lacks. A prefill without a prefix cache has no state worth
returning to, so the least loaded replica is taken (``LeastOutstanding``). A draining replica
(its pod is leaving) is never chosen: the conversation moves to another.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from disagg_router.replicas import Replica, ReplicaPool


class Affinity(enum.StrEnum):
    """Why a replica was chosen for a conversation's turn."""

    NONE = "none"
    KEPT = "kept"
    OVERLOADED = "overloaded"
    UNHEALTHY = "unhealthy"
    GONE = "gone"
    DRAINING = "draining"
    """The previous turn's replica is leaving: the conversation moves to another replica."""


@dataclass(frozen=True)
class Choice:
    """The replica chosen (None when no available one is left) and why."""

    replica: Replica | None
    affinity: Affinity = Affinity.NONE


class RoutingStrategy(Protocol):
    """Chooses the replica of ``pool`` for a turn."""

    def choose(
        self,
        pool: ReplicaPool,
        previous_url: str | None = None,
        exclude: Collection[Replica] = (),
    ) -> Choice:
        """An available replica outside ``exclude`` for a turn whose conversation last ran on
        ``previous_url`` (None: no previous turn, or one that does not matter)."""
        ...


class LeastOutstanding:
    """The available replica with the fewest requests in flight; ties rotate."""

    def choose(
        self,
        pool: ReplicaPool,
        previous_url: str | None = None,
        exclude: Collection[Replica] = (),
    ) -> Choice:
        """The least loaded replica, whatever ran the conversation before."""
        return Choice(pool.least_outstanding(exclude))


class ConversationAffinity:
    """The replica of the conversation's previous turn, unless it left the pool, is draining,
    failed its health check (or is excluded), or has more than ``slack`` requests in flight
    beyond the least loaded replica; otherwise the least loaded replica."""

    def __init__(self, slack: int) -> None:
        self._slack = slack

    def choose(
        self,
        pool: ReplicaPool,
        previous_url: str | None = None,
        exclude: Collection[Replica] = (),
    ) -> Choice:
        """The previous turn's replica when it is kept, else the least loaded one."""
        best = pool.least_outstanding(exclude)
        if previous_url is None:
            return Choice(best, Affinity.NONE)
        previous = pool.get(previous_url)
        if previous is None:
            return Choice(best, Affinity.GONE)
        if previous.draining:
            return Choice(best, Affinity.DRAINING)
        if not previous.healthy or previous in exclude:
            return Choice(best, Affinity.UNHEALTHY)
        if best is not None and previous.outstanding > best.outstanding + self._slack:
            return Choice(best, Affinity.OVERLOADED)
        return Choice(previous, Affinity.KEPT)
