"""A reader's claims on the KV another engine offers, asked and answered off vLLM's scheduling
thread.

Before an engine reads the blocks another offers (prefill decode's retained KV, D->P; decode
prefill's KV of its prompt, P->D) it claims them on the issuer's lease service (see
:mod:`lease_service`). The claim is sent when the request arrives, on a small pool of
threads, and the scheduler only looks at the answer: a request whose claim is still out waits
in vLLM's queue (the connector answers "not yet" for it) while every other request is
scheduled as usual. A claim unanswered after :data:`CLAIM_DEADLINE_S` counts as refused, so
the request recomputes; and an issuer that left a claim unanswered that long is stalled: while
a claim to it is out, its other claims are refused at once, without a thread, and the next
claim after that probes it again. An issuer that hangs thus costs only the requests that
wanted its KV, each at most the deadline, and holds at most one thread.
Pure logic, no vLLM.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from disagg_connector.lease_service import ClaimTarget
from disagg_connector.retention import Grant

CLAIM_DEADLINE_S = 0.25
"""Longest a request waits for the issuer's answer to its claim before it recomputes instead."""
CLAIM_WORKERS = 8
"""Threads that send claims; each gives up at the deadline too, so an issuer that hangs holds
a thread no longer than the request it was sent for waits."""

Answer = Grant | str
"""The issuer's grant, or why no grant came (a refusal, an error or no answer in time)."""
ClaimFunction = Callable[[ClaimTarget, str, str | None, float], Answer]
"""Sends one claim (target, claimant, credential, seconds it may take): :func:`claim`."""


@dataclass
class _Claim:
    target: ClaimTarget
    sent_at: float
    future: Future[Answer] | None = None
    answer: Answer | None = None


@dataclass
class _Peer:
    """What the desk knows about one issuer's lease service."""

    stalled: bool = False
    out: set[str] = field(default_factory=set)


class ClaimDesk:
    """Sends claims in the background and tells the scheduler how each one stands."""

    def __init__(
        self,
        credential: str | None,
        send: ClaimFunction,
        deadline_s: float = CLAIM_DEADLINE_S,
        workers: int = CLAIM_WORKERS,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._credential = credential
        self._send = send
        self.deadline_s = deadline_s
        self._clock = clock
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="disagg-claim")
        self._lock = threading.RLock()  # cancelling a claim runs its callback at once
        self._claims: dict[str, _Claim] = {}
        self._peers: dict[tuple[str, int], _Peer] = {}

    def ask(self, key: str, target: ClaimTarget, claimant: str) -> None:
        """Send a claim for ``key`` (replacing any earlier one), unless its issuer is stalled
        and already has a claim out."""
        peer_key = (target.host, target.port)
        with self._lock:
            self._forget(key)
            claim = _Claim(target, self._clock())
            self._claims[key] = claim
            peer = self._peers.setdefault(peer_key, _Peer())
            if peer.stalled and peer.out:
                claim.answer = (
                    f"{target.host}:{target.port} left a claim unanswered for "
                    f"{self.deadline_s * 1000:.0f} ms; not asked until it answers again"
                )
                return
            peer.out.add(key)
        claim.future = self._pool.submit(
            self._send, target, claimant, self._credential, self.deadline_s
        )
        claim.future.add_done_callback(lambda done: self._answered(peer_key, key, done))

    def answer(self, key: str) -> Answer | None:
        """The answer to ``key``'s claim, or None while it may still come in time."""
        with self._lock:
            claim = self._claims.get(key)
            if claim is None:
                return "no claim was sent"
            if claim.answer is not None:
                return claim.answer
            assert claim.future is not None
            if claim.future.done():
                claim.answer = claim.future.result()
                return claim.answer
            if self._clock() - claim.sent_at < self.deadline_s:
                return None
            peer = self._peers[(claim.target.host, claim.target.port)]
            peer.stalled = True
            claim.answer = (
                f"no answer from {claim.target.host}:{claim.target.port} "
                f"within {self.deadline_s * 1000:.0f} ms"
            )
            return claim.answer

    def sent_at(self, key: str) -> float | None:
        """When ``key``'s claim was sent (this desk's clock), or None without a claim."""
        with self._lock:
            claim = self._claims.get(key)
            return None if claim is None else claim.sent_at

    def drop(self, key: str) -> None:
        """Forget ``key``'s claim (its request was scheduled or finished)."""
        with self._lock:
            self._forget(key)

    def stalled(self) -> list[str]:
        """The issuers (``host:port``) that left a claim unanswered and answered none since."""
        with self._lock:
            return [f"{host}:{port}" for (host, port), peer in self._peers.items() if peer.stalled]

    def close(self) -> None:
        """Stop the threads; claims still out are abandoned."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _answered(self, peer_key: tuple[str, int], key: str, done: Future[Answer]) -> None:
        """A claim's thread ended: a grant or refusal from the issuer clears its stall, no answer
        sets it."""
        with self._lock:
            peer = self._peers.get(peer_key)
            if peer is None:
                return
            if not done.cancelled():
                peer.stalled = not isinstance(done.result(), Grant)
            peer.out.discard(key)
            if not peer.out and not peer.stalled:
                del self._peers[peer_key]

    def _forget(self, key: str) -> None:
        claim = self._claims.pop(key, None)
        if claim is not None and claim.future is not None:
            claim.future.cancel()
