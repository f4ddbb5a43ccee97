"""Active health checks of engine replicas, and the served-model list they report."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from disagg_contract import Role
from disagg_router.replicas import Replica, ReplicaPool
from disagg_router.upstream import EngineClient, UpstreamFailure

log = logging.getLogger(__name__)

_MAX_SLEEP_S = 0.25


class HealthChecker:
    """Polls ``/health`` of due replicas; failing ones back off exponentially. Draining
    replicas are not polled: a pod that is leaving is not a failed one.

    Successful decode checks also refresh the model list (``/v1/models``) that the router
    serves and validates ``model`` against.
    """

    def __init__(
        self,
        client: EngineClient,
        pools: tuple[ReplicaPool, ...],
        interval_s: float,
        timeout_s: float,
    ) -> None:
        self._client = client
        self._pools = pools
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self.models: list[dict[str, Any]] = []
        self.model_ids: frozenset[str] = frozenset()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Run checks in the background until ``stop``."""
        self._task = asyncio.create_task(self._run(), name="router-health")

    async def stop(self) -> None:
        """Cancel the background checks."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await self.check_due()
            await asyncio.sleep(self._until_next_check())

    def _until_next_check(self) -> float:
        """Seconds until the earliest scheduled check; short enough to notice replicas that
        requests marked failed meanwhile (their backoff may end before the interval does)."""
        now = time.monotonic()
        upcoming = [
            r.next_check - now for pool in self._pools for r in pool.members() if not r.draining
        ]
        return max(0.01, min([self._interval_s, _MAX_SLEEP_S, *upcoming]))

    async def check_due(self) -> None:
        """Check every replica whose check is due, concurrently."""
        now = time.monotonic()
        checks = [(pool, r) for pool in self._pools for r in pool.due(now)]
        await asyncio.gather(*(self._check(pool, replica) for pool, replica in checks))

    async def _check(self, pool: ReplicaPool, replica: Replica) -> None:
        try:
            status, _ = await self._client.get(replica.url + "/health", self._timeout_s)
            healthy = status == 200
        except UpstreamFailure:
            healthy = False
        if not healthy:
            if replica.healthy:
                log.warning("replica %s %s failed its health check", pool.role, replica.url)
            pool.mark_failed(replica)
            return
        if not replica.healthy:
            log.info("replica %s %s is healthy again", pool.role, replica.url)
        pool.mark_ok(replica)
        if pool.role is Role.DECODE:
            await self._refresh_models(replica)

    async def ensure_models(self) -> None:
        """Fetch the model list now from the first healthy decode replica that answers."""
        for pool in self._pools:
            if pool.role is not Role.DECODE:
                continue
            for replica in pool.available():
                if await self._refresh_models(replica):
                    return

    async def _refresh_models(self, replica: Replica) -> bool:
        try:
            status, content = await self._client.get(replica.url + "/v1/models", self._timeout_s)
            cards = json.loads(content).get("data") if status == 200 else None
        except (UpstreamFailure, ValueError, AttributeError):
            return False
        if not isinstance(cards, list) or not all(isinstance(c, dict) and "id" in c for c in cards):
            return False
        self.models = cards
        self.model_ids = frozenset(str(c["id"]) for c in cards)
        return True
