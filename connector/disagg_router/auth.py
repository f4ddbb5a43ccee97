"""Client authentication: which conversation scope a request belongs to, if it may proceed.

With client keys (``--api-key``, ``--client-keys-dir``) a request needs one on every path but
the open ones, and its scope is the key's tenant; without any, every request proceeds and the
bearer token it sends, if any, is its scope (a label the client chose, not a credential). The
check reads the raw ASGI headers (no ``Headers`` object, no decoding), the cheapest way to look
at every request; benchmarks/README.md (router section) has its cost.
"""

from __future__ import annotations

from typing import Protocol

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import Scope

from disagg_contract import REUSE_SUMMARY_PATH
from disagg_router.errors import RouterError, error_response, request_id_of
from disagg_router.tenants import TenantKeys

OPEN_PATHS = frozenset({"/health", "/metrics", REUSE_SUMMARY_PATH})
"""Probes, Prometheus and the operator read these without a key (vLLM leaves its /health open
too); none of them holds a secret or a conversation."""
CONVERSATION_SCOPE = "disagg.conversation_scope"
"""The ASGI scope key under which the app hands FastAPI's routes the request's conversation
scope."""


class Guard(Protocol):
    """Decides whether a request may proceed, and in which conversation scope."""

    def scope_of(self, scope: Scope) -> str | None:
        """The conversation scope of the HTTP request in ``scope``; None: refused (401)."""
        ...


def tenant_scope(tenant: str) -> str:
    """The conversation scope of the tenant named ``tenant``."""
    return f"tenant:{tenant}"


def bearer_token(scope: Scope) -> bytes | None:
    """The token of the request's ``Authorization: Bearer <token>`` header, if any."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() != b"bearer":
                return None
            return token.strip() or None
    return None


class KeyGuard:
    """Admits requests that carry a client key, or ask for an open path; a key's scope is its
    tenant, so tenants never share a conversation."""

    __slots__ = ("_keys",)

    def __init__(self, keys: TenantKeys) -> None:
        self._keys = keys

    def scope_of(self, scope: Scope) -> str | None:
        """``tenant:<name>`` for a client key, ``""`` for an open path, else None."""
        if scope["path"] in OPEN_PATHS:
            return ""
        token = bearer_token(scope)
        tenant = self._keys.tenant_of(token) if token is not None else None
        return None if tenant is None else tenant_scope(tenant)


class OpenGuard:
    """Admits every request (no client keys configured)."""

    __slots__ = ()

    def scope_of(self, scope: Scope) -> str:
        """``token:<token>`` for a request with a bearer token, else ``""``."""
        token = bearer_token(scope)
        return "" if token is None else "token:" + token.decode("latin-1")


def unauthorized(scope: Scope) -> Response:
    """The 401 an OpenAI client expects for a missing or wrong key."""
    error = RouterError(
        401,
        "Missing or incorrect API key: send it as 'Authorization: Bearer <key>'.",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )
    return error_response(error, request_id_of(Headers(scope=scope)))
