"""The proxy service: one client turn is a prefill call, a decode call and conversation upkeep."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp

from disagg_contract import EXPIRES_AT_KEY, EXPIRY_MARGIN_S, KV_TRANSFER_PARAMS
from disagg_router.config import RouterConfig
from disagg_router.conversation import (
    SESSION_HEADER,
    Lookup,
    TurnEntry,
    bearer_token,
    conversation_key,
)
from disagg_router.errors import (
    RouterError,
    engine_message,
    engine_refusal,
    error_response,
    request_id_of,
    upstream_error,
)
from disagg_router.health import HealthChecker
from disagg_router.metrics import RouterMetrics
from disagg_router.openai_request import Endpoint, parse_request, read_body
from disagg_router.payloads import EngineBodies, json_object, prefill_params, prompt_usage, routable
from disagg_router.relay import DecodeRelay
from disagg_router.replicas import Replica, ReplicaPool
from disagg_router.routing import Affinity, ConversationAffinity, LeastOutstanding
from disagg_router.stores import ConversationStore
from disagg_router.turn import Turn
from disagg_router.upstream import EngineClient, EngineResponse, UpstreamFailure

log = logging.getLogger("disagg.router")


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
        engines: EngineClient,
        prefill: ReplicaPool,
        decode: ReplicaPool,
        store: ConversationStore,
        metrics: RouterMetrics,
        health: HealthChecker,
    ) -> None:
        self._config = config
        self._engines = engines
        self._prefill = prefill
        self._decode = decode
        self._store = store
        self._metrics = metrics
        self._health = health
        self._prefill_routing = LeastOutstanding()
        self._decode_routing = ConversationAffinity(config.decode_affinity_slack)

    async def handle(self, endpoint: Endpoint, request: Request) -> ASGIApp:
        """Serve one generation request end to end: the response to send; never raises."""
        request_id = request_id_of(request.headers)
        turn: Turn | None = None
        try:
            raw = await read_body(request, self._config.max_body_bytes)
            parsed = parse_request(
                endpoint, raw, request.headers.get(SESSION_HEADER), self._health.model_ids
            )
            turn = Turn(parsed, EngineBodies(parsed.body), request_id, time.perf_counter())
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
        turn: Turn | None,
        error: RouterError,
        outcome: str,
    ) -> ASGIApp:
        if turn is not None and turn.key and turn.entry is not None and not turn.entry_spent:
            try:
                await self._store.restore(turn.key, turn.entry)
            except Exception as exc:
                self._store_failed("restore", exc)
        self._metrics.requests.labels(endpoint.value, outcome).inc()
        return error_response(error, request_id)

    async def _begin(self, turn: Turn, api_key: str | None) -> None:
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

    async def _post(
        self, turn: Turn, replica: Replica, content: bytes, read_timeout_s: float
    ) -> EngineResponse:
        """POST the turn's endpoint on ``replica``."""
        url = replica.url + turn.request.endpoint.value
        return await self._engines.post(url, content, turn.request_id, read_timeout_s)

    def _upstream_failed(self, replica: Replica, kind: str, detail: object, mark: bool) -> None:
        """Count a failed engine call; ``mark`` (refused connections only) takes the replica
        out of rotation until a health check passes. Other failures may hit one request or
        one connection, so health checks alone decide about them."""
        self._metrics.upstream_errors.labels(replica.role.value, replica.url, kind).inc()
        log.warning("%s replica %s failed (%s): %s", replica.role, replica.url, kind, detail)
        if mark:
            pool = self._prefill if replica.role is self._prefill.role else self._decode
            pool.mark_failed(replica)

    async def _run_prefill(self, turn: Turn) -> _Prefilled:
        """Prefill with max_tokens=1; retry once on another replica if it fails."""
        params = prefill_params(turn.entry)
        tried: list[Replica] = []
        failure = upstream_error(503, "No healthy prefill replica.", "no_prefill_replica")
        for attempt in range(2):
            replica = self._prefill_routing.choose(self._prefill, exclude=tried).replica
            if replica is None:
                break
            if attempt:
                self._metrics.prefill_retries.inc()
            tried.append(replica)
            started = time.perf_counter()
            try:
                with self._prefill.track(replica):
                    response = await self._post(
                        turn, replica, turn.bodies.prefill(params), self._config.prefill_timeout_s
                    )
                    content = await response.read()
            except UpstreamFailure as exc:
                refused = exc.kind == "connect"
                self._upstream_failed(replica, exc.kind, exc, mark=refused)
                if refused:
                    failure = upstream_error(
                        503, "Prefill replica unreachable.", "prefill_unreachable"
                    )
                    continue
                turn.entry_spent, params = True, prefill_params(None)
                status = 504 if exc.kind == "timeout" else 502
                failure = upstream_error(status, f"Prefill {exc.kind}.", "prefill")
                continue
            elapsed = time.perf_counter() - started
            status = response.status
            if 400 <= status < 500:
                raise engine_refusal(status, content, "Prefill")
            data = json_object(content) if status == 200 else None
            if data is None:
                turn.entry_spent, params = True, prefill_params(None)
                message = engine_message(content)
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
                replica,
                routable(data.get(KV_TRANSFER_PARAMS), replica.host),
                self._count_tokens(data),
            )
        raise failure

    def _count_tokens(self, prefill_response: dict[str, Any]) -> int:
        prompt_tokens, reused = prompt_usage(prefill_response)
        self._metrics.prompt_tokens.labels("reused").inc(reused)
        self._metrics.prompt_tokens.labels("recomputed").inc(prompt_tokens - reused)
        return prompt_tokens

    async def _run_decode(self, turn: Turn, prefilled: _Prefilled) -> ASGIApp:
        previous = turn.start.previous_decode if turn.start else None
        choice = self._decode_routing.choose(self._decode, previous)
        self._metrics.decode_affinity.labels(choice.affinity.value).inc()
        if choice.affinity is Affinity.KEPT and turn.entry is not None:
            retained = turn.entry.kv_transfer_params.get("remote_num_tokens")
            if isinstance(retained, int) and retained > 0:
                saved = min(retained, prefilled.prompt_tokens)
                self._metrics.pd_saved_tokens.inc(saved)
                self._metrics.pd_saved_bytes.inc(saved * self._config.kv_bytes_per_token)
        body = turn.bodies.decode(prefilled.params)
        replica, response = await self._send_decode(turn, choice.replica, body)
        relay = DecodeRelay(self, turn, replica, response)
        return relay if turn.request.stream else await relay.complete()

    async def _send_decode(
        self, turn: Turn, first: Replica | None, content: bytes
    ) -> tuple[Replica, EngineResponse]:
        """Open the decode call; fail over once if the chosen replica cannot be reached.

        The 200 response returned keeps its replica's outstanding count until it is released.
        """
        tried: list[Replica] = []
        replica = first
        failure = upstream_error(503, "No healthy decode replica.", "no_decode_replica")
        for _ in range(2):
            if replica is None:
                break
            tried.append(replica)
            try:
                response = await self._open_decode(turn, replica, content)
            except UpstreamFailure as exc:
                refused = exc.kind == "connect"
                self._upstream_failed(replica, exc.kind, exc, mark=refused)
                if not refused:
                    raise upstream_error(502, "Decode transport error.", "decode") from None
                failure = upstream_error(503, "Decode replica unreachable.", "decode_unreachable")
                replica = self._decode_routing.choose(self._decode, exclude=tried).replica
                continue
            if response.status == 200:
                return replica, response
            try:
                refusal = await response.read()
            except UpstreamFailure as exc:
                refusal = str(exc).encode()
            if 400 <= response.status < 500:
                raise engine_refusal(response.status, refusal, "Decode")
            message = engine_message(refusal)
            self._upstream_failed(replica, f"http_{response.status}", message, mark=False)
            raise upstream_error(502, f"Decode failed: {message}", "decode_failed")
        raise failure

    async def _open_decode(self, turn: Turn, replica: Replica, content: bytes) -> EngineResponse:
        """POST to decode, counted as outstanding on ``replica`` from now; the count stays
        only with a 200 response (its relay ends it)."""
        replica.outstanding += 1
        opened = False
        try:
            response = await self._post(turn, replica, content, self._config.decode_timeout_s)
            opened = response.status == 200
            return response
        finally:
            if not opened:
                replica.outstanding -= 1

    async def commit(self, turn: Turn, replica: Replica, params: object) -> None:
        """Remember decode's params for the conversation's next turn."""
        kv = routable(params, replica.host)
        if turn.key is None or turn.start is None or kv is None:
            return
        now = time.time()
        expires_at = now + self._config.conversation_ttl_s
        published = kv.get(EXPIRES_AT_KEY)
        if isinstance(published, int | float) and not isinstance(published, bool):
            expires_at = min(expires_at, published - EXPIRY_MARGIN_S)
        entry = TurnEntry(kv, replica.url, now, expires_at, turn.start.seq)
        try:
            await self._store.commit(turn.key, entry)
        except Exception as exc:
            self._store_failed("commit", exc)

    def finished(self, turn: Turn, outcome: str) -> None:
        """Count a turn that got past decode's first byte."""
        self._metrics.requests.labels(turn.request.endpoint.value, outcome).inc()
        if outcome == "success":
            self._metrics.e2e_seconds.observe(time.perf_counter() - turn.started)

    def first_byte(self, turn: Turn) -> None:
        """Record time to first streamed byte."""
        self._metrics.ttft_seconds.observe(time.perf_counter() - turn.started)

    def upstream_failed(self, replica: Replica, kind: str, detail: object) -> None:
        """Count a decode failure after the response started."""
        self._upstream_failed(replica, kind, detail, mark=False)
