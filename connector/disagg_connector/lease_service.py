"""An engine's lease service, and the claim a reader makes through it before each read.

The scheduler process of an engine that offers KV serves its
:class:`~disagg_connector.retention.RetentionTable` on the lease port (JSON over HTTP, the
paths and messages of :mod:`disagg_contract`): on decode the router renews and releases
leases and prefill claims a retention before a D->P read; on prefill decode claims the KV of
its prompt before the P->D read. When the engines hold an
engine credential (``VLLM_API_KEY``) every call must carry it as a bearer token; vLLM's own
HTTP port already requires it, and only the router and the engines hold it. A malformed call
is a 4xx: nothing a caller sends reaches the engine loop.

The service runs inside vLLM, so what any caller can make it hold is bounded. One thread runs
an asyncio loop that serves every connection, one call per connection. Each connection has
``LEASE_CALL_TIMEOUT_S`` from its accept to the last byte of the reply, whatever it is waiting
for (headers, body, the caller reading the reply); past it the connection is closed and counted
``closed_on_deadline``. At most ``MAX_CONNECTIONS`` are open at once (and as many more may
wait in the kernel's accept queue): a connection past that bound is closed as soon as it is
accepted and counted ``refused_at_bound``; :meth:`LeaseService.connection_stats` reads the
counts. A connection buffers at most ``MAX_HEADER_BYTES`` of headers before its credential is
checked and ``MAX_BODY_BYTES`` of body after, so the service's memory is bounded by
``MAX_CONNECTIONS`` times their sum, and its threads by one.
"""

from __future__ import annotations

import asyncio
import hmac
import http.client
import io
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from disagg_connector.retention import ClaimRefusal, Grant, RetentionTable
from disagg_contract import (
    LEASE_CALL_TIMEOUT_S,
    LEASE_CLAIM_PATH,
    LEASE_RELEASE_PATH,
    LEASE_RENEW_PATH,
    MAX_LEASES_PER_CALL,
    ClaimCall,
    ClaimReply,
    LeaseName,
    ReleaseReply,
    RenewReply,
)

logger = logging.getLogger(f"vllm.{__name__}")

MAX_CONNECTIONS = 512
"""Connections the service holds open at once; one more is closed as soon as it is accepted
(well under the file descriptors vLLM's process may open)."""
MAX_HEADER_BYTES = 16 << 10
"""Largest request line and headers of a call, read before its credential is checked."""
MAX_BODY_BYTES = 1 << 20
"""Largest call body the service reads (a release of MAX_LEASES_PER_CALL leases with the
longest ids fits)."""
MAX_ID_CHARS = 256
"""Longest request or offer id (or claimant) a call may name."""

LeaseReply = ClaimReply | RenewReply | ReleaseReply
"""What the service answers on one of the lease paths."""


class CallError(ValueError):
    """A call the service refuses, with the status to answer."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _text(document: Mapping[str, Any], key: str) -> str:
    value = document.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS:
        raise CallError(HTTPStatus.BAD_REQUEST, f"{key} is not a short non-empty string")
    return value


def _object(document: object, what: str) -> Mapping[str, Any]:
    if not isinstance(document, dict):
        raise CallError(HTTPStatus.BAD_REQUEST, f"{what} is not a JSON object")
    return document


def _leases(document: Mapping[str, Any]) -> list[LeaseName]:
    leases = document.get("leases")
    if not isinstance(leases, list) or len(leases) > MAX_LEASES_PER_CALL:
        raise CallError(
            HTTPStatus.BAD_REQUEST, f"leases is not a list of at most {MAX_LEASES_PER_CALL}"
        )
    names: list[LeaseName] = []
    for lease in leases:
        named = _object(lease, "a lease")
        names.append(LeaseName(request=_text(named, "request"), offer=_text(named, "offer")))
    return names


def _claim_call(document: Mapping[str, Any]) -> ClaimCall:
    return ClaimCall(
        request=_text(document, "request"),
        offer=_text(document, "offer"),
        claimant=_text(document, "claimant"),
    )


def answer(table: RetentionTable, path: str, document: object) -> LeaseReply:
    """The answer to one call on ``path`` with the decoded JSON ``document``."""
    body = _object(document, "the body")
    if path == LEASE_CLAIM_PATH:
        call = _claim_call(body)
        grant = table.claim(call["request"], call["offer"], call["claimant"])
        return ClaimReply(granted=grant.granted, hold_s=grant.hold_s, reason=grant.refusal or "")
    if path == LEASE_RENEW_PATH:
        gone = [
            lease for lease in _leases(body) if not table.renew(lease["request"], lease["offer"])
        ]
        return RenewReply(gone=gone)
    if path == LEASE_RELEASE_PATH:
        released = sum(table.release(lease["request"], lease["offer"]) for lease in _leases(body))
        return ReleaseReply(released=released)
    raise CallError(HTTPStatus.NOT_FOUND, f"no such path {path}")


@dataclass(frozen=True)
class ConnectionStats:
    """The lease port's connections: open now, and closed by the service's limits so far."""

    open: int
    closed_on_deadline: int
    """Closed because the call was not done within LEASE_CALL_TIMEOUT_S of its accept."""
    refused_at_bound: int
    """Closed on accept because MAX_CONNECTIONS were open."""


class LeaseService:
    """The lease port of one engine: one daemon thread serving its table of held blocks."""

    def __init__(
        self,
        table: RetentionTable,
        host: str,
        port: int,
        credential: str | None,
        on_call: Callable[[str, dict[str, Any]], None],
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        """Bind ``host:port`` (port 0: any free port); serve from ``start`` on.

        ``on_call(path, answer)`` runs for each call answered OK, before the answer goes out
        (the connector counts it, and a release wakes an idle engine).
        """
        self._table = table
        self._expected = f"Bearer {credential}".encode() if credential else None
        self._on_call = on_call
        self._max_connections = max_connections
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        self._socket = socket.create_server((host, port), family=family, backlog=max_connections)
        self._port = int(self._socket.getsockname()[1])
        self._open = 0
        self._closed_on_deadline = 0
        self._refused_at_bound = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._serving = threading.Event()
        self._thread = threading.Thread(target=self._run, name="disagg-lease-service", daemon=True)

    @property
    def port(self) -> int:
        """The port the service is bound to."""
        return self._port

    def connection_stats(self) -> ConnectionStats:
        """The counts of the lease port's connections (read from any thread)."""
        return ConnectionStats(self._open, self._closed_on_deadline, self._refused_at_bound)

    def start(self) -> None:
        """Serve in the background; returns once the port accepts calls."""
        self._thread.start()
        self._serving.wait()

    def stop(self) -> None:
        """Stop serving, close every connection and the port (again: nothing to do)."""
        if self._thread.is_alive() and self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join()
        self._socket.close()

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        """The service thread's loop: accept until stopped; asyncio.run then cancels (and so
        closes) the connections still open."""
        try:
            self._loop = asyncio.get_running_loop()
            self._stopping = asyncio.Event()
            server = await asyncio.start_server(
                self._connection,
                sock=self._socket,
                limit=MAX_HEADER_BYTES,
                backlog=self._max_connections,
            )
        finally:
            self._serving.set()
        async with server:
            await self._stopping.wait()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one call within the deadline, or close the connection."""
        if self._open >= self._max_connections:
            self._refused_at_bound += 1
            writer.transport.abort()
            return
        self._open += 1
        finished = False
        try:
            async with asyncio.timeout(LEASE_CALL_TIMEOUT_S):
                writer.write(await self._exchange(reader))
                writer.close()
                await writer.wait_closed()
            finished = True
        except TimeoutError:
            self._closed_on_deadline += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the caller went away
        except Exception:
            logger.exception("Lease service: a call failed")
        finally:
            self._open -= 1
            if not finished:
                writer.transport.abort()

    async def _exchange(self, reader: asyncio.StreamReader) -> bytes:
        """Read one call and return the whole HTTP response to it."""
        try:
            path, headers = await _read_head(reader)
            self._authorize(headers)
            document = await _read_body(reader, headers)
            result = answer(self._table, path, document)
        except CallError as exc:
            return _response(exc.status, {"error": str(exc)})
        self._on_call(path, dict(result))
        return _response(HTTPStatus.OK, result)

    def _authorize(self, headers: http.client.HTTPMessage) -> None:
        if self._expected is None:
            return
        given = headers.get("Authorization", "").encode("utf-8", "replace")
        if not hmac.compare_digest(given, self._expected):
            raise CallError(HTTPStatus.UNAUTHORIZED, "missing or wrong engine credential")


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, http.client.HTTPMessage]:
    """The path and headers of a POST (what precedes the blank line)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError as exc:
        raise CallError(
            HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"headers over {MAX_HEADER_BYTES} bytes"
        ) from exc
    line, _, fields = head.partition(b"\r\n")
    parts = line.decode("latin-1").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise CallError(HTTPStatus.BAD_REQUEST, "not an HTTP/1 request line")
    if parts[0] != "POST":
        raise CallError(HTTPStatus.METHOD_NOT_ALLOWED, "every lease call is a POST")
    try:
        headers = http.client.parse_headers(io.BytesIO(fields))
    except http.client.HTTPException as exc:
        raise CallError(HTTPStatus.BAD_REQUEST, f"bad headers: {exc}") from exc
    return parts[1], headers


async def _read_body(reader: asyncio.StreamReader, headers: http.client.HTTPMessage) -> object:
    """The decoded JSON body the Content-Length announces."""
    try:
        length = int(headers.get("Content-Length", ""))
    except ValueError as exc:
        raise CallError(HTTPStatus.LENGTH_REQUIRED, "no Content-Length") from exc
    if not 0 <= length <= MAX_BODY_BYTES:
        raise CallError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY_BYTES} bytes")
    body = await reader.readexactly(length)
    try:
        return json.loads(body)
    except ValueError as exc:
        raise CallError(HTTPStatus.BAD_REQUEST, f"body is not JSON: {exc}") from exc


def _response(status: HTTPStatus, document: Mapping[str, Any]) -> bytes:
    body = json.dumps(document).encode()
    head = (
        f"HTTP/1.1 {status.value} {status.phrase}\r\n"
        "Server: disagg-lease\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


@dataclass(frozen=True)
class ClaimTarget:
    """Where and what a reader claims: the issuer's lease service and the blocks' names."""

    host: str
    port: int
    request_id: str
    offer_id: str


def claim(
    target: ClaimTarget,
    claimant: str,
    credential: str | None,
    timeout_s: float = LEASE_CALL_TIMEOUT_S,
) -> Grant | str:
    """Ask the issuer for the read of the blocks it holds: its grant, or why no answer came.

    Takes at most ``timeout_s`` (at most LEASE_CALL_TIMEOUT_S), connecting included; a later
    answer counts as none.
    That is no longer than the trust window of the shortest hold an issuer grants (a contract
    invariant, tested), so a grant this returns still leaves its read time to start.
    """
    call = ClaimCall(request=target.request_id, offer=target.offer_id, claimant=claimant)
    timeout_s = min(timeout_s, LEASE_CALL_TIMEOUT_S)
    document = _post(target, LEASE_CLAIM_PATH, json.dumps(call), credential, timeout_s)
    if isinstance(document, str):
        return document
    reply = _claim_reply(document)
    if isinstance(reply, str):
        return reply
    if reply["granted"]:
        return Grant(True, hold_s=reply["hold_s"])
    try:
        return Grant(False, ClaimRefusal(reply["reason"]))
    except ValueError:
        return f"refused for an unknown reason {reply['reason']!r}"


def _post(
    target: ClaimTarget, path: str, body: str, credential: str | None, timeout_s: float
) -> object:
    """POST ``body`` to the issuer's lease service: its decoded JSON reply within ``timeout_s``,
    or (a string) why none came."""
    deadline = time.monotonic() + timeout_s
    headers = {"Content-Type": "application/json"}
    if credential:
        headers["Authorization"] = f"Bearer {credential}"
    connection = http.client.HTTPConnection(target.host, target.port, timeout=timeout_s)
    try:
        connection.connect()
        connection.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        connection.request("POST", path, body, headers)
        response = connection.getresponse()
        text = response.read(MAX_BODY_BYTES)
        if time.monotonic() > deadline:
            raise TimeoutError(f"answered after {timeout_s}s")
        if response.status != HTTPStatus.OK:
            return f"the lease service answered {response.status}"
        document: object = json.loads(text)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return f"no answer from {target.host}:{target.port} ({type(exc).__name__}: {exc})"
    finally:
        connection.close()
    return document


def _claim_reply(document: object) -> ClaimReply | str:
    """The issuer's answer as a ClaimReply, or what is wrong with it."""
    if not isinstance(document, dict) or not isinstance(document.get("granted"), bool):
        return "the answer is not a grant"
    hold_s = document.get("hold_s")
    if not isinstance(hold_s, int | float) or isinstance(hold_s, bool):
        return "the answer has no hold"
    if document["granted"] and not hold_s > 0:
        return "granted no hold"
    return ClaimReply(
        granted=document["granted"], hold_s=float(hold_s), reason=str(document.get("reason"))
    )
