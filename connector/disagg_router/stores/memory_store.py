"""In-memory conversation store: bounded per tenant and in all, least-recently-used eviction,
per-entry expiry.

Each scope (tenant) keeps its conversations in an LRU of its own, bounded by its share
(:class:`TenantShares`): a tenant opening its share-plus-first conversation (``open_turn``)
evicts its own least recently used one. When all scopes together reach ``max_conversations``,
the scope holding the most gives up its least recently used one (of scopes as large, the one
whose least recently used conversation is the oldest), so a tenant flooding the store with
fresh ids evicts only its own conversations.

Entries are kept serialized: decode's block-id lists are several times smaller as JSON text
than as Python lists (benchmarks/README.md, router section, has the sizes).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from disagg_router.conversation import Lookup, TenantShares, TurnEntry, TurnStart


@dataclass
class _Conversation:
    seq: int = 0
    committed: int = 0
    entry: bytes | None = None
    decode_url: str | None = None
    prefill_url: str | None = None
    used: int = 0
    """When it was last used, in the store's own count of uses."""


def _nothing(key: str) -> None:
    pass


class MemoryStore:
    """Store for a single router replica; holds at most ``max_conversations`` conversations, of
    each scope at most its share (without ``shares``, ``max_conversations``), and calls
    ``on_evict`` with the key of each one it evicts for room."""

    def __init__(
        self,
        max_conversations: int,
        on_evict: Callable[[str], None] | None = None,
        shares: TenantShares | None = None,
    ) -> None:
        self._max = max_conversations
        self._on_evict = on_evict or _nothing
        self._shares = shares or TenantShares(max_conversations)
        self._scopes: dict[str, OrderedDict[str, _Conversation]] = {}
        self._count = 0
        self._uses = 0

    def __len__(self) -> int:
        return self._count

    def _get(self, key: str) -> _Conversation | None:
        scope = self._scopes.get(self._shares.of(key)[0])
        return scope.get(key) if scope is not None else None

    def _touch(self, key: str) -> _Conversation:
        tag, share = self._shares.of(key)
        scope = self._scopes.setdefault(tag, OrderedDict())
        self._uses += 1
        conv = scope.get(key)
        if conv is not None:
            scope.move_to_end(key)
            conv.used = self._uses
            return conv
        conv = scope[key] = _Conversation(used=self._uses)
        self._count += 1
        while len(scope) > share:
            self._evict(tag, scope)
        while self._count > self._max:
            self._evict(*self._largest_but(tag))
        return conv

    def _largest_but(self, tag: str) -> tuple[str, OrderedDict[str, _Conversation]]:
        """The scope holding the most conversations (on a tie ``tag``'s, the one adding, then
        the one whose least recently used conversation is the oldest), leaving out ``tag``'s
        when it holds only the conversation being added."""
        return max(
            ((t, s) for t, s in self._scopes.items() if t != tag or len(s) > 1),
            key=lambda item: (len(item[1]), item[0] == tag, -next(iter(item[1].values())).used),
        )

    def _evict(self, tag: str, scope: OrderedDict[str, _Conversation]) -> None:
        key = scope.popitem(last=False)[0]
        self._count -= 1
        if not scope:
            del self._scopes[tag]
        self._on_evict(key)

    async def begin_turn(self, key: str) -> TurnStart:
        """Number a new turn and take the conversation's entry, if any; sequence 0 (nothing
        stored) for a conversation the store does not hold."""
        if self._get(key) is None:
            return TurnStart(0, None, Lookup.MISS, None)
        conv = self._touch(key)
        conv.seq += 1
        raw, conv.entry = conv.entry, None
        previous = conv.decode_url, conv.prefill_url
        if raw is None:
            return TurnStart(conv.seq, None, Lookup.MISS, *previous)
        entry = TurnEntry.from_json(raw)
        if entry.expired():
            return TurnStart(conv.seq, None, Lookup.EXPIRED, *previous)
        return TurnStart(conv.seq, entry, Lookup.HIT, *previous)

    async def open_turn(self, key: str) -> int:
        """Number a turn that began with sequence 0, storing its conversation in its scope's
        share (which may evict the scope's least recently used one)."""
        conv = self._touch(key)
        conv.seq += 1
        return conv.seq

    async def commit(self, key: str, entry: TurnEntry) -> bool:
        """Store ``entry`` unless a later-started turn already committed."""
        raw = entry.to_json().encode()
        return self._settle(key, entry.seq, raw, entry.decode_url, entry.prefill_url)

    async def place(self, key: str, seq: int, decode_url: str, prefill_url: str | None) -> bool:
        """Record where turn ``seq`` ran, with no entry, unless a later-started turn already
        committed."""
        return self._settle(key, seq, None, decode_url, prefill_url)

    def _settle(
        self, key: str, seq: int, raw: bytes | None, decode_url: str, prefill_url: str | None
    ) -> bool:
        """Turn ``seq``'s commit: its entry (None: none) and replicas, if no newer turn won."""
        conv = self._touch(key)
        if seq <= conv.committed:
            return False
        conv.committed, conv.entry = seq, raw
        conv.decode_url, conv.prefill_url = decode_url, prefill_url
        return True

    async def restore(self, key: str, entry: TurnEntry) -> bool:
        """Put back an entry taken by a failed turn, if nothing newer was committed."""
        conv = self._get(key)
        if conv is None or conv.entry is not None or conv.committed != entry.seq:
            return False
        conv.entry = entry.to_json().encode()
        return True

    async def drop(self, key: str, seq: int) -> bool:
        """Remove the entry turn ``seq`` committed, if it is still there untaken."""
        conv = self._get(key)
        if conv is None or conv.entry is None or conv.committed != seq:
            return False
        conv.entry = None
        return True

    async def forget(self, key: str) -> tuple[bool, TurnEntry | None]:
        """Remove the conversation; whether it was known, and its entry."""
        tag = self._shares.of(key)[0]
        scope = self._scopes.get(tag)
        conv = scope.pop(key, None) if scope is not None else None
        if conv is None:
            return False, None
        self._count -= 1
        if not scope:
            del self._scopes[tag]
        return True, TurnEntry.from_json(conv.entry) if conv.entry is not None else None

    async def check(self) -> None:
        """Always reachable."""

    async def close(self) -> None:
        """Drop all conversations."""
        self._scopes.clear()
        self._count = 0
