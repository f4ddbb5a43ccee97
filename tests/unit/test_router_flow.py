"""Turn flow through the router against engine stand-ins: params, reuse, streaming, scoping."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from disagg_contract import PrefillRouting
from engine_standin import MODEL
from router_harness import RouterRig, metric


def sse_events(text: str) -> list[Any]:
    """The decoded ``data:`` payloads of an SSE body (``[DONE]`` kept as a string)."""
    events = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            payload = block[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def chat(
    client: httpx.Client,
    messages: list[dict[str, str]],
    *,
    stream: bool = False,
    headers: dict[str, str] | None = None,
    **fields: Any,
) -> tuple[httpx.Response, str]:
    """Send one chat turn; return the response and the assistant text."""
    body = {"model": MODEL, "messages": messages, "stream": stream, **fields}
    response = client.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    if not stream:
        return response, response.json()["choices"][0]["message"]["content"]
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    text = "".join(
        c["delta"].get("content", "") for e in events[:-1] for c in e["choices"] if "delta" in c
    )
    return response, text


def conversation(client: httpx.Client, turns: int, stream: bool, **fields: Any) -> list[str]:
    messages: list[dict[str, str]] = []
    answers = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn} about routers"})
        _, answer = chat(client, messages, stream=stream, **fields)
        messages.append({"role": "assistant", "content": answer})
        answers.append(answer)
    return answers


@pytest.mark.parametrize("stream", [False, True])
def test_second_turn_sends_decode_params_to_prefill(
    rig: RouterRig, client: httpx.Client, stream: bool
) -> None:
    conversation(client, 3, stream, conversation_id="conv-1")
    prefill_bodies = [b for e in rig.prefill for b in e.state.received]
    decode_bodies = [b for e in rig.decode for b in e.state.received]
    assert len(prefill_bodies) == len(decode_bodies) == 3
    for body in prefill_bodies:
        assert (body["max_tokens"], body["stream"]) == (1, False)
        assert "stream_options" not in body and "conversation_id" not in body
        assert body["kv_transfer_params"]["do_remote_decode"] is True
        assert body["kv_transfer_params"]["do_remote_prefill"] is False
    first = min(prefill_bodies, key=lambda b: len(b["messages"]))
    assert first["kv_transfer_params"]["remote_block_ids"] is None
    reads = [params for e in rig.prefill for params in e.state.reads]
    assert len(reads) == 2, "turns 2 and 3 read decode's blocks back"
    for params in reads:
        assert params["remote_engine_id"].startswith("d")
        assert params["remote_host"] == "127.0.0.1", "decode's 'localhost' is rewritten"
    for body in decode_bodies:
        assert body["kv_transfer_params"]["do_remote_prefill"] is True
        assert body["kv_transfer_params"]["remote_engine_id"].startswith("p")
        assert body["stream"] is stream
    assert metric(client, "disagg_router_conversation_lookups_total", result="miss") == 1
    assert metric(client, "disagg_router_conversation_lookups_total", result="hit") == 2


def test_decode_keeps_serving_the_conversation(rig: RouterRig, client: httpx.Client) -> None:
    conversation(client, 4, False, conversation_id="sticky")
    served = [len(e.state.received) for e in rig.decode]
    assert sorted(served) == [0, 4]
    assert metric(client, "disagg_router_decode_affinity_total", result="kept") == 3
    assert metric(client, "disagg_router_pd_saved_tokens_total") > 0


def test_prefill_keeps_serving_the_conversation(rig: RouterRig, client: httpx.Client) -> None:
    """Prefill's prefix cache holds the conversation too: its turns go back to the replica of
    the previous turn, while turns of other conversations spread over both."""
    conversation(client, 4, False, conversation_id="sticky")
    assert sorted(len(e.state.received) for e in rig.prefill) == [0, 4]
    assert metric(client, "disagg_router_prefill_affinity_total", result="kept") == 3
    assert metric(client, "disagg_router_prefill_affinity_total", result="none") == 1
    for index in range(4):
        conversation(client, 1, False, conversation_id=f"other-{index}")
    assert min(len(e.state.received) for e in rig.prefill) > 0


def test_a_conversation_keeps_its_replicas_when_decode_keeps_no_kv(
    rig: RouterRig, client: httpx.Client
) -> None:
    """With bidirectional transfer off decode offers nothing, so there is no entry to store; the
    router still records where each turn ran, and the prefix caches keep serving it."""
    for engine in rig.decode:
        engine.state.retains = False
    conversation(client, 4, False, conversation_id="plain")
    assert sorted(len(e.state.received) for e in rig.prefill) == [0, 4]
    assert sorted(len(e.state.received) for e in rig.decode) == [0, 4]
    assert metric(client, "disagg_router_prefill_affinity_total", result="kept") == 3
    assert metric(client, "disagg_router_conversation_lookups_total", result="hit") == 0
    assert [r for e in rig.prefill for r in e.state.reads] == []


@pytest.mark.parametrize("rig", [{"prefill_routing": PrefillRouting.LEAST_LOADED}], indirect=True)
def test_least_loaded_prefill_routing_spreads_a_conversation(
    rig: RouterRig, client: httpx.Client
) -> None:
    conversation(client, 4, False, conversation_id="spread")
    assert sorted(len(e.state.received) for e in rig.prefill) == [2, 2]
    assert metric(client, "disagg_router_prefill_affinity_total", result="kept") == 0


def test_clients_never_see_kv_transfer_params(client: httpx.Client) -> None:
    messages = [{"role": "user", "content": "hi"}]
    plain, _ = chat(client, messages, conversation_id="c")
    streamed, _ = chat(client, messages, stream=True, conversation_id="c")
    assert "kv_transfer_params" not in plain.text
    assert "kv_transfer_params" not in streamed.text


def test_client_kv_transfer_params_are_dropped(rig: RouterRig, client: httpx.Client) -> None:
    forged = {"do_remote_decode": True, "remote_host": "evil", "remote_block_ids": [[1]]}
    chat(client, [{"role": "user", "content": "hi"}], kv_transfer_params=forged)
    (body,) = [b for e in rig.prefill for b in e.state.received]
    assert body["kv_transfer_params"]["remote_host"] is None
    assert [r for e in rig.prefill for r in e.state.reads] == []


@pytest.mark.parametrize("stream", [False, True])
def test_nested_carriers_of_engine_params_are_emptied(
    rig: RouterRig, client: httpx.Client, stream: bool
) -> None:
    forged = json.dumps({"do_remote_decode": True, "remote_host": "evil"})
    xargs = {"kv_transfer_params": forged, "ec_transfer_params": forged, "my_plugin": 3}
    chat(
        client,
        [{"role": "user", "content": "hi"}],
        stream=stream,
        vllm_xargs=xargs,
        ec_transfer_params={"remote": "evil"},
    )
    received = [b for e in rig.prefill + rig.decode for b in e.state.received]
    assert len(received) == 2
    for body in received:
        assert body["vllm_xargs"] == {"my_plugin": 3}, "other custom arguments pass through"
        assert "ec_transfer_params" not in body
    assert "evil" not in json.dumps(received)


def test_session_header_keys_the_conversation(rig: RouterRig, client: httpx.Client) -> None:
    messages = [{"role": "user", "content": "hello"}]
    chat(client, messages, headers={"X-Session-ID": "s-1"})
    chat(client, messages, headers={"X-Session-ID": "s-1"})
    assert metric(client, "disagg_router_conversation_lookups_total", result="hit") == 1


def test_api_keys_scope_conversations(client: httpx.Client) -> None:
    messages = [{"role": "user", "content": "hello"}]
    alice = {"Authorization": "Bearer sk-alice"}
    chat(client, messages, headers=alice, conversation_id="shared-name")
    chat(
        client, messages, headers={"Authorization": "Bearer sk-bob"}, conversation_id="shared-name"
    )
    assert metric(client, "disagg_router_conversation_lookups_total", result="hit") == 0
    chat(client, messages, headers=alice, conversation_id="shared-name")
    assert metric(client, "disagg_router_conversation_lookups_total", result="hit") == 1


def test_requests_without_conversation_run_without_reuse(client: httpx.Client) -> None:
    conversation(client, 2, False)
    assert metric(client, "disagg_router_conversation_lookups_total", result="no_key") == 2
    assert metric(client, "disagg_router_conversation_lookups_total", result="hit") == 0


def test_completions_endpoint_and_usage(rig: RouterRig, client: httpx.Client) -> None:
    body = {"model": MODEL, "prompt": "one two three", "max_tokens": 3, "conversation_id": "t"}
    plain = client.post("/v1/completions", json=body)
    assert plain.status_code == 200
    assert plain.json()["usage"]["completion_tokens"] == 3
    assert len(plain.json()["choices"][0]["text"].split()) == 3
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    streamed = client.post("/v1/completions", json=body)
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]"
    assert events[-2]["usage"]["completion_tokens"] == 3
    assert metric(client, "disagg_router_conversation_lookups_total", result="hit") == 1


def test_request_id_is_echoed_and_forwarded(rig: RouterRig, client: httpx.Client) -> None:
    response, _ = chat(
        client, [{"role": "user", "content": "x"}], headers={"X-Request-Id": "req-42"}
    )
    assert response.headers["X-Request-Id"] == "req-42"
    generated, _ = chat(client, [{"role": "user", "content": "x"}])
    assert len(generated.headers["X-Request-Id"]) == 32


def test_models_and_health(client: httpx.Client) -> None:
    assert client.get("/v1/models").json()["data"][0]["id"] == MODEL
    health = client.get("/health")
    assert health.status_code == 200
    assert health.json() == {
        "prefill_healthy": 2,
        "decode_healthy": 2,
        "store": "ok",
        "status": "ok",
    }


def test_streams_answer_like_non_streams(client: httpx.Client) -> None:
    messages = [{"role": "user", "content": "same question"}]
    _, plain = chat(client, messages)
    _, streamed = chat(client, messages, stream=True)
    assert plain == streamed and plain


@pytest.mark.parametrize("rig", [{"conversation_ttl_s": 0.3}], indirect=True, ids=["ttl-0.3s"])
def test_turn_after_the_conversation_ttl_is_a_clean_miss(
    rig: RouterRig, client: httpx.Client
) -> None:
    messages = [{"role": "user", "content": "hello"}]
    chat(client, messages, conversation_id="slow")
    time.sleep(0.5)
    chat(client, messages, conversation_id="slow")
    assert metric(client, "disagg_router_conversation_lookups_total", result="expired") == 1
    assert [r for e in rig.prefill for r in e.state.reads] == []


def test_decode_published_expiry_shortens_the_entry(rig: RouterRig, client: httpx.Client) -> None:
    for engine in rig.decode:
        engine.state.publish_expiry_s = 5.3
    messages = [{"role": "user", "content": "hello"}]
    chat(client, messages, conversation_id="short")
    time.sleep(0.5)
    chat(client, messages, conversation_id="short")
    assert metric(client, "disagg_router_conversation_lookups_total", result="expired") == 1
