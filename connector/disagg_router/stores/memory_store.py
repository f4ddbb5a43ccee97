"""In-memory conversation store: bounded, least-recently-used eviction, per-entry expiry.

Entries are kept serialized: decode's block-id lists are several times smaller as JSON text
than as Python lists (benchmarks/README.md, router section, has the sizes).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from disagg_router.conversation import Lookup, TurnEntry, TurnStart


@dataclass
class _Conversation:
    seq: int = 0
    committed: int = 0
    entry: bytes | None = None
    decode_url: str | None = None


def _nothing(key: str) -> None:
    pass


class MemoryStore:
    """Store for a single router replica; holds at most ``max_conversations`` conversations
    and calls ``on_evict`` with the key of each one it evicts for room."""

    def __init__(
        self, max_conversations: int, on_evict: Callable[[str], None] | None = None
    ) -> None:
        self._max = max_conversations
        self._on_evict = on_evict or _nothing
        self._items: OrderedDict[str, _Conversation] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def _touch(self, key: str) -> _Conversation:
        conv = self._items.get(key)
        if conv is None:
            conv = self._items[key] = _Conversation()
            while len(self._items) > self._max:
                self._on_evict(self._items.popitem(last=False)[0])
        else:
            self._items.move_to_end(key)
        return conv

    async def begin_turn(self, key: str) -> TurnStart:
        """Number a new turn and take the conversation's entry, if any; sequence 0 (nothing
        stored) for a conversation the store does not hold."""
        conv = self._items.get(key)
        if conv is None:
            return TurnStart(0, None, Lookup.MISS, None)
        self._items.move_to_end(key)
        conv.seq += 1
        raw, conv.entry = conv.entry, None
        if raw is None:
            return TurnStart(conv.seq, None, Lookup.MISS, conv.decode_url)
        entry = TurnEntry.from_json(raw)
        if entry.expired():
            return TurnStart(conv.seq, None, Lookup.EXPIRED, conv.decode_url)
        return TurnStart(conv.seq, entry, Lookup.HIT, conv.decode_url)

    async def open_turn(self, key: str) -> int:
        """Number a turn that began with sequence 0, storing its conversation (which may evict
        the least recently used one)."""
        conv = self._touch(key)
        conv.seq += 1
        return conv.seq

    async def commit(self, key: str, entry: TurnEntry) -> bool:
        """Store ``entry`` unless a later-started turn already committed."""
        conv = self._touch(key)
        if entry.seq <= conv.committed:
            return False
        conv.committed = entry.seq
        conv.entry = entry.to_json().encode()
        conv.decode_url = entry.decode_url
        return True

    async def restore(self, key: str, entry: TurnEntry) -> bool:
        """Put back an entry taken by a failed turn, if nothing newer was committed."""
        conv = self._items.get(key)
        if conv is None or conv.entry is not None or conv.committed != entry.seq:
            return False
        conv.entry = entry.to_json().encode()
        return True

    async def drop(self, key: str, seq: int) -> bool:
        """Remove the entry turn ``seq`` committed, if it is still there untaken."""
        conv = self._items.get(key)
        if conv is None or conv.entry is None or conv.committed != seq:
            return False
        conv.entry = None
        return True

    async def forget(self, key: str) -> tuple[bool, TurnEntry | None]:
        """Remove the conversation; whether it was known, and its entry."""
        conv = self._items.pop(key, None)
        if conv is None:
            return False, None
        return True, TurnEntry.from_json(conv.entry) if conv.entry is not None else None

    async def check(self) -> None:
        """Always reachable."""

    async def close(self) -> None:
        """Drop all conversations."""
        self._items.clear()
