"""The stages of a router turn, each run alone on a ``Turn`` against real stand-in engines on
loopback: read, resolve, prefill, decode, relay, and the refusal of a turn that failed."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest
from starlette.requests import Request
from starlette.types import Message

from disagg_contract import CACHE_SALT_KEY, KV_TRANSFER_PARAMS, RETAIN_KEY, Role
from disagg_router.auth import Client
from disagg_router.conversation import Lookup, TurnEntry, conversation_key
from disagg_router.errors import EngineRejected, RouterError
from disagg_router.health import HealthChecker
from disagg_router.leases import LeaseBook
from disagg_router.metrics import RouterMetrics
from disagg_router.openai_request import Endpoint
from disagg_router.payloads import EngineBodies
from disagg_router.proxy import ProxyService, Turn
from disagg_router.replicas import ReplicaPool
from disagg_router.salts import CacheSalts
from disagg_router.stores import ConversationStore
from disagg_router.stores.memory_store import MemoryStore
from disagg_router.upstream import EngineClient
from engine_standin import MODEL
from router_harness import Engine, router_config, start_engine

CLIENT = Client("alice", "tenant:alice")
SALTS = CacheSalts("engine-secret")
MESSAGES = [{"role": "user", "content": "what is a router"}]


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, list[Engine]]]:
    """Two prefill and two decode stand-ins for the whole module."""
    running = {
        "prefill": [start_engine("prefill", f"p{i}") for i in range(2)],
        "decode": [start_engine("decode", f"d{i}") for i in range(2)],
    }
    try:
        yield running
    finally:
        for engine in running["prefill"] + running["decode"]:
            engine.server.stop()


@pytest.fixture(autouse=True)
def fresh_engines(engines: dict[str, list[Engine]]) -> None:
    """Each test starts with stand-ins that received nothing and fail nothing."""
    for engine in engines["prefill"] + engines["decode"]:
        engine.state.received.clear()
        engine.state.reads.clear()
        engine.state.fail_statuses.clear()


class FailingStore(MemoryStore):
    """A store that cannot be reached."""

    async def begin_turn(self, key: str) -> Any:
        raise ConnectionError("store down")


class NoRoomStore(MemoryStore):
    """A store that fails to store a new conversation (as a Redis past its timeout)."""

    async def open_turn(self, key: str) -> int:
        raise TimeoutError("store too slow")


@asynccontextmanager
async def proxy(
    engines: dict[str, list[Engine]], store: ConversationStore | None = None
) -> AsyncIterator[ProxyService]:
    """A proxy service over the stand-ins, with its real parts."""
    config = router_config([e.url for e in engines["prefill"]], [e.url for e in engines["decode"]])
    client = EngineClient(config.connect_timeout_s)
    pools = []
    for role, urls in ((Role.PREFILL, config.prefill_urls), (Role.DECODE, config.decode_urls)):
        pool = ReplicaPool(role, config.health_interval_s, config.health_max_backoff_s)
        pool.set_urls(urls)
        pools.append(pool)
    prefill, decode = pools
    store = store if store is not None else MemoryStore(100)
    metrics = RouterMetrics()
    health = HealthChecker(client, (prefill, decode), 1.0, 1.0)
    leases = LeaseBook(client, store, metrics, config.idle_timeout_s)
    try:
        yield ProxyService(config, client, prefill, decode, store, metrics, health, leases, SALTS)
    finally:
        await client.close()


def run(
    engines: dict[str, list[Engine]],
    scenario: Callable[[ProxyService], Awaitable[None]],
    store: ConversationStore | None = None,
) -> None:
    async def main() -> None:
        async with proxy(engines, store) as service:
            await scenario(service)

    asyncio.run(main())


def turn(conversation_id: str | None = "conv", stream: bool = False) -> Turn:
    """A turn as ``read`` leaves it."""
    body = {"model": MODEL, "messages": MESSAGES, "stream": stream}
    bodies = EngineBodies(body, SALTS.salt(CLIENT.tenant, None))
    return Turn(
        Endpoint.CHAT,
        CLIENT,
        "req-1",
        0.0,
        stream=stream,
        conversation_id=conversation_id,
        bodies=bodies,
    )


async def committed(store: ConversationStore, conversation_id: str, decode_url: str) -> TurnEntry:
    """A turn of the conversation opened and committed, as a served turn leaves it."""
    params = {"remote_block_ids": [[100, 101]], "remote_num_tokens": 20, "remote_host": "h"}
    key = key_of(conversation_id)
    entry = TurnEntry(params, decode_url, time.time(), time.time() + 60, await store.open_turn(key))
    assert await store.commit(key, entry)
    return entry


def key_of(conversation_id: str) -> str:
    return conversation_key(conversation_id, CLIENT.conversation_scope)


def request_with(body: bytes) -> Request:
    scope = {
        "type": "http",
        "method": "POST",
        "path": Endpoint.CHAT.value,
        "headers": [(b"content-length", str(len(body)).encode())],
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    return Request(scope, receive)


async def never_leaves() -> Message:
    """An ASGI ``receive`` of a client that stays until the answer ends."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


def collect(sent: list[Message]) -> Callable[[Message], Awaitable[None]]:
    """An ASGI ``send`` that keeps every message in ``sent``."""

    async def send(message: Message) -> None:
        sent.append(message)

    return send


def test_read_checks_the_request_and_salts_the_engine_bodies(engines: Any) -> None:
    async def scenario(service: ProxyService) -> None:
        sent = {"model": MODEL, "messages": MESSAGES, "conversation_id": "c", "stream": True}
        read = Turn(Endpoint.CHAT, CLIENT, "req-1", 0.0)
        await service.read(read, request_with(json.dumps(sent).encode()))
        assert (read.conversation_id, read.stream) == ("c", True)
        assert read.bodies is not None
        prefill = json.loads(read.bodies.prefill({}))
        assert prefill[CACHE_SALT_KEY] == SALTS.salt("alice", None)
        assert "conversation_id" not in prefill
        salted = {**sent, CACHE_SALT_KEY: "mine"}
        await service.read(read, request_with(json.dumps(salted).encode()))
        assert read.bodies is not None
        assert json.loads(read.bodies.decode(None))[CACHE_SALT_KEY] == SALTS.salt("alice", "mine")
        with pytest.raises(RouterError) as refused:
            await service.read(read, request_with(json.dumps({**sent, "n": 2}).encode()))
        assert (refused.value.status, refused.value.param) == (400, "n")
        for replica in service._decode.members():
            service._decode.mark_failed(replica)
        with pytest.raises(RouterError) as unavailable:
            await service.read(read, request_with(json.dumps(sent).encode()))
        assert (unavailable.value.status, unavailable.value.code) == (503, "no_decode_replica")

    run(engines, scenario)


def test_resolve_takes_a_hit_and_tells_misses_apart(engines: Any) -> None:
    decode_url = engines["decode"][0].url

    async def scenario(service: ProxyService) -> None:
        store = service._store
        without = turn(conversation_id=None)
        await service.resolve(without)
        assert (without.key, without.lookup, without.seq) == (None, Lookup.NO_KEY, 0)
        unknown = turn("new")
        await service.resolve(unknown)
        assert (unknown.key, unknown.lookup, unknown.seq) == (key_of("new"), Lookup.MISS, 0)
        assert await store.forget(key_of("new")) == (False, None), "resolving stores nothing"
        first = await committed(store, "conv", decode_url)
        hit = turn()
        await service.resolve(hit)
        assert (hit.lookup, hit.seq, hit.entry) == (Lookup.HIT, 2, first)
        assert hit.start is not None and hit.start.previous_decode == decode_url
        await committed(store, "conv", decode_url)
        service._decode.set_urls([e.url for e in engines["decode"]], draining=[decode_url])
        leaving = turn()
        await service.resolve(leaving)
        assert (leaving.lookup, leaving.entry) == (Lookup.DRAINING, None)

    run(engines, scenario)


def test_resolve_runs_a_turn_without_its_store_as_a_miss(engines: Any) -> None:
    async def scenario(service: ProxyService) -> None:
        blind = turn()
        await service.resolve(blind)
        assert (blind.lookup, blind.start, blind.seq) == (Lookup.MISS, None, 0)
        assert service._metrics.store_errors.labels("begin_turn")._value.get() == 1

    run(engines, scenario, FailingStore(100))


def test_prefill_reads_a_hits_params_and_opens_an_unknown_conversation(engines: Any) -> None:
    decode_url = engines["decode"][0].url

    async def scenario(service: ProxyService) -> None:
        fresh = turn("fresh")
        await service.resolve(fresh)
        await service.prefill(fresh)
        assert fresh.prefill is not None and fresh.prefilled[KV_TRANSFER_PARAMS]
        assert fresh.seq == 1, "prefill accepted the turn: the conversation is stored"
        assert (await service._store.forget(key_of("fresh")))[0]
        await committed(service._store, "conv", decode_url)
        hit = turn()
        await service.resolve(hit)
        await service.prefill(hit)
        reads = [read for e in engines["prefill"] for read in e.state.reads]
        assert [read["remote_block_ids"] for read in reads] == [[[100, 101]]]
        assert (hit.offered, hit.entry_spent, hit.seq, hit.prompt_tokens) == (True, True, 2, 6)

    run(engines, scenario)


def test_prefill_refusing_a_turn_stores_nothing(engines: Any) -> None:
    async def scenario(service: ProxyService) -> None:
        refused = turn("refused")
        await service.resolve(refused)
        for engine in engines["prefill"]:
            engine.state.fail_statuses.append(400)
        with pytest.raises(EngineRejected) as error:
            await service.prefill(refused)
        assert error.value.status == 400 and refused.seq == 0
        assert await service._store.forget(key_of("refused")) == (False, None)

    run(engines, scenario)


def test_prefill_retries_a_failed_call_once_on_the_other_replica(engines: Any) -> None:
    async def scenario(service: ProxyService) -> None:
        failing = turn()
        await service.resolve(failing)
        for engine in engines["prefill"]:
            engine.state.fail_statuses.append(500)
        with pytest.raises(RouterError) as error:
            await service.prefill(failing)
        assert (error.value.status, error.value.code) == (502, "prefill_failed")
        assert [len(e.state.received) for e in engines["prefill"]] == [1, 1]
        assert service._metrics.prefill_retries._value.get() == 1

    run(engines, scenario)


def test_a_turn_its_store_could_not_open_is_neither_retained_nor_committed(engines: Any) -> None:
    async def scenario(service: ProxyService) -> None:
        unopened = turn("new")
        await service.resolve(unopened)
        await service.prefill(unopened)
        assert unopened.seq == 0
        assert service._metrics.store_errors.labels("open_turn")._value.get() == 1
        await service.decode(unopened)
        assert unopened.answer is not None
        await service.relay(unopened, {"type": "http"}, never_leaves, collect([]))
        [sent] = [body for e in engines["decode"] for body in e.state.received]
        assert RETAIN_KEY not in sent[KV_TRANSFER_PARAMS]
        assert await service._store.forget(key_of("new")) == (False, None), "nothing committed"

    run(engines, scenario, NoRoomStore(100))


@pytest.mark.parametrize(("conversation_id", "retained"), [("conv", True), (None, False)])
def test_decode_asks_to_retain_only_a_numbered_turns_kv(
    engines: Any, conversation_id: str | None, retained: bool
) -> None:
    async def scenario(service: ProxyService) -> None:
        decoded = turn(conversation_id)
        await service.resolve(decoded)
        await service.prefill(decoded)
        await service.decode(decoded)
        assert decoded.answer is not None and decoded.answer.status == 200
        decoded.answer.release()
        sent = [body for e in engines["decode"] for body in e.state.received]
        assert len(sent) == 1
        params = sent[0][KV_TRANSFER_PARAMS]
        assert params["do_remote_prefill"] is True
        assert (params.get(RETAIN_KEY) is True) is retained
        assert sent[0][CACHE_SALT_KEY] == SALTS.salt("alice", None)

    run(engines, scenario)


def test_decode_stays_on_the_previous_turns_replica(engines: Any) -> None:
    kept = engines["decode"][1]

    async def scenario(service: ProxyService) -> None:
        await committed(service._store, "conv", kept.url)
        decoded = turn()
        await service.resolve(decoded)
        await service.prefill(decoded)
        await service.decode(decoded)
        assert decoded.decode is not None and decoded.decode.url == kept.url
        assert decoded.answer is not None
        decoded.answer.release()

    run(engines, scenario)


@pytest.mark.parametrize("stream", [False, True])
def test_relay_answers_without_params_and_commits_them(engines: Any, stream: bool) -> None:
    async def scenario(service: ProxyService) -> None:
        relayed = turn(stream=stream)
        await service.resolve(relayed)
        await service.prefill(relayed)
        await service.decode(relayed)
        sent: list[Message] = []
        await service.relay(relayed, {"type": "http"}, never_leaves, collect(sent))
        assert relayed.answering and sent[0]["status"] == 200
        body = b"".join(m.get("body", b"") for m in sent[1:])
        assert b"w" in body and KV_TRANSFER_PARAMS.encode() not in body
        after = turn()
        await service.resolve(after)
        assert after.lookup is Lookup.HIT and after.entry is not None
        assert after.entry.seq == relayed.seq and after.entry.decode_url == relayed.decode.url

    run(engines, scenario)


def test_refuse_puts_back_an_entry_prefill_never_read(engines: Any) -> None:
    decode_url = engines["decode"][0].url

    async def scenario(service: ProxyService) -> None:
        await committed(service._store, "conv", decode_url)
        unread = turn()
        await service.resolve(unread)
        response = await service.refuse(unread, RouterError(503, "no prefill"))
        assert response.status_code == 503
        assert json.loads(bytes(response.body))["error"]["message"] == "no prefill"
        read = turn()
        await service.resolve(read)
        assert read.lookup is Lookup.HIT, "the entry went back"
        spent = replace(read, entry_spent=True)
        await service.refuse(spent, RouterError(502, "prefill broke"))
        after = turn()
        await service.resolve(after)
        assert after.lookup is Lookup.MISS, "an entry prefill may have read is gone"

    run(engines, scenario)
