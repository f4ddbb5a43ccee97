"""Fixed replica lists (``--prefill URL... --decode URL...``) for local runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from disagg_router.replicas import ReplicaPool


class StaticDiscovery:
    """Sets each pool's members once."""

    def __init__(self, urls: Mapping[ReplicaPool, Sequence[str]]) -> None:
        self._urls = urls

    async def start(self) -> None:
        """Fill the pools."""
        for pool, urls in self._urls.items():
            pool.set_urls(urls)

    async def stop(self) -> None:
        """Nothing to stop."""
