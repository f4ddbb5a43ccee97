"""OpenAI-shaped error bodies, and the exception the router raises to send one."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import Response

from disagg_contract import ENGINE_API_KEY_ENV, ENGINE_KEY_FILE_ENV, ROUTER_API_KEY_ENV
from disagg_router.payloads import json_object

REQUEST_ID_HEADER = "X-Request-Id"
_MAX_REQUEST_ID_CHARS = 128


class RouterError(Exception):
    """An error answered to the client with ``status``, an OpenAI error body and ``headers``
    (``Retry-After``, ``WWW-Authenticate``, ``Connection: close``) besides the request id."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The ``{"error": {...}}`` body the OpenAI API returns."""
        return error_body(self.message, self.error_type, self.param, self.code)

    def render(self) -> bytes:
        """The response body."""
        return json.dumps(self.body()).encode()


class EngineRejected(RouterError):
    """An engine refused the request (4xx); its own error body is relayed as is."""

    def __init__(self, status: int, content: bytes) -> None:
        super().__init__(status, engine_message(content), error_type="engine_error")
        self.content = content

    def render(self) -> bytes:
        """The engine's body when it is an OpenAI error, else one built from its text."""
        parsed = json_object(self.content)
        if parsed is not None and isinstance(parsed.get("error"), dict):
            return self.content
        return super().render()


def engine_refusal(status: int, content: bytes, role: str) -> RouterError:
    """An engine's 4xx, relayed to the client; a 401 is not the client's fault (the router
    passed its key check) but the engine refusing the router's credential: a 502 saying so."""
    if status == 401:
        return upstream_error(
            502,
            f"{role} refused the router's engine credential (HTTP 401): the engines' "
            f"{ENGINE_API_KEY_ENV} must be the key of disagg router --engine-key-file "
            f"({ENGINE_KEY_FILE_ENV}), or without one its --api-key ({ROUTER_API_KEY_ENV}); "
            "the operator generates and mounts both from spec.auth.",
            "engine_unauthorized",
        )
    return EngineRejected(status, content)


def engine_message(content: bytes) -> str:
    """The ``message`` of an engine's error body, else its first 300 characters."""
    parsed = json_object(content)
    if parsed is not None:
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(parsed.get("message"), str):
            return str(parsed["message"])
    return content[:300].decode(errors="replace")


def bad_request(message: str, param: str | None = None) -> RouterError:
    """A 400 naming the offending field."""
    return RouterError(400, message, param=param, code="invalid_value")


def overloaded(limit: int) -> RouterError:
    """The 503 for a request beyond ``--max-concurrent-requests``: retry in a second."""
    return RouterError(
        503,
        f"The router is serving its limit of {limit} requests at once "
        "(--max-concurrent-requests); retry shortly.",
        error_type="service_unavailable",
        code="router_overloaded",
        headers={"Retry-After": "1"},
    )


def tenant_overloaded(share: int) -> RouterError:
    """The 429 for a request beyond its tenant's share of the slots (``--max-requests-per-tenant``,
    ``--tenant-requests``): the client's own tenant is at its bound, retry in a second."""
    return RouterError(
        429,
        f"Your tenant is sending its limit of {share} requests at once "
        "(--max-requests-per-tenant, --tenant-requests); retry shortly.",
        error_type="rate_limit_exceeded",
        code="tenant_overloaded",
        headers={"Retry-After": "1"},
    )


def upstream_error(status: int, message: str, code: str) -> RouterError:
    """A 5xx caused by an engine or by the lack of a healthy one."""
    error_type = "service_unavailable" if status == 503 else "upstream_error"
    return RouterError(status, message, error_type=error_type, code=code)


def error_body(
    message: str, error_type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """Build an OpenAI error body."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(error: RouterError, request_id: str) -> Response:
    """Render ``error`` as a JSON response that echoes the request id."""
    return Response(
        error.render(),
        status_code=error.status,
        media_type="application/json",
        headers={**error.headers, REQUEST_ID_HEADER: request_id},
    )


def request_id_of(headers: Headers) -> str:
    """The client's ``X-Request-Id`` when it is sane, else a fresh one."""
    given = headers.get(REQUEST_ID_HEADER)
    if given and len(given) <= _MAX_REQUEST_ID_CHARS and given.isprintable():
        return given
    return uuid.uuid4().hex
