"""Decode's retentions as leases and claims, and the lease service that serves them."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from disagg_connector.lease_service import ClaimTarget, LeaseService, answer, claim
from disagg_connector.retention import ClaimRefusal, FreeReason, Grant, RetentionTable
from disagg_contract import (
    LEASE_CLAIM_PATH,
    LEASE_RELEASE_PATH,
    LEASE_RENEW_PATH,
    ClaimCall,
    ClaimReply,
    LeaseName,
    ReleaseCall,
    ReleasedLease,
    ReleaseReply,
    RenewCall,
    RenewReply,
)

TERM_S, HOLD_S, MIN_HOLD_S, CAP_S = 30.0, 10.0, 4.0, 480.0
GRANTED = Grant(True, hold_s=HOLD_S)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def table(clock: Clock) -> RetentionTable:
    return RetentionTable(TERM_S, HOLD_S, clock, min_hold_s=MIN_HOLD_S)


def test_lease_lapses_without_renewal_and_lives_with_it(
    table: RetentionTable, clock: Clock
) -> None:
    table.retain("a", "offer-a", 4, CAP_S)
    table.retain("b", "offer-b", 2, CAP_S)
    clock.now += TERM_S - 1
    assert table.renew("a", "offer-a")
    assert table.take_due() == []
    clock.now += 2
    assert table.take_due() == [("b", FreeReason.LEASE_LAPSED)]
    for _ in range(20):
        clock.now += TERM_S - 1
        assert table.renew("a", "offer-a"), "renewed leases live past the lease term"
    assert table.take_due() == [] and table.held_blocks() == 4
    assert not table.renew("b", "offer-b"), "a lapsed lease is gone"


def test_without_a_lease_term_only_the_cap_frees(clock: Clock) -> None:
    table = RetentionTable(None, HOLD_S, clock)
    table.retain("a", "offer-a", 4, CAP_S)
    clock.now += CAP_S - 1
    assert table.take_due() == []
    clock.now += 2
    assert table.forget("a") is FreeReason.CAPPED


def test_release_needs_the_offer_id(table: RetentionTable) -> None:
    table.retain("a", "offer-a", 4, CAP_S)
    assert not table.release("a", "guessed")
    assert table.take_due() == []
    assert table.release("a", "offer-a")
    assert not table.release("a", "offer-a")
    assert table.take_due() == [("a", FreeReason.RELEASED)]


def test_one_claimant_per_retention(table: RetentionTable, clock: Clock) -> None:
    table.retain("a", "offer-a", 4, CAP_S)
    assert table.claim("a", "offer-a", "prefill-0:r1") == GRANTED
    assert table.claim("a", "offer-a", "prefill-1:r9") == Grant(False, ClaimRefusal.CLAIMED)
    clock.now += 1
    assert table.claim("a", "offer-a", "prefill-0:r1") == GRANTED, "the claimant renews"
    assert table.claim("a", "other", "prefill-0:r1") == Grant(False, ClaimRefusal.UNKNOWN)
    assert table.forget("a") is FreeReason.READ
    assert table.claim("a", "offer-a", "prefill-0:r1") == Grant(False, ClaimRefusal.UNKNOWN)


def test_a_claim_holds_the_blocks_through_release_lapse_and_pressure(
    table: RetentionTable, clock: Clock
) -> None:
    table.retain("a", "offer-a", 4, CAP_S)
    assert table.claim("a", "offer-a", "p:r").granted
    assert table.release("a", "offer-a")
    table.release_for_pressure(100)
    clock.now += HOLD_S - 0.1
    assert table.take_due() == [], "freed inside the hold"
    assert table.claim("a", "offer-a", "p:r") == Grant(False, ClaimRefusal.RELEASED)
    clock.now += 0.2
    assert table.take_due() == [("a", FreeReason.RELEASED)]


def test_shutdown_releases_every_retention_still_held_and_keeps_a_claims_hold(
    table: RetentionTable, clock: Clock
) -> None:
    for name in ("claimed", "idle", "released"):
        table.retain(name, f"offer-{name}", 4, CAP_S)
    assert table.claim("claimed", "offer-claimed", "p:r").granted
    assert table.release("released", "offer-released")
    table.release_all(FreeReason.SHUTDOWN)
    assert table.claim("idle", "offer-idle", "p:r") == Grant(False, ClaimRefusal.RELEASED)
    assert sorted(table.take_due()) == [
        ("idle", FreeReason.SHUTDOWN),
        ("released", FreeReason.RELEASED),
    ]
    clock.now += HOLD_S
    assert table.take_due() == [("claimed", FreeReason.SHUTDOWN)], "after the read's hold"
    assert len(table) == 0


def test_released_before_the_claim_is_refused(table: RetentionTable) -> None:
    table.retain("a", "offer-a", 4, CAP_S)
    table.release("a", "offer-a")
    assert table.claim("a", "offer-a", "p:r") == Grant(False, ClaimRefusal.RELEASED)
    assert table.take_due() == [("a", FreeReason.RELEASED)]


def test_lapsed_lease_refuses_a_claim_before_it_is_swept(
    table: RetentionTable, clock: Clock
) -> None:
    table.retain("a", "offer-a", 4, CAP_S)
    clock.now += TERM_S
    assert table.claim("a", "offer-a", "p:r") == Grant(False, ClaimRefusal.RELEASED)


def test_no_hold_outlives_the_cap(table: RetentionTable, clock: Clock) -> None:
    table.retain("a", "offer-a", 4, CAP_S)
    clock.now += CAP_S - HOLD_S / 2
    assert table.renew("a", "offer-a")
    assert table.claim("a", "offer-a", "p:r") == Grant(True, hold_s=HOLD_S / 2)
    clock.now += HOLD_S / 2 - MIN_HOLD_S + 0.5
    assert table.claim("a", "offer-a", "p:r") == Grant(False, ClaimRefusal.EXPIRING)


def test_pressure_frees_least_recently_made_first_and_only_what_is_needed(
    table: RetentionTable, clock: Clock
) -> None:
    for name in "abcd":
        table.retain(name, f"offer-{name}", 3, CAP_S)
        clock.now += 1
    table.renew("a", "offer-a")  # a renewal is not a use
    assert table.claim("b", "offer-b", "p:r").granted
    table.release_for_pressure(4)
    due = table.take_due()
    assert due == [("a", FreeReason.PRESSURE), ("c", FreeReason.PRESSURE)]
    assert sorted(r.request_id for r in table._retained.values()) == ["b", "d"]


def _table_calls(table: RetentionTable) -> dict[str, Any]:
    table.retain("a", "offer-a", 1, CAP_S)
    table.retain("b", "offer-b", 1, CAP_S)
    renew = RenewCall(
        leases=[LeaseName(request="a", offer="offer-a"), LeaseName(request="z", offer="x")]
    )
    release = ReleaseCall(leases=[ReleasedLease(request="b", offer="offer-b", reason="idle")])
    return {
        "renewed": answer(table, LEASE_RENEW_PATH, renew),
        "released": answer(table, LEASE_RELEASE_PATH, release),
        "claimed": answer(
            table, LEASE_CLAIM_PATH, ClaimCall(request="b", offer="offer-b", claimant="c")
        ),
    }


def test_answers_to_each_call(table: RetentionTable) -> None:
    assert _table_calls(table) == {
        "renewed": RenewReply(gone=[LeaseName(request="z", offer="x")]),
        "released": ReleaseReply(released=1),
        "claimed": ClaimReply(granted=False, hold_s=0.0, reason="released"),
    }


@pytest.fixture
def service(table: RetentionTable) -> Iterator[tuple[LeaseService, list[str]]]:
    calls: list[str] = []
    service = LeaseService(
        table, "127.0.0.1", 0, "engine-secret", lambda path, _: calls.append(path)
    )
    service.start()
    yield service, calls
    service.stop()


def _post(port: int, path: str, body: bytes, token: str | None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize(
    ("path", "body", "token", "status"),
    [
        (LEASE_RENEW_PATH, b'{"leases": []}', None, 401),
        (LEASE_RENEW_PATH, b'{"leases": []}', "client-key", 401),
        (LEASE_RENEW_PATH, b"not json", "engine-secret", 400),
        (LEASE_RENEW_PATH, b"[1]", "engine-secret", 400),
        (LEASE_RENEW_PATH, b'{"leases": [["a", "b"]]}', "engine-secret", 400),
        (LEASE_RENEW_PATH, b'{"leases": [{"request": 1, "offer": "x"}]}', "engine-secret", 400),
        (LEASE_CLAIM_PATH, b'{"request": "a", "offer": "b"}', "engine-secret", 400),
        ("/elsewhere", b"{}", "engine-secret", 404),
        (LEASE_RENEW_PATH, b'{"leases": []}', "engine-secret", 200),
    ],
)
def test_the_service_refuses_what_it_cannot_take(
    service: tuple[LeaseService, list[str]], path: str, body: bytes, token: str | None, status: int
) -> None:
    lease_service, calls = service
    code, document = _post(lease_service.port, path, body, token)
    assert code == status, document
    assert calls == ([path] if status == 200 else [])


def test_claim_over_the_wire(
    service: tuple[LeaseService, list[str]], table: RetentionTable
) -> None:
    lease_service, calls = service
    table.retain("a", "offer-a", 1, CAP_S)
    target = ClaimTarget("127.0.0.1", lease_service.port, "a", "offer-a")
    assert claim(target, "p:1", "engine-secret") == GRANTED
    assert claim(target, "p:2", "engine-secret") == Grant(False, ClaimRefusal.CLAIMED)
    assert "401" in str(claim(target, "p:1", "wrong"))
    assert calls == [LEASE_CLAIM_PATH, LEASE_CLAIM_PATH]


def test_claim_to_nobody_is_an_answer_not_an_exception(
    service: tuple[LeaseService, list[str]],
) -> None:
    lease_service, _ = service
    port = lease_service.port
    lease_service.stop()
    answer_ = claim(ClaimTarget("127.0.0.1", port, "a", "offer-a"), "p:1", None)
    assert isinstance(answer_, str) and "no answer" in answer_


def test_seconds_until_due_follows_leases_and_holds(table: RetentionTable, clock: Clock) -> None:
    assert table.seconds_until_due() is None
    table.retain("a", "offer-a", 1, CAP_S)
    assert table.seconds_until_due() == TERM_S
    clock.now += 5
    assert table.claim("a", "offer-a", "p:r").granted
    table.release("a", "offer-a")
    assert table.seconds_until_due() == HOLD_S
    assert RetentionTable(None, HOLD_S, clock).seconds_until_due() is None
