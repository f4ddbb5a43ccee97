"""Connections that never finish a request's head, against a real ``disagg router`` process:
each is answered 408 and closed at ``--header-timeout``, the router's threads and memory stay
bounded meanwhile, and it keeps serving everyone else."""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest

from engine_standin import MODEL
from router_harness import RouterProcess, RouterRig, metric, router_process, start_engine

HEADER_TIMEOUT_S = 2.0
MARGIN_S = 2.0
"""Slack past the deadline for a loaded machine to close 300 connections."""
STALLED = 300
PARTIAL_HEADS = (
    b"",  # connects and sends nothing
    b"POST /v1/chat/comp",  # half a request line
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Le",  # half the headers
)
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def router() -> Iterator[RouterProcess]:
    rig = RouterRig([start_engine("prefill", "p0")], [start_engine("decode", "d0")])
    try:
        prefill, decode = [e.url for e in rig.prefill], [e.url for e in rig.decode]
        with router_process(prefill, decode, "--header-timeout", str(HEADER_TIMEOUT_S)) as process:
            yield process
    finally:
        rig.stop()


def open_stalled(url: str, head: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(head)
    sock.setblocking(False)
    return sock


def wait_closed(socks: list[socket.socket], limit_s: float) -> dict[socket.socket, bytes]:
    """What each socket read until the router closed it; fails past ``limit_s``."""
    read: dict[socket.socket, bytes] = {sock: b"" for sock in socks}
    deadline = time.monotonic() + limit_s
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            assert left > 0, f"{len(selector.get_map())} connections still open"
            for key, _ in selector.select(timeout=left):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                chunk = sock.recv(4096)
                read[sock] += chunk
                if not chunk:
                    selector.unregister(sock)
    return read


def test_stalled_heads_are_closed_at_the_deadline_with_threads_and_memory_bounded(
    router: RouterProcess,
) -> None:
    process = psutil.Process(router.process.pid)
    with httpx.Client(base_url=router.url, timeout=10) as client:
        assert client.post("/v1/chat/completions", json=BODY).status_code == 200
        threads, rss = process.num_threads(), process.memory_info().rss
        began = time.monotonic()
        socks = [open_stalled(router.url, PARTIAL_HEADS[i % 3]) for i in range(STALLED)]
        try:
            assert client.post("/v1/chat/completions", json=BODY).status_code == 200
            assert process.num_threads() <= threads + 2
            read = wait_closed(socks, HEADER_TIMEOUT_S + MARGIN_S)
        finally:
            for sock in socks:
                sock.close()
        took = time.monotonic() - began
        assert HEADER_TIMEOUT_S - 0.5 <= took < HEADER_TIMEOUT_S + MARGIN_S, took
        assert all(data.startswith(b"HTTP/1.1 408 ") for data in read.values())
        assert process.num_threads() <= threads + 2
        assert process.memory_info().rss - rss < 32 * 2**20
        assert metric(client, "disagg_router_header_timeouts_total") == STALLED
        assert client.post("/v1/chat/completions", json=BODY).status_code == 200


def test_a_kept_alive_connection_gets_the_deadline_again_on_its_next_request(
    router: RouterProcess,
) -> None:
    with httpx.Client(base_url=router.url, timeout=10) as client:
        before = metric(client, "disagg_router_header_timeouts_total")
    host, port = router.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: router\r\n\r\n")
        answer = b""
        while not answer.endswith(b"}"):
            chunk = sock.recv(4096)
            assert chunk, answer
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        time.sleep(HEADER_TIMEOUT_S + 0.5)  # idle between requests: the keep-alive timeout's
        sock.sendall(b"GET /health HTTP/1.1\r\nHo")
        began = time.monotonic()
        sock.setblocking(False)
        read = wait_closed([sock], HEADER_TIMEOUT_S + MARGIN_S)
        assert time.monotonic() - began >= HEADER_TIMEOUT_S - 0.5
        assert read[sock].startswith(b"HTTP/1.1 408 ")
    with httpx.Client(base_url=router.url, timeout=10) as client:
        assert metric(client, "disagg_router_header_timeouts_total") == before + 1
