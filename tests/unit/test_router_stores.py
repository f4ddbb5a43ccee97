"""Conversation store semantics, on the in-memory store and on a real redis-server."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace

import pytest

from disagg_router.auth import OPEN_TENANT, Client, KeyGuard, OpenGuard, tenant_scope
from disagg_router.config import RouterConfig
from disagg_router.conversation import (
    Lookup,
    TenantShares,
    TurnEntry,
    conversation_key,
    scope_tag,
    split_key,
)
from disagg_router.stores import ConversationStore, tenant_shares
from disagg_router.stores.memory_store import MemoryStore
from disagg_router.stores.redis_store import RedisStore
from disagg_router.tenants import TenantKeys
from router_harness import redis_server

StoreFactory = Callable[[], ConversationStore]


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


@pytest.fixture(params=["memory", "redis"])
def make_store(request: pytest.FixtureRequest) -> StoreFactory:
    if request.param == "memory":
        return lambda: MemoryStore(max_conversations=100)
    url = request.getfixturevalue("redis_url")
    prefix = f"test:{request.node.name}:{time.monotonic_ns()}:"
    return lambda: RedisStore(url, prefix, 60, 2.0, max_connections=8, shares=TenantShares(100))


def run(make_store: StoreFactory, scenario: Callable[[ConversationStore], Awaitable[None]]) -> None:
    async def main() -> None:
        store = make_store()
        try:
            await scenario(store)
        finally:
            await store.close()

    asyncio.run(main())


def entry(seq: int, decode: str = "http://d0", ttl: float = 60.0) -> TurnEntry:
    params = {"remote_engine_id": f"e{seq}", "remote_block_ids": [[seq]]}
    return TurnEntry(params, decode, time.time(), time.time() + ttl, seq)


def test_first_turn_misses_then_next_turn_hits_once(make_store: StoreFactory) -> None:
    async def scenario(store: ConversationStore) -> None:
        first = await store.begin_turn("k")
        assert (first.seq, first.entry, first.lookup) == (0, None, Lookup.MISS)
        assert await store.open_turn("k") == 1
        assert await store.commit("k", entry(1))
        second = await store.begin_turn("k")
        assert second.lookup is Lookup.HIT and second.entry is not None
        assert second.entry.kv_transfer_params == entry(1).kv_transfer_params
        assert (second.entry.seq, second.entry.decode_url) == (1, "http://d0")
        assert second.previous_decode == "http://d0"
        third = await store.begin_turn("k")
        assert third.lookup is Lookup.MISS and third.entry is None
        assert third.previous_decode == "http://d0"

    run(make_store, scenario)


def test_the_previous_prefill_is_kept_like_the_previous_decode(make_store: StoreFactory) -> None:
    """The prefill of the last committed turn comes back with every later turn's start, taken
    entry or not; an entry of an older router, which names no prefill, reads as none."""

    async def scenario(store: ConversationStore) -> None:
        await store.begin_turn("k")
        await store.open_turn("k")
        assert await store.commit("k", replace(entry(1), prefill_url="http://p1"))
        hit = await store.begin_turn("k")
        assert (hit.previous_prefill, hit.previous_decode) == ("http://p1", "http://d0")
        assert hit.entry is not None and hit.entry.prefill_url == "http://p1"
        again = await store.begin_turn("k")
        assert (again.entry, again.previous_prefill) == (None, "http://p1")
        assert await store.commit("k", entry(3))
        older = await store.begin_turn("k")
        assert older.entry is not None and older.previous_prefill is None

    run(make_store, scenario)


def test_a_turn_without_an_entry_still_places_the_next_one(make_store: StoreFactory) -> None:
    """A turn whose decode kept no KV records its replicas (and supersedes an older entry) under
    the rule commits follow: the latest-started turn wins."""

    async def scenario(store: ConversationStore) -> None:
        await store.begin_turn("k")
        first = await store.open_turn("k")
        assert await store.commit("k", entry(first))
        second = (await store.begin_turn("k")).seq
        third = (await store.begin_turn("k")).seq
        assert await store.place("k", third, "http://d1", "http://p1")
        assert not await store.place("k", second, "http://d2", "http://p2")
        assert not await store.commit("k", entry(second))
        later = await store.begin_turn("k")
        assert (later.lookup, later.entry) == (Lookup.MISS, None)
        assert (later.previous_decode, later.previous_prefill) == ("http://d1", "http://p1")
        assert await store.place("k", later.seq, "http://d0", None)
        last = await store.begin_turn("k")
        assert (last.previous_decode, last.previous_prefill) == ("http://d0", None)

    run(make_store, scenario)


def test_an_entry_without_a_prefill_parses() -> None:
    stored = json.loads(entry(1).to_json())
    del stored["prefill_url"]
    assert TurnEntry.from_json(json.dumps(stored)).prefill_url is None


def test_expired_entry_is_reported_and_not_reused(make_store: StoreFactory) -> None:
    async def scenario(store: ConversationStore) -> None:
        assert await store.commit("k", entry(await store.open_turn("k"), ttl=-1))
        later = await store.begin_turn("k")
        assert (later.lookup, later.entry) == (Lookup.EXPIRED, None)

    run(make_store, scenario)


def test_latest_started_turn_wins_whatever_the_finish_order(make_store: StoreFactory) -> None:
    async def scenario(store: ConversationStore) -> None:
        older = await store.open_turn("k")
        newer = (await store.begin_turn("k")).seq
        newest = await store.open_turn("k")
        assert newest == newer + 1 == older + 2
        assert await store.commit("k", entry(newer, "http://d1"))
        assert not await store.commit("k", entry(older, "http://d0"))
        taken = await store.begin_turn("k")
        assert taken.entry is not None and taken.entry.seq == newer
        assert taken.entry.decode_url == "http://d1"

    run(make_store, scenario)


def test_restore_only_when_nothing_newer_committed(make_store: StoreFactory) -> None:
    async def scenario(store: ConversationStore) -> None:
        await store.commit("k", entry(1))
        failed = await store.begin_turn("k")
        assert failed.entry is not None
        assert await store.restore("k", failed.entry)
        assert not await store.restore("k", failed.entry), "an entry is already there"
        again = await store.begin_turn("k")
        assert again.lookup is Lookup.HIT and again.entry is not None
        assert await store.commit("k", entry(again.seq, "http://d1"))
        taken = await store.begin_turn("k")
        assert not await store.restore("k", again.entry), "a newer turn committed"
        assert taken.entry is not None and taken.entry.decode_url == "http://d1"

    run(make_store, scenario)


def test_conversations_are_independent(make_store: StoreFactory) -> None:
    async def scenario(store: ConversationStore) -> None:
        await store.commit("a", entry(1, "http://da"))
        assert (await store.begin_turn("b")).lookup is Lookup.MISS
        hit = await store.begin_turn("a")
        assert hit.entry is not None and hit.entry.decode_url == "http://da"

    run(make_store, scenario)


def test_drop_removes_only_the_entry_of_the_turn_named(make_store: StoreFactory) -> None:
    async def scenario(store: ConversationStore) -> None:
        assert not await store.drop("k", 1), "nothing to drop yet"
        first = await store.open_turn("k")
        assert await store.commit("k", entry(first))
        second = await store.begin_turn("k")
        assert await store.commit("k", entry(second.seq, "http://d1"))
        assert not await store.drop("k", first), "a newer turn's entry stays"
        assert await store.drop("k", second.seq)
        after = await store.begin_turn("k")
        assert (after.lookup, after.entry) == (Lookup.MISS, None)
        assert after.previous_decode == "http://d1", "the decode affinity stays"
        assert not await store.drop("k", second.seq), "already dropped"

    run(make_store, scenario)


def test_forget_removes_the_conversation_and_returns_its_entry(make_store: StoreFactory) -> None:
    async def scenario(store: ConversationStore) -> None:
        assert await store.forget("k") == (False, None)
        await store.open_turn("k")
        assert await store.forget("k") == (True, None), "known, without an entry"
        seq = await store.open_turn("k")
        assert await store.commit("k", entry(seq, "http://d1"))
        known, held = await store.forget("k")
        assert known and held is not None
        assert held.kv_transfer_params == entry(seq).kv_transfer_params
        after = await store.begin_turn("k")
        assert (after.seq, after.lookup, after.previous_decode) == (0, Lookup.MISS, None)
        assert await store.open_turn("k") == 1, "numbering starts afresh"
        await store.forget("k")
        assert await store.forget("k") == (False, None)

    run(make_store, scenario)


def test_a_conversation_is_stored_only_once_its_turn_is_opened(make_store: StoreFactory) -> None:
    async def scenario(store: ConversationStore) -> None:
        assert await store.commit("kept", entry(1, "http://d1"))
        for index in range(50):
            start = await store.begin_turn(f"refused-{index}")
            assert (start.seq, start.entry, start.lookup) == (0, None, Lookup.MISS)
            assert start.previous_decode is None
        assert await store.forget("refused-0") == (False, None), "a turn that began stored nothing"
        kept = await store.begin_turn("kept")
        assert kept.entry is not None and kept.entry.decode_url == "http://d1"

    run(make_store, scenario)


def test_turns_that_only_began_evict_nothing_from_a_full_memory_store() -> None:
    async def scenario() -> None:
        evicted: list[str] = []
        store = MemoryStore(max_conversations=2, on_evict=evicted.append)
        await store.commit("a", entry(1))
        await store.commit("b", entry(1))
        for index in range(100):
            assert (await store.begin_turn(f"fresh-{index}")).seq == 0
        assert len(store) == 2 and evicted == []
        assert await store.open_turn("fresh-0") == 1
        assert evicted == ["a"], "an opened turn takes room as any conversation does"

    asyncio.run(scenario())


def test_memory_store_is_bounded_least_recently_used_first() -> None:
    async def scenario() -> None:
        evicted: list[str] = []
        store = MemoryStore(max_conversations=2, on_evict=evicted.append)
        await store.commit("a", entry(1))
        await store.commit("b", entry(1))
        await store.begin_turn("a")
        await store.commit("c", entry(1))
        assert len(store) == 2 and evicted == ["b"]
        assert (await store.begin_turn("b")).lookup is Lookup.MISS, "b was least recently used"
        assert len(store) == 2 and evicted == ["b"], "a turn that only began stores nothing"
        await store.open_turn("b")
        assert len(store) == 2 and evicted == ["b", "a"]
        await store.forget("c")
        assert evicted == ["b", "a"], "a conversation forgotten is not evicted"

    asyncio.run(scenario())


def test_entries_round_trip_through_json() -> None:
    original = entry(7, "http://10.0.0.5:8200")
    assert TurnEntry.from_json(original.to_json()) == original


def test_conversation_key_is_scoped_by_tenant_or_open_token() -> None:
    def scope(authorization: bytes | None, path: str = "/v1/completions") -> dict[str, object]:
        headers = [(b"authorization", authorization)] if authorization is not None else []
        return {"type": "http", "path": path, "headers": headers}

    keyed = KeyGuard(TenantKeys(None, "sk-1", refresh_s=5.0))
    assert keyed.admit(scope(b"Bearer  sk-1 ")) == Client("default", "tenant:default")
    assert keyed.admit(scope(b"Basic sk-1")) is None
    assert keyed.admit(scope(None, "/health")) == Client(OPEN_TENANT, "")
    open_guard = OpenGuard()
    assert open_guard.admit(scope(b"Bearer sk-1")) == Client(OPEN_TENANT, "token:sk-1")
    assert open_guard.admit(scope(b"Basic abc")) == open_guard.admit(scope(None))
    assert open_guard.admit(scope(None)) == Client(OPEN_TENANT, "")
    assert conversation_key("c", "tenant:a") != conversation_key("c", "tenant:b")
    assert conversation_key("c", "") != conversation_key("d", "")


FLOOD = 20_000
SHARE = 100
BATCH = 500
"""Fresh ids begun and opened at once, so that the Redis flood takes seconds, not minutes (the
last one alone after them, so that it is the most recently used)."""

SharedStoreFactory = Callable[[TenantShares, list[str]], ConversationStore]


@pytest.fixture(params=["memory", "redis"])
def make_shared_store(request: pytest.FixtureRequest) -> SharedStoreFactory:
    """A store with ``shares`` that appends each key it evicts to the list given."""
    if request.param == "memory":
        return lambda shares, evicted: MemoryStore(10 * SHARE, evicted.append, shares)
    url = request.getfixturevalue("redis_url")
    prefix = f"test:{request.node.name}:{time.monotonic_ns()}:"
    return lambda shares, evicted: RedisStore(
        url, prefix, 60, 5.0, max_connections=BATCH, shares=shares, on_evict=evicted.append
    )


def key_of(tenant: str, conversation: str) -> str:
    return conversation_key(conversation, tenant_scope(tenant))


async def accepted_turn(store: ConversationStore, key: str) -> int:
    """A turn as the proxy runs one that prefill accepted: begun, and opened when the store did
    not hold its conversation; its sequence."""
    return (await store.begin_turn(key)).seq or await store.open_turn(key)


def test_a_tenant_flooding_fresh_ids_evicts_only_its_own_conversations(
    make_shared_store: SharedStoreFactory,
) -> None:
    async def main() -> None:
        evicted: list[str] = []
        store = make_shared_store(TenantShares(SHARE), evicted)
        try:
            bob = [key_of("bob", f"b{i}") for i in range(10)]
            for key in bob:
                assert await store.commit(key, entry(await accepted_turn(store, key)))
            refused = [key_of("alice", f"refused{i}") for i in range(BATCH)]
            starts = await asyncio.gather(*(store.begin_turn(key) for key in refused))
            assert {start.seq for start in starts} == {0} and evicted == [], "nothing stored"
            for start in range(0, FLOOD - 1, BATCH):
                ids = range(start, min(start + BATCH, FLOOD - 1))
                keys = [key_of("alice", f"a{i}") for i in ids]
                await asyncio.gather(*(accepted_turn(store, key) for key in keys))
            await accepted_turn(store, key_of("alice", f"a{FLOOD - 1}"))
            for key in bob:
                assert (await store.begin_turn(key)).lookup is Lookup.HIT, "bob's stayed"
            alice = scope_tag(tenant_scope("alice"))
            assert len(evicted) == FLOOD - SHARE
            assert {split_key(key)[0] for key in evicted} == {alice}
            kept = await store.forget(key_of("alice", f"a{FLOOD - 1}"))
            assert kept[0], "alice's most recent conversation is still there"
        finally:
            await store.close()

    asyncio.run(main())


def test_a_tenant_of_its_own_share_is_bounded_by_it(make_shared_store: SharedStoreFactory) -> None:
    async def main() -> None:
        evicted: list[str] = []
        config = RouterConfig(tenant_conversations=(("alice", 2),), max_conversations_per_tenant=3)
        store = make_shared_store(tenant_shares(config), evicted)
        try:
            for tenant in ("alice", "bob"):
                for index in range(4):
                    assert (await store.begin_turn(key_of(tenant, f"c{index}"))).seq == 0
            assert evicted == [], "turns that only began take no room in a share"
            for tenant in ("alice", "bob"):
                for index in range(4):
                    assert await store.open_turn(key_of(tenant, f"c{index}")) == 1
            assert evicted == [key_of("alice", "c0"), key_of("alice", "c1"), key_of("bob", "c0")]
            for index in range(10):
                assert (await store.begin_turn(key_of("alice", f"new{index}"))).seq == 0
            assert len(evicted) == 3, "nor do they once the share is full"
            for index in (2, 3):
                assert (await store.begin_turn(key_of("alice", f"c{index}"))).seq == 2
        finally:
            await store.close()

    asyncio.run(main())


def test_the_memory_stores_bound_over_all_tenants_takes_from_the_largest() -> None:
    async def main() -> None:
        evicted: list[str] = []
        store = MemoryStore(4, evicted.append, TenantShares(4))
        for index in range(3):
            await store.open_turn(key_of("alice", f"a{index}"))
        await store.open_turn(key_of("bob", "b0"))
        assert (await store.begin_turn(key_of("bob", "b1"))).seq == 0 and evicted == []
        await store.open_turn(key_of("bob", "b1"))
        assert evicted == [key_of("alice", "a0")], "alice held the most"
        await store.open_turn(key_of("carol", "c0"))
        assert evicted[1:] == [key_of("alice", "a1")], "on a tie, the least recently used"
        assert len(store) == 4

    asyncio.run(main())
