"""Client authentication: one API key, compared in constant time, on every path but the open ones.

The check reads the raw ASGI headers (no ``Headers`` object, no decoding), the cheapest way
to look at every request; benchmarks/README.md (router section) has its cost.
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import Scope

from disagg_router.errors import RouterError, error_response, request_id_of

OPEN_PATHS = frozenset({"/health", "/metrics"})
"""Probes and Prometheus scrape these without a key (vLLM leaves its /health open too)."""


class ApiKeyGuard:
    """Admits requests that carry ``Authorization: Bearer <key>`` or ask for an open path."""

    __slots__ = ("_key",)

    def __init__(self, api_key: str) -> None:
        self._key = api_key.encode()

    def allows(self, scope: Scope) -> bool:
        """Whether the HTTP request in ``scope`` may proceed."""
        if scope["path"] in OPEN_PATHS:
            return True
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token, self._key)
        return False


def unauthorized(scope: Scope) -> Response:
    """The 401 an OpenAI client expects for a missing or wrong key."""
    error = RouterError(
        401,
        "Missing or incorrect API key: send it as 'Authorization: Bearer <key>'.",
        code="invalid_api_key",
    )
    response = error_response(error, request_id_of(Headers(scope=scope)))
    response.headers["WWW-Authenticate"] = "Bearer"
    return response
