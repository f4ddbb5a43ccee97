"""The workloads: the sweep's target prompt lengths per turn, the many-conversations workload's
shape, and the deterministic user text that reaches them."""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass

_VOCABULARY = (
    "able acid aged also area army away baby back ball band bank base bath bear beat been beer "
    "bell belt best bill bird blow blue boat body bomb bond bone book boom born boss both bowl "
    "bulk burn bush busy call calm came camp card care case cash cast cell chat chip city club "
    "coal coat code cold come cook cool cope copy core cost crew crop dark data date dawn days "
    "dead deal dean dear debt deep deny desk dial diet disc disk does done door dose down draw "
    "drew drop drug dual duke dust duty each earn ease east easy edge else even ever evil exit "
    "face fact fail fair fall farm fast fate fear feed feel feet fell felt file fill film find "
    "fine fire firm fish five flat flow food foot ford form fort four free from fuel full fund"
)
_WORDS = _VOCABULARY.split()
_LENGTH = re.compile(r"^(\d+(?:\.\d+)?)([kK]?)$")


def parse_length(text: str) -> int:
    """``2k`` -> 2000, ``1500`` -> 1500."""
    match = _LENGTH.match(text.strip())
    if match is None:
        raise ValueError(f"--lengths: {text!r} is not a token count (e.g. 2000 or 2k)")
    number, kilo = match.groups()
    return round(float(number) * (1000 if kilo else 1))


def parse_lengths(text: str) -> list[int]:
    """``2k,4k,8k`` (a list) or ``2k:24k:2k`` (start:stop:step, stop included), increasing."""
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise ValueError(f"--lengths: {text!r} must be START:STOP:STEP, e.g. 2k:24k:2k")
        start, stop, step = (parse_length(part) for part in parts)
        if step <= 0:
            raise ValueError(f"--lengths: step of {text!r} must be positive")
        lengths = list(range(start, stop + 1, step))
    else:
        lengths = [parse_length(part) for part in text.split(",") if part.strip()]
    if not lengths or any(b <= a for a, b in itertools.pairwise(lengths)):
        raise ValueError(f"--lengths: {text!r} must name increasing token counts")
    if lengths[0] <= 0:
        raise ValueError(f"--lengths: {text!r} must be positive token counts")
    return lengths


@dataclass(frozen=True)
class TurnPlan:
    """One turn: the prompt length aimed at and how many new user words reach it."""

    turn: int
    target_tokens: int
    new_words: int


def plan_turns(
    lengths: list[int], answer_tokens: int, tokens_per_word: float, base_tokens: int
) -> list[TurnPlan]:
    """New user words per turn so the whole prompt reaches each target length.

    Turn 1 carries ``lengths[0] - base_tokens`` tokens of text; turn ``i`` adds what the
    previous prompt and its answer leave to ``lengths[i]``.
    """
    if tokens_per_word <= 0:
        raise ValueError(f"tokens per word must be positive, got {tokens_per_word}")
    plans = []
    reached = base_tokens
    for index, target in enumerate(lengths):
        needed = max(target - reached, 1)
        words = max(round(needed / tokens_per_word), 8)
        plans.append(TurnPlan(index + 1, target, words))
        reached = reached + round(words * tokens_per_word) + answer_tokens
    return plans


def user_text(seed: str, words: int) -> str:
    """Deterministic text of ``words`` words for one (conversation, turn) seed."""
    rng = random.Random(seed)
    sentences = []
    remaining = words
    while remaining > 0:
        size = min(remaining, rng.randint(6, 14))
        sentences.append(" ".join(rng.choice(_WORDS) for _ in range(size)).capitalize() + ".")
        remaining -= size
    return " ".join(sentences)


@dataclass(frozen=True)
class ConversationsWorkload:
    """The conversations to run and how (every field is a ``disagg bench`` option)."""

    conversations: int = 10
    turns: int = 6
    system_tokens: int = 1024
    """The system prompt every conversation shares."""
    tool_tokens: int = 530
    """The new user text (a tool result) of every turn."""
    answer_tokens: int = 32
    concurrency: int = 2
    think_s: float = 0.0
    """Between an answer and the conversation's next turn."""
    seed: str = "disagg-conversations"

    def __post_init__(self) -> None:
        for name in ("conversations", "turns", "concurrency", "answer_tokens", "tool_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.system_tokens < 0 or self.think_s < 0:
            raise ValueError("--system-tokens and --think-s must not be negative")
