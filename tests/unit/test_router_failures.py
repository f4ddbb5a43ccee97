"""Failures: prefill retry, decode failover, engine errors, unhealthy replicas, entry upkeep."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from engine_standin import MODEL
from router_harness import RouterRig, metric, start_engine

# Health checks too rare to notice a replica going away: only failed calls reveal it.
unwatched = pytest.mark.parametrize(
    "rig", [{"health_interval_s": 60}], indirect=True, ids=["health-60s"]
)


def chat_body(text: str = "hello", conv: str = "c", **fields: object) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "conversation_id": conv,
        **fields,
    }


def turn(
    client: httpx.Client, text: str = "hello", conv: str = "c", **fields: object
) -> httpx.Response:
    return client.post("/v1/chat/completions", json=chat_body(text, conv, **fields))


def lookups(client: httpx.Client, result: str) -> float:
    return metric(client, "disagg_router_conversation_lookups_total", result=result)


def outstanding(rig: RouterRig) -> list[int]:
    """Requests the router counts in flight, per prefill then decode replica."""
    state = rig.routers[0].app_state()
    return [r.outstanding for pool in (state.prefill, state.decode) for r in pool.members()]


def wait_until(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not callable(condition) or not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def test_prefill_error_is_retried_on_the_other_replica(
    rig: RouterRig, client: httpx.Client
) -> None:
    broken, healthy = rig.prefill
    broken.state.fail_statuses = [500] * 10
    for index in range(2):
        assert turn(client, conv=f"c{index}").status_code == 200
    assert (len(broken.state.received), len(healthy.state.received)) == (1, 2)
    assert metric(client, "disagg_router_prefill_retries_total") == 1
    labels = {"role": "prefill", "replica": broken.url, "kind": "http_500"}
    assert metric(client, "disagg_router_upstream_errors_total", **labels) == 1


@unwatched
def test_unreachable_prefill_fails_over_and_still_reuses_kv(
    rig: RouterRig, client: httpx.Client
) -> None:
    assert turn(client).status_code == 200
    # The prefill that served the first turn, which the conversation's next turn goes back to.
    dead, live = sorted(rig.prefill, key=lambda prefill: -len(prefill.state.received))
    dead.server.stop()
    for _ in range(2):
        assert turn(client).status_code == 200
    labels = {"role": "prefill", "replica": dead.url, "kind": "connect"}
    assert metric(client, "disagg_router_upstream_errors_total", **labels) == 1
    assert metric(client, "disagg_router_prefill_retries_total") == 1
    assert lookups(client, "hit") == 2
    assert len(live.state.reads) == 2, "the retry still read decode's blocks"
    assert outstanding(rig) == [0, 0, 0, 0], "a refused call is no longer in flight"


def test_engine_client_errors_are_relayed_and_keep_the_entry(
    rig: RouterRig, client: httpx.Client
) -> None:
    assert turn(client).status_code == 200
    for engine in rig.prefill:
        engine.state.fail_statuses = [400]
    rejected = turn(client)
    assert rejected.status_code == 400
    assert rejected.json()["error"]["message"] == "stand-in failure 400"
    for engine in rig.prefill:
        engine.state.fail_statuses.clear()
    assert turn(client).status_code == 200
    assert lookups(client, "hit") == 2, "the rejected turn put the entry back"


def test_prefill_failing_everywhere_gives_502_then_next_turn_recomputes(
    rig: RouterRig, client: httpx.Client
) -> None:
    assert turn(client).status_code == 200
    for engine in rig.prefill:
        engine.state.fail_statuses = [503]
    failed = turn(client)
    assert failed.status_code == 502
    assert failed.json()["error"]["code"] == "prefill_failed"
    assert "X-Request-Id" in failed.headers
    assert turn(client).status_code == 200
    assert (lookups(client, "hit"), lookups(client, "miss")) == (1, 2)


@unwatched
def test_no_prefill_reachable_is_503_and_keeps_the_entry(
    rig: RouterRig, client: httpx.Client
) -> None:
    assert turn(client).status_code == 200
    ports = [e.server.port for e in rig.prefill]
    for engine in rig.prefill:
        engine.server.stop()
    down = turn(client)
    assert down.status_code == 503
    assert down.json()["error"]["type"] == "service_unavailable"
    rig.prefill = [start_engine("prefill", f"p{i}", port) for i, port in enumerate(ports)]
    wait_until(lambda: client.get("/health").status_code == 200)
    assert turn(client).status_code == 200
    assert lookups(client, "hit") == 2
    reads = [r for e in rig.prefill for r in e.state.reads]
    assert len(reads) == 1, "the unserved turn kept the entry usable"


def test_decode_killed_between_turns_next_turn_recomputes_elsewhere(
    rig: RouterRig, client: httpx.Client
) -> None:
    assert turn(client).status_code == 200
    (used,) = [e for e in rig.decode if e.state.received]
    (other,) = [e for e in rig.decode if e is not used]
    used.server.stop()
    wait_until(lambda: client.get("/health").json()["decode_healthy"] == 1)
    assert turn(client).status_code == 200
    assert len(other.state.received) == 1
    assert [r for e in rig.prefill for r in e.state.reads] == [], "no read from a dead decode"
    assert lookups(client, "stale") == 1
    assert turn(client).status_code == 200
    assert lookups(client, "hit") == 1


@unwatched
def test_decode_dying_unnoticed_fails_over_to_another_decode(
    rig: RouterRig, client: httpx.Client
) -> None:
    assert turn(client).status_code == 200
    (used,) = [e for e in rig.decode if e.state.received]
    (other,) = [e for e in rig.decode if e is not used]
    used.server.stop()
    assert turn(client).status_code == 200
    assert len(other.state.received) == 1
    labels = {"role": "decode", "replica": used.url, "kind": "connect"}
    assert metric(client, "disagg_router_upstream_errors_total", **labels) == 1
    assert metric(client, "disagg_router_decode_affinity_total", result="kept") == 1
    assert outstanding(rig) == [0, 0, 0, 0], "a refused call is no longer in flight"


def test_decode_error_is_a_502_for_that_request_only(rig: RouterRig, client: httpx.Client) -> None:
    for engine in rig.decode:
        engine.state.fail_statuses = [500]
    failed = turn(client, conv="a")
    assert failed.status_code == 502
    assert failed.json()["error"]["code"] == "decode_failed"
    for engine in rig.decode:
        engine.state.fail_statuses.clear()
    assert turn(client, conv="b").status_code == 200
    labels = {"endpoint": "/v1/chat/completions", "outcome": "upstream_error"}
    assert metric(client, "disagg_router_requests_total", **labels) == 1
    assert outstanding(rig) == [0, 0, 0, 0], "a refused answer is released"


def test_unhealthy_replicas_are_skipped_until_they_recover(
    rig: RouterRig, client: httpx.Client
) -> None:
    down = rig.decode[0]
    port = down.server.port
    down.server.stop()
    wait_until(lambda: client.get("/health").json()["decode_healthy"] == 1)
    assert metric(client, "disagg_router_replica_healthy", role="decode", replica=down.url) == 0
    for index in range(4):
        assert turn(client, conv=f"n{index}").status_code == 200
    assert len(rig.decode[1].state.received) == 4
    rig.decode[0] = start_engine("decode", "d0", port)
    wait_until(lambda: client.get("/health").json()["decode_healthy"] == 2)


def test_no_healthy_decode_is_503(rig: RouterRig, client: httpx.Client) -> None:
    for engine in rig.decode:
        engine.server.stop()
    wait_until(lambda: client.get("/health").status_code == 503)
    response = turn(client)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_decode_replica"
    assert sum(len(e.state.received) for e in rig.prefill) == 0, "no prefill work wasted"


def test_concurrent_turns_of_one_conversation_reuse_the_kv_once(
    rig: RouterRig, client: httpx.Client
) -> None:
    assert turn(client).status_code == 200
    for engine in rig.prefill:
        engine.state.delay_s = 0.2

    async def fan_out() -> list[int]:
        async with httpx.AsyncClient(base_url=rig.routers[0].url, timeout=10) as http:
            body = chat_body("tool call")
            responses = await asyncio.gather(
                *(http.post("/v1/chat/completions", json=body) for _ in range(5))
            )
            return [r.status_code for r in responses]

    assert asyncio.run(fan_out()) == [200] * 5
    assert sum(len(e.state.reads) for e in rig.prefill) == 1
    assert (lookups(client, "hit"), lookups(client, "miss")) == (1, 5)
    for engine in rig.prefill:
        engine.state.delay_s = 0
    assert turn(client).status_code == 200
    assert lookups(client, "hit") == 2, "exactly one of the concurrent turns' entries was kept"


def test_client_leaving_mid_stream_releases_the_decode_call(
    rig: RouterRig, client: httpx.Client
) -> None:
    assert turn(client).status_code == 200
    for engine in rig.decode:
        engine.state.token_delay_s = 0.2
    body = chat_body("long answer", stream=True, max_tokens=50)
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        next(response.iter_bytes())
    state = rig.routers[0].app_state()
    wait_until(lambda: all(r.outstanding == 0 for r in state.decode.members()))
    labels = {"endpoint": "/v1/chat/completions", "outcome": "cancelled"}
    wait_until(lambda: metric(client, "disagg_router_requests_total", **labels) == 1)
    for engine in rig.decode:
        engine.state.token_delay_s = 0
    assert turn(client).status_code == 200
    assert lookups(client, "miss") == 2, "an unfinished turn stores nothing"


def test_decode_restarted_in_place_does_not_get_stale_reads(
    rig: RouterRig, client: httpx.Client
) -> None:
    assert turn(client).status_code == 200
    index = next(i for i, e in enumerate(rig.decode) if e.state.received)
    port = rig.decode[index].server.port
    rig.decode[index].server.stop()
    wait_until(lambda: client.get("/health").json()["decode_healthy"] == 1)
    rig.decode[index] = start_engine("decode", "d-restarted", port)
    wait_until(lambda: client.get("/health").json()["decode_healthy"] == 2)
    assert turn(client).status_code == 200
    assert lookups(client, "stale") == 1, "its retained KV died with the old process"
    assert [r for e in rig.prefill for r in e.state.reads] == []


def test_decode_stream_breaking_off_ends_with_an_error_event(
    rig: RouterRig, client: httpx.Client
) -> None:
    assert turn(client).status_code == 200
    for engine in rig.decode:
        engine.state.break_stream_after = 3
    response = turn(client, stream=True)
    assert response.status_code == 200
    last = response.text.strip().split("\n\n")[-1]
    assert last.startswith("data: ") and '"error"' in last
    labels = {"endpoint": "/v1/chat/completions", "outcome": "upstream_error"}
    assert metric(client, "disagg_router_requests_total", **labels) == 1
    for engine in rig.decode:
        engine.state.break_stream_after = None
    assert turn(client).status_code == 200
    assert lookups(client, "miss") == 2, "the broken turn stored nothing"


@pytest.mark.parametrize(
    "rig", [{"prefill_timeout_s": 0.3, "decode_timeout_s": 0.3}], indirect=True, ids=["read-0.3s"]
)
def test_engine_timeouts_bound_each_read_not_the_whole_answer(
    rig: RouterRig, client: httpx.Client
) -> None:
    for engine in rig.prefill:
        engine.state.delay_s = 1.0
    response = turn(client)
    assert response.status_code == 504 and response.json()["error"]["code"] == "prefill"
    for engine in rig.prefill:
        labels = {"role": "prefill", "replica": engine.url, "kind": "timeout"}
        assert metric(client, "disagg_router_upstream_errors_total", **labels) == 1
        engine.state.delay_s = 0
    state = rig.routers[0].app_state()
    assert all(r.healthy for r in state.prefill.members()), "a slow answer is no refusal"
    for engine in rig.decode:
        engine.state.token_delay_s = 0.1
    slow = turn(client, stream=True, max_tokens=6)
    assert slow.status_code == 200 and '"error"' not in slow.text, "0.6 s in 0.1 s steps"
    for engine in rig.decode:
        engine.state.token_delay_s = 1.0
    stalled = turn(client, stream=True, max_tokens=2)
    last = stalled.text.strip().split("\n\n")[-1]
    assert last.startswith("data: ") and '"error"' in last
    for engine in rig.decode:
        engine.state.token_delay_s = 0
