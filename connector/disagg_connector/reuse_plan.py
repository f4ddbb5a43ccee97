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

from disagg_connector.prefix_digest import (
    NO_INPUTS,
    DigestFormatError,
    PromptInputs,
    TokenDigest,
    TokenRangeError,
)
from disagg_contract import EXPIRES_AT_KEY, EXPIRY_MARGIN_S, TOKEN_DIGEST_KEY


class Verdict(enum.StrEnum):
    """What became of an offer: read as offered, cut, or refused, and why.

    The first group is decided on the offer itself before anything reads it (see
    :mod:`offer`); the second by checking decode's digest against the new prompt, then by
    decode's answer to the claim before the read (see :mod:`retention`), and the last by
    prefill's measured costs.
    """

    MALFORMED = "malformed"
    """A field has the wrong type, range or shape (or the params are not an object)."""
    NO_KEY = "no-key"
    """This engine holds no signing key, so it cannot check the offer."""
    UNSIGNED = "unsigned"
    """The offer carries no signed envelope."""
    OTHER_MODEL = "other-model"
    """The envelope names another model (or block size) than this engine serves."""
    BAD_SIGNATURE = "bad-signature"
    """The signature does not match the offer under any key: forged or altered."""
    EXPIRED = "expired"
    REPLAYED = "replayed"
    """This engine already accepted the offer once (offers are single-use)."""
    UNCHECKED = "unchecked"
    """A prefill-to-decode offer accepted unsigned, because neither side holds a key."""

    VERIFIED = "verified"
    DIVERGED = "diverged"
    NO_DIGEST = "no-digest"
    BAD_DIGEST = "bad-digest"
    BLOCK_SIZE_MISMATCH = "block-size-mismatch"
    PARTIAL_HYBRID = "partial-hybrid"
    PROMPT_EMBEDS = "prompt-embeds"
    """The prompt comes as embeddings, which the digest does not cover."""
    UNCLAIMED = "unclaimed"
    """Decode refused (or did not answer) the claim prefill makes before each read: the KV was
    released, freed for live requests, lapsed, or claimed by another reader."""
    RECOMPUTE_CHEAPER = "recompute-cheaper"
    """Prefill's measured costs say computing the verified tokens is faster than reading them
    (the measured read decision, see :mod:`read_cost`)."""


@dataclass(frozen=True)
class ReusePlan:
    """How many of the tokens decode offers prefill will pull.

    ``usable_tokens`` is the whole-block part of the offer that lies inside the new prompt
    (its last token excluded): the most any reuse can cover. ``verified_tokens`` is what
    passed verification; the rest of the usable part is rejected and recomputed.
    """

    verdict: Verdict
    offered_tokens: int
    usable_tokens: int
    verified_tokens: int

    @property
    def rejected_tokens(self) -> int:
        """Usable tokens recomputed because they failed verification (or the offer expired)."""
        return self.usable_tokens - self.verified_tokens


def offers_remote_kv(params: dict[str, Any] | None) -> bool:
    """Whether ``params`` are decode's retained-KV offer (a D->P read candidate)."""
    return bool(params and params.get("do_remote_decode") and params.get("remote_block_ids"))


def plan_reuse(
    params: dict[str, Any],
    prompt_token_ids: Sequence[int],
    block_size: int,
    *,
    inputs: PromptInputs = NO_INPUTS,
    now_unix: float,
    blocks_cuttable: bool,
) -> ReusePlan:
    """Plan the verified reuse of decode's retained KV for a new prompt.

    ``params`` must have passed :func:`offer_form.form_problem`. ``inputs`` are the new
    prompt's salt, adapter and multimodal items. ``blocks_cuttable`` is false for hybrid
    models (sliding-window or state groups), whose block lists cannot be cut at an arbitrary
    block: there reuse is all or nothing.
    """
    remote_tokens = int(params.get("remote_num_tokens") or 0)
    offered = min(remote_tokens, len(prompt_token_ids))
    # Never cover the whole prompt: its last token must be computed to sample from it.
    usable_blocks = max(0, min(remote_tokens, len(prompt_token_ids) - 1)) // block_size
    usable = usable_blocks * block_size

    def rejected(verdict: Verdict) -> ReusePlan:
        return ReusePlan(verdict, offered, usable, 0)

    expires_at = params.get(EXPIRES_AT_KEY)
    if isinstance(expires_at, int | float) and now_unix + EXPIRY_MARGIN_S >= expires_at:
        return rejected(Verdict.EXPIRED)
    if TOKEN_DIGEST_KEY not in params:
        return rejected(Verdict.NO_DIGEST)
    try:
        digest = TokenDigest.from_wire(params[TOKEN_DIGEST_KEY])
    except DigestFormatError:
        return rejected(Verdict.BAD_DIGEST)
    if digest.block_size != block_size:
        return rejected(Verdict.BLOCK_SIZE_MISMATCH)

    try:
        verified = digest.matching_blocks(prompt_token_ids[:usable], inputs) * block_size
    except TokenRangeError:
        return rejected(Verdict.MALFORMED)
    if not blocks_cuttable and verified != remote_tokens:
        return rejected(Verdict.PARTIAL_HYBRID)
    verdict = Verdict.VERIFIED if verified == usable else Verdict.DIVERGED
    return ReusePlan(verdict, offered, usable, verified)


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
