"""Replica selection: least outstanding for prefill, conversation affinity for decode."""

from __future__ import annotations

import enum

from disagg_router.replicas import Replica, ReplicaPool


class Affinity(enum.StrEnum):
    """Why a decode replica was chosen."""

    NONE = "none"
    KEPT = "kept"
    OVERLOADED = "overloaded"
    UNHEALTHY = "unhealthy"
    GONE = "gone"


def choose_prefill(pool: ReplicaPool, exclude: tuple[Replica, ...] = ()) -> Replica | None:
    """The healthy prefill replica with the fewest requests in flight, outside ``exclude``."""
    return pool.least_outstanding(exclude)


def choose_decode(
    pool: ReplicaPool, previous_url: str | None, slack: int
) -> tuple[Replica | None, Affinity]:
    """Prefer the decode replica of the previous turn (its prefix cache holds the history).

    It is kept unless it left the pool, failed health, or has more than ``slack`` requests in
    flight beyond the least loaded replica; otherwise the least loaded replica is chosen.
    """
    best = pool.least_outstanding()
    if previous_url is None:
        return best, Affinity.NONE
    previous = pool.get(previous_url)
    if previous is None:
        return best, Affinity.GONE
    if not previous.healthy:
        return best, Affinity.UNHEALTHY
    if best is not None and previous.outstanding > best.outstanding + slack:
        return best, Affinity.OVERLOADED
    return previous, Affinity.KEPT
