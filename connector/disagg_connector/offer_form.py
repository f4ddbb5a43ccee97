"""The shape of an offer: every field vLLM's pull scheduler and worker read, checked first.

An offer is the ``kv_transfer_params`` of a request that asks this engine to read another
engine's KV: decode's retained blocks on a prefill request (D->P), or prefill's blocks on a
decode request (P->D). vLLM reads those fields inside its scheduler loop and worker without
checking them, so one malformed request (a string token count, a flat block list, a list for
an engine id) would raise there and take the whole engine down. Pure logic, no vLLM: the
scheduler side calls :func:`form_problem` before anything else reads the offer and serves the
request as a recompute when it answers a problem.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from typing import Any

from disagg_contract import EXPIRES_AT_KEY, LEASE_KEY, OFFER_KEY, TOKEN_DIGEST_KEY

MAX_ID_CHARS = 256
"""Longest engine id, request id or host an offer may name."""
MAX_BLOCK_ID = 2**31 - 1
"""Largest block id: NIXL descriptors index blocks with 32-bit signed ints."""
MAX_TOKENS = 2**31 - 1
MAX_PARALLEL = 2**16
"""Largest tensor-, decode-context- or pipeline-parallel size an offer may name."""

OFFERED_FIELDS = (
    "remote_engine_id",
    "remote_request_id",
    "remote_host",
    "remote_port",
    "remote_block_ids",
    "remote_num_tokens",
    "remote_block_size",
    "remote_blocks_expiry_time",
    "tp_size",
    "dcp_size",
    "pp_size",
    "transfer_mode",
    TOKEN_DIGEST_KEY,
    EXPIRES_AT_KEY,
    LEASE_KEY,
)
"""The fields that describe where the offered KV is: what vLLM's pull scheduler and worker read,
and our digest, expiry and lease service."""
REMOTE_FIELDS = (*OFFERED_FIELDS, OFFER_KEY)
"""Every field that describes KV to read: what a refused offer loses."""


class Direction(enum.StrEnum):
    """Which way an offer moves KV (the ``direction`` label of the offer counter)."""

    DECODE_TO_PREFILL = "decode_to_prefill"
    """Decode's retained KV of the previous turn, read back by prefill."""
    PREFILL_TO_DECODE = "prefill_to_decode"
    """Prefill's KV of this turn's prompt, read by decode (vLLM's P/D)."""


def pull_direction(params: Mapping[str, Any]) -> Direction | None:
    """Which way ``params`` ask this engine to read KV, or None when they ask for no read.

    Mirrors the conditions under which vLLM's pull scheduler reads: ``do_remote_prefill``,
    or ``do_remote_decode`` with block ids.
    """
    if params.get("do_remote_prefill"):
        return Direction.PREFILL_TO_DECODE
    if params.get("do_remote_decode") and params.get("remote_block_ids"):
        return Direction.DECODE_TO_PREFILL
    return None


def drop_private_keys(params: dict[str, Any]) -> None:
    """Remove keys starting with ``_``: the engine's own bookkeeping, never a caller's.

    vLLM marks a request's params with such keys once it acted on them (for example
    ``_remote_blocks_processed``); a caller that sent one could make the engine skip a step.
    """
    for key in [key for key in params if key.startswith("_")]:
        del params[key]


def refuse(params: dict[str, Any]) -> None:
    """Rewrite refused params in place so that no engine reads, or notifies, anything.

    The request keeps its role (prefill still retains its KV for decode), so the turn goes on
    as a recompute.
    """
    for key in REMOTE_FIELDS:
        params.pop(key, None)
    params["do_remote_prefill"] = False
    params["do_remote_decode"] = params.get("do_remote_decode") is True


def form_problem(
    params: Mapping[str, Any], *, num_groups: int, block_size: int, exact_block_counts: bool
) -> str | None:
    """What is wrong with the shape of an offer that asks for a read, or None.

    ``num_groups`` is how many KV cache groups this engine transfers: vLLM's worker asserts
    that the offer has one block list per group. With ``exact_block_counts`` (every group full
    attention, both engines one block size) each list must hold exactly the blocks that
    ``remote_num_tokens`` fill; vLLM's worker aligns lists by their end, so a longer list
    would read the wrong blocks and a shorter one fails an assertion.
    """
    for key in ("do_remote_prefill", "do_remote_decode"):
        if params.get(key) is not None and type(params.get(key)) is not bool:
            return f"{key} is not a boolean"
    if params.get("do_remote_prefill") and params.get("do_remote_decode"):
        return "do_remote_prefill and do_remote_decode are both set"
    for key in ("remote_engine_id", "remote_request_id", "remote_host"):
        if (problem := _text_problem(params.get(key))) is not None:
            return f"{key} {problem}"
    checks: list[tuple[str, int, int, bool]] = [
        ("remote_port", 1, 65535, True),
        ("remote_num_tokens", 0, MAX_TOKENS, True),
        ("remote_block_size", 1, MAX_TOKENS, False),
        ("tp_size", 1, MAX_PARALLEL, False),
        ("dcp_size", 1, MAX_PARALLEL, False),
        ("pp_size", 1, MAX_PARALLEL, False),
    ]
    for key, low, high, required in checks:
        if (problem := _int_problem(params.get(key), low, high, required)) is not None:
            return f"{key} {problem}"
    for key in ("remote_blocks_expiry_time", EXPIRES_AT_KEY):
        if (problem := _time_problem(params.get(key))) is not None:
            return f"{key} {problem}"
    if params.get("transfer_mode") not in (None, "pull"):
        return "transfer_mode is not pull"
    if (problem := _lease_problem(params.get(LEASE_KEY))) is not None:
        return f"{LEASE_KEY} {problem}"
    return _blocks_problem(
        params.get("remote_block_ids"),
        params["remote_num_tokens"],
        num_groups=num_groups,
        block_size=block_size,
        exact_block_counts=exact_block_counts,
    )


def _lease_problem(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return "is not an object"
    if (problem := _int_problem(value.get("port"), 1, 65535, True)) is not None:
        return f"port {problem}"
    if (problem := _time_problem(value.get("term_s"))) is not None:
        return f"term_s {problem}"
    return None


def _text_problem(value: object) -> str | None:
    if not isinstance(value, str) or not value:
        return "is not a non-empty string"
    if len(value) > MAX_ID_CHARS or not value.isprintable() or any(c.isspace() for c in value):
        return f"is longer than {MAX_ID_CHARS} characters or holds spaces or control characters"
    return None


def _is_int(value: object) -> bool:
    """A JSON integer: ``True`` is an ``int`` to Python but not a count."""
    return isinstance(value, int) and not isinstance(value, bool)


def _int_problem(value: object, low: int, high: int, required: bool) -> str | None:
    if value is None:
        return "is missing" if required else None
    if not isinstance(value, int) or isinstance(value, bool):
        return f"is not an integer ({type(value).__name__})"
    if not low <= value <= high:
        return f"is outside [{low}, {high}]"
    return None


def _time_problem(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        return f"is not a number ({type(value).__name__})"
    if not math.isfinite(value) or value < 0:
        return "is not a finite non-negative number"
    return None


def _blocks_problem(
    value: object,
    num_tokens: int,
    *,
    num_groups: int,
    block_size: int,
    exact_block_counts: bool,
) -> str | None:
    if not isinstance(value, Sequence) or isinstance(value, str):
        return "remote_block_ids is not a list of block lists"
    if len(value) != num_groups:
        return f"remote_block_ids has {len(value)} block lists, not one per KV group ({num_groups})"
    needed = -(-num_tokens // block_size)
    for index, group in enumerate(value):
        if not isinstance(group, Sequence) or isinstance(group, str):
            return f"remote_block_ids[{index}] is not a list"
        if not all(_is_int(block) and 0 <= block <= MAX_BLOCK_ID for block in group):
            return f"remote_block_ids[{index}] holds something else than block ids"
        if exact_block_counts and len(group) != needed:
            return (
                f"remote_block_ids[{index}] has {len(group)} blocks, but remote_num_tokens "
                f"{num_tokens} fill {needed}"
            )
    if not any(value):
        return "remote_block_ids holds no block"
    return None
