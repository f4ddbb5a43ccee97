"""Router replicas sharing one real redis-server: reuse survives alternation and restarts, models
sharing a Redis never meet, and a Redis that never answers costs a turn its reuse, not its
answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from disagg_contract import REDIS_PREFIX_ENV, REUSE_SUMMARY_PATH
from disagg_router.config import ConfigError, RouterConfig
from engine_standin import MODEL
from router_harness import (
    RouterRig,
    bind_loopback,
    metric,
    redis_server,
    router_process,
    start_engine,
)

REDIS_TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


@pytest.fixture
def rig() -> Iterator[RouterRig]:
    running = RouterRig(
        [start_engine("prefill", f"p{i}") for i in range(2)],
        [start_engine("decode", f"d{i}") for i in range(2)],
    )
    try:
        yield running
    finally:
        running.stop()


def turn(router_url: str, messages: list[dict[str, str]], conv: str) -> str:
    with httpx.Client(base_url=router_url, timeout=10) as client:
        body = {"model": MODEL, "messages": messages, "conversation_id": conv}
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        return str(response.json()["choices"][0]["message"]["content"])


def hits(router_url: str) -> float:
    with httpx.Client(base_url=router_url, timeout=10) as client:
        return metric(client, "disagg_router_conversation_lookups_total", result="hit")


def test_alternating_turns_between_two_router_processes_still_hit(
    rig: RouterRig, redis_url: str
) -> None:
    prefill, decode = [e.url for e in rig.prefill], [e.url for e in rig.decode]
    options = ("--store", "redis", "--redis-url", redis_url, "--redis-prefix", "alt:")
    with (
        router_process(prefill, decode, *options) as first,
        router_process(prefill, decode, *options) as second,
    ):
        messages: list[dict[str, str]] = []
        for index in range(6):
            messages.append({"role": "user", "content": f"turn {index}"})
            answer = turn((first, second)[index % 2].url, messages, "shared")
            messages.append({"role": "assistant", "content": answer})
        assert hits(first.url) + hits(second.url) == 5
    assert sum(len(e.state.reads) for e in rig.prefill) == 5
    served = sorted(len(e.state.received) for e in rig.decode)
    assert served == [0, 6], "both routers keep the conversation on one decode"


def test_router_killed_and_restarted_keeps_conversations(rig: RouterRig, redis_url: str) -> None:
    prefill, decode = [e.url for e in rig.prefill], [e.url for e in rig.decode]
    options = ("--store", "redis", "--redis-url", redis_url, "--redis-prefix", "restart:")
    messages = [{"role": "user", "content": "before restart"}]
    with router_process(prefill, decode, *options) as first:
        turn(first.url, messages, "durable")
    with router_process(prefill, decode, *options) as second:
        turn(second.url, messages, "durable")
        assert hits(second.url) == 1


def test_models_with_their_own_prefix_never_share_a_conversation(
    rig: RouterRig, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefill, decode = [e.url for e in rig.prefill], [e.url for e in rig.decode]
    options = ("--store", "redis", "--redis-url", redis_url)
    messages = [{"role": "user", "content": "same id, two models"}]
    monkeypatch.setenv(REDIS_PREFIX_ENV, "disagg:team-a:model-1:conv:")
    with router_process(prefill, decode, *options) as model_1:
        turn(model_1.url, messages, "shared-id")
    with router_process(
        prefill, decode, *options, "--redis-prefix", "disagg:team-a:m2:"
    ) as model_2:
        turn(model_2.url, messages, "shared-id")
        assert hits(model_2.url) == 0, "another model's entry under the same id is not this model's"
    with router_process(prefill, decode, *options) as model_1_again:
        turn(model_1_again.url, messages, "shared-id")
        assert hits(model_1_again.url) == 1, "the prefix comes from the environment"


def test_api_key_scoping_holds_across_routers(rig: RouterRig, redis_url: str) -> None:
    options = {"store": "redis", "redis_url": redis_url, "redis_prefix": "scope:"}
    a, b = rig.start_router(**options), rig.start_router(**options)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "conversation_id": "c"}
    with httpx.Client(timeout=10) as client:
        alice = {"Authorization": "Bearer alice"}
        client.post(a.url + "/v1/chat/completions", json=body, headers=alice).raise_for_status()
        bob = {"Authorization": "Bearer bob"}
        client.post(b.url + "/v1/chat/completions", json=body, headers=bob).raise_for_status()
    assert hits(b.url) == 0


def test_unreachable_store_degrades_to_no_reuse(rig: RouterRig) -> None:
    router = rig.start_router(store="redis", redis_url="redis://127.0.0.1:1/0")
    with httpx.Client(base_url=router.url, timeout=10) as client:
        health = client.get("/health")
        assert health.status_code == 200
        assert health.json()["status"] == "degraded"
        assert health.json()["store"].startswith("unreachable")
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "conversation_id": "c",
        }
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        assert metric(client, "disagg_router_store_errors_total", operation="begin_turn") == 1


def test_a_stopped_redis_shows_in_the_store_error_counter_and_the_reuse_summary(
    rig: RouterRig,
) -> None:
    messages = [{"role": "user", "content": "before the store stops"}]
    with redis_server() as url:
        router = rig.start_router(store="redis", redis_url=url, redis_timeout_s=REDIS_TIMEOUT_S)
        turn(router.url, messages, "c")
        with httpx.Client(base_url=router.url, timeout=10) as client:
            assert client.get(REUSE_SUMMARY_PATH).json()["store_errors"] == 0
    turn(router.url, messages, "c")
    with httpx.Client(base_url=router.url, timeout=10) as client:
        assert metric(client, "disagg_router_store_errors_total", operation="begin_turn") == 1
        assert metric(client, "disagg_router_conversation_lookups_total", result="hit") == 0
        summary = client.get(REUSE_SUMMARY_PATH).json()
    assert summary["store_errors"] == 1, summary
    assert summary["turns"] == 2, "the turn was answered, without reuse"


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A Redis URL whose listener accepts connections (the kernel's backlog) and never answers."""
    with bind_loopback() as sock:
        sock.listen(1024)
        yield f"redis://127.0.0.1:{sock.getsockname()[1]}/0"


def test_a_black_holed_redis_makes_each_turn_a_miss_within_the_timeout(
    rig: RouterRig, black_hole: str
) -> None:
    router = rig.start_router(store="redis", redis_url=black_hole, redis_timeout_s=REDIS_TIMEOUT_S)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "conversation_id": "c"}
    with httpx.Client(base_url=router.url, timeout=30) as client:
        for _ in range(2):
            began = time.monotonic()
            response = client.post("/v1/chat/completions", json=body)
            took = time.monotonic() - began
            assert response.status_code == 200, response.text
            assert REDIS_TIMEOUT_S <= took < REDIS_TIMEOUT_S + 1.0, took
        assert metric(client, "disagg_router_store_errors_total", operation="begin_turn") == 2
        assert metric(client, "disagg_router_conversation_lookups_total", result="hit") == 0
        began = time.monotonic()
        health = client.get("/health")
        assert time.monotonic() - began < REDIS_TIMEOUT_S + 1.0
        assert health.status_code == 200 and health.json()["status"] == "degraded"
    assert sum(len(e.state.reads) for e in rig.prefill) == 0


def test_the_redis_timeout_is_a_positive_number_of_seconds() -> None:
    urls = ("http://p:1",)
    with pytest.raises(ConfigError, match="--redis-timeout"):
        RouterConfig(urls, urls, redis_timeout_s=0).validate()
    with pytest.raises(ConfigError, match="--redis-prefix"):
        RouterConfig(urls, urls, redis_prefix="").validate()


CONCURRENT_STREAMS = 256


async def streamed_turns(url: str, round_name: str) -> list[int]:
    """One streamed turn of each of ``CONCURRENT_STREAMS`` conversations, all at once; the
    status of each."""

    async def one(client: httpx.AsyncClient, index: int) -> int:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"{round_name} {index}"}],
            "conversation_id": f"conv-{index}",
            "stream": True,
        }
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            async for _ in response.aiter_bytes():
                pass
            return response.status_code

    limits = httpx.Limits(max_connections=CONCURRENT_STREAMS)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        return await asyncio.gather(*(one(client, i) for i in range(CONCURRENT_STREAMS)))


def test_256_concurrent_streams_meet_no_store_error_with_the_default_settings(
    rig: RouterRig, redis_url: str
) -> None:
    for engine in rig.prefill + rig.decode:
        engine.state.record = False
    for engine in rig.decode:
        engine.state.token_delay_s = 0.05  # every stream still open when the last one starts
    prefill, decode = [e.url for e in rig.prefill], [e.url for e in rig.decode]
    options = ("--store", "redis", "--redis-url", redis_url, "--redis-prefix", "streams:")
    with router_process(prefill, decode, *options) as router:
        for round_name in ("first", "second"):
            statuses = asyncio.run(streamed_turns(router.url, round_name))
            assert statuses == [200] * CONCURRENT_STREAMS
        with httpx.Client(base_url=router.url, timeout=10) as client:
            errors = metric(client, "disagg_router_store_errors_total", operation="begin_turn")
            errors += metric(client, "disagg_router_store_errors_total", operation="commit")
            assert errors == 0
            assert hits(router.url) == CONCURRENT_STREAMS, "every second turn read its KV back"
