"""Shared fixtures: a router rig over engine stand-ins and an HTTP client on its first router."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from router_harness import RouterRig, router_rig


@pytest.fixture
def rig(request: pytest.FixtureRequest) -> Iterator[RouterRig]:
    """Two prefill and two decode stand-ins behind one router; indirect params override config."""
    with router_rig(**getattr(request, "param", {})) as running:
        yield running


@pytest.fixture
def client(rig: RouterRig) -> Iterator[httpx.Client]:
    """An HTTP client on the rig's first router."""
    with httpx.Client(base_url=rig.routers[0].url, timeout=10) as http:
        yield http
