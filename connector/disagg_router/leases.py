"""The leases the router holds on decode's retained KV: renewed while a conversation is active,
released as soon as no turn will read them.

Decode retains a turn's KV only when the router asks (``RETAIN_KEY``, on turns with a
conversation id) and names the retention in its offer: ``LEASE_KEY`` (its lease service's port),
``remote_host``, ``remote_request_id`` and the signed envelope's offer id. The router keeps one
lease per conversation in a ``LeaseBook``. Every renewal period it renews, in one call per
decode, the leases of conversations that had a turn within the idle timeout; it releases a
conversation idle past that timeout (and drops its stored entry: the next turn recomputes), one
held on a decode replica that is draining (likewise), one whose entry outlived its expiry, one
its store evicted, one the client closed, and the lease a turn took once the turn committed a
new one. A renewal's ``gone`` names leases decode no longer holds (freed under memory pressure,
or read by a turn another router served); those are dropped with their entry.

No turn waits for a lease call: releases are queued and sent by a background task, renewals run
in another, each call within ``LEASE_CALL_TIMEOUT_S``, and a failed call is only counted (decode
frees a lease that is neither renewed nor released at the end of its term). Each router holds the
leases of the turns it committed; with routers sharing a store, a later turn served by another
router releases this router's lease or leaves decode reporting it gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from disagg_contract import (
    LEASE_CALL_TIMEOUT_S,
    LEASE_KEY,
    LEASE_RELEASE_PATH,
    LEASE_RENEW_PATH,
    MAX_LEASES_PER_CALL,
    OFFER_KEY,
    LeaseName,
    ReleaseCall,
    ReleasedLease,
    ReleaseReason,
    RenewCall,
    RenewReply,
    renewal_period_s,
)
from disagg_router.conversation import TurnEntry
from disagg_router.metrics import GONE, RouterMetrics
from disagg_router.payloads import dumps, json_object
from disagg_router.stores import ConversationStore
from disagg_router.upstream import EngineClient, UpstreamFailure

log = logging.getLogger("disagg.router.leases")


@dataclass(frozen=True)
class Lease:
    """One retention on decode: the lease service that holds it and the name it has there."""

    service: str
    request: str
    offer: str

    def name(self) -> LeaseName:
        """How the lease service names it."""
        return LeaseName(request=self.request, offer=self.offer)

    def released(self, reason: ReleaseReason) -> ReleasedLease:
        """How a release names it."""
        return ReleasedLease(request=self.request, offer=self.offer, reason=reason.value)


def lease_of(params: Mapping[str, Any] | None) -> Lease | None:
    """The lease decode's offer ``params`` name (after ``routable``), or None without one."""
    if params is None:
        return None
    lease, envelope = params.get(LEASE_KEY), params.get(OFFER_KEY)
    host, request = params.get("remote_host"), params.get("remote_request_id")
    port = lease.get("port") if isinstance(lease, dict) else None
    offer = envelope.get("id") if isinstance(envelope, dict) else None
    if not (
        isinstance(port, int)
        and not isinstance(port, bool)
        and 0 < port < 65536
        and isinstance(host, str)
        and host
        and isinstance(request, str)
        and isinstance(offer, str)
    ):
        return None
    address = f"[{host}]" if ":" in host else host
    return Lease(f"http://{address}:{port}", request, offer)


@dataclass
class _Held:
    """A lease the router holds for a conversation: the turn that committed it, when its entry
    expires (wall clock), when the conversation last had a turn (monotonic clock), the decode
    replica that holds the KV and whether a turn started since (its end settles the lease)."""

    lease: Lease
    seq: int
    expires_at: float
    active_at: float
    decode_url: str
    in_turn: bool = False


class LeaseBook:
    """The leases of this router's conversations, by conversation key; renewed and released by
    two background tasks between ``start`` and ``stop``."""

    def __init__(
        self,
        engines: EngineClient,
        store: ConversationStore,
        metrics: RouterMetrics,
        idle_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        draining: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        """``draining`` names the URLs of the decode replicas that are leaving."""
        self._engines = engines
        self._store = store
        self._metrics = metrics
        self._idle_timeout_s = idle_timeout_s
        self._period_s = renewal_period_s(idle_timeout_s)
        self._clock = clock
        self._draining = draining
        self._held: dict[str, _Held] = {}
        self._releases: list[tuple[Lease, ReleaseReason]] = []
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def __len__(self) -> int:
        return len(self._held)

    def start(self) -> None:
        """Start renewing and releasing in the background."""
        self._tasks = [
            asyncio.create_task(self._renew_loop(), name="router-lease-renewals"),
            asyncio.create_task(self._release_loop(), name="router-lease-releases"),
        ]

    async def stop(self) -> None:
        """Stop the background tasks, then send the releases still queued."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._send_releases()

    def touch(self, key: str) -> None:
        """A turn of conversation ``key`` started: its lease counts as active."""
        held = self._held.get(key)
        if held is not None:
            held.active_at = self._clock()
            held.in_turn = True

    def turn_finished(
        self,
        key: str,
        seq: int,
        taken: TurnEntry | None,
        offered: TurnEntry | None,
        stored: bool | None,
    ) -> None:
        """Turn ``seq`` of conversation ``key`` answered: the entry it ``taken`` at its start and
        any older lease held for ``key`` are superseded; decode's new ``offered`` entry is held
        when the store kept it (``stored``), superseded when a newer turn won, and left to lapse
        on decode when the store could not be reached (None)."""
        superseded: set[Lease] = set()
        if taken is not None and (lease := lease_of(taken.kv_transfer_params)) is not None:
            superseded.add(lease)
        held = self._held.get(key)
        if held is not None and held.seq < seq:
            superseded.add(held.lease)
            del self._held[key]
        new = lease_of(offered.kv_transfer_params) if offered is not None else None
        if new is not None and offered is not None and stored is not None:
            if stored:
                self._held[key] = _Held(
                    new, seq, offered.expires_at, self._clock(), offered.decode_url
                )
                superseded.discard(new)
            else:
                superseded.add(new)
        for lease in superseded:
            self.release(lease, ReleaseReason.SUPERSEDED)

    def evicted(self, key: str) -> None:
        """The store evicted conversation ``key``: release its lease."""
        held = self._held.pop(key, None)
        if held is not None:
            self.release(held.lease, ReleaseReason.EVICTED)

    def close(self, key: str, entry: TurnEntry | None) -> bool:
        """The client closed conversation ``key``: release the lease held for it and the one its
        stored ``entry`` names (another router's, with a shared store); whether this router
        held one."""
        closed: set[Lease] = set()
        held = self._held.pop(key, None)
        if held is not None:
            closed.add(held.lease)
        if entry is not None and (lease := lease_of(entry.kv_transfer_params)) is not None:
            closed.add(lease)
        for lease in closed:
            self.release(lease, ReleaseReason.CLOSED)
        return held is not None

    def release(self, lease: Lease, reason: ReleaseReason) -> None:
        """Count ``lease`` released and queue the call that tells decode."""
        self._metrics.lease_released(reason.value)
        self._releases.append((lease, reason))
        self._wake.set()

    async def sweep(self) -> None:
        """One renewal pass: release what lapsed, went idle or is on a draining decode (unless
        a turn in flight will supersede it), renew the rest but those on a draining decode (one
        call per lease service and MAX_LEASES_PER_CALL leases), drop what decode reports gone."""
        now, wall = self._clock(), time.time()
        draining = set(self._draining())
        renewals: dict[str, list[tuple[str, _Held]]] = {}
        drops: list[tuple[str, int]] = []
        for key, held in list(self._held.items()):
            if held.expires_at <= wall:
                del self._held[key]
                self.release(held.lease, ReleaseReason.LAPSED)
                continue
            leaving = held.decode_url in draining
            if (leaving and not held.in_turn) or now - held.active_at >= self._idle_timeout_s:
                del self._held[key]
                self.release(held.lease, ReleaseReason.DRAINED if leaving else ReleaseReason.IDLE)
                drops.append((key, held.seq))
            elif not leaving:
                renewals.setdefault(held.lease.service, []).append((key, held))
        await asyncio.gather(
            *(
                self._renew(service, batch[start : start + MAX_LEASES_PER_CALL])
                for service, batch in renewals.items()
                for start in range(0, len(batch), MAX_LEASES_PER_CALL)
            ),
            *(self._drop(key, seq) for key, seq in drops),
        )

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self._period_s)
            try:
                await self.sweep()
            except Exception:
                log.exception("lease renewal pass failed")

    async def _release_loop(self) -> None:
        while True:
            await self._wake.wait()
            try:
                await self._send_releases()
            except Exception:
                log.exception("lease releases failed")

    async def _send_releases(self) -> None:
        """Send every queued release, one call per lease service and MAX_LEASES_PER_CALL leases."""
        self._wake.clear()
        queued, self._releases = self._releases, []
        batches: dict[str, list[ReleasedLease]] = {}
        for lease, reason in queued:
            batches.setdefault(lease.service, []).append(lease.released(reason))
        await asyncio.gather(
            *(
                self._call(
                    service + LEASE_RELEASE_PATH,
                    ReleaseCall(leases=leases[start : start + MAX_LEASES_PER_CALL]),
                    "release",
                )
                for service, leases in batches.items()
                for start in range(0, len(leases), MAX_LEASES_PER_CALL)
            )
        )

    async def _renew(self, service: str, batch: list[tuple[str, _Held]]) -> None:
        """Renew one lease service's leases; drop those it reports gone."""
        body = RenewCall(leases=[held.lease.name() for _, held in batch])
        reply = await self._call(service + LEASE_RENEW_PATH, body, "renew")
        if reply is None:
            return
        renewed = _renew_reply(reply)
        if renewed is None:
            self._failed("renew", "bad_reply", f"{service}: no gone list")
            return
        names = {(name["request"], name["offer"]) for name in renewed["gone"]}
        drops = []
        for key, held in batch:
            lease = held.lease
            if (lease.request, lease.offer) in names and self._held.get(key) is held:
                del self._held[key]
                self._metrics.lease_released(GONE)
                drops.append(self._drop(key, held.seq))
        await asyncio.gather(*drops)

    async def _drop(self, key: str, seq: int) -> None:
        """Remove the entry of a released lease from the store (a newer one stays)."""
        try:
            await self._store.drop(key, seq)
        except Exception as exc:
            self._metrics.store_errors.labels("drop").inc()
            log.warning("conversation store drop failed: %s: %s", type(exc).__name__, exc)

    async def _call(
        self, url: str, body: RenewCall | ReleaseCall, call: str
    ) -> dict[str, Any] | None:
        """POST ``body`` to a lease service; its JSON reply, or None (counted) on failure."""
        try:
            status, content = await self._engines.call(url, dumps(body), LEASE_CALL_TIMEOUT_S)
        except UpstreamFailure as exc:
            self._failed(call, exc.kind, f"{url}: {exc}")
            return None
        if status != 200:
            self._failed(call, f"http_{status}", f"{url}: {content[:200]!r}")
            return None
        reply = json_object(content)
        if reply is None:
            self._failed(call, "bad_reply", f"{url}: {content[:200]!r}")
        return reply

    def _failed(self, call: str, kind: str, detail: str) -> None:
        self._metrics.lease_call_failures.labels(call, kind).inc()
        log.warning("lease %s failed (%s): %s", call, kind, detail)


def _renew_reply(reply: Mapping[str, Any]) -> RenewReply | None:
    """A renewal's reply as a RenewReply (names that are not two strings left out), or None
    when it has no ``gone`` list."""
    gone = reply.get("gone")
    if not isinstance(gone, list):
        return None
    names = [name for name in gone if isinstance(name, dict)]
    return RenewReply(
        gone=[
            LeaseName(request=name["request"], offer=name["offer"])
            for name in names
            if isinstance(name.get("request"), str) and isinstance(name.get("offer"), str)
        ]
    )
