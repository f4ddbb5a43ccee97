"""Chained per-block digests of the token sequence a KV cache holds.

Decode publishes the digest of the tokens its retained KV was computed from; prefill hashes
its new prompt the same way and keeps only the leading blocks whose hashes match. A block's
hash chains over every block before it, so equal hashes at block ``i`` mean equal inputs in
blocks ``0..i`` (up to a 64-bit second preimage). Besides the token ids, the inputs are what
else decides a block's KV: the prefix-cache salt and the LoRA adapter seed the chain, and each
multimodal item (its content hash and placeholder range) enters the hash of the block where
its placeholder starts. A text-only prompt without an adapter hashes as it always did, so any
disagreement between two versions on the rest fails safe (no match).

A digest of a whole prompt (prefill's offer of this turn's KV to decode) also carries the hash
of the trailing partial block, chained over the whole blocks, so that a reader can tell that it
covers exactly the prompt it was sent, its last tokens included.

The wire format is versioned: a reader refuses any version it does not know, so reuse is never
granted on a format it cannot check.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from disagg_contract import DIGEST_WIRE_VERSION

HASH_BYTES = 8
_PERSON = b"disagg-kv-v1"


class DigestFormatError(ValueError):
    """A published digest is malformed or of an unknown wire version."""


class TokenRangeError(ValueError):
    """A token id does not fit the digest's unsigned 32-bit encoding."""


@dataclass(frozen=True)
class MultimodalItem:
    """One multimodal input of a prompt: where its placeholder tokens lie and what it is."""

    offset: int
    length: int
    identifier: str
    """vLLM's content hash of the item (``MultiModalFeatureSpec.identifier``)."""


@dataclass(frozen=True)
class PromptInputs:
    """What besides the token ids decides the KV a prompt's blocks hold."""

    cache_salt: str | None = None
    """vLLM's per-tenant prefix-cache salt."""
    adapter: tuple[str, str] | None = None
    """The LoRA adapter's name and path, or None for the base model."""
    multimodal: tuple[MultimodalItem, ...] = ()


NO_INPUTS = PromptInputs()


def _blake(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=HASH_BYTES, person=_PERSON).digest()


def _seed(block_size: int, inputs: PromptInputs) -> bytes:
    seed = _blake(f"{block_size}|{inputs.cache_salt or ''}".encode())
    if inputs.adapter is not None:
        seed = _blake(seed + b"|lora|" + json.dumps(list(inputs.adapter)).encode())
    return seed


def _items_by_block(inputs: PromptInputs, block_size: int) -> dict[int, bytes]:
    """The canonical bytes of the multimodal items whose placeholder starts in each block."""
    grouped: dict[int, list[list[object]]] = {}
    for item in sorted(inputs.multimodal, key=lambda i: (i.offset, i.length, i.identifier)):
        grouped.setdefault(item.offset // block_size, []).append(
            [item.offset, item.length, item.identifier]
        )
    return {index: b"|mm|" + json.dumps(items).encode() for index, items in grouped.items()}


def chained_block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    inputs: PromptInputs = NO_INPUTS,
    max_blocks: int | None = None,
) -> list[bytes]:
    """Hash every whole block of ``token_ids``, each hash chained over the previous one.

    The salt and the adapter seed the chain, so KV computed under one salt or adapter never
    verifies against a prompt sent under another; a block where a multimodal item starts
    also hashes that item, so the same placeholder tokens for another image do not match.
    Raises :class:`TokenRangeError` for a token id outside unsigned 32 bits.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    num_blocks = len(token_ids) // block_size
    if max_blocks is not None:
        num_blocks = min(num_blocks, max_blocks)
    previous = _seed(block_size, inputs)
    items = _items_by_block(inputs, block_size)
    hashes: list[bytes] = []
    for index in range(num_blocks):
        block = token_ids[index * block_size : (index + 1) * block_size]
        try:
            packed = struct.pack(f"<{block_size}I", *block)
        except struct.error as exc:
            raise TokenRangeError(f"block {index} holds a token id outside 32 bits") from exc
        previous = _blake(previous + packed + items.get(index, b""))
        hashes.append(previous)
    return hashes


def _tail_hash(
    token_ids: Sequence[int], block_size: int, inputs: PromptInputs, hashes: Sequence[bytes]
) -> bytes:
    """The hash of the tokens after the last whole block, chained over the whole blocks."""
    tail = token_ids[len(hashes) * block_size :]
    try:
        packed = struct.pack(f"<{len(tail)}I", *tail)
    except struct.error as exc:
        raise TokenRangeError("the last partial block holds a token id outside 32 bits") from exc
    previous = hashes[-1] if hashes else _seed(block_size, inputs)
    return _blake(previous + b"|tail|" + packed)


@dataclass(frozen=True)
class TokenDigest:
    """The chained block hashes of the tokens a KV cache holds (and, for a whole prompt, the
    hash of its last partial block)."""

    block_size: int
    block_hashes: tuple[bytes, ...]
    tail: bytes | None = None

    @classmethod
    def of_tokens(
        cls,
        token_ids: Sequence[int],
        block_size: int,
        inputs: PromptInputs = NO_INPUTS,
        *,
        with_tail: bool = False,
    ) -> TokenDigest:
        """Digest the whole blocks of ``token_ids``, and with ``with_tail`` the rest too."""
        hashes = tuple(chained_block_hashes(token_ids, block_size, inputs))
        tail = _tail_hash(token_ids, block_size, inputs, hashes) if with_tail else None
        return cls(block_size, hashes, tail)

    @property
    def num_blocks(self) -> int:
        """Number of whole blocks the digest covers."""
        return len(self.block_hashes)

    def to_wire(self) -> dict[str, Any]:
        """JSON-serialisable form carried in ``kv_transfer_params``."""
        wire: dict[str, Any] = {
            "v": DIGEST_WIRE_VERSION,
            "block_size": self.block_size,
            "hashes": base64.b64encode(b"".join(self.block_hashes)).decode("ascii"),
        }
        if self.tail is not None:
            wire["tail"] = base64.b64encode(self.tail).decode("ascii")
        return wire

    @classmethod
    def from_wire(cls, wire: object) -> TokenDigest:
        """Parse the wire form; raise :class:`DigestFormatError` if it cannot be trusted."""
        if not isinstance(wire, Mapping):
            raise DigestFormatError(f"digest must be an object, got {type(wire).__name__}")
        version = wire.get("v")
        if version != DIGEST_WIRE_VERSION:
            raise DigestFormatError(f"digest wire version {version!r} is not {DIGEST_WIRE_VERSION}")
        block_size = wire.get("block_size")
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
            raise DigestFormatError(f"digest block_size {block_size!r} is not a positive int")
        encoded = wire.get("hashes")
        if not isinstance(encoded, str):
            raise DigestFormatError("digest hashes must be a base64 string")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except ValueError as exc:
            raise DigestFormatError(f"digest hashes are not valid base64: {exc}") from exc
        if len(raw) % HASH_BYTES:
            raise DigestFormatError(
                f"digest hashes length {len(raw)} is not a multiple of {HASH_BYTES}"
            )
        hashes = tuple(raw[i : i + HASH_BYTES] for i in range(0, len(raw), HASH_BYTES))
        tail = None
        if "tail" in wire:
            if not isinstance(wire["tail"], str):
                raise DigestFormatError("digest tail must be a base64 string")
            try:
                tail = base64.b64decode(wire["tail"], validate=True)
            except ValueError as exc:
                raise DigestFormatError(f"digest tail is not valid base64: {exc}") from exc
            if len(tail) != HASH_BYTES:
                raise DigestFormatError(f"digest tail is not {HASH_BYTES} bytes")
        return cls(block_size, hashes, tail)

    def matching_blocks(self, token_ids: Sequence[int], inputs: PromptInputs = NO_INPUTS) -> int:
        """Count the leading whole blocks of ``token_ids`` whose inputs match the digest."""
        candidate = chained_block_hashes(token_ids, self.block_size, inputs, self.num_blocks)
        matched = 0
        for published, computed in zip(self.block_hashes, candidate, strict=False):
            if published != computed:
                break
            matched += 1
        return matched

    def covers(self, token_ids: Sequence[int], inputs: PromptInputs = NO_INPUTS) -> bool:
        """Whether the digest is of exactly ``token_ids`` (whole blocks and tail)."""
        if self.tail is None or len(token_ids) // self.block_size != self.num_blocks:
            return False
        hashes = chained_block_hashes(token_ids, self.block_size, inputs)
        if tuple(hashes) != self.block_hashes:
            return False
        tail = _tail_hash(token_ids, self.block_size, inputs, hashes)
        return hmac.compare_digest(tail, self.tail)
