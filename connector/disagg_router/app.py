"""ASGI app wiring: generation requests go straight to the proxy's turn, FastAPI serves the rest.

The lifespan opens the one engine client session and starts discovery, health checks and the
lease book's renewals, and stops them at shutdown. The two generation endpoints are raw ASGI:
they skip FastAPI's routing and middleware stack and Starlette's streaming response, a fast
path whose saving benchmarks/README.md (router section) records; every other route stays with
FastAPI. Every request passes the client guard first; a generation request then needs one of
the request slots, of its tenant's share and of the whole, which the probes and the other
routes never wait for.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from starlette.datastructures import Headers, State
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from disagg_contract import Role
from disagg_router import routes
from disagg_router.auth import CONVERSATION_SCOPE, Guard, KeyGuard, OpenGuard, unauthorized
from disagg_router.config import RouterConfig, check_client_keys, engine_credential
from disagg_router.discovery import build_discovery
from disagg_router.errors import (
    RouterError,
    error_response,
    overloaded,
    request_id_of,
    tenant_overloaded,
)
from disagg_router.health import HealthChecker
from disagg_router.leases import LeaseBook
from disagg_router.limits import RequestSlots
from disagg_router.metrics import RouterMetrics
from disagg_router.openai_request import Endpoint
from disagg_router.proxy import ProxyService
from disagg_router.replicas import ReplicaPool
from disagg_router.salts import CacheSalts
from disagg_router.stores import build_store
from disagg_router.tenants import TenantKeys
from disagg_router.upstream import EngineClient

_ENDPOINTS = {endpoint.value: endpoint for endpoint in Endpoint}


class RouterApp:
    """The router's ASGI app: ``guard`` admits each HTTP request in its conversation scope,
    ``slots`` bound the generation requests in flight; ``metrics`` live as long as the app (the
    server counts the connections it closes in them too)."""

    def __init__(
        self, api: FastAPI, guard: Guard, slots: RequestSlots, metrics: RouterMetrics
    ) -> None:
        self._api = api
        self._guard = guard
        self.slots = slots
        self.metrics = metrics

    @property
    def state(self) -> State:
        """The router's parts (pools, store, metrics, proxy), set by the lifespan."""
        return self._api.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve POSTs to the generation endpoints directly, anything else through FastAPI."""
        if scope["type"] != "http":
            await self._api(scope, receive, send)
            return
        endpoint = _ENDPOINTS.get(scope["path"])
        client = self._guard.admit(scope)
        if client is None:
            label = endpoint.value if endpoint is not None else "other"
            self.state.metrics.requests.labels(label, "unauthorized").inc()
            await unauthorized(scope)(scope, receive, send)
            return
        if endpoint is None:
            scope[CONVERSATION_SCOPE] = client.conversation_scope
            await self._api(scope, receive, send)
            return
        if scope["method"] != "POST":
            response = not_routed(405, "Method Not Allowed", Request(scope, receive))
            await response(scope, receive, send)
            return
        if not self.slots.take(client.tenant):
            await self._refuse_slot(endpoint, client.tenant, scope, receive, send)
            return
        try:
            await self.state.proxy.serve_turn(endpoint, client, scope, receive, send)
        finally:
            self.slots.give_back(client.tenant)

    async def _refuse_slot(
        self, endpoint: Endpoint, tenant: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Answer a request that found no slot: 503 when the router holds all of them, 429 when
        the client's tenant holds its whole share."""
        if self.slots.in_flight >= self.slots.limit:
            error, outcome = overloaded(self.slots.limit), "overloaded"
        else:
            error, outcome = tenant_overloaded(self.slots.share(tenant)), "tenant_overloaded"
        self.state.metrics.requests.labels(endpoint.value, outcome).inc()
        response = error_response(error, request_id_of(Headers(scope=scope)))
        await response(scope, receive, send)


def create_app(config: RouterConfig) -> RouterApp:
    """Build the router app for a validated ``config``, reading the key files it names (raise
    ``ConfigError`` naming a file that holds no usable key)."""
    credential = engine_credential(config)
    folder = Path(config.client_keys_dir) if config.client_keys_dir else None
    if folder is not None:
        check_client_keys(folder, config.api_key)
    guard: Guard = OpenGuard()
    if config.authenticates:
        guard = KeyGuard(TenantKeys(folder, config.api_key, config.client_keys_refresh_s))
    slots = RequestSlots(
        config.max_concurrent_requests,
        config.requests_per_tenant,
        dict(config.tenant_requests),
    )
    salts = CacheSalts(credential)
    metrics = RouterMetrics()
    metrics.in_flight.set_function(lambda: slots.in_flight)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engines = EngineClient(config.connect_timeout_s, credential)
        pools = tuple(
            ReplicaPool(role, config.health_interval_s, config.health_max_backoff_s)
            for role in (Role.PREFILL, Role.DECODE)
        )
        prefill, decode = pools

        def evicted(key: str) -> None:
            leases.evicted(key)

        store = build_store(config, evicted)
        discovery = build_discovery(config, prefill, decode)
        leases = LeaseBook(
            engines,
            store,
            metrics,
            config.idle_timeout_s,
            draining=lambda: {replica.url for replica in decode.draining()},
        )
        metrics.leases_held.set_function(lambda: len(leases))
        health = HealthChecker(engines, pools, config.health_interval_s, config.health_timeout_s)
        await discovery.start()
        await health.check_due()
        health.start()
        leases.start()
        state = app.state
        state.prefill, state.decode, state.store = prefill, decode, store
        state.metrics, state.health, state.leases = metrics, health, leases
        state.proxy = ProxyService(
            config, engines, prefill, decode, store, metrics, health, leases, salts
        )
        try:
            yield
        finally:
            await health.stop()
            await discovery.stop()
            await leases.stop()
            await store.close()
            await engines.close()

    api = FastAPI(
        title="disagg router", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    api.include_router(routes.router)
    api.add_exception_handler(HTTPException, _http_error)
    return RouterApp(api, guard, slots, metrics)


def not_routed(status: int, detail: str, request: Request) -> Response:
    """An OpenAI-shaped error for a path or method the router does not serve."""
    error = RouterError(status, f"{detail}: {request.method} {request.url.path}")
    return error_response(error, request_id_of(request.headers))


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown paths and wrong methods, as OpenAI-shaped errors."""
    if isinstance(exc, HTTPException):
        return not_routed(exc.status_code, exc.detail, request)
    return not_routed(500, "Internal router error.", request)
