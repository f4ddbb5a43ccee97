"""Decode's lease service, and the claim prefill makes through it before each D->P read.

Decode's scheduler process serves its :class:`~disagg_connector.retention.RetentionTable` on
the lease port (JSON over HTTP, see the paths in :mod:`disagg_contract`): the router renews
and releases leases, prefill claims a retention before it reads. When the engines hold an
engine credential (``VLLM_API_KEY``) every call must carry it as a bearer token; vLLM's own
HTTP port already requires it, and only the router and the engines hold it. A malformed call
is a 4xx: nothing a caller sends reaches the engine loop.
"""

from __future__ import annotations

import hmac
import http.client
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from disagg_connector.retention import ClaimRefusal, Grant, RetentionTable
from disagg_contract import LEASE_CLAIM_PATH, LEASE_RELEASE_PATH, LEASE_RENEW_PATH

MAX_BODY_BYTES = 1 << 20
"""Largest call body the service reads."""
MAX_LEASES_PER_CALL = 10_000
"""Most leases one renewal or release names."""
CLAIM_TIMEOUT_S = 2.0
"""How long prefill waits for decode's answer to a claim before it recomputes instead."""
_MAX_ID_CHARS = 256


class CallError(ValueError):
    """A call the service refuses, with the status to answer."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _text(document: Mapping[str, Any], key: str) -> str:
    value = document.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= _MAX_ID_CHARS:
        raise CallError(HTTPStatus.BAD_REQUEST, f"{key} is not a short non-empty string")
    return value


def _leases(document: Mapping[str, Any]) -> list[tuple[str, str]]:
    leases = document.get("leases")
    if not isinstance(leases, list) or len(leases) > MAX_LEASES_PER_CALL:
        raise CallError(
            HTTPStatus.BAD_REQUEST, f"leases is not a list of at most {MAX_LEASES_PER_CALL}"
        )
    named: list[tuple[str, str]] = []
    for lease in leases:
        if not isinstance(lease, dict):
            raise CallError(HTTPStatus.BAD_REQUEST, "a lease is not an object")
        named.append((_text(lease, "request"), _text(lease, "offer")))
    return named


def answer(table: RetentionTable, path: str, document: object) -> dict[str, Any]:
    """The answer to one call on ``path`` with the decoded JSON ``document``."""
    if not isinstance(document, dict):
        raise CallError(HTTPStatus.BAD_REQUEST, "the body is not a JSON object")
    if path == LEASE_CLAIM_PATH:
        grant = table.claim(
            _text(document, "request"), _text(document, "offer"), _text(document, "claimant")
        )
        return {"granted": grant.granted, "hold_s": grant.hold_s, "reason": grant.refusal or ""}
    if path == LEASE_RENEW_PATH:
        gone = [
            {"request": request, "offer": offer}
            for request, offer in _leases(document)
            if not table.renew(request, offer)
        ]
        return {"gone": gone}
    if path == LEASE_RELEASE_PATH:
        released = sum(table.release(request, offer) for request, offer in _leases(document))
        return {"released": released}
    raise CallError(HTTPStatus.NOT_FOUND, f"no such path {path}")


class LeaseService:
    """The lease port of one decode engine: a daemon thread serving its retention table."""

    def __init__(
        self,
        table: RetentionTable,
        host: str,
        port: int,
        credential: str | None,
        on_call: Callable[[str, dict[str, Any]], None],
    ) -> None:
        """``on_call(path, answer)`` runs for each call answered OK, before the answer goes out
        (the connector counts it, and a release wakes an idle engine)."""
        handler = _handler(table, credential, on_call)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="disagg-lease-service", daemon=True
        )

    @property
    def port(self) -> int:
        """The port the service is bound to."""
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Serve in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the port."""
        self._server.shutdown()
        self._server.server_close()


def _handler(
    table: RetentionTable,
    credential: str | None,
    on_call: Callable[[str, dict[str, Any]], None],
) -> type[BaseHTTPRequestHandler]:
    expected = f"Bearer {credential}".encode() if credential else None

    class Handler(BaseHTTPRequestHandler):
        server_version = "disagg-lease"

        def do_POST(self) -> None:
            try:
                self._authorize()
                body = self._body()
                try:
                    document = json.loads(body)
                except ValueError as exc:
                    raise CallError(HTTPStatus.BAD_REQUEST, f"body is not JSON: {exc}") from exc
                result = answer(table, self.path, document)
            except CallError as exc:
                self._reply(exc.status, {"error": str(exc)})
                return
            on_call(self.path, result)
            self._reply(HTTPStatus.OK, result)

        def _authorize(self) -> None:
            if expected is None:
                return
            given = self.headers.get("Authorization", "").encode("utf-8", "replace")
            if not hmac.compare_digest(given, expected):
                raise CallError(HTTPStatus.UNAUTHORIZED, "missing or wrong engine credential")

        def _body(self) -> bytes:
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError as exc:
                raise CallError(HTTPStatus.LENGTH_REQUIRED, "no Content-Length") from exc
            if not 0 <= length <= MAX_BODY_BYTES:
                raise CallError(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY_BYTES} bytes"
                )
            return self.rfile.read(length)

        def _reply(self, status: HTTPStatus, document: dict[str, Any]) -> None:
            body = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: one line per call would flood vLLM's log."""

    return Handler


@dataclass(frozen=True)
class ClaimTarget:
    """Where and what prefill claims: decode's lease service and the retention's names."""

    host: str
    port: int
    request_id: str
    offer_id: str


def claim(target: ClaimTarget, claimant: str, credential: str | None) -> Grant | str:
    """Ask decode for the read of a retention: its grant, or why no answer came."""
    body = json.dumps(
        {"request": target.request_id, "offer": target.offer_id, "claimant": claimant}
    )
    headers = {"Content-Type": "application/json"}
    if credential:
        headers["Authorization"] = f"Bearer {credential}"
    connection = http.client.HTTPConnection(target.host, target.port, timeout=CLAIM_TIMEOUT_S)
    try:
        connection.request("POST", LEASE_CLAIM_PATH, body, headers)
        response = connection.getresponse()
        text = response.read(MAX_BODY_BYTES)
        if response.status != HTTPStatus.OK:
            return f"decode answered {response.status}"
        document = json.loads(text)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return f"no answer from {target.host}:{target.port} ({type(exc).__name__}: {exc})"
    finally:
        connection.close()
    if not isinstance(document, dict) or not isinstance(document.get("granted"), bool):
        return "decode's answer is not a grant"
    if document["granted"]:
        hold_s = document.get("hold_s")
        if not isinstance(hold_s, int | float) or isinstance(hold_s, bool) or not hold_s > 0:
            return "decode granted no hold"
        return Grant(True, hold_s=float(hold_s))
    try:
        return Grant(False, ClaimRefusal(str(document.get("reason"))))
    except ValueError:
        return f"decode refused for an unknown reason {document.get('reason')!r}"
