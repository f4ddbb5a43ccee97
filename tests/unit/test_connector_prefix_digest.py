"""Chained block digests: what decode publishes and prefill checks, without vLLM."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from disagg_connector.prefix_digest import (
    DigestFormatError,
    MultimodalItem,
    PromptInputs,
    TokenDigest,
    TokenRangeError,
    chained_block_hashes,
)
from disagg_contract import DIGEST_WIRE_VERSION

BLOCK = 4
tokens = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=40)


def test_digest_covers_whole_blocks_only() -> None:
    digest = TokenDigest.of_tokens(list(range(10)), BLOCK)
    assert digest.num_blocks == 2


@given(tokens)
def test_wire_round_trip(token_ids: list[int]) -> None:
    digest = TokenDigest.of_tokens(token_ids, BLOCK)
    assert TokenDigest.from_wire(digest.to_wire()) == digest


@given(tokens, tokens)
def test_matching_blocks_is_longest_common_whole_block_prefix(a: list[int], b: list[int]) -> None:
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    expected = min(common // BLOCK, len(a) // BLOCK, len(b) // BLOCK)
    assert TokenDigest.of_tokens(a, BLOCK).matching_blocks(b) == expected


def test_one_changed_token_stops_the_match_at_its_block() -> None:
    held = list(range(100, 124))
    prompt = [*held[:9], 7, *held[10:]]
    assert TokenDigest.of_tokens(held, BLOCK).matching_blocks(prompt) == 2


def test_chaining_makes_equal_blocks_after_a_difference_not_match() -> None:
    held = [1, 2, 3, 4, 5, 6, 7, 8]
    prompt = [9, 2, 3, 4, 5, 6, 7, 8]
    assert TokenDigest.of_tokens(held, BLOCK).matching_blocks(prompt) == 0


def test_cache_salt_separates_tenants() -> None:
    held = list(range(16))
    digest = TokenDigest.of_tokens(held, BLOCK, PromptInputs(cache_salt="tenant-a"))
    assert digest.matching_blocks(held, PromptInputs(cache_salt="tenant-a")) == 4
    assert digest.matching_blocks(held, PromptInputs(cache_salt="tenant-b")) == 0
    assert digest.matching_blocks(held) == 0


def test_lora_adapter_is_bound() -> None:
    held = list(range(16))
    adapter = PromptInputs(adapter=("sql", "/adapters/sql"))
    digest = TokenDigest.of_tokens(held, BLOCK, adapter)
    assert digest.matching_blocks(held, adapter) == 4
    assert digest.matching_blocks(held) == 0
    assert digest.matching_blocks(held, PromptInputs(adapter=("sql", "/adapters/other"))) == 0
    assert TokenDigest.of_tokens(held, BLOCK).matching_blocks(held, adapter) == 0


def test_salt_cannot_spell_an_adapter() -> None:
    held = list(range(8))
    with_adapter = TokenDigest.of_tokens(held, BLOCK, PromptInputs("a", ("n", "p")))
    assert with_adapter.matching_blocks(held, PromptInputs('a|lora|["n", "p"]')) == 0


def test_multimodal_item_binds_the_block_where_it_starts_and_all_after() -> None:
    held = [7] * 16  # the same placeholder tokens for either image
    cat = PromptInputs(multimodal=(MultimodalItem(5, 6, "hash-cat"),))
    dog = PromptInputs(multimodal=(MultimodalItem(5, 6, "hash-dog"),))
    digest = TokenDigest.of_tokens(held, BLOCK, cat)
    assert digest.matching_blocks(held, cat) == 4
    assert digest.matching_blocks(held, dog) == 1  # block 0 precedes the image
    assert digest.matching_blocks(held) == 1
    moved = PromptInputs(multimodal=(MultimodalItem(9, 6, "hash-cat"),))
    assert digest.matching_blocks(held, moved) == 1


def test_text_only_digest_is_unchanged_by_the_input_binding() -> None:
    """Digest v1 of a plain prompt: the bytes a v1 decode or prefill computes."""
    assert chained_block_hashes([1, 2, 3, 4], BLOCK)[0].hex() == "afcc942e5a599937"


@pytest.mark.parametrize("token", [-1, 2**32, 2**40])
def test_token_ids_outside_32_bits_raise_a_value_error(token: int) -> None:
    with pytest.raises(TokenRangeError):
        chained_block_hashes([1, 2, 3, token], BLOCK)


def test_block_size_is_part_of_the_hash() -> None:
    assert chained_block_hashes(list(range(8)), 4)[1] != chained_block_hashes(list(range(8)), 8)[0]


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        ("nope", "must be an object"),
        ({"v": DIGEST_WIRE_VERSION + 1, "block_size": 4, "hashes": ""}, "wire version"),
        ({"v": DIGEST_WIRE_VERSION, "block_size": 0, "hashes": ""}, "block_size"),
        ({"v": DIGEST_WIRE_VERSION, "block_size": True, "hashes": ""}, "block_size"),
        ({"v": DIGEST_WIRE_VERSION, "block_size": 4, "hashes": 3}, "base64 string"),
        ({"v": DIGEST_WIRE_VERSION, "block_size": 4, "hashes": "!!"}, "not valid base64"),
        ({"v": DIGEST_WIRE_VERSION, "block_size": 4, "hashes": "AAAA"}, "multiple of"),
    ],
)
def test_untrustworthy_wire_forms_are_refused(wire: object, message: str) -> None:
    with pytest.raises(DigestFormatError, match=message):
        TokenDigest.from_wire(wire)
