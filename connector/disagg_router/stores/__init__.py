"""Conversation stores: one interface, an in-memory default and a Redis/Valkey one.

Semantics shared by every store (so several router replicas behave as one):

* ``begin_turn`` numbers the turn (per-conversation sequence) and *takes* the stored entry:
  decode frees retained blocks once prefill has read them, so one entry serves one turn.
  Concurrent turns of a conversation therefore resolve deterministically: the first to start
  reuses the KV, the others recompute. A conversation the store does not hold is left as it
  is (not stored, the turn not numbered: sequence 0).
* ``open_turn`` numbers such a turn once prefill accepted it, storing the conversation: a
  request prefill refuses never takes room in the store, nor evicts another conversation.
* ``commit`` stores a successful turn's entry only if no later-started turn committed first
  (highest sequence wins, whatever order the turns finish in).
* ``place`` records where a successful turn that left no entry ran (decode kept no KV: its
  bidirectional transfer is off, or it refused), under the same rule, so that the next turn
  still finds its prefill and decode replicas (their prefix caches hold its prompt).
* ``restore`` puts an entry back when its turn failed before prefill could read the blocks,
  unless a newer turn has committed since.
* ``drop`` removes the entry a given turn committed, and only that one: a router releasing its
  lease on decode's KV (idle, or freed by decode) never removes a newer turn's entry.
* ``forget`` removes a conversation (the client closed it) and returns the entry it held.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from disagg_router.auth import tenant_scope
from disagg_router.config import RouterConfig, StoreKind
from disagg_router.conversation import TenantShares, TurnEntry, TurnStart, scope_tag

REDIS_SPARE_CONNECTIONS = 16
"""Redis connections beyond one per request slot: the lease book's drops, a client's DELETE of a
conversation and the health check use the store outside the slots."""


class ConversationStore(Protocol):
    """Per-conversation state behind the router."""

    async def begin_turn(self, key: str) -> TurnStart:
        """Number a new turn and take the conversation's entry, if any; sequence 0 (nothing
        stored) for a conversation the store does not hold."""
        ...

    async def open_turn(self, key: str) -> int:
        """Number a turn that began with sequence 0, storing its conversation."""
        ...

    async def commit(self, key: str, entry: TurnEntry) -> bool:
        """Store ``entry`` (its ``seq`` is the turn's); False if a newer turn won."""
        ...

    async def place(self, key: str, seq: int, decode_url: str, prefill_url: str | None) -> bool:
        """Record the replicas of turn ``seq``, which left no entry; False if a newer turn won."""
        ...

    async def restore(self, key: str, entry: TurnEntry) -> bool:
        """Put back an entry taken by a failed turn; False if superseded."""
        ...

    async def drop(self, key: str, seq: int) -> bool:
        """Remove the entry turn ``seq`` committed, if it is still there untaken."""
        ...

    async def forget(self, key: str) -> tuple[bool, TurnEntry | None]:
        """Remove every trace of the conversation; whether it had any, and its entry."""
        ...

    async def check(self) -> None:
        """Raise if the store cannot be reached."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


def tenant_shares(config: RouterConfig) -> TenantShares:
    """Each tenant's bound on its conversations: ``--tenant-conversations``, else
    ``--max-conversations-per-tenant``."""
    overrides = {scope_tag(tenant_scope(t)): n for t, n in config.tenant_conversations}
    return TenantShares(config.max_conversations_per_tenant, overrides)


def build_store(
    config: RouterConfig, on_evict: Callable[[str], None] | None = None
) -> ConversationStore:
    """Instantiate the store ``config`` names (lazy import of the Redis client); a store calls
    ``on_evict`` with the key of each conversation it evicts for room."""
    shares = tenant_shares(config)
    if config.store == StoreKind.REDIS:
        from disagg_router.stores.redis_store import RedisStore

        return RedisStore(
            config.redis_url,
            config.redis_prefix,
            config.conversation_ttl_s,
            config.redis_timeout_s,
            config.max_concurrent_requests + REDIS_SPARE_CONNECTIONS,
            shares,
            on_evict,
        )
    from disagg_router.stores.memory_store import MemoryStore

    return MemoryStore(config.max_conversations, on_evict, shares)
