"""The router's side of decode leases (issue 17), through the real router app in front of engine
stand-ins and a lease-service stand-in: retention asked for on conversation turns only,
renewals of active conversations, releases (idle, superseded, evicted, lapsed, closed), leases
decode reports gone, two routers on one Redis, the reuse summary, and lease calls that fail
without failing or slowing a turn."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from disagg_contract import (
    DEFAULT_IDLE_TIMEOUT_S,
    KV_TRANSFER_PARAMS,
    LEASE_RELEASE_PATH,
    LEASE_RENEW_PATH,
    OFFER_KEY,
    READ_REPORT_KEY,
    RETAIN_KEY,
    REUSE_SUMMARY_PATH,
    LeaseName,
    ReleasedLease,
    ReleaseReason,
    ReleaseReply,
    RenewReply,
    renewal_period_s,
)
from disagg_router import leases
from disagg_router.config import ConfigError, RouterConfig
from disagg_router.leases import lease_of
from engine_standin import MODEL, StandinState
from router_harness import RouterRig, SecretVolume, metric, redis_server, router_rig

CHAT = "/v1/chat/completions"
ENGINE_KEY = "sk-engine-lease-42"
KEYS = {"alice": "sk-alice-lease", "bob": "sk-bob-lease"}
NamePair = tuple[str, str]


@dataclass(frozen=True)
class LeaseCall:
    """One call the lease-service stand-in received."""

    at: float
    path: str
    body: dict[str, Any]
    authorization: str | None


class LeaseServiceStandIn:
    """A stand-in for decode's lease service (not the connector's): it answers renewals and
    releases of the leases a decode stand-in retained (``StandinState.retained``, released
    ones leave it) and records every call, and in ``malformed`` those whose leases do not have
    exactly the contract's fields. ``status`` and ``delay_s`` inject failures."""

    def __init__(self, decode: StandinState) -> None:
        self.decode = decode
        self.calls: list[LeaseCall] = []
        self.malformed: list[LeaseCall] = []
        self.status = 200
        self.delay_s = 0.0
        self._lock = threading.Lock()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length))
                call = LeaseCall(
                    time.monotonic(), self.path, body, self.headers.get("Authorization")
                )
                status, reply = stand_in.answer(call)
                if stand_in.delay_s:
                    time.sleep(stand_in.delay_s)
                content = json.dumps(reply).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(content)))
                    self.end_headers()
                    self.wfile.write(content)
                except ConnectionError:
                    pass  # the router stopped waiting (its call timed out)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        decode.lease_port = self.port

    def answer(self, call: LeaseCall) -> tuple[int, Mapping[str, object]]:
        """Record ``call``; renew reports the leases no longer retained, release frees."""
        shape = LeaseName if call.path == LEASE_RENEW_PATH else ReleasedLease
        with self._lock:
            self.calls.append(call)
            if any(set(lease) != shape.__required_keys__ for lease in call.body["leases"]):
                self.malformed.append(call)
        if self.status != 200:
            return self.status, {"error": "stand-in failure"}
        names = [(lease["request"], lease["offer"]) for lease in call.body["leases"]]
        if call.path == LEASE_RENEW_PATH:
            gone = [n for n in names if n not in self.decode.retained]
            return 200, RenewReply(gone=[LeaseName(request=r, offer=o) for r, o in gone])
        released = [n for n in names if n in self.decode.retained]
        self.decode.retained.difference_update(released)
        return 200, ReleaseReply(released=len(released))

    def renewed(self) -> list[NamePair]:
        """Every lease named in a renewal, in order."""
        return [n for call in self._of(LEASE_RENEW_PATH) for n, _ in _names(call)]

    def released(self) -> list[tuple[NamePair, str]]:
        """Every lease released, with its reason, in order."""
        return [(n, reason) for call in self._of(LEASE_RELEASE_PATH) for n, reason in _names(call)]

    def released_at(self, name: NamePair) -> float:
        """When ``name`` was first released (monotonic clock)."""
        calls = self._of(LEASE_RELEASE_PATH)
        return next(call.at for call in calls for n, _ in _names(call) if n == name)

    def _of(self, path: str) -> list[LeaseCall]:
        with self._lock:
            return [call for call in self.calls if call.path == path]

    def stop(self) -> None:
        """Close the port (connections refused afterwards)."""
        self._server.shutdown()
        self._server.server_close()


def _names(call: LeaseCall) -> list[tuple[NamePair, str]]:
    return [((x["request"], x["offer"]), x.get("reason", "")) for x in call.body["leases"]]


@contextmanager
def leased_rig(**overrides: Any) -> Iterator[tuple[RouterRig, LeaseServiceStandIn, httpx.Client]]:
    """One prefill and one decode stand-in, decode's lease service, and a router over them."""
    with router_rig(prefills=1, decodes=1, **overrides) as rig:
        lease = LeaseServiceStandIn(rig.decode[0].state)
        try:
            with httpx.Client(base_url=rig.routers[0].url, timeout=10) as client:
                yield rig, lease, client
            assert lease.malformed == [], "every lease call has the contract's fields"
        finally:
            lease.stop()


def turn(
    client: httpx.Client,
    conversation: str | None,
    content: str = "question about leases",
    *,
    stream: bool = False,
    key: str | None = None,
) -> float:
    """One chat turn; returns how long it took."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
    }
    if conversation is not None:
        body["conversation_id"] = conversation
    headers = {"Authorization": f"Bearer {key}"} if key is not None else None
    began = time.monotonic()
    response = client.post(CHAT, json=body, headers=headers)
    assert response.status_code == 200, response.text
    return time.monotonic() - began


def offered(rig: RouterRig) -> list[NamePair]:
    """Every lease decode offered, in order."""
    return list(rig.decode[0].state.offers)


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s:g} s for {what}"
        time.sleep(0.05)


def lookups(client: httpx.Client, result: str) -> float:
    return metric(client, "disagg_router_conversation_lookups_total", result=result)


def releases(client: httpx.Client, reason: str) -> float:
    return metric(client, "disagg_router_lease_releases_total", reason=reason)


def held(client: httpx.Client) -> float:
    return metric(client, "disagg_router_leases_held")


@pytest.mark.parametrize("stream", [False, True])
def test_decode_is_asked_to_retain_only_on_turns_with_a_conversation_id(stream: bool) -> None:
    with leased_rig() as (rig, _, client):
        turn(client, None, stream=stream)
        turn(client, "kept", stream=stream)
        decode = rig.decode[0].state
        asked = [body[KV_TRANSFER_PARAMS].get(RETAIN_KEY) for body in decode.received]
        assert asked == [None, True]
        assert len(decode.retained) == 1, "only the conversation's turn left KV on decode"
        assert held(client) == 1


def test_an_active_conversation_is_renewed_and_an_idle_one_released() -> None:
    idle_s = 2.0
    with leased_rig(idle_timeout_s=idle_s) as (rig, lease, client):
        turn(client, "a")
        committed = time.monotonic()
        (name,) = offered(rig)
        wait_until(lambda: name in lease.renewed(), 3 * renewal_period_s(idle_s), "a renewal")
        assert lease.released() == [], "renewed while active, not released"
        wait_until(lambda: lease.released() != [], idle_s + 3, "the idle release")
        assert lease.released() == [(name, ReleaseReason.IDLE.value)]
        assert lease.released_at(name) - committed >= idle_s
        assert (held(client), releases(client, "idle")) == (0, 1)
        reads = len(rig.prefill[0].state.reads)
        turn(client, "a")
        assert lookups(client, "miss") == 2, "the idle conversation's entry was dropped"
        assert len(rig.prefill[0].state.reads) == reads, "the next turn recomputed"


def test_the_next_turn_supersedes_the_lease_it_took() -> None:
    with leased_rig(idle_timeout_s=4.0) as (rig, lease, client):
        turn(client, "s", "first question")
        turn(client, "s", "second question")
        first, second = offered(rig)
        wait_until(lambda: lease.released() != [], 3, "the superseded release")
        assert lease.released() == [(first, ReleaseReason.SUPERSEDED.value)]
        assert rig.decode[0].state.retained == {second}
        assert lookups(client, "hit") == 1, "the second turn read the first one's KV"
        assert (held(client), releases(client, "superseded")) == (1, 1)
        wait_until(lambda: second in lease.renewed(), 3, "the new lease renewed")
        assert first not in lease.renewed(), "the superseded lease is no longer renewed"


def test_a_conversation_the_store_evicts_has_its_lease_released() -> None:
    with leased_rig(max_conversations=1) as (rig, lease, client):
        turn(client, "first")
        (evicted,) = offered(rig)
        turn(client, "second")
        wait_until(lambda: lease.released() != [], 3, "the eviction's release")
        assert lease.released() == [(evicted, ReleaseReason.EVICTED.value)]
        assert (held(client), releases(client, "evicted")) == (1, 1)


def test_an_entry_past_its_expiry_has_its_lease_released() -> None:
    with leased_rig(idle_timeout_s=4.0, conversation_ttl_s=0.5) as (rig, lease, client):
        turn(client, "short")
        (lapsed,) = offered(rig)
        wait_until(lambda: lease.released() != [], 3, "the lapse")
        assert lease.released() == [(lapsed, ReleaseReason.LAPSED.value)]
        assert (held(client), releases(client, "lapsed")) == (0, 1)


def test_a_lease_decode_reports_gone_is_dropped_with_its_entry() -> None:
    with leased_rig(idle_timeout_s=4.0) as (rig, lease, client):
        turn(client, "pressed")
        (freed,) = offered(rig)
        rig.decode[0].state.retained.clear()  # decode released it under memory pressure
        wait_until(lambda: releases(client, "gone") == 1, 3, "the gone lease dropped")
        assert held(client) == 0
        assert lease.released() == [], "decode no longer holds it: nothing to release"
        calls = len(lease.renewed())
        turn(client, "pressed")
        assert lookups(client, "miss") == 2, "its entry was dropped: the next turn recomputes"
        assert rig.prefill[0].state.reads == []
        wait_until(lambda: len(lease.renewed()) > calls, 3, "the next renewal")
        assert freed not in lease.renewed()[calls:]


def test_renewals_are_batched_per_decode_in_calls_of_bounded_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(leases, "MAX_LEASES_PER_CALL", 2)
    with leased_rig(idle_timeout_s=4.0) as (rig, lease, client):
        for conversation in ("x", "y", "z"):
            turn(client, conversation)
        names = set(offered(rig))
        wait_until(lambda: names <= set(lease.renewed()), 3, "every lease renewed")
        sizes = {len(c.body["leases"]) for c in lease.calls if c.path == LEASE_RENEW_PATH}
        assert max(sizes) == 2, "one call names several leases of a decode, at most the bound"


@pytest.fixture
def tenants(tmp_path: Path) -> Iterator[tuple[RouterRig, LeaseServiceStandIn, httpx.Client]]:
    """Client keys for alice and bob; engines (and the lease service) see only ENGINE_KEY."""
    volume = SecretVolume(tmp_path / "client-keys", KEYS)
    engine_key = SecretVolume(tmp_path / "engine-key", {"disagg-key": ENGINE_KEY})
    with leased_rig(
        engine_api_key=ENGINE_KEY,
        client_keys_dir=str(volume.path),
        engine_key_file=str(engine_key.path / "disagg-key"),
    ) as running:
        yield running


def close(client: httpx.Client, conversation: str, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else None
    return client.delete(f"/v1/conversations/{conversation}", headers=headers)


def test_the_client_closes_its_conversation_and_only_its_own(
    tenants: tuple[RouterRig, LeaseServiceStandIn, httpx.Client],
) -> None:
    rig, lease, client = tenants
    turn(client, "chat/1", key=KEYS["alice"])
    (name,) = offered(rig)
    assert close(client, "chat/1", None).status_code == 401
    refused = close(client, "chat/1", KEYS["bob"])
    assert refused.status_code == 404, "bob cannot close alice's conversation"
    assert refused.json()["error"]["code"] == "not_found"
    assert refused.headers["X-Request-Id"]
    time.sleep(0.3)
    assert lease.released() == [] and held(client) == 1
    assert close(client, "chat/1", KEYS["alice"]).status_code == 204
    wait_until(lambda: lease.released() != [], 3, "the closed release")
    assert lease.released() == [(name, ReleaseReason.CLOSED.value)]
    assert (held(client), releases(client, "closed")) == (0, 1)
    assert close(client, "chat/1", KEYS["alice"]).status_code == 404, "already closed"
    assert close(client, "never-opened", KEYS["alice"]).status_code == 404
    assert close(client, "%01", KEYS["alice"]).status_code == 400
    turn(client, "chat/1", key=KEYS["alice"])
    assert lookups(client, "miss") == 2, "a closed conversation starts afresh"
    assert {call.authorization for call in lease.calls} == {f"Bearer {ENGINE_KEY}"}


def test_the_reuse_summary_is_open_and_matches_the_metrics(
    tenants: tuple[RouterRig, LeaseServiceStandIn, httpx.Client],
) -> None:
    rig, lease, client = tenants
    rig.prefill[0].state.prefix_cached_tokens = 2  # prefill's prefix cache: no read, no hit
    turn(client, "sum", "one two three four", key=KEYS["alice"])
    turn(client, "sum", "five six seven eight", key=KEYS["alice"])
    turn(client, None, key=KEYS["alice"])
    wait_until(lambda: lease.released() != [], 3, "the superseded release")
    summary = client.get(REUSE_SUMMARY_PATH)
    assert summary.status_code == 200, "the operator reads it without a client key"
    # Turn 1: 4 words + 2 framing = 6 tokens, 2 from prefill's prefix cache; decode keeps 6 + 8
    # answer words = 14. Turn 2's prompt (one user message of 4 words) is 6 tokens, all 6 read
    # back. The turn without a conversation id (5 tokens, 2 cached) is no conversation turn.
    assert summary.json() == {
        "turns": 2,
        "hits": 1,
        "reused_tokens": 2 + 6,
        "recomputed_tokens": 4,
        "leases_held": 1,
        "released": {
            "superseded": 1,
            "evicted": 0,
            "lapsed": 0,
            "idle": 0,
            "closed": 0,
            "drained": 0,
            "gone": 0,
        },
        "store_errors": 0,
        "offered_tokens": 14,
        "verified_tokens": 14,
        "diverged_tokens": 0,
    }
    assert metric(client, "disagg_router_reuse_turns_total", result="hit") == 1
    assert metric(client, "disagg_router_reuse_turns_total", result="miss") == 1
    reused = metric(client, "disagg_router_reuse_prompt_tokens_total", kind="reused")
    recomputed = metric(client, "disagg_router_reuse_prompt_tokens_total", kind="recomputed")
    assert (reused, recomputed) == (8, 4)
    assert metric(client, "disagg_router_prompt_tokens_total", kind="recomputed") == 4 + 3


@pytest.mark.parametrize("failure", ["refused", "http_500", "stalled"])
def test_lease_calls_that_fail_never_fail_or_slow_a_turn(failure: str) -> None:
    with leased_rig(idle_timeout_s=4.0) as (_, lease, client):
        if failure == "refused":
            lease.stop()
        elif failure == "http_500":
            lease.status = 500
        else:
            lease.delay_s = 3.0
        turn(client, "f", "first")
        for index in range(3):
            took = turn(client, "f", f"follow-up {index}", stream=bool(index % 2))
            assert took < 1.0, "a turn never waits for a lease call"
        assert lookups(client, "hit") == 3, "reuse goes on while the lease service fails"
        kind = {"refused": "connect", "http_500": "http_500", "stalled": "timeout"}[failure]
        failures = {
            call: lambda call=call: metric(
                client, "disagg_router_lease_call_failures_total", call=call, kind=kind
            )
            for call in ("release", "renew")
        }
        wait_until(lambda: failures["release"]() >= 1, 6, "a failed release counted")
        wait_until(lambda: failures["renew"]() >= 1, 6, "a failed renewal counted")
        assert held(client) == 1, "a failed renewal drops nothing"


def test_tokens_lost_to_divergence_are_counted_and_the_report_stays_with_the_router(
    tenants: tuple[RouterRig, LeaseServiceStandIn, httpx.Client],
) -> None:
    """Prefill's read report on a turn whose history differs from decode's (4 of the 14 offered
    tokens diverged) shows in the metric and the reuse summary; decode never sees it."""
    rig, _, client = tenants
    rig.prefill[0].state.diverged_tokens = 4
    turn(client, "edited", "one two three four", key=KEYS["alice"])
    turn(client, "edited", "five six seven eight", key=KEYS["alice"])
    summary = client.get(REUSE_SUMMARY_PATH).json()
    counted = {kind: summary[f"{kind}_tokens"] for kind in ("offered", "verified", "diverged")}
    assert counted == {"offered": 14, "verified": 10, "diverged": 4}
    for kind, tokens in counted.items():
        assert metric(client, "disagg_router_offer_tokens_total", kind=kind) == tokens
    sent = [body[KV_TRANSFER_PARAMS] for body in rig.decode[0].state.received]
    assert len(sent) == 2 and all(READ_REPORT_KEY not in params for params in sent)


def test_two_routers_on_one_redis_each_renew_what_they_committed() -> None:
    with redis_server() as url, leased_rig() as (rig, lease, _):
        shared = {
            "store": "redis",
            "redis_url": url,
            "redis_prefix": "leases:",
            "idle_timeout_s": 4,
        }
        a, b = rig.start_router(**shared), rig.start_router(**shared)
        with (
            httpx.Client(base_url=a.url, timeout=10) as on_a,
            httpx.Client(base_url=b.url, timeout=10) as on_b,
        ):
            turn(on_a, "both", "turn one")
            turn(on_b, "both", "turn two")
            first, second = offered(rig)
            wait_until(lambda: releases(on_a, "gone") == 1, 3, "a's lease reported gone")
            assert (held(on_a), held(on_b)) == (0, 1)
            assert lease.released() == [(first, ReleaseReason.SUPERSEDED.value)]
            turn(on_a, "both", "turn three")
            assert lookups(on_b, "hit") + lookups(on_a, "hit") == 2, (
                "a dropping its gone lease left b's newer entry in place"
            )
            third = offered(rig)[-1]
            wait_until(lambda: releases(on_b, "gone") == 1, 3, "b's lease reported gone")
            assert (held(on_a), held(on_b)) == (1, 0)
            assert rig.decode[0].state.retained == {third}
            assert second not in rig.decode[0].state.retained


def test_offers_name_a_lease_only_when_complete() -> None:
    base = {
        "remote_host": "10.0.0.7",
        "remote_request_id": "r-1",
        "disagg_lease": {"port": 5700, "term_s": 90},
        OFFER_KEY: {"v": 1, "id": "o-1"},
    }
    lease = lease_of(base)
    assert lease is not None and lease.service == "http://10.0.0.7:5700"
    assert lease.name() == {"request": "r-1", "offer": "o-1"}
    v6 = lease_of({**base, "remote_host": "fd00::7"})
    assert v6 is not None and v6.service == "http://[fd00::7]:5700"
    for broken in (
        {**base, "disagg_lease": {"port": True}},
        {**base, "disagg_lease": {"port": 0}},
        {**base, "disagg_lease": "5700"},
        {**base, OFFER_KEY: {"v": 1}},
        {**base, "remote_request_id": None},
        {k: v for k, v in base.items() if k != "remote_host"},
    ):
        assert lease_of(broken) is None, broken
    assert lease_of(None) is None


def test_the_idle_timeout_is_an_option_and_a_positive_number_of_seconds() -> None:
    from disagg.cli import build_parser
    from disagg_router.options import config_from_args

    args = ["router", "--prefill", "http://p:1", "--decode", "http://d:1"]
    assert config_from_args(build_parser().parse_args(args)).idle_timeout_s == (
        DEFAULT_IDLE_TIMEOUT_S
    )
    given = build_parser().parse_args([*args, "--idle-timeout-s", "30"])
    assert config_from_args(given).idle_timeout_s == 30
    urls = ("http://127.0.0.1:1",)
    for bad in (0, -1, math.nan, math.inf):
        with pytest.raises(ConfigError, match="--idle-timeout-s"):
            RouterConfig(urls, urls, idle_timeout_s=bad).validate()
