"""Chained per-block digests of the token sequence a KV cache holds.

Decode publishes the digest of the tokens its retained KV was computed from; prefill hashes
its new prompt the same way and keeps only the leading blocks whose hashes match. A block's
hash chains over every block before it, so equal hashes at block ``i`` mean equal tokens in
blocks ``0..i`` (up to a 64-bit second preimage). The wire format is versioned: a reader
refuses any version it does not know, so reuse is never granted on a format it cannot check.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from disagg_contract import DIGEST_WIRE_VERSION

HASH_BYTES = 8
_PERSON = b"disagg-kv-v1"


class DigestFormatError(ValueError):
    """A published digest is malformed or of an unknown wire version."""


def _seed(block_size: int, cache_salt: str | None) -> bytes:
    seed = f"{block_size}|{cache_salt or ''}".encode()
    return hashlib.blake2b(seed, digest_size=HASH_BYTES, person=_PERSON).digest()


def chained_block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    cache_salt: str | None = None,
    max_blocks: int | None = None,
) -> list[bytes]:
    """Hash every whole block of ``token_ids``, each hash chained over the previous one.

    ``cache_salt`` (vLLM's per-tenant prefix-cache salt) seeds the chain, so KV computed
    under one salt never verifies against a prompt sent under another.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    num_blocks = len(token_ids) // block_size
    if max_blocks is not None:
        num_blocks = min(num_blocks, max_blocks)
    previous = _seed(block_size, cache_salt)
    hashes: list[bytes] = []
    for index in range(num_blocks):
        block = token_ids[index * block_size : (index + 1) * block_size]
        packed = struct.pack(f"<{block_size}I", *block)
        previous = hashlib.blake2b(
            previous + packed, digest_size=HASH_BYTES, person=_PERSON
        ).digest()
        hashes.append(previous)
    return hashes


@dataclass(frozen=True)
class TokenDigest:
    """The chained block hashes of the tokens a retained KV cache holds."""

    block_size: int
    block_hashes: tuple[bytes, ...]

    @classmethod
    def of_tokens(
        cls, token_ids: Sequence[int], block_size: int, cache_salt: str | None = None
    ) -> TokenDigest:
        """Digest the whole blocks of ``token_ids``."""
        return cls(block_size, tuple(chained_block_hashes(token_ids, block_size, cache_salt)))

    @property
    def num_blocks(self) -> int:
        """Number of whole blocks the digest covers."""
        return len(self.block_hashes)

    def to_wire(self) -> dict[str, Any]:
        """JSON-serialisable form carried in ``kv_transfer_params``."""
        return {
            "v": DIGEST_WIRE_VERSION,
            "block_size": self.block_size,
            "hashes": base64.b64encode(b"".join(self.block_hashes)).decode("ascii"),
        }

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
        return cls(block_size, hashes)

    def matching_blocks(self, token_ids: Sequence[int], cache_salt: str | None = None) -> int:
        """Count the leading whole blocks of ``token_ids`` whose tokens match the digest."""
        candidate = chained_block_hashes(token_ids, self.block_size, cache_salt, self.num_blocks)
        matched = 0
        for published, computed in zip(self.block_hashes, candidate, strict=False):
            if published != computed:
                break
            matched += 1
        return matched
