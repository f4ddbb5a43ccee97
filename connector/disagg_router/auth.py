"""Client authentication: which tenant and conversation scope a request belongs to, if it may
proceed.

With client keys (``--api-key``, ``--client-keys-dir``) a request needs one on every path but
the open ones, and its tenant and scope are the key's tenant; without any, every request
proceeds as one tenant (``OPEN_TENANT``), and the bearer token it sends, if any, is its
conversation scope (a label the client chose, not a credential). A request's tenant is whose
request slots it takes (``limits``) and whose ``cache_salt`` the engines get (``salts``). The
check reads the raw ASGI headers (no ``Headers`` object, no decoding), the cheapest way to look
at every request; benchmarks/README.md (router section) has its cost.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

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
OPEN_TENANT = ""
"""The one tenant of a router without client keys (no key file can have this name)."""


class Client(NamedTuple):
    """Who sent a request: its tenant, and the scope its conversation ids live in."""

    tenant: str
    conversation_scope: str


_UNSCOPED = Client(OPEN_TENANT, "")
"""An open path's client under keys, or an open router's client without a bearer token."""


class Guard(Protocol):
    """Decides whether a request may proceed, as which client."""

    def admit(self, scope: Scope) -> Client | None:
        """The client of the HTTP request in ``scope``; None: refused (401)."""
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
    """Admits requests that carry a client key, or ask for an open path; a key's client is its
    tenant, in the scope :func:`tenant_scope`, so tenants never share a conversation."""

    __slots__ = ("_clients", "_keys")

    def __init__(self, keys: TenantKeys) -> None:
        self._keys = keys
        self._clients: dict[str, Client] = {}

    def admit(self, scope: Scope) -> Client | None:
        """The key's tenant, a client of no tenant for an open path, else None."""
        if scope["path"] in OPEN_PATHS:
            return _UNSCOPED
        token = bearer_token(scope)
        tenant = self._keys.tenant_of(token) if token is not None else None
        if tenant is None:
            return None
        client = self._clients.get(tenant)
        if client is None:
            client = self._clients[tenant] = Client(tenant, tenant_scope(tenant))
        return client


class OpenGuard:
    """Admits every request (no client keys configured), all of them ``OPEN_TENANT``'s."""

    __slots__ = ()

    def admit(self, scope: Scope) -> Client:
        """The open tenant, in the scope ``token:<token>`` for a request with a bearer token,
        else ``""``."""
        token = bearer_token(scope)
        if token is None:
            return _UNSCOPED
        return Client(OPEN_TENANT, "token:" + token.decode("latin-1"))


def unauthorized(scope: Scope) -> Response:
    """The 401 an OpenAI client expects for a missing or wrong key."""
    error = RouterError(
        401,
        "Missing or incorrect API key: send it as 'Authorization: Bearer <key>'.",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )
    return error_response(error, request_id_of(Headers(scope=scope)))
