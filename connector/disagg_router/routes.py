"""FastAPI routes besides generation (``app.RouterApp`` serves those): models, closing a
conversation, health, metrics and the reuse summary."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

from disagg_contract import REUSE_SUMMARY_PATH
from disagg_router.auth import CONVERSATION_SCOPE
from disagg_router.conversation import conversation_key
from disagg_router.errors import (
    REQUEST_ID_HEADER,
    RouterError,
    error_response,
    request_id_of,
)
from disagg_router.openai_request import checked_conversation_id

log = logging.getLogger("disagg.router")

router = APIRouter()


def _json(data: Mapping[str, object], status: int = 200) -> Response:
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


@router.delete("/v1/conversations/{conversation_id:path}")
async def close_conversation(conversation_id: str, request: Request) -> Response:
    """Forget a conversation of the client's scope and release the decode KV it holds: 204, or
    404 when the router knows no such conversation (its next turn starts afresh either way)."""
    state = request.app.state
    request_id = request_id_of(request.headers)
    try:
        checked = checked_conversation_id(conversation_id, "conversation_id")
    except RouterError as exc:
        return error_response(exc, request_id)
    key = conversation_key(checked, request.scope.get(CONVERSATION_SCOPE, ""))
    try:
        known, entry = await state.store.forget(key)
    except Exception as exc:
        state.metrics.store_errors.labels("forget").inc()
        log.warning("conversation store forget failed: %s: %s", type(exc).__name__, exc)
        error = RouterError(
            503,
            "The conversation store is unreachable; retry shortly.",
            error_type="service_unavailable",
            code="store_unreachable",
        )
        return error_response(error, request_id)
    held = state.leases.close(key, entry)
    if not (known or held):
        error = RouterError(
            404, f"No conversation {checked!r}.", param="conversation_id", code="not_found"
        )
        return error_response(error, request_id)
    return Response(status_code=204, headers={REQUEST_ID_HEADER: request_id})


@router.get("/health")
async def health(request: Request) -> Response:
    """200 when at least one prefill and one decode replica are healthy and not draining.

    An unreachable conversation store only degrades the router (turns run without reuse),
    so it is reported but does not take the router out of its Service.
    """
    state = request.app.state
    body: dict[str, Any] = {
        "prefill_healthy": len(state.prefill.available()),
        "decode_healthy": len(state.decode.available()),
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


@router.get(REUSE_SUMMARY_PATH)
async def reuse_summary(request: Request) -> Response:
    """The router's reuse counters and the leases it holds (``ReuseSummary``), for the
    operator's status."""
    state = request.app.state
    return _json(state.metrics.reuse_summary(len(state.leases)))
