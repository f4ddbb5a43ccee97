"""Engine replicas per role: outstanding requests, health state, backoff and draining.

A replica whose endpoint is terminating (its pod is leaving: scale-down, rollout, eviction)
stays a member while it drains: it finishes the requests it has and takes no new one, and it
is not health-checked (a leaving pod is not a failed one).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from disagg_contract import Role


@dataclass(eq=False)
class Replica:
    """One engine server, addressed by its base URL."""

    url: str
    role: Role
    host: str = field(init=False)
    outstanding: int = 0
    healthy: bool = True
    failures: int = 0
    next_check: float = 0.0
    recovered_at: float = 0.0
    """Wall time of the last unhealthy -> healthy transition: KV retained before it may be gone."""
    draining: bool = False
    """Its endpoint is terminating: it finishes the requests in flight and takes no new one."""

    def __post_init__(self) -> None:
        self.host = urlsplit(self.url).hostname or ""


class ReplicaPool:
    """The current replicas of one role, kept in step with discovery."""

    def __init__(self, role: Role, interval_s: float, max_backoff_s: float) -> None:
        self.role = role
        self._interval_s = interval_s
        self._max_backoff_s = max_backoff_s
        self._replicas: dict[str, Replica] = {}
        self._turn = 0

    def set_urls(self, urls: Iterable[str], draining: Iterable[str] = ()) -> None:
        """Replace the membership, keeping the state of replicas that stay; the members also
        in ``draining`` are leaving (their endpoints are terminating)."""
        leaving = {url.rstrip("/") for url in draining}
        members: dict[str, Replica] = {}
        for url in dict.fromkeys(url.rstrip("/") for url in urls):
            replica = self._replicas.get(url) or Replica(url, self.role)
            replica.draining = url in leaving
            members[url] = replica
        self._replicas = members

    def get(self, url: str) -> Replica | None:
        """The replica at ``url`` if it is still a member."""
        return self._replicas.get(url)

    def members(self) -> list[Replica]:
        """Every member, healthy or not."""
        return list(self._replicas.values())

    def healthy(self) -> list[Replica]:
        """Members that passed their last health check."""
        return [r for r in self._replicas.values() if r.healthy]

    def available(self) -> list[Replica]:
        """Members that take new requests: healthy and not draining."""
        return [r for r in self._replicas.values() if r.healthy and not r.draining]

    def draining(self) -> list[Replica]:
        """Members that are leaving."""
        return [r for r in self._replicas.values() if r.draining]

    def least_outstanding(self, exclude: Iterable[Replica] = ()) -> Replica | None:
        """The available replica with the fewest requests in flight; ties rotate."""
        skip = set(exclude)
        candidates = [r for r in self.available() if r not in skip]
        if not candidates:
            return None
        self._turn += 1
        start = self._turn % len(candidates)
        rotated = candidates[start:] + candidates[:start]
        return min(rotated, key=lambda r: r.outstanding)

    def mark_failed(self, replica: Replica, now: float | None = None) -> None:
        """Take ``replica`` out of rotation until a health check passes (with backoff)."""
        replica.healthy = False
        replica.failures += 1
        backoff = min(self._interval_s * 2 ** (replica.failures - 1), self._max_backoff_s)
        replica.next_check = (time.monotonic() if now is None else now) + backoff

    def mark_ok(self, replica: Replica, now: float | None = None) -> None:
        """Put ``replica`` back in rotation."""
        if not replica.healthy:
            replica.recovered_at = time.time()
        replica.healthy = True
        replica.failures = 0
        replica.next_check = (time.monotonic() if now is None else now) + self._interval_s

    def due(self, now: float) -> list[Replica]:
        """Members whose next health check is due (draining ones are not checked)."""
        return [r for r in self._replicas.values() if r.next_check <= now and not r.draining]
