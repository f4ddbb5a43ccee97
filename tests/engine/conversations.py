"""Deterministic multi-turn conversations and the checks the engine tests share."""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from disagg.rig.engine import EngineServer
from driver import Conversation, PDDriver, TurnResult

ANSWER_TOKENS = 24
LOGPROB_TOLERANCE = 1e-3
SYSTEM = "You are a terse assistant. Answer in the invented language of the user."
_WORDS = ["kalo", "mine", "suta", "ripo", "vade", "guzi", "onel", "tami", "kane", "lori"]


def tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    """The rig model's tokenizer (also used to build token-id prompts)."""
    return AutoTokenizer.from_pretrained(model_dir)


def user_text(seed: int, words: int) -> str:
    """A deterministic user message of about ``words`` pseudo-words."""
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) + rng.choice(_WORDS[:4]) for _ in range(words)) + "."


@dataclass
class ReuseRecord:
    """What prefill's connector logged for one request's D->P offer."""

    verdict: str
    offered: int
    usable: int
    verified: int
    rejected: int
    read: int | None


def reuse_record(prefill: EngineServer, request_id: str, timeout_s: float = 10) -> ReuseRecord:
    """Parse prefill's log lines about ``request_id``'s offer (waiting for them to appear)."""
    offer = re.compile(
        rf"D->P offer for \S*{request_id}\S* from engine \S+: ([\w-]+), offered (\d+) tokens, "
        r"usable (\d+), verified (\d+), rejected (\d+)"
    )
    read = re.compile(rf"D->P reuse for \S*{request_id}\S*: reading (\d+) tokens from decode")
    deadline = time.monotonic() + timeout_s
    while True:
        log = prefill.log_text()
        offered = offer.search(log)
        reading = read.search(log)
        if (offered and reading) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert offered is not None, f"no D->P offer logged for {request_id}:\n{prefill.log_tail()}"
    verdict, *counts = offered.groups()
    return ReuseRecord(
        verdict,
        *(int(count) for count in counts),
        int(reading.group(1)) if reading else None,
    )


def assert_same_answers(on: list[TurnResult], off: list[TurnResult]) -> None:
    """Token-identical answers and first-token logprobs within tolerance, turn by turn."""
    assert len(on) == len(off)
    for index, (a, b) in enumerate(zip(on, off, strict=True)):
        assert a.prefill_token_id == b.prefill_token_id, f"turn {index + 1}: prefill token"
        assert a.token_ids == b.token_ids, f"turn {index + 1}: answer tokens differ"
        assert abs(a.first_logprob - b.first_logprob) <= LOGPROB_TOLERANCE, f"turn {index + 1}"
        assert abs(a.prefill_logprob - b.prefill_logprob) <= LOGPROB_TOLERANCE, f"turn {index + 1}"


def run_token_turns(
    driver: PDDriver, prompts: list[list[int]], conversation: Conversation | None = None
) -> list[TurnResult]:
    """Token-id turns: each prompt is the previous prompt, decode's answer, then ``prompts[i]``.

    ``prompts[0]`` is the first prompt; later items are appended after the previous answer.
    """
    conversation = conversation or Conversation()
    history: list[int] = []
    for index, addition in enumerate(prompts):
        if index:
            history = history + conversation.turns[-1].token_ids
        history = history + addition
        driver.token_turn(conversation, history, ANSWER_TOKENS)
    return conversation.turns


def run_chat_turns(
    driver: PDDriver, user_messages: list[str], answers: dict[int, str] | None = None
) -> tuple[list[TurnResult], list[list[dict[str, str]]]]:
    """Chat turns as a client sends them; ``answers`` replaces earlier assistant texts by index."""
    conversation = Conversation()
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    sent: list[list[dict[str, str]]] = []
    for index, message in enumerate(user_messages):
        if index:
            previous = (answers or {}).get(index - 1, conversation.turns[-1].text)
            messages.append({"role": "assistant", "content": previous})
        messages.append({"role": "user", "content": message})
        sent.append([dict(m) for m in messages])
        driver.chat_turn(conversation, messages, ANSWER_TOKENS)
    return conversation.turns, sent


def chat_prompt_ids(tok: PreTrainedTokenizerBase, messages: list[dict[str, Any]]) -> list[int]:
    """Token ids vLLM builds for ``messages``: the rendered template, no extra special tokens."""
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tok.encode(text, add_special_tokens=False))


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    length = 0
    while length < min(len(a), len(b)) and a[length] == b[length]:
        length += 1
    return length
