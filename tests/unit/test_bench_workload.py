"""The sweep's lengths, turn plans and user texts."""

from __future__ import annotations

import pytest

from disagg.bench.workload import parse_length, parse_lengths, plan_turns, user_text


def test_lengths_accept_lists_and_ranges_with_k() -> None:
    assert parse_length("2k") == 2000
    assert parse_length("1.5k") == 1500
    assert parse_lengths("2k,4k,8k") == [2000, 4000, 8000]
    assert parse_lengths("2k:24k:2k") == list(range(2000, 24001, 2000))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2k,x", "'x' is not a token count"),
        ("4k,2k", "increasing"),
        ("2k:8k", "START:STOP:STEP"),
        ("2k:8k:0", "step"),
        ("0,1k", "positive"),
    ],
)
def test_bad_lengths_name_the_option(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="--lengths") as error:
        parse_lengths(text)
    assert message in str(error.value)


def test_plan_reaches_each_target_counting_answers_and_base() -> None:
    plans = plan_turns([1000, 2000, 3000], answer_tokens=50, tokens_per_word=2.0, base_tokens=20)
    assert [p.turn for p in plans] == [1, 2, 3]
    assert [p.new_words for p in plans] == [490, 475, 475]
    reached = 20
    for plan in plans:
        reached += plan.new_words * 2
        assert reached == plan.target_tokens
        reached += 50


def test_plan_refuses_a_non_positive_ratio() -> None:
    with pytest.raises(ValueError, match="tokens per word"):
        plan_turns([1000], 10, 0.0, 0)


def test_user_text_is_deterministic_with_the_asked_word_count() -> None:
    text = user_text("conv-1-2", 123)
    assert text == user_text("conv-1-2", 123)
    assert text != user_text("conv-1-3", 123)
    assert len(text.split()) == 123
