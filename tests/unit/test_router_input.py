"""Bad input gets OpenAI-style 4xx errors naming the problem; fuzzed bodies never get a 5xx."""

from __future__ import annotations

import gc
import json
import tracemalloc
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_standin import MODEL
from router_harness import RouterRig, router_rig

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def rig() -> Iterator[RouterRig]:
    with router_rig(prefills=1, decodes=1, max_body_bytes=MAX_BODY) as running:
        yield running


@pytest.fixture(scope="module")
def client(rig: RouterRig) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=rig.routers[0].url, timeout=10) as http:
        http.get("/v1/models").raise_for_status()
        yield http


def assert_openai_error(response: httpx.Response, status: int, mentions: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert mentions in error["message"] or mentions == error["param"]
    assert response.headers.get("X-Request-Id")


MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("path", "body", "mentions"),
    [
        (CHAT, b"{not json", "not valid JSON"),
        (CHAT, b"\xff\xfe\x00", "not valid JSON"),
        (CHAT, b"[" * 20_000, "not valid JSON"),
        (CHAT, b"[1, 2]", "JSON object"),
        (CHAT, {"model": MODEL}, "messages"),
        (CHAT, {"model": MODEL, "messages": []}, "messages"),
        (CHAT, {"model": MODEL, "messages": ["hi"]}, "messages"),
        (CHAT, {"model": MODEL, "messages": MESSAGES, "stream": "yes"}, "stream"),
        (CHAT, {"model": MODEL, "messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
        (
            CHAT,
            {"model": MODEL, "messages": MESSAGES, "max_completion_tokens": True},
            "max_completion_tokens",
        ),
        (CHAT, {"model": MODEL, "messages": MESSAGES, "n": 3}, "n"),
        (CHAT, {"model": MODEL, "messages": MESSAGES, "stream_options": []}, "stream_options"),
        (CHAT, {"model": MODEL, "messages": MESSAGES, "conversation_id": 5}, "conversation_id"),
        (CHAT, {"model": MODEL, "messages": MESSAGES, "conversation_id": ""}, "conversation_id"),
        *(
            (
                CHAT,
                {"model": MODEL, "messages": MESSAGES, "conversation_id": odd},
                "conversation_id",
            )
            for odd in ("\ud800", "a\udfffb", "a\x00b", "a\nb", "\u2028", "a\x85b", "\ue000")
        ),
        (CHAT, {"model": 7, "messages": MESSAGES}, "model"),
        (COMPLETIONS, {"model": MODEL}, "prompt"),
        (COMPLETIONS, {"model": MODEL, "prompt": [1, "a"]}, "prompt"),
        (COMPLETIONS, {"model": MODEL, "prompt": ""}, "prompt"),
    ],
)
def test_bad_requests_get_400_naming_the_field(
    client: httpx.Client, path: str, body: Any, mentions: str
) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = client.post(path, content=content, headers={"Content-Type": "application/json"})
    assert_openai_error(response, 400, mentions)


def test_unknown_model_is_404(client: httpx.Client) -> None:
    response = client.post(CHAT, json={"model": "gpt-99", "messages": MESSAGES})
    assert_openai_error(response, 404, "gpt-99")
    assert response.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("value", [b"x" * 600, b"a\tb", b"a\x85b", b"\xa0"])
def test_bad_session_header_is_400(client: httpx.Client, value: bytes) -> None:
    response = client.post(
        CHAT, json={"model": MODEL, "messages": MESSAGES}, headers={"X-Session-ID": value}
    )
    assert_openai_error(response, 400, "X-Session-ID")


def test_printable_ids_of_any_script_are_served(client: httpx.Client) -> None:
    for odd_but_fine in ("会话 1", "émoji 🙂", "a b"):
        body = {"model": MODEL, "messages": MESSAGES, "conversation_id": odd_but_fine}
        assert client.post(CHAT, json=body).status_code == 200


def test_oversized_bodies_are_413(client: httpx.Client) -> None:
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * MAX_BODY}]}
    response = client.post(CHAT, json=big)
    assert_openai_error(response, 413, "--max-body-bytes")

    def chunked() -> Iterator[bytes]:
        yield b'{"model": "standin-model", "messages": [{"role": "user", "content": "'
        for _ in range(MAX_BODY // 1024 + 1):
            yield b"x" * 1024
        yield b'"}]}'

    streamed = client.post(CHAT, content=chunked(), headers={"Content-Type": "application/json"})
    assert_openai_error(streamed, 413, "--max-body-bytes")


def test_unknown_paths_and_methods_are_openai_errors(client: httpx.Client) -> None:
    assert_openai_error(client.get("/v1/nope"), 404, "/v1/nope")
    assert_openai_error(client.get(CHAT), 405, CHAT)


def test_request_id_is_echoed_on_errors(client: httpx.Client) -> None:
    response = client.post(CHAT, content=b"{", headers={"X-Request-Id": "bad-1"})
    assert response.headers["X-Request-Id"] == "bad-1"


# Every code point, and the odd ones often: lone surrogates (JSON escapes them, Python decodes
# them to str), control and format characters, separators, private use. The ids of
# ``valid_but_the_id`` hold at least one of them, in bodies that are otherwise served.
ODD_CHARACTERS = "\ud800\udbff\udc00\udfff\x00\t\n\x1b\x7f\x85\xa0\u200b\u2028\u2029\ue000"
characters = st.characters(exclude_categories=()) | st.sampled_from(ODD_CHARACTERS)
any_text = st.text(characters, max_size=20)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | any_text,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(characters, max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = [
    "model",
    "messages",
    "prompt",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "conversation_id",
    "kv_transfer_params",
    "vllm_xargs",
    "ec_transfer_params",
    "temperature",
    "min_tokens",
]
valid_chat = st.fixed_dictionaries({}, optional={name: json_values for name in FIELDS}).map(
    lambda overrides: {"model": MODEL, "messages": MESSAGES, **overrides}
)
odd_ids = st.tuples(any_text, st.sampled_from(ODD_CHARACTERS), any_text).map("".join)
valid_but_the_id = odd_ids.map(
    lambda conversation_id: {
        "model": MODEL,
        "messages": MESSAGES,
        "conversation_id": conversation_id,
    }
)
bodies = st.one_of(
    valid_chat.map(lambda b: json.dumps(b).encode()),
    valid_but_the_id.map(lambda b: json.dumps(b).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=64),
)


@settings(
    max_examples=150,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=bodies, path=st.sampled_from([CHAT, COMPLETIONS]), session=st.none() | any_text)
def test_fuzzed_bodies_never_get_a_router_5xx(
    client: httpx.Client, body: bytes, path: str, session: str | None
) -> None:
    headers = {"Content-Type": "application/json"}
    # Header values are printable ASCII without surrounding whitespace (else the client refuses).
    if session is not None and session.isascii() and session.isprintable():
        headers["X-Session-ID"] = session.strip()
    response = client.post(path, content=body, headers=headers)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert "error" in response.json()


def test_router_is_healthy_after_the_fuzzing(rig: RouterRig, client: httpx.Client) -> None:
    assert client.get("/health").status_code == 200
    assert all(r.outstanding == 0 for r in rig_replicas(rig))


def rig_replicas(rig: RouterRig) -> list[Any]:
    state = rig.routers[0].app_state()
    return [*state.prefill.members(), *state.decode.members()]


def test_bad_and_good_requests_do_not_leak_memory(rig: RouterRig, client: httpx.Client) -> None:
    for engine in rig.prefill + rig.decode:
        engine.state.record = False  # the stand-ins' request log would read as a leak
    bad = [b"{", b"[1]", json.dumps({"model": MODEL}).encode(), b"x" * (MAX_BODY + 1)]
    good = json.dumps({"model": MODEL, "messages": MESSAGES}).encode()

    def burst(rounds: int) -> None:
        for _ in range(rounds):
            for body in [*bad, good]:
                client.post(CHAT, content=body, headers={"Content-Type": "application/json"})

    burst(50)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        burst(200)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 256 * 1024, f"{grown} bytes kept after 1000 requests"
