"""The proxy service: one client turn is a prefill call, a decode call and conversation upkeep."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from disagg_connector.router.config import DECODE_EXPIRY_MARGIN_S, RouterConfig
from disagg_connector.router.conversation import (
    SESSION_HEADER,
    Lookup,
    TurnEntry,
    TurnStart,
    bearer_token,
    conversation_key,
)
from disagg_connector.router.errors import (
    REQUEST_ID_HEADER,
    EngineRejected,
    RouterError,
    engine_message,
    error_body,
    error_response,
    request_id_of,
    upstream_error,
)
from disagg_connector.router.health import HealthChecker
from disagg_connector.router.kv_params import (
    DECODE_EXPIRY_KEY,
    KV_MARKER,
    KV_PARAMS,
    prefill_params,
    routable,
    strip_from_events,
)
from disagg_connector.router.metrics import RouterMetrics
from disagg_connector.router.openai_request import ClientRequest, Endpoint, parse_request, read_body
from disagg_connector.router.replicas import Replica, ReplicaPool
from disagg_connector.router.selection import Affinity, choose_decode, choose_prefill
from disagg_connector.router.stores import ConversationStore

log = logging.getLogger("disagg.router")

_PREFILL_DROPPED = ("max_completion_tokens", "min_tokens", "stream_options")


def _dumps(data: object) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


@dataclass
class _Turn:
    """State of one client request as it moves through prefill and decode."""

    request: ClientRequest
    request_id: str
    started: float
    key: str | None = None
    start: TurnStart | None = None
    entry: TurnEntry | None = None
    entry_spent: bool = False
    lookup: Lookup = Lookup.NO_KEY


@dataclass(frozen=True)
class _Prefilled:
    replica: Replica
    params: dict[str, Any] | None
    prompt_tokens: int


class ProxyService:
    """Routes turns across the prefill and decode pools and remembers decode's KV per turn."""

    def __init__(
        self,
        config: RouterConfig,
        transport: httpx.AsyncBaseTransport,
        prefill: ReplicaPool,
        decode: ReplicaPool,
        store: ConversationStore,
        metrics: RouterMetrics,
        health: HealthChecker,
    ) -> None:
        self._config = config
        self._transport = transport
        self._prefill = prefill
        self._decode = decode
        self._store = store
        self._metrics = metrics
        self._health = health

    async def handle(self, endpoint: Endpoint, request: Request) -> Response:
        """Serve one generation request end to end; never raises."""
        request_id = request_id_of(request.headers)
        turn: _Turn | None = None
        try:
            raw = await read_body(request, self._config.max_body_bytes)
            parsed = parse_request(
                endpoint, raw, request.headers.get(SESSION_HEADER), self._health.model_ids
            )
            turn = _Turn(parsed, request_id, time.perf_counter())
            if not self._decode.healthy():
                raise upstream_error(503, "No healthy decode replica.", "no_decode_replica")
            await self._begin(turn, bearer_token(request.headers.get("authorization")))
            prefilled = await self._run_prefill(turn)
            return await self._run_decode(turn, prefilled)
        except RouterError as error:
            outcome = "client_error" if error.status < 500 else "upstream_error"
            return await self._fail(endpoint, request_id, turn, error, outcome)
        except Exception:
            log.exception("[%s] router error", request_id)
            internal = RouterError(500, "Internal router error.", error_type="server_error")
            return await self._fail(endpoint, request_id, turn, internal, "router_error")

    async def _fail(
        self,
        endpoint: Endpoint,
        request_id: str,
        turn: _Turn | None,
        error: RouterError,
        outcome: str,
    ) -> Response:
        if turn is not None and turn.key and turn.entry is not None and not turn.entry_spent:
            try:
                await self._store.restore(turn.key, turn.entry)
            except Exception as exc:
                self._store_failed("restore", exc)
        self._metrics.requests.labels(endpoint.value, outcome).inc()
        return error_response(error, request_id)

    async def _begin(self, turn: _Turn, api_key: str | None) -> None:
        conversation_id = turn.request.conversation_id
        if conversation_id is None:
            self._metrics.lookups.labels(Lookup.NO_KEY.value).inc()
            return
        turn.key = conversation_key(conversation_id, api_key, self._config.scope_by_api_key)
        try:
            turn.start = await self._store.begin_turn(turn.key)
        except Exception as exc:
            self._store_failed("begin_turn", exc)
            turn.lookup = Lookup.MISS
            return
        lookup, turn.entry = turn.start.lookup, turn.start.entry
        if turn.entry is not None:
            decode = self._decode.get(turn.entry.decode_url)
            if decode is None or not decode.healthy or decode.recovered_at >= turn.entry.created_at:
                lookup, turn.entry = Lookup.STALE, None
        self._metrics.lookups.labels(lookup.value).inc()
        turn.lookup = lookup

    def _store_failed(self, operation: str, exc: Exception) -> None:
        self._metrics.store_errors.labels(operation).inc()
        log.warning("conversation store %s failed (turn runs without reuse): %s", operation, exc)

    def _request(
        self, turn: _Turn, replica: Replica, content: bytes, timeout_s: float
    ) -> httpx.Request:
        """A ready request for the shared transport.

        Engine calls go to the client's transport directly: the client's auth, redirect,
        cookie and hook layers cost ~20% of a call's CPU and the router needs none of them.
        """
        headers = {REQUEST_ID_HEADER: turn.request_id, "Content-Type": "application/json"}
        url = replica.url + turn.request.endpoint.value
        request = httpx.Request("POST", url, content=content, headers=headers)
        timeout = httpx.Timeout(timeout_s, connect=self._config.connect_timeout_s)
        request.extensions["timeout"] = timeout.as_dict()
        return request

    async def _send(self, request: httpx.Request) -> httpx.Response:
        """Send and read a whole response through the shared transport."""
        response = await self._transport.handle_async_request(request)
        try:
            await response.aread()
        finally:
            await response.aclose()
        return response

    def _upstream_failed(self, replica: Replica, kind: str, detail: object, mark: bool) -> None:
        """Count a failed engine call; ``mark`` (refused connections only) takes the replica
        out of rotation until a health check passes. Other failures may hit one request or
        one connection, so health checks alone decide about them."""
        self._metrics.upstream_errors.labels(replica.role.value, replica.url, kind).inc()
        log.warning("%s replica %s failed (%s): %s", replica.role, replica.url, kind, detail)
        if mark:
            pool = self._prefill if replica.role is self._prefill.role else self._decode
            pool.mark_failed(replica)

    async def _run_prefill(self, turn: _Turn) -> _Prefilled:
        """Prefill with max_tokens=1; retry once on another replica if it fails."""
        params = prefill_params(turn.entry)
        tried: list[Replica] = []
        failure = upstream_error(503, "No healthy prefill replica.", "no_prefill_replica")
        for attempt in range(2):
            replica = choose_prefill(self._prefill, tuple(tried))
            if replica is None:
                break
            if attempt:
                self._metrics.prefill_retries.inc()
            tried.append(replica)
            payload = {**turn.request.body, "stream": False, "max_tokens": 1, KV_PARAMS: params}
            for name in _PREFILL_DROPPED:
                payload.pop(name, None)
            started = time.perf_counter()
            try:
                request = self._request(
                    turn, replica, _dumps(payload), self._config.prefill_timeout_s
                )
                with self._prefill.track(replica):
                    response = await self._send(request)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                self._upstream_failed(replica, "connect", exc, mark=True)
                failure = upstream_error(503, "Prefill replica unreachable.", "prefill_unreachable")
                continue
            except httpx.HTTPError as exc:
                timed_out = isinstance(exc, httpx.TimeoutException)
                kind = "timeout" if timed_out else "transport"
                self._upstream_failed(replica, kind, exc, mark=False)
                turn.entry_spent, params = True, prefill_params(None)
                failure = upstream_error(504 if timed_out else 502, f"Prefill {kind}.", "prefill")
                continue
            elapsed = time.perf_counter() - started
            status = response.status_code
            if 400 <= status < 500:
                raise EngineRejected(status, response.content)
            data = _json_object(response.content) if status == 200 else None
            if data is None:
                turn.entry_spent, params = True, prefill_params(None)
                message = engine_message(response.content)
                self._upstream_failed(replica, f"http_{status}", message, mark=False)
                failure = upstream_error(502, f"Prefill failed: {message}", "prefill_failed")
                continue
            turn.entry_spent = True
            self._metrics.prefill_seconds.observe(elapsed)
            log.info(
                "[%s] Prefill done in %.0fms (replica=%s, conversation cache %s)",
                turn.request_id,
                elapsed * 1000,
                replica.url,
                turn.lookup.value.upper(),
            )
            return _Prefilled(
                replica, routable(data.get(KV_PARAMS), replica.host), self._count_tokens(data)
            )
        raise failure

    def _count_tokens(self, prefill_response: dict[str, Any]) -> int:
        usage = prefill_response.get("usage")
        if not isinstance(usage, dict) or not isinstance(usage.get("prompt_tokens"), int):
            return 0
        prompt_tokens: int = usage["prompt_tokens"]
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        reused = min(cached, prompt_tokens) if isinstance(cached, int) and cached > 0 else 0
        self._metrics.prompt_tokens.labels("reused").inc(reused)
        self._metrics.prompt_tokens.labels("recomputed").inc(prompt_tokens - reused)
        return prompt_tokens

    async def _run_decode(self, turn: _Turn, prefilled: _Prefilled) -> Response:
        previous = turn.start.previous_decode if turn.start else None
        replica, affinity = choose_decode(
            self._decode, previous, self._config.decode_affinity_slack
        )
        self._metrics.decode_affinity.labels(affinity.value).inc()
        if affinity is Affinity.KEPT and turn.entry is not None:
            retained = turn.entry.kv_transfer_params.get("remote_num_tokens")
            if isinstance(retained, int) and retained > 0:
                saved = min(retained, prefilled.prompt_tokens)
                self._metrics.pd_saved_tokens.inc(saved)
                self._metrics.pd_saved_bytes.inc(saved * self._config.kv_bytes_per_token)
        body = dict(turn.request.body)
        if prefilled.params is not None:
            body[KV_PARAMS] = prefilled.params
        replica, response = await self._send_decode(turn, replica, _dumps(body))
        stream = _DecodeStream(self, turn, replica, response)
        if turn.request.stream:
            return StreamingResponse(
                stream.events(),
                media_type="text/event-stream",
                headers={REQUEST_ID_HEADER: turn.request_id},
                background=BackgroundTask(stream.close),
            )
        return await stream.complete()

    async def _send_decode(
        self, turn: _Turn, first: Replica | None, content: bytes
    ) -> tuple[Replica, httpx.Response]:
        """Open the decode call; fail over once if the chosen replica cannot be reached."""
        tried: list[Replica] = []
        replica = first
        failure = upstream_error(503, "No healthy decode replica.", "no_decode_replica")
        for _ in range(2):
            if replica is None:
                break
            tried.append(replica)
            request = self._request(turn, replica, content, self._config.decode_timeout_s)
            replica.outstanding += 1
            try:
                response = await self._transport.handle_async_request(request)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                replica.outstanding -= 1
                self._upstream_failed(replica, "connect", exc, mark=True)
                failure = upstream_error(503, "Decode replica unreachable.", "decode_unreachable")
                replica = self._decode.least_outstanding(tried)
                continue
            except httpx.HTTPError as exc:
                replica.outstanding -= 1
                self._upstream_failed(replica, "transport", exc, mark=False)
                raise upstream_error(502, "Decode transport error.", "decode") from None
            if response.status_code == 200:
                return replica, response
            refusal = await response.aread()
            await response.aclose()
            replica.outstanding -= 1
            if 400 <= response.status_code < 500:
                raise EngineRejected(response.status_code, refusal)
            message = engine_message(refusal)
            self._upstream_failed(replica, f"http_{response.status_code}", message, mark=False)
            raise upstream_error(502, f"Decode failed: {message}", "decode_failed")
        raise failure

    async def commit(self, turn: _Turn, replica: Replica, params: object) -> None:
        """Remember decode's params for the conversation's next turn."""
        kv = routable(params, replica.host)
        if turn.key is None or turn.start is None or kv is None:
            return
        now = time.time()
        expires_at = now + self._config.conversation_ttl_s
        published = kv.get(DECODE_EXPIRY_KEY)
        if isinstance(published, int | float) and not isinstance(published, bool):
            expires_at = min(expires_at, published - DECODE_EXPIRY_MARGIN_S)
        entry = TurnEntry(kv, replica.url, now, expires_at, turn.start.seq)
        try:
            await self._store.commit(turn.key, entry)
        except Exception as exc:
            self._store_failed("commit", exc)

    def finished(self, turn: _Turn, outcome: str) -> None:
        """Count a turn that got past decode's first byte."""
        self._metrics.requests.labels(turn.request.endpoint.value, outcome).inc()
        if outcome == "success":
            self._metrics.e2e_seconds.observe(time.perf_counter() - turn.started)

    def first_byte(self, turn: _Turn) -> None:
        """Record time to first streamed byte."""
        self._metrics.ttft_seconds.observe(time.perf_counter() - turn.started)

    def upstream_failed(self, replica: Replica, kind: str, detail: object) -> None:
        """Count a decode failure after the response started."""
        self._upstream_failed(replica, kind, detail, mark=False)


class _DecodeStream:
    """Relays one decode response and releases it exactly once."""

    def __init__(
        self, service: ProxyService, turn: _Turn, replica: Replica, response: httpx.Response
    ) -> None:
        self._service = service
        self._turn = turn
        self._replica = replica
        self._response = response
        self._closed = False

    async def close(self) -> None:
        """Close the upstream response and stop counting it as outstanding."""
        if not self._closed:
            self._closed = True
            self._replica.outstanding -= 1
            await self._response.aclose()

    async def complete(self) -> Response:
        """Read the whole (non-streamed) answer, keep its params, return it without them."""
        try:
            content = await self._response.aread()
        except httpx.HTTPError as exc:
            self._service.upstream_failed(self._replica, "transport", exc)
            raise upstream_error(502, "Decode transport error.", "decode") from None
        finally:
            await self.close()
        data = _json_object(content)
        if data is None:
            self._service.upstream_failed(self._replica, "bad_response", content[:200])
            raise upstream_error(502, "Decode returned a malformed response.", "decode_failed")
        await self._service.commit(self._turn, self._replica, data.pop(KV_PARAMS, None))
        self._service.finished(self._turn, "success")
        return Response(
            _dumps(data),
            media_type="application/json",
            headers={REQUEST_ID_HEADER: self._turn.request_id},
        )

    async def events(self) -> AsyncIterator[bytes]:
        """Forward whole SSE events; take ``kv_transfer_params`` out and keep them."""
        outcome = "cancelled"
        pending = b""
        first = True
        try:
            async for chunk in self._response.aiter_bytes():
                if first:
                    self._service.first_byte(self._turn)
                    first = False
                pending += chunk
                cut = pending.rfind(b"\n\n")
                if cut < 0:
                    continue
                ready, pending = pending[: cut + 2], pending[cut + 2 :]
                yield await self._strip(ready) if KV_MARKER in ready else ready
            if pending:
                yield await self._strip(pending)
            outcome = "success"
        except httpx.HTTPError as exc:
            outcome = "upstream_error"
            self._service.upstream_failed(self._replica, "stream", exc)
            body = error_body("Decode stream broke off.", "upstream_error", code="decode")
            yield b"data: " + _dumps(body) + b"\n\n"
        finally:
            await self.close()
            self._service.finished(self._turn, outcome)

    async def _strip(self, events: bytes) -> bytes:
        events, params = strip_from_events(events)
        if params is not None:
            await self._service.commit(self._turn, self._replica, params)
        return events


def _json_object(content: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None
