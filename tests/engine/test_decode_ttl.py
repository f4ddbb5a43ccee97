"""A turn that comes after decode's TTL falls back to recompute, with no error to the client."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from conftest import DECODE_CORE, MODEL_DIR, Rig
from conversations import ANSWER_TOKENS, assert_same_answers, reuse_record, tokenizer, user_text
from disagg.rig.engine import EngineServer, ServerSpec, start_all
from disagg_contract import Role
from driver import Conversation, PDDriver

TTL_S = 12

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def short_ttl_decode(rig: Rig) -> Iterator[EngineServer]:
    server = rig.decode_server(
        ServerSpec("decode-short-ttl", Role.DECODE, 18202, 15604, DECODE_CORE, ttl_s=TTL_S)
    )
    start_all([server])
    yield server
    server.stop()


def test_late_turn_recomputes_without_client_error(
    rig: Rig, short_ttl_decode: EngineServer
) -> None:
    tok = tokenizer(MODEL_DIR)
    driver = PDDriver(rig.on.prefill.url, short_ttl_decode.url)
    off_driver = rig.off.driver()
    prompts = [tok.encode(user_text(70 + i, 320 if i == 0 else 40)) for i in range(3)]
    conversation, off_conversation = Conversation(), Conversation()
    history: list[int] = []
    histories: list[list[int]] = []
    for index, addition in enumerate(prompts):
        if index:
            history = history + conversation.turns[-1].token_ids
        if index == 2:
            time.sleep(TTL_S + 1)
        history = history + addition
        histories.append(history)
        driver.token_turn(conversation, history, ANSWER_TOKENS)
    # Bidirectional off answers the same histories afterwards: the in-time turn's window within
    # the TTL holds nothing else.
    for history in histories:
        off_driver.token_turn(off_conversation, history, ANSWER_TOKENS)
    assert_same_answers(conversation.turns, off_conversation.turns)

    in_time = reuse_record(rig.on.prefill, conversation.turns[1].request_id)
    assert in_time.verdict == "verified" and in_time.read == in_time.verified > 0
    late = reuse_record(rig.on.prefill, conversation.turns[2].request_id)
    # Decode freed the turn at its TTL, so it refuses the claim (its clock alone decides).
    assert late.read == 0
    refusal = rf"Claim of the D->P offer for \S*{conversation.turns[2].request_id}\S* not granted"
    assert re.search(refusal, rig.on.prefill.log_text())
    assert "Declining expired remote read" not in rig.on.prefill.log_text()
