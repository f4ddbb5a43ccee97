"""Decide how much of decode's retained KV prefill may reuse, and cut the pull to it.

Pure logic, no vLLM: given decode's ``kv_transfer_params`` (with its published digest) and
the prompt prefill is about to compute, keep only the longest block-aligned prefix whose tokens
match, then rewrite ``remote_num_tokens`` and every group's ``remote_block_ids`` so that vLLM's
stock pull machinery reads exactly that prefix and recomputes the rest.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from disagg_connector.prefix_digest import DIGEST_PARAM_KEY, DigestFormatError, TokenDigest

EXPIRY_PARAM_KEY = "disagg_expires_at"
"""Unix time (decode's wall clock) at which decode frees the retained blocks."""

EXPIRY_MARGIN_S = 5.0
"""Refuse a read this close to expiry (vLLM's worker uses the same 5 s safety margin)."""


class Verdict(enum.StrEnum):
    """Why prefill reuses what it reuses."""

    VERIFIED = "verified"
    DIVERGED = "diverged"
    NO_DIGEST = "no-digest"
    BAD_DIGEST = "bad-digest"
    BLOCK_SIZE_MISMATCH = "block-size-mismatch"
    EXPIRED = "expired"
    PARTIAL_HYBRID = "partial-hybrid"


@dataclass(frozen=True)
class ReusePlan:
    """How many of the tokens decode offers prefill will pull."""

    verdict: Verdict
    offered_tokens: int
    verified_tokens: int

    @property
    def rejected_tokens(self) -> int:
        """Offered tokens that will be recomputed because they could not be verified."""
        return self.offered_tokens - self.verified_tokens


def offers_remote_kv(params: dict[str, Any] | None) -> bool:
    """Whether ``params`` are decode's retained-KV offer (a D->P read candidate)."""
    return bool(params and params.get("do_remote_decode") and params.get("remote_block_ids"))


def plan_reuse(
    params: dict[str, Any],
    prompt_token_ids: Sequence[int],
    block_size: int,
    *,
    cache_salt: str | None,
    now_unix: float,
    blocks_cuttable: bool,
) -> ReusePlan:
    """Plan the verified reuse of decode's retained KV for a new prompt.

    ``blocks_cuttable`` is false for hybrid models (sliding-window or state groups), whose
    block lists cannot be cut at an arbitrary block: there reuse is all or nothing.
    """
    remote_tokens = int(params.get("remote_num_tokens") or 0)
    offered = min(remote_tokens, len(prompt_token_ids))

    expires_at = params.get(EXPIRY_PARAM_KEY)
    if isinstance(expires_at, int | float) and now_unix + EXPIRY_MARGIN_S >= expires_at:
        return ReusePlan(Verdict.EXPIRED, offered, 0)
    if DIGEST_PARAM_KEY not in params:
        return ReusePlan(Verdict.NO_DIGEST, offered, 0)
    try:
        digest = TokenDigest.from_wire(params[DIGEST_PARAM_KEY])
    except DigestFormatError:
        return ReusePlan(Verdict.BAD_DIGEST, offered, 0)
    if digest.block_size != block_size:
        return ReusePlan(Verdict.BLOCK_SIZE_MISMATCH, offered, 0)

    # Never cover the whole prompt: its last token must be computed to sample from it.
    usable_blocks = min(remote_tokens, len(prompt_token_ids) - 1) // block_size
    prompt_head = prompt_token_ids[: usable_blocks * block_size]
    matched = digest.matching_blocks(prompt_head, cache_salt)
    verified = matched * block_size
    if not blocks_cuttable and verified != remote_tokens:
        return ReusePlan(Verdict.PARTIAL_HYBRID, offered, 0)
    verdict = Verdict.VERIFIED if verified == usable_blocks * block_size else Verdict.DIVERGED
    return ReusePlan(verdict, offered, verified)


def cut_params(params: dict[str, Any], plan: ReusePlan, block_size: int) -> None:
    """Rewrite decode's offer in place so the stock pull reads only the verified prefix.

    A fully verified offer is left as is. An expired offer loses its block ids (nothing to
    read, nobody to notify); any other rejection keeps them with zero tokens, so prefill
    still tells decode to free its blocks.
    """
    if plan.verdict is Verdict.EXPIRED:
        params["remote_block_ids"] = []
        params["remote_num_tokens"] = 0
        return
    if plan.verified_tokens >= int(params.get("remote_num_tokens") or 0):
        return
    params["remote_num_tokens"] = plan.verified_tokens
    if plan.verified_tokens:
        keep_blocks = plan.verified_tokens // block_size
        params["remote_block_ids"] = [
            list(group[:keep_blocks]) for group in params["remote_block_ids"]
        ]
