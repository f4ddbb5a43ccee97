"""The retainer half of the connector without vLLM: decode's leases kept, claimed and freed."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from disagg_connector.lease_service import ClaimTarget, claim
from disagg_connector.retainer import GRANTED, Retainer
from disagg_connector.retention import FreeReason, RetentionTable
from disagg_contract import LEASE_CALL_TIMEOUT_S

BLOCK = 4


@dataclass
class Recorder:
    """Collects what the retainer counts."""

    frees: list[FreeReason] = field(default_factory=list)
    claims: list[str] = field(default_factory=list)
    retained: list[tuple[int, int]] = field(default_factory=list)

    def record_free(self, reason: FreeReason) -> None:
        self.frees.append(reason)

    def record_claim(self, outcome: str) -> None:
        self.claims.append(outcome)

    def record_retained(self, requests: int, blocks: int) -> None:
        self.retained.append((requests, blocks))

    def record_lease_connections_closed(self, reason: str, count: int) -> None:
        """Checked in the test of the port's limits."""


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def retainer(clock: Clock | None = None, wake: list[int] | None = None) -> Retainer:
    table = RetentionTable(10.0, 4.0, clock=clock or Clock(), min_hold_s=1.0)
    woken = wake if wake is not None else []
    return Retainer(table, BLOCK, lambda: woken.append(1))


def test_claims_on_the_lease_port_are_counted_and_the_retention_reported() -> None:
    kept = retainer()
    kept.serve("127.0.0.1", 0, "engine-secret")
    try:
        kept.retain("turn-1", "offer-1", 5, 60.0)
        target = ClaimTarget("127.0.0.1", kept.lease_key()["port"], "turn-1", "offer-1")
        assert claim(target, "prefill-a:r1", "engine-secret").granted
        refused = claim(target, "prefill-b:r1", "engine-secret")
        assert not isinstance(refused, str) and not refused.granted
    finally:
        kept.stop()
    recorder = Recorder()
    kept.report(recorder)
    assert recorder.claims == [GRANTED, "claimed"]
    assert recorder.retained == [(1, 5)]
    kept.report(recorder)
    assert recorder.retained == [(1, 5)], "an unchanged retention is reported once"


def test_a_request_asked_again_makes_retained_kv_give_way() -> None:
    clock = Clock()
    kept = retainer(clock)
    kept.retain("old", "o", 3, 60.0)
    kept.retain("new", "n", 3, 60.0)
    clock.now = 1.0
    kept.table.renew("new", "n")
    kept.asked("live", num_tokens=10, num_computed_tokens=0)
    recorder = Recorder()
    assert kept.due(False, False, recorder) == []
    kept.asked("live", num_tokens=10, num_computed_tokens=0)
    assert kept.due(False, False, recorder) == ["old"], "3 blocks make room for 10 tokens"
    assert recorder.frees == [FreeReason.PRESSURE]
    kept.freed(["old"], recorder)
    assert recorder.frees == [FreeReason.PRESSURE], "a retention it freed is counted once"


def test_a_preemption_frees_the_least_recently_made_retention() -> None:
    kept = retainer()
    kept.retain("a", "oa", 2, 60.0)
    kept.retain("b", "ob", 2, 60.0)
    recorder = Recorder()
    assert kept.due(True, False, recorder) == ["a"]


def test_a_shutdown_releases_every_retention_but_a_claims_hold() -> None:
    clock = Clock()
    kept = retainer(clock)
    kept.retain("held", "h", 2, 60.0)
    kept.retain("idle", "i", 2, 60.0)
    assert kept.table.claim("held", "h", "prefill-a:r").granted
    recorder = Recorder()
    assert kept.due(False, True, recorder) == ["idle"]
    clock.now = 5.0
    assert kept.due(False, True, recorder) == ["held"]
    assert recorder.frees == [FreeReason.SHUTDOWN, FreeReason.SHUTDOWN]


def test_vllm_freeing_a_read_retention_counts_it_read() -> None:
    kept = retainer()
    kept.retain("turn", "t", 2, 60.0)
    recorder = Recorder()
    kept.freed(["turn", "never-retained"], recorder)
    assert recorder.frees == [FreeReason.READ]


def test_lease_connections_closed_at_a_limit_are_reported_once() -> None:
    """A connection that never sends its call is closed at the deadline and counted."""
    kept = retainer()
    kept.serve("127.0.0.1", 0, None)
    recorder = ClosedRecorder()
    try:
        port = kept.lease_key()["port"]
        with socket.create_connection(("127.0.0.1", port)) as stalled:
            stalled.sendall(b"POST /disagg/v1/leases/claim HTTP/1.1\r\n")
            stalled.settimeout(LEASE_CALL_TIMEOUT_S + 3)
            assert stalled.recv(1) == b"", "the port closes the stalled connection"
        kept.report(recorder)
        kept.report(recorder)
    finally:
        kept.stop()
    assert recorder.closed == [("deadline", 1)]


@dataclass
class ClosedRecorder(Recorder):
    closed: list[tuple[str, int]] = field(default_factory=list)

    def record_lease_connections_closed(self, reason: str, count: int) -> None:
        self.closed.append((reason, count))
