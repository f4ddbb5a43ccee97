"""Hostile clients on loopback: a body sent too slowly is cut at the deadline, requests beyond
the bound get a 503 with Retry-After, one tenant's slow bodies never take another tenant's
slots, a flood of requests prefill refuses evicts no conversation, and a thousand idle
connections leave the router serving. Raw sockets, as a client that does not play by HTTP's
rules."""

from __future__ import annotations

import json
import resource
import select
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from engine_standin import MODEL
from router_harness import RouterRig, SecretVolume, metric, router_process, router_rig, start_engine

BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
BODY_TIMEOUT_S = 1.0


def request_head(size: int, path: str = "/v1/chat/completions", key: str | None = None) -> bytes:
    authorization = f"Authorization: Bearer {key}\r\n" if key is not None else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
        f"{authorization}Content-Length: {size}\r\n\r\n"
    ).encode()


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-case names) and body of one response, read to the close or to
    its Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside the body"
        body += chunk
    return int(status_line.split()[1]), headers, body


def trickle_until_answered(sock: socket.socket, limit_s: float) -> float:
    """Send one body byte every 0.1 s until the router answers; seconds until it did."""
    began = time.monotonic()
    sock.sendall(request_head(len(BODY)) + BODY[:1])
    sent = 1
    while time.monotonic() - began < limit_s:
        readable, _, _ = select.select([sock], [], [], 0.1)
        if readable:
            return time.monotonic() - began
        if sent < len(BODY) - 1:  # never the last byte: the body stays incomplete
            sock.sendall(BODY[sent : sent + 1])
            sent += 1
    raise AssertionError(f"no answer within {limit_s} s")


@pytest.fixture(scope="module")
def rig() -> Iterator[RouterRig]:
    with router_rig(
        prefills=1, decodes=1, body_timeout_s=BODY_TIMEOUT_S, max_concurrent_requests=3
    ) as running:
        yield running


@pytest.fixture(scope="module")
def client(rig: RouterRig) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=rig.routers[0].url, timeout=10) as http:
        yield http


def chat(client: httpx.Client) -> httpx.Response:
    return client.post("/v1/chat/completions", content=BODY)


def test_a_slowloris_body_is_cut_at_the_deadline(rig: RouterRig, client: httpx.Client) -> None:
    with connect(rig.routers[0].url) as sock:
        waited = trickle_until_answered(sock, limit_s=BODY_TIMEOUT_S + 3)
        status, headers, body = read_response(sock)
        assert status == 408, body
        assert BODY_TIMEOUT_S <= waited < BODY_TIMEOUT_S + 1.0
        error = json.loads(body)["error"]
        assert error["code"] == "request_timeout" and "--body-timeout" in error["message"]
        assert headers["connection"] == "close"
        sock.settimeout(2)
        assert sock.recv(1) == b"", "the router closed the slow client's connection"
    assert chat(client).status_code == 200


def test_requests_beyond_the_bound_get_503_with_retry_after(
    rig: RouterRig, client: httpx.Client
) -> None:
    before = metric(
        client,
        "disagg_router_requests_total",
        endpoint="/v1/chat/completions",
        outcome="overloaded",
    )
    with ExitStack() as stack:
        slow = [stack.enter_context(connect(rig.routers[0].url)) for _ in range(3)]
        for sock in slow:
            sock.sendall(request_head(len(BODY)) + BODY[:5])
        deadline = time.monotonic() + 5
        while rig.routers[0].app.slots.in_flight < 3:
            assert time.monotonic() < deadline, "the slow requests never took their slots"
            time.sleep(0.01)
        assert metric(client, "disagg_router_requests_in_flight") == 3
        refused = chat(client)
        assert refused.status_code == 503, refused.text
        assert refused.headers["Retry-After"] == "1"
        error = refused.json()["error"]
        assert (error["type"], error["code"]) == ("service_unavailable", "router_overloaded")
        assert "--max-concurrent-requests" in error["message"]
        assert client.get("/health").status_code == 200, "probes never wait for a slot"
        for sock in slow:
            assert read_response(sock)[0] == 408
    after = metric(
        client,
        "disagg_router_requests_total",
        endpoint="/v1/chat/completions",
        outcome="overloaded",
    )
    assert after == before + 1
    assert chat(client).status_code == 200, "slots come back once the slow bodies are cut"
    assert rig.routers[0].app.slots.in_flight == 0


@contextmanager
def slow_bodies(url: str, count: int, key: str | None) -> Iterator[list[socket.socket]]:
    """``count`` requests with ``key`` whose bodies never finish (each holds its slot)."""
    with ExitStack() as stack:
        held = [stack.enter_context(connect(url)) for _ in range(count)]
        for sock in held:
            sock.sendall(request_head(len(BODY), key=key) + BODY[:5])
        yield held


def wait_in_flight(client: httpx.Client, count: int) -> None:
    deadline = time.monotonic() + 10
    while metric(client, "disagg_router_requests_in_flight") != count:
        assert time.monotonic() < deadline, f"never {count} requests in flight"
        time.sleep(0.05)


def authorized(client: httpx.Client, key: str) -> httpx.Response:
    return client.post(
        "/v1/chat/completions", content=BODY, headers={"Authorization": f"Bearer {key}"}
    )


@pytest.fixture(scope="module")
def engines() -> Iterator[list[str]]:
    """One prefill and one decode stand-in, for routers run as processes."""
    running = [start_engine("prefill", "p"), start_engine("decode", "d")]
    try:
        yield [engine.url for engine in running]
    finally:
        for engine in running:
            engine.server.stop()


def test_one_tenants_slow_bodies_never_get_another_tenant_a_503(
    engines: list[str], tmp_path: Path
) -> None:
    keys = {"alice": "sk-alice-1", "bob": "sk-bob-2"}
    folder = SecretVolume(tmp_path / "keys", keys).path
    options = ["--client-keys-dir", str(folder), "--max-concurrent-requests", "5"]
    options += ["--max-requests-per-tenant", "2", "--tenant-requests", "bob=3"]
    with (
        router_process([engines[0]], [engines[1]], *options) as router,
        httpx.Client(base_url=router.url, timeout=10) as client,
        slow_bodies(router.url, 2, keys["alice"]),
    ):
        wait_in_flight(client, 2)
        refused = authorized(client, keys["alice"])
        assert refused.status_code == 429, refused.text
        assert refused.headers["Retry-After"] == "1"
        error = refused.json()["error"]
        assert (
            error["code"] == "tenant_overloaded" and "--max-requests-per-tenant" in error["message"]
        )
        for _ in range(5):
            assert authorized(client, keys["bob"]).status_code == 200
        with slow_bodies(router.url, 3, keys["bob"]):
            wait_in_flight(client, 5)
            assert authorized(client, keys["bob"]).status_code == 503, "the global bound holds"
        outcomes = {
            outcome: metric(
                client,
                "disagg_router_requests_total",
                endpoint="/v1/chat/completions",
                outcome=outcome,
            )
            for outcome in ("tenant_overloaded", "overloaded", "success")
        }
        assert outcomes == {"tenant_overloaded": 1, "overloaded": 1, "success": 5}


def test_without_keys_every_client_is_one_tenant(engines: list[str]) -> None:
    options = ["--max-concurrent-requests", "4", "--max-requests-per-tenant", "1"]
    with (
        router_process([engines[0]], [engines[1]], *options) as router,
        httpx.Client(base_url=router.url, timeout=10) as client,
    ):
        assert authorized(client, "label-a").status_code == 200
        with slow_bodies(router.url, 1, "label-a"):
            wait_in_flight(client, 1)
            assert authorized(client, "label-b").status_code == 429
            assert client.post("/v1/chat/completions", content=BODY).status_code == 429


def test_a_flood_prefill_refuses_evicts_no_conversation() -> None:
    with (
        router_rig(prefills=1, decodes=1, max_conversations=2) as rig,
        httpx.Client(base_url=rig.routers[0].url, timeout=10) as client,
    ):
        kept = json.loads(BODY) | {"conversation_id": "kept"}
        assert client.post("/v1/chat/completions", json=kept).status_code == 200
        rig.prefill[0].state.fail_statuses.extend([400] * 20)
        for index in range(20):
            fresh = kept | {"conversation_id": f"fresh-{index}"}
            assert client.post("/v1/chat/completions", json=fresh).status_code == 400
        assert len(rig.routers[0].app_state().store) == 1, "no refused turn was stored"
        assert client.post("/v1/chat/completions", json=kept).status_code == 200
        hits = metric(client, "disagg_router_conversation_lookups_total", result="hit")
        assert hits == 1, "the kept conversation was neither evicted nor touched"


@contextmanager
def idle_connections(url: str, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections to ``url`` that send nothing; closed on exit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * count + 256  # both ends live in this process (the router runs on a thread)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    with ExitStack() as stack:
        yield [stack.enter_context(connect(url)) for _ in range(count)]
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_thousand_idle_connections_leave_the_router_serving(
    rig: RouterRig, client: httpx.Client
) -> None:
    with idle_connections(rig.routers[0].url, 1000) as idle:
        assert len(idle) == 1000
        began = time.monotonic()
        with httpx.Client(base_url=rig.routers[0].url, timeout=5) as fresh:
            assert chat(fresh).status_code == 200
        assert time.monotonic() - began < 2.0
        assert rig.routers[0].app.slots.in_flight == 0, "idle connections hold no slot"
    assert chat(client).status_code == 200
