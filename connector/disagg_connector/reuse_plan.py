"""Decide how much of another engine's offered KV a request may reuse, and cut the pull to it.

Pure logic, no vLLM: given an offer's ``kv_transfer_params`` (with the digest of the tokens its
KV holds) and the prompt this engine is about to serve, keep only the longest block-aligned
prefix whose tokens match, then rewrite ``remote_num_tokens`` and every group's
``remote_block_ids`` so that vLLM's stock pull machinery reads exactly that prefix and computes
the rest. Both ways: prefill reading decode's retained KV back (:func:`plan_reuse`) and decode
reading prefill's KV of this turn's prompt (:func:`plan_pull`). No expiry is checked here: the
engine holding the KV decides on its own clock whether it still does (the claim, see
:mod:`claims`), so two machines' clocks are never compared.
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
from disagg_contract import TOKEN_DIGEST_KEY


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
    """The offering engine refused (or did not answer) the claim the reader makes before each
    read: the KV was released, freed for live requests, lapsed or past vLLM's own lease on it,
    or claimed by another reader (a replay, or an engine restarted since)."""
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
        """Usable tokens recomputed because they failed verification (or were not claimed)."""
        return self.usable_tokens - self.verified_tokens


def offers_remote_kv(params: dict[str, Any] | None) -> bool:
    """Whether ``params`` are decode's retained-KV offer (a D->P read candidate)."""
    return bool(params and params.get("do_remote_decode") and params.get("remote_block_ids"))


def _published_digest(params: dict[str, Any], block_size: int) -> TokenDigest | Verdict:
    """The offer's digest, or the verdict that refuses it."""
    if TOKEN_DIGEST_KEY not in params:
        return Verdict.NO_DIGEST
    try:
        digest = TokenDigest.from_wire(params[TOKEN_DIGEST_KEY])
    except DigestFormatError:
        return Verdict.BAD_DIGEST
    if digest.block_size != block_size:
        return Verdict.BLOCK_SIZE_MISMATCH
    return digest


def plan_reuse(
    params: dict[str, Any],
    prompt_token_ids: Sequence[int],
    block_size: int,
    *,
    inputs: PromptInputs = NO_INPUTS,
    blocks_cuttable: bool,
) -> ReusePlan:
    """Plan the verified reuse of decode's retained KV (D->P) for a new prompt.

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
    digest = _published_digest(params, block_size)
    if isinstance(digest, Verdict):
        return ReusePlan(digest, offered, usable, 0)
    try:
        verified = digest.matching_blocks(prompt_token_ids[:usable], inputs) * block_size
    except TokenRangeError:
        return ReusePlan(Verdict.MALFORMED, offered, usable, 0)
    if not blocks_cuttable and verified != remote_tokens:
        return ReusePlan(Verdict.PARTIAL_HYBRID, offered, usable, 0)
    verdict = Verdict.VERIFIED if verified == usable else Verdict.DIVERGED
    return ReusePlan(verdict, offered, usable, verified)


def plan_pull(
    params: dict[str, Any],
    prompt_token_ids: Sequence[int],
    block_size: int,
    *,
    inputs: PromptInputs = NO_INPUTS,
    blocks_cuttable: bool,
) -> ReusePlan:
    """Plan decode's read of prefill's KV (P->D) for the prompt decode was sent.

    The offer's digest must cover exactly this prompt, its last partial block included, for
    the whole offer to be read; otherwise only the leading whole blocks that match are read
    and decode computes the rest, so KV made from another prompt never enters decode's cache.
    """
    offered = int(params.get("remote_num_tokens") or 0)
    usable = min(offered, len(prompt_token_ids))
    digest = _published_digest(params, block_size)
    if isinstance(digest, Verdict):
        return ReusePlan(digest, offered, usable, 0)
    try:
        matched = digest.matching_blocks(prompt_token_ids, inputs)
        whole = matched * block_size
        exact = offered == len(prompt_token_ids) and digest.covers(prompt_token_ids, inputs)
    except TokenRangeError:
        return ReusePlan(Verdict.MALFORMED, offered, usable, 0)
    if exact:
        return ReusePlan(Verdict.VERIFIED, offered, usable, usable)
    verified = min(whole, usable)
    if not blocks_cuttable:
        verified = 0
    return ReusePlan(Verdict.DIVERGED, offered, usable, verified)


def cut_params(params: dict[str, Any], plan: ReusePlan, block_size: int) -> None:
    """Rewrite an offer in place so the stock pull reads only the verified prefix.

    A fully verified offer is left as is. A rejection keeps the block ids with zero tokens, so
    the reader still tells the engine that offered them to free its blocks.
    """
    if plan.verified_tokens >= int(params.get("remote_num_tokens") or 0):
        return
    params["remote_num_tokens"] = plan.verified_tokens
    if plan.verified_tokens:
        keep_blocks = plan.verified_tokens // block_size
        params["remote_block_ids"] = [
            list(group[:keep_blocks]) for group in params["remote_block_ids"]
        ]
