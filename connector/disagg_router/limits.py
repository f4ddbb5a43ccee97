"""The bounds on generation requests in flight, so that slow or many clients cannot take every
buffer and task of the router (``--max-concurrent-requests``), nor one tenant every slot
(``--max-requests-per-tenant``, ``--tenant-requests``); the body deadline is
``openai_request.read_body``'s.

A request takes its slot as soon as its headers arrived, before its body is read, from its
tenant's share and from the global pool together: a tenant whose clients hold their share
with bodies that never finish is refused its next request, while other tenants' requests
still find slots as long as the shares leave the pool room for them.
"""

from __future__ import annotations

from collections.abc import Mapping


class RequestSlots:
    """At most ``limit`` requests hold a slot at once, and at most ``tenant_limit`` of one
    tenant (``overrides``: per tenant, in place of ``tenant_limit``); ``in_flight`` is how
    many do."""

    __slots__ = ("_held", "_overrides", "in_flight", "limit", "tenant_limit")

    def __init__(
        self, limit: int, tenant_limit: int | None = None, overrides: Mapping[str, int] = {}
    ) -> None:
        self.limit = limit
        self.tenant_limit = limit if tenant_limit is None else tenant_limit
        self._overrides = dict(overrides)
        self._held: dict[str, int] = {}
        self.in_flight = 0

    def share(self, tenant: str) -> int:
        """The most slots ``tenant`` may hold at once."""
        return self._overrides.get(tenant, self.tenant_limit)

    def take(self, tenant: str) -> bool:
        """Take a slot for ``tenant``; False (none taken) when all are held, or all of the
        tenant's share."""
        if self.in_flight >= self.limit:
            return False
        held = self._held.get(tenant, 0)
        if held >= self.share(tenant):
            return False
        self._held[tenant] = held + 1
        self.in_flight += 1
        return True

    def give_back(self, tenant: str) -> None:
        """Give back a slot taken for ``tenant``."""
        self.in_flight -= 1
        held = self._held[tenant] - 1
        if held:
            self._held[tenant] = held
        else:
            del self._held[tenant]
