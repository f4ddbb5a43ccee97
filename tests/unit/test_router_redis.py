"""Router replicas sharing one real redis-server: reuse survives alternation and restarts."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from router_harness import RouterRig, metric, redis_server, router_process, start_engine

MODEL = "standin-model"


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
            answer = turn((first, second)[index % 2], messages, "shared")
            messages.append({"role": "assistant", "content": answer})
        assert hits(first) + hits(second) == 5
    assert sum(len(e.state.reads) for e in rig.prefill) == 5
    served = sorted(len(e.state.received) for e in rig.decode)
    assert served == [0, 6], "both routers keep the conversation on one decode"


def test_router_killed_and_restarted_keeps_conversations(rig: RouterRig, redis_url: str) -> None:
    prefill, decode = [e.url for e in rig.prefill], [e.url for e in rig.decode]
    options = ("--store", "redis", "--redis-url", redis_url, "--redis-prefix", "restart:")
    messages = [{"role": "user", "content": "before restart"}]
    with router_process(prefill, decode, *options) as first:
        turn(first, messages, "durable")
    with router_process(prefill, decode, *options) as second:
        turn(second, messages, "durable")
        assert hits(second) == 1


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
