"""Verified-prefix reuse planning and the cut of decode's offer, without vLLM."""

from __future__ import annotations

from typing import Any

import pytest

from disagg_connector.prefix_digest import TokenDigest
from disagg_connector.reuse_plan import (
    Verdict,
    cut_params,
    offers_remote_kv,
    plan_pull,
    plan_reuse,
)
from disagg_contract import EXPIRES_AT_KEY, EXPIRY_MARGIN_S, TOKEN_DIGEST_KEY

BLOCK = 4
NOW = 1_000_000.0


def offer(held: list[int], *, groups: int = 1, **extra: Any) -> dict[str, Any]:
    """Decode's kv_transfer_params for a turn whose KV holds ``held``."""
    num_blocks = -(-len(held) // BLOCK)
    params: dict[str, Any] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_block_ids": [list(range(g * 100, g * 100 + num_blocks)) for g in range(groups)],
        "remote_engine_id": "decode-0",
        "remote_request_id": "req-1",
        "remote_host": "127.0.0.1",
        "remote_port": 5601,
        "remote_num_tokens": len(held),
        TOKEN_DIGEST_KEY: TokenDigest.of_tokens(held, BLOCK).to_wire(),
        EXPIRES_AT_KEY: NOW + 60,
    }
    params.update(extra)
    return params


def plan(params: dict[str, Any], prompt: list[int], *, cuttable: bool = True) -> Any:
    return plan_reuse(params, prompt, BLOCK, blocks_cuttable=cuttable)


HELD = list(range(1000, 1018))  # 18 tokens: 4 whole blocks and 2 tokens


def test_extended_history_reuses_every_whole_held_block() -> None:
    params = offer(HELD)
    result = plan(params, [*HELD, 1, 2, 3, 4, 5])
    assert (result.verdict, result.offered_tokens, result.usable_tokens) == (
        Verdict.VERIFIED,
        18,
        16,
    )
    assert (result.verified_tokens, result.rejected_tokens) == (16, 0)
    cut_params(params, result, BLOCK)
    assert params["remote_num_tokens"] == 16
    assert params["remote_block_ids"] == [[0, 1, 2, 3]]


def test_divergence_keeps_only_blocks_before_it() -> None:
    prompt = [*HELD[:9], 7, *HELD[10:], 1, 2, 3]
    params = offer(HELD, groups=2)
    result = plan(params, prompt)
    assert (result.verdict, result.verified_tokens, result.rejected_tokens) == (
        Verdict.DIVERGED,
        8,
        8,
    )
    cut_params(params, result, BLOCK)
    assert params["remote_num_tokens"] == 8
    assert params["remote_block_ids"] == [[0, 1], [100, 101]]


def test_divergence_in_first_block_rejects_all_but_keeps_blocks_to_free() -> None:
    params = offer(HELD)
    result = plan(params, [5, *HELD[1:], 9])
    assert (result.verdict, result.verified_tokens, result.rejected_tokens) == (
        Verdict.DIVERGED,
        0,
        16,
    )
    cut_params(params, result, BLOCK)
    assert params["remote_num_tokens"] == 0
    assert params["remote_block_ids"] == [[0, 1, 2, 3, 4]]


def test_prompt_last_token_is_never_covered() -> None:
    params = offer(HELD[:16])
    result = plan(params, HELD[:16])
    assert (result.usable_tokens, result.verified_tokens) == (12, 12)


def test_short_prompt_offers_nothing_usable() -> None:
    result = plan(offer(HELD), HELD[:1])
    assert (result.offered_tokens, result.usable_tokens, result.verified_tokens) == (1, 0, 0)


def test_missing_digest_rejects_everything() -> None:
    params = offer(HELD)
    del params[TOKEN_DIGEST_KEY]
    assert plan(params, [*HELD, 1]).verdict is Verdict.NO_DIGEST


def test_unknown_digest_version_rejects_everything() -> None:
    params = offer(HELD)
    params[TOKEN_DIGEST_KEY] = {**params[TOKEN_DIGEST_KEY], "v": 99}
    result = plan(params, [*HELD, 1])
    assert (result.verdict, result.verified_tokens, result.rejected_tokens) == (
        Verdict.BAD_DIGEST,
        0,
        16,
    )


def test_other_block_size_rejects_everything() -> None:
    params = offer(HELD)
    params[TOKEN_DIGEST_KEY] = TokenDigest.of_tokens(HELD, 2).to_wire()
    assert plan(params, [*HELD, 1]).verdict is Verdict.BLOCK_SIZE_MISMATCH


@pytest.mark.parametrize("seconds_left", [EXPIRY_MARGIN_S - 0.1, 0.0, -30.0])
def test_the_plan_compares_no_clock(seconds_left: float) -> None:
    """Decode's expiry is decode's clock: whether it still holds the KV is its to say (the
    claim), so the plan verifies tokens only."""
    params = offer(HELD, **{EXPIRES_AT_KEY: NOW + seconds_left})
    assert plan(params, [*HELD, 1]).verdict is Verdict.VERIFIED


def pulled(prompt: list[int], **extra: Any) -> dict[str, Any]:
    """Prefill's P->D offer of the KV of ``prompt`` (the whole prompt, tail included)."""
    num_blocks = -(-len(prompt) // BLOCK)
    params: dict[str, Any] = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [list(range(num_blocks))],
        "remote_num_tokens": len(prompt),
        TOKEN_DIGEST_KEY: TokenDigest.of_tokens(prompt, BLOCK, with_tail=True).to_wire(),
    }
    params.update(extra)
    return params


def test_a_pull_of_exactly_the_prompt_reads_all_of_it() -> None:
    params = pulled(HELD)
    result = plan_pull(params, HELD, BLOCK, blocks_cuttable=True)
    assert (result.verdict, result.verified_tokens) == (Verdict.VERIFIED, 18)
    cut_params(params, result, BLOCK)
    assert params["remote_block_ids"] == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize(
    ("sent", "verified"),
    [
        ([*HELD[:17], 9], 16),  # the last partial block differs: only the whole blocks read
        ([*HELD[:6], 9, *HELD[7:]], 4),  # a token of the second block differs
        ([9, *HELD[1:]], 0),  # the first token differs: nothing read
        (HELD[:16], 16),  # a shorter prompt: the offer covers more than it
        ([*HELD, 1, 2], 16),  # a longer prompt: the offer covers less than it
    ],
)
def test_a_pull_of_another_prompt_reads_only_its_matching_blocks(
    sent: list[int], verified: int
) -> None:
    """Decode sent prompt B with prefill's offer of prompt A's KV: B's matching whole blocks
    are read, the rest computed, nothing of A enters decode's cache."""
    params = pulled(HELD)
    result = plan_pull(params, sent, BLOCK, blocks_cuttable=True)
    assert (result.verdict, result.verified_tokens) == (Verdict.DIVERGED, verified)
    cut_params(params, result, BLOCK)
    assert params["remote_num_tokens"] == verified
    assert len(params["remote_block_ids"][0]) == (verified // BLOCK or 5)


def test_a_pull_without_a_tail_digest_is_never_read_whole() -> None:
    params = pulled(HELD, **{TOKEN_DIGEST_KEY: TokenDigest.of_tokens(HELD, BLOCK).to_wire()})
    result = plan_pull(params, HELD, BLOCK, blocks_cuttable=True)
    assert (result.verdict, result.verified_tokens) == (Verdict.DIVERGED, 16)


def test_a_pull_without_a_digest_reads_nothing() -> None:
    params = pulled(HELD)
    del params[TOKEN_DIGEST_KEY]
    assert plan_pull(params, HELD, BLOCK, blocks_cuttable=True).verdict is Verdict.NO_DIGEST


def test_hybrid_models_reuse_all_or_nothing() -> None:
    aligned = HELD[:16]
    full = offer(aligned, groups=2)
    assert plan(full, [*aligned, 1], cuttable=False).verified_tokens == 16
    partial = offer(HELD, groups=2)
    result = plan(partial, [*HELD, 1], cuttable=False)
    assert (result.verdict, result.verified_tokens) == (Verdict.PARTIAL_HYBRID, 0)


def test_full_verification_leaves_the_offer_untouched() -> None:
    aligned = HELD[:16]
    params = offer(aligned)
    before = {k: v for k, v in params.items()}
    cut_params(params, plan(params, [*aligned, 1]), BLOCK)
    assert params == before


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (None, False),
        ({"do_remote_decode": True, "remote_block_ids": None}, False),
        ({"do_remote_decode": False, "remote_block_ids": [[1]]}, False),
        ({"do_remote_decode": True, "remote_block_ids": [[1]]}, True),
    ],
)
def test_offers_remote_kv(params: dict[str, Any] | None, expected: bool) -> None:
    assert offers_remote_kv(params) is expected


def test_prompt_token_outside_32_bits_is_a_refusal_not_an_exception() -> None:
    params = offer(HELD)
    result = plan(params, [*HELD[:4], 2**32, *HELD[5:], 1])
    assert (result.verdict, result.verified_tokens) == (Verdict.MALFORMED, 0)
