"""The ``cache_salt`` the router puts on every engine body, per tenant.

vLLM hashes a request's ``cache_salt`` into its prefix-cache block hashes, so requests with
different salts never share cached blocks: a tenant's prompt is never served from another
tenant's cache, and a client cannot probe (by timing) whether another tenant sent a prompt.
The router therefore sets the salt itself, from the tenant (``auth``), and never passes a
client's ``cache_salt`` on as sent: a client's own salt (to split its own traffic further) is
scoped under its tenant, ``salt = f(tenant, client_salt)``, so no client can choose or learn
another tenant's salt.

``f`` is HMAC-SHA256 keyed by the engine credential (``config.engine_credential``), which
every router replica of a model shares: replicas salt alike, so a conversation keeps its
prefix cache whichever router serves its turn, and a salt reveals nothing of the tenant's
name to whoever reads engine logs. Without an engine credential ``f`` is a plain SHA-256:
the engines then accept requests from anyone who reaches them, so no key would keep a salt
from being chosen there, while through the router the tenant still always goes in (likewise
when the credential is the ``--api-key``, sent to the engines without ``--engine-key-file``:
its clients could reach the engines with it directly). The
message is the JSON array ``[context, tenant, client_salt]``, an unambiguous encoding: two
different (tenant, client salt) pairs never hash the same input. A new engine credential
changes every salt once (each tenant's prefix cache starts cold).
"""

from __future__ import annotations

import hashlib
import hmac
import json

_CONTEXT = "disagg cache_salt v1"
"""Separates these digests from any other use of the engine credential."""


class CacheSalts:
    """Derives ``cache_salt`` values; a tenant's own salt (no client salt) is kept, one per
    tenant, as every turn without a client salt needs it."""

    __slots__ = ("_key", "_tenants")

    def __init__(self, secret: str | None) -> None:
        self._key = secret.encode() if secret is not None else None
        self._tenants: dict[str, str] = {}

    def salt(self, tenant: str, client_salt: str | None) -> str:
        """The ``cache_salt`` of a request of ``tenant`` that sent ``client_salt`` (or none)."""
        if client_salt is not None:
            return self._derive(tenant, client_salt)
        salt = self._tenants.get(tenant)
        if salt is None:
            salt = self._tenants[tenant] = self._derive(tenant, None)
        return salt

    def _derive(self, tenant: str, client_salt: str | None) -> str:
        message = json.dumps([_CONTEXT, tenant, client_salt]).encode()
        if self._key is None:
            return hashlib.sha256(message).hexdigest()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()
