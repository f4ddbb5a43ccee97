"""The shape check every offer passes before vLLM reads it: each malformed form is named."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disagg_connector.offer_form import (
    REMOTE_FIELDS,
    Direction,
    drop_private_keys,
    form_problem,
    pull_direction,
    refuse,
)
from disagg_contract import EXPIRES_AT_KEY, OFFER_KEY, TOKEN_DIGEST_KEY

BLOCK = 4


def offer(**changes: Any) -> dict[str, Any]:
    """Decode's offer of 10 tokens (3 blocks) in one KV group, as vLLM publishes it."""
    params: dict[str, Any] = {
        "do_remote_prefill": False,
        "do_remote_decode": True,
        "remote_block_ids": [[7, 8, 9]],
        "remote_engine_id": "decode-0",
        "remote_request_id": "cmpl-1",
        "remote_host": "10.0.0.7",
        "remote_port": 5600,
        "tp_size": 1,
        "dcp_size": 1,
        "pp_size": 1,
        "remote_num_tokens": 10,
        "remote_blocks_expiry_time": 1234.5,
        "transfer_mode": "pull",
        EXPIRES_AT_KEY: 1_000_000.0,
    }
    params.update(changes)
    return params


def problem(params: dict[str, Any], *, groups: int = 1, exact: bool = True) -> str | None:
    return form_problem(params, num_groups=groups, block_size=BLOCK, exact_block_counts=exact)


def test_an_honest_offer_has_no_problem() -> None:
    assert problem(offer()) is None
    assert problem(offer(remote_block_ids=[[1, 2, 3], [4, 5, 6]]), groups=2) is None


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        # the forms issue 18 measured or names
        ({"remote_num_tokens": "x"}, "remote_num_tokens is not an integer"),
        ({"remote_num_tokens": [1]}, "remote_num_tokens is not an integer"),
        ({"remote_num_tokens": float("inf")}, "remote_num_tokens is not an integer"),  # 1e400
        ({"remote_num_tokens": 10.0}, "remote_num_tokens is not an integer"),
        ({"remote_num_tokens": True}, "remote_num_tokens is not an integer"),
        ({"remote_num_tokens": -1}, "remote_num_tokens is outside"),
        ({"remote_num_tokens": 2**63}, "remote_num_tokens is outside"),
        ({"remote_num_tokens": None}, "remote_num_tokens is missing"),
        ({"remote_block_ids": [7, 8, 9]}, "remote_block_ids has 3 block lists"),
        ({"remote_block_ids": "7,8,9"}, "not a list of block lists"),
        ({"remote_block_ids": [["7", 8, 9]]}, "something else than block ids"),
        ({"remote_block_ids": [[7, -8, 9]]}, "something else than block ids"),
        ({"remote_block_ids": [[7, 2**31, 9]]}, "something else than block ids"),
        ({"remote_block_ids": [[7, 8.0, 9]]}, "something else than block ids"),
        ({"remote_block_ids": [[7, 8]]}, "has 2 blocks, but remote_num_tokens 10 fill 3"),
        ({"remote_block_ids": [[6, 7, 8, 9]]}, "has 4 blocks"),
        ({"remote_block_ids": [[7, 8, 9], [1, 2, 3]]}, "2 block lists, not one per KV group"),
        ({"remote_block_ids": {"0": [7, 8, 9]}}, "not a list of block lists"),
        ({"remote_engine_id": ["decode-0"]}, "remote_engine_id is not a non-empty string"),
        ({"remote_engine_id": ""}, "remote_engine_id is not a non-empty string"),
        ({"remote_engine_id": "d" * 300}, "remote_engine_id is longer than"),
        ({"remote_request_id": "a\nb"}, "remote_request_id is longer than"),
        ({"remote_request_id": 17}, "remote_request_id is not a non-empty string"),
        ({"remote_host": None}, "remote_host is not a non-empty string"),
        ({"remote_host": "10.0.0.7 evil"}, "remote_host is longer than"),
        ({"remote_port": "5600"}, "remote_port is not an integer"),
        ({"remote_port": 0}, "remote_port is outside"),
        ({"remote_port": 70000}, "remote_port is outside"),
        ({"tp_size": "x"}, "tp_size is not an integer"),
        ({"tp_size": 0}, "tp_size is outside"),
        ({"dcp_size": 2**20}, "dcp_size is outside"),
        ({"pp_size": [1]}, "pp_size is not an integer"),
        ({"remote_block_size": 0}, "remote_block_size is outside"),
        ({"remote_blocks_expiry_time": "soon"}, "remote_blocks_expiry_time is not a number"),
        ({"remote_blocks_expiry_time": float("nan")}, "remote_blocks_expiry_time is not a finite"),
        ({EXPIRES_AT_KEY: float("inf")}, f"{EXPIRES_AT_KEY} is not a finite"),
        ({EXPIRES_AT_KEY: True}, f"{EXPIRES_AT_KEY} is not a number"),
        ({"transfer_mode": "push"}, "transfer_mode is not pull"),
        ({"do_remote_decode": "yes"}, "do_remote_decode is not a boolean"),
        ({"do_remote_prefill": True}, "both set"),
    ],
)
def test_each_malformed_form_is_named(changes: dict[str, Any], named: str) -> None:
    found = problem(offer(**changes))
    assert found is not None
    assert named in found


def test_1e400_is_what_json_turns_into_infinity() -> None:
    params = json.loads('{"remote_num_tokens": 1e400}')
    assert problem(offer(**params)) == "remote_num_tokens is not an integer (float)"


def test_hybrid_models_skip_the_exact_count() -> None:
    # sliding-window groups keep only their window's blocks
    params = offer(remote_block_ids=[[1, 2, 3], [3]])
    assert problem(params, groups=2, exact=False) is None
    assert problem(params, groups=2, exact=True) is not None


def test_an_offer_with_no_block_at_all_is_malformed() -> None:
    assert problem(offer(remote_block_ids=[[]], remote_num_tokens=0)) == (
        "remote_block_ids holds no block"
    )


@pytest.mark.parametrize(
    ("params", "direction"),
    [
        ({"do_remote_decode": True, "do_remote_prefill": False}, None),
        ({"do_remote_decode": True, "remote_block_ids": None}, None),
        ({"do_remote_decode": True, "remote_block_ids": []}, None),
        ({"do_remote_decode": True, "remote_block_ids": [[1]]}, Direction.DECODE_TO_PREFILL),
        ({"do_remote_decode": True, "remote_block_ids": "x"}, Direction.DECODE_TO_PREFILL),
        ({"do_remote_prefill": True}, Direction.PREFILL_TO_DECODE),
        ({"do_remote_prefill": "yes", "remote_block_ids": [[1]]}, Direction.PREFILL_TO_DECODE),
        ({}, None),
    ],
)
def test_pull_direction_follows_what_vllm_would_read(
    params: dict[str, Any], direction: Direction | None
) -> None:
    assert pull_direction(params) is direction


def test_refuse_leaves_a_plain_request_of_the_same_role() -> None:
    params = offer(**{TOKEN_DIGEST_KEY: {"v": 1}, OFFER_KEY: {"sig": "x"}, "other": 1})
    refuse(params)
    assert params == {"do_remote_prefill": False, "do_remote_decode": True, "other": 1}
    assert pull_direction(params) is None
    forged = offer(do_remote_prefill=True, do_remote_decode="yes")
    refuse(forged)
    assert (forged["do_remote_prefill"], forged["do_remote_decode"]) == (False, False)
    assert not set(REMOTE_FIELDS) & set(forged)


def test_private_keys_are_dropped() -> None:
    params = {"_remote_blocks_processed": True, "_disagg_verified": True, "remote_port": 1}
    drop_private_keys(params)
    assert params == {"remote_port": 1}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=12,
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(REMOTE_FIELDS), json_values))
def test_any_json_values_give_an_answer_not_an_exception(changes: dict[str, Any]) -> None:
    result = problem(offer(**changes))
    assert result is None or isinstance(result, str)
