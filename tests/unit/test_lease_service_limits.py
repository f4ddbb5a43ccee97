"""Decode's lease service under callers that never finish: a real LeaseService on 127.0.0.1
over a real RetentionTable closes every connection at its deadline, holds at most its bound of
connections on one thread, and keeps answering claims and renewals meanwhile; the largest call
the contract allows and the router's own client are served; a claim gives up in time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import selectors
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from disagg_connector.lease_service import (
    MAX_BODY_BYTES,
    MAX_CONNECTIONS,
    MAX_ID_CHARS,
    ClaimTarget,
    ConnectionStats,
    LeaseService,
    claim,
)
from disagg_connector.retention import Grant, RetentionTable
from disagg_contract import (
    LEASE_CALL_TIMEOUT_S,
    LEASE_CLAIM_PATH,
    LEASE_RELEASE_PATH,
    LEASE_RENEW_PATH,
    MAX_LEASES_PER_CALL,
    MIN_CLAIM_HOLD_S,
    LeaseName,
    ReleaseCall,
    ReleasedLease,
    ReleaseReason,
    ReleaseReply,
    RenewCall,
    RenewReply,
    claim_trust_s,
)
from disagg_router.payloads import dumps
from disagg_router.upstream import EngineClient

CREDENTIAL = "engine-secret"
FLOOD = 300
MARGIN_S = 3.0
"""Slack on a loaded machine between the server's deadline and the client seeing the close."""
HOLD_S, CAP_S = 10.0, 480.0

PARTIAL_HEADERS = f"POST {LEASE_CLAIM_PATH} HTTP/1.1\r\nHost: decode\r\n".encode()
PARTIAL_BODY = (
    f"POST {LEASE_RENEW_PATH} HTTP/1.1\r\nHost: decode\r\nAuthorization: Bearer {CREDENTIAL}"
    '\r\nContent-Length: 100\r\n\r\n{"leases": ['
).encode()


@contextmanager
def lease_service(max_connections: int = MAX_CONNECTIONS) -> Iterator[LeaseService]:
    table = RetentionTable(None, HOLD_S, time.monotonic)
    table.retain("a", "offer-a", 1, CAP_S)
    service = LeaseService(
        table, "127.0.0.1", 0, CREDENTIAL, lambda _, __: None, max_connections=max_connections
    )
    service.start()
    try:
        yield service
    finally:
        service.stop()


def stats_reach(service: LeaseService, expected: ConnectionStats, within_s: float) -> None:
    """Wait until the service's connection counts are ``expected``."""
    end = time.monotonic() + within_s
    while service.connection_stats() != expected and time.monotonic() < end:
        time.sleep(0.02)
    assert service.connection_stats() == expected


def renew(port: int) -> dict[str, object]:
    """A renewal of lease a over the wire; its reply."""
    body = json.dumps(RenewCall(leases=[LeaseName(request="a", offer="offer-a")])).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{LEASE_RENEW_PATH}", data=body)
    request.add_header("Authorization", f"Bearer {CREDENTIAL}")
    with urllib.request.urlopen(request, timeout=LEASE_CALL_TIMEOUT_S) as response:
        reply: dict[str, object] = json.loads(response.read())
    return reply


class Stalled:
    """Connections that send part of a call and stop (every third keeps dribbling one byte of
    its headers every half second), and when each was seen closed by the server."""

    def __init__(self, port: int, count: int) -> None:
        self.opened: dict[socket.socket, float] = {}
        self.closed: dict[socket.socket, float] = {}
        self.dribbling: list[socket.socket] = []
        for index in range(count):
            connection = socket.create_connection(("127.0.0.1", port), timeout=5)
            connection.sendall(PARTIAL_BODY if index % 3 == 1 else PARTIAL_HEADERS)
            connection.setblocking(False)
            self.opened[connection] = time.monotonic()
            if index % 3 == 2:
                self.dribbling.append(connection)

    def watch(self, for_s: float) -> None:
        """Note the connections the server closes within ``for_s`` seconds."""
        end = time.monotonic() + for_s
        next_dribble = time.monotonic()
        with selectors.DefaultSelector() as selector:
            for connection in self.opened:
                if connection not in self.closed:
                    selector.register(connection, selectors.EVENT_READ)
            while len(self.closed) < len(self.opened) and (now := time.monotonic()) < end:
                if now >= next_dribble:
                    self._dribble()
                    next_dribble = now + 0.5
                for key, _ in selector.select(timeout=0.1):
                    ready = key.fileobj
                    assert isinstance(ready, socket.socket)
                    if self._ended(ready):
                        self.closed[ready] = time.monotonic()
                        selector.unregister(ready)

    def _dribble(self) -> None:
        for connection in self.dribbling:
            if connection not in self.closed:
                with contextlib.suppress(OSError):  # closed by the server: the selector sees it
                    connection.send(b"X")

    @staticmethod
    def _ended(connection: socket.socket) -> bool:
        try:
            return connection.recv(4096) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def close(self) -> None:
        for connection in self.opened:
            connection.close()


def test_stalled_connections_close_at_the_deadline_while_calls_go_on() -> None:
    with lease_service() as service:
        threads = threading.active_count()
        stalled = Stalled(service.port, FLOOD)
        try:
            target = ClaimTarget("127.0.0.1", service.port, "a", "offer-a")
            assert claim(target, "p:1", CREDENTIAL) == Grant(True, hold_s=HOLD_S)
            assert renew(service.port) == {"gone": []}
            stats_reach(service, ConnectionStats(FLOOD, 0, 0), 1.0)
            assert threading.active_count() <= threads, "no thread per connection"
            stalled.watch(LEASE_CALL_TIMEOUT_S + MARGIN_S)
            late = [
                stalled.closed.get(connection, float("inf")) - opened
                for connection, opened in stalled.opened.items()
            ]
            assert max(late) <= LEASE_CALL_TIMEOUT_S + MARGIN_S, "every one closed in time"
            assert min(late) >= LEASE_CALL_TIMEOUT_S - 0.5, "none before its deadline"
            stats_reach(service, ConnectionStats(0, FLOOD, 0), 1.0)
            assert renew(service.port) == {"gone": []}
        finally:
            stalled.close()


def test_connections_past_the_bound_are_closed_at_once() -> None:
    bound, extra = 8, 5
    with lease_service(max_connections=bound) as service:
        held = Stalled(service.port, bound)
        refused = Stalled(service.port, extra)
        try:
            refused.watch(1.0)
            assert len(refused.closed) == extra
            stats_reach(service, ConnectionStats(bound, 0, extra), 1.0)
            held.watch(LEASE_CALL_TIMEOUT_S + MARGIN_S)
            assert len(held.closed) == bound
            assert renew(service.port) == {"gone": []}, "calls resume once the stalled ones go"
            stats_reach(service, ConnectionStats(0, bound, extra), 1.0)
        finally:
            held.close()
            refused.close()


def test_the_largest_call_the_contract_allows_is_served() -> None:
    name = "x" * MAX_ID_CHARS
    call = ReleaseCall(
        leases=[
            ReleasedLease(request=name, offer=name, reason=ReleaseReason.SUPERSEDED.value)
            for _ in range(MAX_LEASES_PER_CALL)
        ]
    )
    body = json.dumps(call).encode()
    assert len(body) <= MAX_BODY_BYTES
    with lease_service() as service:
        request = urllib.request.Request(
            f"http://127.0.0.1:{service.port}{LEASE_RELEASE_PATH}", data=body
        )
        request.add_header("Authorization", f"Bearer {CREDENTIAL}")
        with urllib.request.urlopen(request, timeout=LEASE_CALL_TIMEOUT_S) as response:
            assert json.loads(response.read()) == {"released": 0}


def test_the_routers_client_is_served_by_the_real_service() -> None:
    """The router's pooled aiohttp client, as LeaseBook calls it: one renewal and one release,
    each answered, then the connection closed by the service (one call per connection)."""
    renewal = RenewCall(leases=[LeaseName(request="a", offer="offer-a")])
    release = ReleaseCall(
        leases=[ReleasedLease(request="a", offer="offer-a", reason=ReleaseReason.IDLE.value)]
    )

    async def calls(port: int) -> list[tuple[int, bytes]]:
        client = EngineClient(LEASE_CALL_TIMEOUT_S, api_key=CREDENTIAL)
        base = f"http://127.0.0.1:{port}"
        try:
            return [
                await client.call(base + LEASE_RENEW_PATH, dumps(renewal), LEASE_CALL_TIMEOUT_S),
                await client.call(base + LEASE_RELEASE_PATH, dumps(release), LEASE_CALL_TIMEOUT_S),
                await client.call(base + LEASE_RENEW_PATH, dumps(renewal), LEASE_CALL_TIMEOUT_S),
            ]
        finally:
            await client.close()

    with lease_service() as service:
        answers = asyncio.run(calls(service.port))
        assert [(status, json.loads(body)) for status, body in answers] == [
            (200, RenewReply(gone=[])),
            (200, ReleaseReply(released=1)),
            (200, RenewReply(gone=[LeaseName(request="a", offer="offer-a")])),
        ]
        stats_reach(service, ConnectionStats(0, 0, 0), 1.0)


def test_a_claim_gives_up_within_the_call_timeout_and_in_its_trust_window() -> None:
    """A lease port that accepts and never answers: the claim is an answer (no grant) within
    LEASE_CALL_TIMEOUT_S, which ends no later than the trust window of the shortest hold, so a
    grant claim() returns always leaves its read time to start."""
    assert claim_trust_s(MIN_CLAIM_HOLD_S) >= LEASE_CALL_TIMEOUT_S
    with socket.create_server(("127.0.0.1", 0)) as silent:
        target = ClaimTarget("127.0.0.1", silent.getsockname()[1], "a", "offer-a")
        began = time.monotonic()
        answer = claim(target, "p:1", CREDENTIAL)
        took = time.monotonic() - began
    assert isinstance(answer, str) and "no answer" in answer, answer
    assert LEASE_CALL_TIMEOUT_S - 0.1 <= took <= LEASE_CALL_TIMEOUT_S + 1.0
