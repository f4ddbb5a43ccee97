"""Endpoint discovery: keeps the prefill and decode pools' membership current."""

from __future__ import annotations

from typing import Protocol

from disagg_router.config import DiscoveryKind, RouterConfig
from disagg_router.replicas import ReplicaPool


class Discovery(Protocol):
    """Feeds replica URLs into the pools from ``start`` until ``stop``."""

    async def start(self) -> None:
        """Fill the pools and begin following changes."""
        ...

    async def stop(self) -> None:
        """Stop following changes."""
        ...


def build_discovery(config: RouterConfig, prefill: ReplicaPool, decode: ReplicaPool) -> Discovery:
    """Instantiate the discovery ``config`` names (lazy import of the Kubernetes client)."""
    if config.discovery == DiscoveryKind.KUBERNETES:
        from disagg_router.discovery.kubernetes import EndpointSliceDiscovery

        return EndpointSliceDiscovery(
            config.namespace,
            {config.prefill_service: prefill, config.decode_service: decode},
            config.port_name,
            config.kubeconfig or None,
        )
    from disagg_router.discovery.static import StaticDiscovery

    return StaticDiscovery({prefill: config.prefill_urls, decode: config.decode_urls})
