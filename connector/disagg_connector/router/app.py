"""ASGI app wiring: the lifespan owns the shared HTTP client and the router's parts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from disagg_connector.router import routes
from disagg_connector.router.config import RouterConfig
from disagg_connector.router.discovery import build_discovery
from disagg_connector.router.errors import RouterError, error_response, request_id_of
from disagg_connector.router.health import HealthChecker
from disagg_connector.router.metrics import RouterMetrics
from disagg_connector.router.proxy import ProxyService
from disagg_connector.router.replicas import ReplicaPool, Role
from disagg_connector.router.stores import build_store


def create_app(config: RouterConfig) -> FastAPI:
    """Build the router app for a validated ``config``."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Idle engine connections are dropped before uvicorn's (vLLM's) 5 s keep-alive closes
        # them, so a request never races the server closing its connection.
        limits = httpx.Limits(
            max_connections=None, max_keepalive_connections=1024, keepalive_expiry=4.0
        )
        transport = httpx.AsyncHTTPTransport(limits=limits)
        client = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(config.decode_timeout_s, connect=config.connect_timeout_s),
        )
        pools = tuple(
            ReplicaPool(role, config.health_interval_s, config.health_max_backoff_s)
            for role in (Role.PREFILL, Role.DECODE)
        )
        prefill, decode = pools
        store = build_store(config)
        discovery = build_discovery(config, prefill, decode)
        metrics = RouterMetrics()
        health = HealthChecker(client, pools, config.health_interval_s, config.health_timeout_s)
        await discovery.start()
        await health.check_due()
        health.start()
        state = app.state
        state.prefill, state.decode, state.store = prefill, decode, store
        state.metrics, state.health = metrics, health
        state.proxy = ProxyService(config, transport, prefill, decode, store, metrics, health)
        try:
            yield
        finally:
            await health.stop()
            await discovery.stop()
            await store.close()
            await client.aclose()

    app = FastAPI(
        title="disagg router", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.include_router(routes.router)
    app.add_exception_handler(HTTPException, _http_error)
    return app


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown paths and wrong methods, as OpenAI-shaped errors."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "Internal router error."
    error = RouterError(status, f"{detail}: {request.method} {request.url.path}")
    return error_response(error, request_id_of(request.headers))
