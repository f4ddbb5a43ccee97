"""Hostile clients on loopback: a body sent too slowly is cut at the deadline, requests beyond
the bound get a 503 with Retry-After, and a thousand idle connections leave the router serving.
Raw sockets, as a client that does not play by HTTP's rules."""

from __future__ import annotations

import json
import resource
import select
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx
import pytest

from engine_standin import MODEL
from router_harness import RouterRig, metric, router_rig

BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
BODY_TIMEOUT_S = 1.0


def request_head(size: int, path: str = "/v1/chat/completions") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
        f"Content-Length: {size}\r\n\r\n"
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
