"""Conversation keys and what the router remembers about a conversation's last turn."""

from __future__ import annotations

import enum
import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from disagg_contract import KV_TRANSFER_PARAMS

SESSION_HEADER = "X-Session-ID"
MAX_CONVERSATION_ID_CHARS = 512


class Lookup(enum.StrEnum):
    """Outcome of looking a conversation up at the start of a turn."""

    HIT = "hit"
    MISS = "miss"
    EXPIRED = "expired"
    STALE = "stale"
    DRAINING = "draining"
    """The entry's KV is on a decode replica that is leaving: the turn recomputes elsewhere."""
    NO_KEY = "no_key"


@dataclass(frozen=True)
class TurnEntry:
    """Decode's KV metadata after a successful turn, where that KV lives, and the prefill
    replica that served the turn (its prefix cache holds the conversation's prompt)."""

    kv_transfer_params: dict[str, Any]
    decode_url: str
    created_at: float
    expires_at: float
    seq: int
    prefill_url: str | None = None

    def to_json(self) -> str:
        """Serialize for a store (field by field: ``asdict`` would deep-copy the block ids)."""
        fields = {name: getattr(self, name) for name in _ENTRY_FIELDS}
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> TurnEntry:
        """Inverse of ``to_json``."""
        data = json.loads(text)
        return cls(
            kv_transfer_params=dict(data[KV_TRANSFER_PARAMS]),
            decode_url=str(data["decode_url"]),
            created_at=float(data["created_at"]),
            expires_at=float(data["expires_at"]),
            seq=int(data["seq"]),
            prefill_url=_optional_str(data.get("prefill_url")),
        )

    def expired(self, now: float | None = None) -> bool:
        """Whether decode may already have released this KV."""
        return (time.time() if now is None else now) >= self.expires_at


_ENTRY_FIELDS = tuple(field.name for field in fields(TurnEntry))


def _optional_str(value: object) -> str | None:
    """A string field an older router's entry may lack."""
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class TurnStart:
    """What a store hands a starting turn: its sequence number, the entry it took, and the
    decode and prefill replicas of the last committed turn (kept even once the entry is taken or
    expired)."""

    seq: int
    entry: TurnEntry | None
    lookup: Lookup
    previous_decode: str | None
    previous_prefill: str | None = None


def scope_tag(scope: str) -> str:
    """The part of a conversation key that names its scope (a digest: an open router's scope is
    a bearer token, which no store may hold in clear)."""
    return hashlib.sha256(scope.encode()).hexdigest()[:16]


def conversation_key(conversation_id: str, scope: str) -> str:
    """The store key of a conversation in a scope (``auth``: a tenant, or an open router's
    bearer token): one id in two scopes is two conversations. ``<scope tag>.<digest>``: a store
    bounds each scope's conversations by the tag (:class:`TenantShares`)."""
    digest = hashlib.sha256(f"{scope}\0{conversation_id}".encode()).hexdigest()
    return f"{scope_tag(scope)}.{digest[:40]}"


def split_key(key: str) -> tuple[str, str]:
    """A conversation key's scope tag and the digest of its id in that scope."""
    tag, _, digest = key.partition(".")
    return tag, digest


@dataclass(frozen=True)
class TenantShares:
    """How many conversations each scope may keep in a store: ``default``, or its own number
    (``by_tag``, by :func:`scope_tag`). A scope past its share gives up its own least recently
    used conversation, never another scope's."""

    default: int
    by_tag: Mapping[str, int] = field(default_factory=dict)

    def of(self, key: str) -> tuple[str, int]:
        """The scope tag of conversation ``key`` and that scope's share."""
        tag = split_key(key)[0]
        return tag, self.by_tag.get(tag, self.default)
