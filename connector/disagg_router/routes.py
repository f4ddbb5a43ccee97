"""FastAPI routes besides generation (``app.RouterApp`` serves those): models, health, metrics."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

from disagg_router.errors import RouterError, error_response, request_id_of

router = APIRouter()


def _json(data: dict[str, Any], status: int = 200) -> Response:
    return Response(json.dumps(data), status_code=status, media_type="application/json")


@router.get("/v1/models")
async def models(request: Request) -> Response:
    """The models decode serves (as the engines list them)."""
    health = request.app.state.health
    if not health.models:
        await health.ensure_models()
    if not health.models:
        error = RouterError(
            503, "No decode replica listed its models yet.", error_type="service_unavailable"
        )
        return error_response(error, request_id_of(request.headers))
    return _json({"object": "list", "data": health.models})


@router.get("/health")
async def health(request: Request) -> Response:
    """200 when at least one prefill and one decode replica are healthy.

    An unreachable conversation store only degrades the router (turns run without reuse),
    so it is reported but does not take the router out of its Service.
    """
    state = request.app.state
    body: dict[str, Any] = {
        "prefill_healthy": len(state.prefill.healthy()),
        "decode_healthy": len(state.decode.healthy()),
        "store": "ok",
    }
    try:
        await state.store.check()
    except Exception as exc:
        body["store"] = f"unreachable: {exc}"
    ready = body["prefill_healthy"] > 0 and body["decode_healthy"] > 0
    status = "ok" if body["store"] == "ok" else "degraded"
    body["status"] = status if ready else "unavailable"
    return _json(body, 200 if ready else 503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus text exposition."""
    state = request.app.state
    payload = state.metrics.render((state.prefill, state.decode))
    return Response(payload, media_type=CONTENT_TYPE_LATEST)
