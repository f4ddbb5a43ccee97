"""A client turn top to bottom: resolve the conversation, prefill, decode, relay and commit.

``ProxyService.serve_turn`` is the router's whole prefill/decode protocol, for both generation
endpoints, streamed or not: it reads the request into a ``Turn`` and runs four numbered stages
over it, each a method that reads what the stages before it left in the turn and adds its own:

1. ``resolve``: take the conversation's entry (decode's KV params from the previous turn) from
   the store;
2. ``prefill``: prefill one token, carrying that entry's params on a hit so that prefill reads
   decode's retained blocks (D->P); a conversation the store did not hold is stored only now,
   once prefill accepted the turn;
3. ``decode``: decode with the params prefill returned (decode reads prefill's blocks, P->D),
   preferably on the replica that served the previous turn, asking decode to retain the
   turn's KV when the turn belongs to a conversation;
4. ``relay``: relay decode's answer to the client without its params, commit those as the
   conversation's entry for its next turn, and hold the lease they name (``leases``).

An error before the answer starts goes to the client as an OpenAI error response
(``refuse``), and an entry prefill never read goes back to the store. A streamed answer is
relayed as raw ASGI messages cut at SSE event boundaries; a client that leaves mid-stream
cancels the relay, which closes the decode connection (vLLM then aborts the request).

Every engine body carries the tenant's ``cache_salt`` (``salts``), so that no tenant's prompt
is served from, or probes, another tenant's prefix cache.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from disagg_contract import EXPIRES_AT_KEY, EXPIRY_MARGIN_S, KV_TRANSFER_PARAMS, PrefillRouting
from disagg_router.auth import Client
from disagg_router.config import RouterConfig
from disagg_router.conversation import (
    SESSION_HEADER,
    Lookup,
    TurnEntry,
    TurnStart,
    conversation_key,
)
from disagg_router.errors import (
    REQUEST_ID_HEADER,
    RouterError,
    engine_message,
    engine_refusal,
    error_body,
    error_response,
    request_id_of,
    upstream_error,
)
from disagg_router.health import HealthChecker
from disagg_router.leases import LeaseBook
from disagg_router.metrics import RouterMetrics
from disagg_router.openai_request import Endpoint, parse_request, read_body
from disagg_router.payloads import (
    EngineBodies,
    decode_params,
    dumps,
    json_object,
    prefill_params,
    prompt_usage,
    read_report,
    routable,
    strip_from_events,
)
from disagg_router.replicas import Replica, ReplicaPool
from disagg_router.routing import (
    Affinity,
    ConversationAffinity,
    LeastOutstanding,
    RoutingStrategy,
)
from disagg_router.salts import CacheSalts
from disagg_router.stores import ConversationStore
from disagg_router.upstream import EngineClient, EngineResponse, UpstreamFailure

log = logging.getLogger("disagg.router")

_SSE_CONTENT_TYPE = b"text/event-stream; charset=utf-8"
_REQUEST_ID = REQUEST_ID_HEADER.lower().encode()
_END: Message = {"type": "http.response.body", "body": b"", "more_body": False}


@dataclass(slots=True, eq=False)
class Turn:
    """One client turn as the stages fill it in: each stage reads what the ones before it
    left here, and the error path reads what must be undone."""

    endpoint: Endpoint
    client: Client
    request_id: str
    started: float
    stream: bool = False
    conversation_id: str | None = None
    bodies: EngineBodies | None = None
    key: str | None = None
    """The conversation's store key; None for a turn without a conversation id."""
    start: TurnStart | None = None
    """What the store handed the turn; None without a conversation or a reachable store."""
    seq: int = 0
    """The turn's number in its conversation, 0 while it has none: only a numbered turn asks
    decode to retain its KV and commits it."""
    lookup: Lookup = Lookup.NO_KEY
    entry: TurnEntry | None = None
    """The entry prefill is offered: the one taken, unless its KV cannot be read."""
    entry_spent: bool = False
    """Prefill may have read the entry's blocks: the entry cannot go back to the store."""
    offered: bool = False
    """The params prefill got carry decode's offer."""
    prefill: Replica | None = None
    prefilled: dict[str, Any] = field(default_factory=dict)
    """Prefill's answer."""
    prompt_tokens: int = 0
    decode: Replica | None = None
    answer: EngineResponse | None = None
    """Decode's answer once its status arrived; released when the turn ends."""
    answering: bool = False
    """The answer started: an error can no longer be sent instead."""


class ProxyService:
    """Serves client turns across the prefill and decode pools and keeps, per conversation,
    the params of the KV its last turn left on decode."""

    def __init__(
        self,
        config: RouterConfig,
        engines: EngineClient,
        prefill: ReplicaPool,
        decode: ReplicaPool,
        store: ConversationStore,
        metrics: RouterMetrics,
        health: HealthChecker,
        leases: LeaseBook,
        salts: CacheSalts,
    ) -> None:
        self._config = config
        self._engines = engines
        self._prefill = prefill
        self._decode = decode
        self._store = store
        self._metrics = metrics
        self._health = health
        self._leases = leases
        self._salts = salts
        self._prefill_routing: RoutingStrategy = (
            ConversationAffinity(config.prefill_affinity_slack)
            if config.prefill_routing is PrefillRouting.AFFINITY
            else LeastOutstanding()
        )
        self._decode_routing = ConversationAffinity(config.decode_affinity_slack)

    async def serve_turn(
        self, endpoint: Endpoint, client: Client, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Serve one POST to a generation endpoint, streamed or not, end to end, for ``client``
        (``auth``: its tenant and conversation scope).

        Every error before the answer starts is answered as an OpenAI error; only a failure
        to send the answer itself propagates (to the server, which logs it).
        """
        request = Request(scope, receive)
        turn = Turn(endpoint, client, request_id_of(request.headers), time.perf_counter())
        try:
            await self.read(turn, request)
            await self.resolve(turn)
            await self.prefill(turn)
            await self.decode(turn)
            await self.relay(turn, scope, receive, send)
        except Exception as exc:
            if turn.answering:
                raise
            response = await self.refuse(turn, exc)
            await response(scope, receive, send)
        finally:
            if turn.answer is not None:
                turn.answer.release()

    async def read(self, turn: Turn, request: Request) -> None:
        """Read and check the client's request, and encode the engines' bodies once, salted
        with the tenant's ``cache_salt`` (``salts``: a client's own salt is scoped under it,
        never passed on as sent)."""
        raw = await read_body(request, self._config.max_body_bytes, self._config.body_timeout_s)
        checked = parse_request(
            turn.endpoint, raw, request.headers.get(SESSION_HEADER), self._health.model_ids
        )
        turn.stream, turn.conversation_id = checked.stream, checked.conversation_id
        salt = self._salts.salt(turn.client.tenant, checked.cache_salt)
        turn.bodies = EngineBodies(checked.body, salt)
        if not self._decode.available():
            raise upstream_error(503, "No healthy decode replica.", "no_decode_replica")

    async def resolve(self, turn: Turn) -> None:
        """1. Resolve the conversation in the client's scope: take its entry from the store
        (one entry serves one turn), unless the decode replica holding that KV left, failed or
        came back since, or is draining (no read from a pod that is leaving: the turn
        recomputes). Without the store (unreachable, or slower than --redis-timeout) the turn
        runs as a miss, counted as a store error."""
        if turn.conversation_id is None:
            self._metrics.lookups.labels(Lookup.NO_KEY.value).inc()
            return
        turn.key = key = conversation_key(turn.conversation_id, turn.client.conversation_scope)
        try:
            turn.start = start = await self._store.begin_turn(key)
        except Exception as exc:
            self._store_failed("begin_turn", exc)
            turn.lookup = Lookup.MISS
        else:
            self._leases.touch(key)
            turn.seq, lookup, entry = start.seq, start.lookup, start.entry
            holder = self._decode.get(entry.decode_url) if entry is not None else None
            if holder is not None and holder.draining:
                lookup, entry = Lookup.DRAINING, None
            elif entry is not None and (
                holder is None or not holder.healthy or holder.recovered_at >= entry.created_at
            ):
                lookup, entry = Lookup.STALE, None
            turn.lookup, turn.entry = lookup, entry
        self._metrics.lookups.labels(turn.lookup.value).inc()

    async def prefill(self, turn: Turn) -> None:
        """2. Prefill one token, with the entry's params on a hit (prefill reads decode's
        blocks: D->P), preferably on the replica that served the previous turn (its prefix
        cache holds the conversation; see ``routing``). A failed call is retried once on
        another replica; once prefill may have read the blocks, the retry goes without them.
        A client error (4xx) is relayed as is.
        Then a turn of a conversation the store did not hold is numbered, which stores the
        conversation: only a turn prefill accepted takes room in the store."""
        assert turn.bodies is not None, "read comes first"
        params = prefill_params(turn.entry)
        turn.offered = turn.entry is not None
        tried: list[Replica] = []
        failure = upstream_error(503, "No healthy prefill replica.", "no_prefill_replica")
        previous = turn.start.previous_prefill if turn.start is not None else None
        for attempt in range(2):
            choice = self._prefill_routing.choose(self._prefill, previous, exclude=tried)
            prefill = choice.replica
            if prefill is None:
                raise failure
            if turn.key is not None and not attempt:
                self._metrics.prefill_affinity.labels(choice.affinity.value).inc()
            if attempt:
                self._metrics.prefill_retries.inc()
            tried.append(prefill)
            began = time.perf_counter()
            try:
                response = await self._post(
                    prefill,
                    turn.endpoint,
                    turn.bodies.prefill(params),
                    turn.request_id,
                    self._config.prefill_timeout_s,
                )
                content = await response.read()
            except UpstreamFailure as exc:
                refused = exc.kind == "connect"  # nothing reached the engine
                self._upstream_failed(prefill, exc.kind, exc, mark=refused)
                if refused:
                    failure = upstream_error(
                        503, "Prefill replica unreachable.", "prefill_unreachable"
                    )
                    continue
                turn.entry_spent, params, turn.offered = True, prefill_params(None), False
                status = 504 if exc.kind == "timeout" else 502
                failure = upstream_error(status, f"Prefill {exc.kind}.", "prefill")
                continue
            elapsed = time.perf_counter() - began
            if 400 <= response.status < 500:
                raise engine_refusal(response.status, content, "Prefill")
            turn.entry_spent = True
            prefilled = json_object(content) if response.status == 200 else None
            if prefilled is not None:
                turn.prefill, turn.prefilled = prefill, prefilled
                break
            params, turn.offered = prefill_params(None), False
            message = engine_message(content)
            self._upstream_failed(prefill, f"http_{response.status}", message, mark=False)
            failure = upstream_error(502, f"Prefill failed: {message}", "prefill_failed")
        else:
            raise failure
        self._prefilled(turn, elapsed)
        if turn.key is not None and turn.start is not None and turn.seq == 0:
            try:
                turn.seq = await self._store.open_turn(turn.key)
            except Exception as exc:
                self._store_failed("open_turn", exc)

    def _prefilled(self, turn: Turn, elapsed: float) -> None:
        """Count and log a prefill that answered, with the prompt tokens it reused."""
        assert turn.prefill is not None
        self._metrics.prefill_seconds.observe(elapsed)
        log.info(
            "[%s] Prefill done in %.0fms (replica=%s, conversation cache %s)",
            turn.request_id,
            elapsed * 1000,
            turn.prefill.url,
            turn.lookup.value.upper(),
        )
        turn.prompt_tokens, reused = prompt_usage(turn.prefilled)
        self._metrics.prompt_tokens.labels("reused").inc(reused)
        self._metrics.prompt_tokens.labels("recomputed").inc(turn.prompt_tokens - reused)
        if turn.key is not None:
            self._metrics.reuse_turn(
                turn.offered and reused > 0, reused, turn.prompt_tokens - reused
            )
            report = read_report(turn.prefilled.get(KV_TRANSFER_PARAMS)) if turn.offered else None
            if report is not None:
                self._metrics.offer_read(report)

    async def decode(self, turn: Turn) -> None:
        """3. Decode with prefill's params (decode reads prefill's blocks: P->D), on the
        previous turn's replica while it is kept (its prefix cache holds the conversation; a
        draining one is not kept); an unreachable replica is replaced once. Decode retains the
        turn's KV only for a numbered turn, which the router can commit as the conversation's
        entry. The answer counts as outstanding on its replica until the turn releases it."""
        assert turn.bodies is not None and turn.prefill is not None, "prefill comes first"
        previous = turn.start.previous_decode if turn.start is not None else None
        choice = self._decode_routing.choose(self._decode, previous)
        self._metrics.decode_affinity.labels(choice.affinity.value).inc()
        if choice.affinity is Affinity.KEPT and turn.entry is not None:
            retained = turn.entry.kv_transfer_params.get("remote_num_tokens")
            if isinstance(retained, int) and retained > 0:
                saved = min(retained, turn.prompt_tokens)
                self._metrics.pd_saved_tokens.inc(saved)
                self._metrics.pd_saved_bytes.inc(saved * self._config.kv_bytes_per_token)
        prefilled = routable(turn.prefilled.get(KV_TRANSFER_PARAMS), turn.prefill.host)
        body = turn.bodies.decode(decode_params(prefilled, retain=turn.seq > 0))
        candidate, tried = choice.replica, list[Replica]()
        failure = upstream_error(503, "No healthy decode replica.", "no_decode_replica")
        while turn.answer is None:
            if candidate is None or len(tried) == 2:
                raise failure
            decode = candidate
            tried.append(decode)
            try:
                response = await self._post(
                    decode, turn.endpoint, body, turn.request_id, self._config.decode_timeout_s
                )
            except UpstreamFailure as exc:
                refused = exc.kind == "connect"
                self._upstream_failed(decode, exc.kind, exc, mark=refused)
                if not refused:
                    raise upstream_error(502, "Decode transport error.", "decode") from None
                failure = upstream_error(503, "Decode replica unreachable.", "decode_unreachable")
                candidate = self._decode_routing.choose(self._decode, exclude=tried).replica
                continue
            if response.status != 200:
                try:
                    refusal = await response.read()
                except UpstreamFailure as exc:
                    refusal = str(exc).encode()
                if 400 <= response.status < 500:
                    raise engine_refusal(response.status, refusal, "Decode")
                message = engine_message(refusal)
                self._upstream_failed(decode, f"http_{response.status}", message, mark=False)
                raise upstream_error(502, f"Decode failed: {message}", "decode_failed")
            turn.decode, turn.answer = decode, response

    async def relay(self, turn: Turn, scope: Scope, receive: Receive, send: Send) -> None:
        """4. Relay decode's answer without its params, and commit those as the
        conversation's entry for its next turn (a streamed answer carries them in its final
        event); the lease book then holds the lease they name and releases the one this turn
        took."""
        if turn.stream:
            await self._relay_stream(turn, receive, send)
        else:
            await self._relay_body(turn, scope, receive, send)

    async def _relay_body(self, turn: Turn, scope: Scope, receive: Receive, send: Send) -> None:
        """Relay a whole (non-streamed) answer once it is read and committed."""
        assert turn.answer is not None and turn.decode is not None, "decode comes first"
        try:
            content = await turn.answer.read()
        except UpstreamFailure as exc:
            self._upstream_failed(turn.decode, exc.kind, exc, mark=False)
            raise upstream_error(502, "Decode transport error.", "decode") from None
        data = json_object(content)
        if data is None:
            self._upstream_failed(turn.decode, "bad_response", content[:200], mark=False)
            raise upstream_error(502, "Decode returned a malformed response.", "decode_failed")
        await self._commit(turn, data.pop(KV_TRANSFER_PARAMS, None))
        self._finished(turn, "success")
        turn.answering = True
        reply = Response(
            dumps(data), media_type="application/json", headers={REQUEST_ID_HEADER: turn.request_id}
        )
        await reply(scope, receive, send)

    async def _relay_stream(self, turn: Turn, receive: Receive, send: Send) -> None:
        """Relay a streamed answer event by event, committing the params of its final event;
        a stream that breaks off ends with an error event."""
        answer, decode = turn.answer, turn.decode
        assert answer is not None and decode is not None, "decode comes first"
        committed = False

        async def forward(events: bytes) -> None:
            nonlocal committed
            events, kv = strip_from_events(events)
            if kv is not None and not committed:
                committed = True
                await self._commit(turn, kv)
            await send({"type": "http.response.body", "body": events, "more_body": True})

        turn.answering = True
        outcome = "cancelled"  # unless the relay below runs to its end
        try:
            async with _cancelled_if_client_leaves(receive):
                headers = [
                    (b"content-type", _SSE_CONTENT_TYPE),
                    (_REQUEST_ID, turn.request_id.encode()),
                ]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                relayed, pending, first = "success", b"", True
                try:
                    async for chunk in answer.chunks():
                        if first:
                            self._metrics.ttft_seconds.observe(time.perf_counter() - turn.started)
                            first = False
                        pending += chunk
                        cut = pending.rfind(b"\n\n") + 2
                        if cut >= 2:
                            ready, pending = pending[:cut], pending[cut:]
                            await forward(ready)
                    if pending:
                        await forward(pending)
                    if not committed:
                        await self._commit(turn, None)
                except UpstreamFailure as exc:
                    relayed = "upstream_error"
                    self._upstream_failed(decode, "stream", exc, mark=False)
                    broke = error_body("Decode stream broke off.", "upstream_error", code="decode")
                    event = b"data: " + dumps(broke) + b"\n\n"
                    await send({"type": "http.response.body", "body": event, "more_body": True})
                await send(_END)
                outcome = relayed
        finally:
            answer.release()
            self._finished(turn, outcome)

    async def refuse(self, turn: Turn, exc: Exception) -> Response:
        """The OpenAI error answering a turn that failed before its answer started; the entry
        it took goes back to the store unless prefill may have read its blocks."""
        if isinstance(exc, RouterError):
            error, outcome = exc, "client_error" if exc.status < 500 else "upstream_error"
        else:
            log.exception("[%s] router error", turn.request_id, exc_info=exc)
            error = RouterError(500, "Internal router error.", error_type="server_error")
            outcome = "router_error"
        if turn.key is not None and turn.entry is not None and not turn.entry_spent:
            try:
                await self._store.restore(turn.key, turn.entry)
            except Exception as store_exc:
                self._store_failed("restore", store_exc)
        self._metrics.requests.labels(turn.endpoint.value, outcome).inc()
        return error_response(error, turn.request_id)

    async def _post(
        self,
        replica: Replica,
        endpoint: Endpoint,
        content: bytes,
        request_id: str,
        read_timeout_s: float,
    ) -> EngineResponse:
        """POST ``endpoint`` on ``replica``, where the call counts as outstanding until its
        response is released (or no response arrives)."""

        def ended() -> None:
            replica.outstanding -= 1

        replica.outstanding += 1
        try:
            url = replica.url + endpoint.value
            return await self._engines.post(url, content, request_id, read_timeout_s, ended)
        except BaseException:
            ended()
            raise

    def _upstream_failed(self, replica: Replica, kind: str, detail: object, mark: bool) -> None:
        """Count a failed engine call; ``mark`` (refused connections only) takes the replica
        out of rotation until a health check passes. Other failures may hit one request or
        one connection, so health checks alone decide about them."""
        self._metrics.upstream_errors.labels(replica.role.value, replica.url, kind).inc()
        log.warning("%s replica %s failed (%s): %s", replica.role, replica.url, kind, detail)
        if mark:
            pool = self._prefill if replica.role is self._prefill.role else self._decode
            pool.mark_failed(replica)

    def _store_failed(self, operation: str, exc: Exception) -> None:
        self._metrics.store_errors.labels(operation).inc()
        log.warning(
            "conversation store %s failed (turn runs without reuse): %s: %s",
            operation,
            type(exc).__name__,
            exc,
        )

    async def _commit(self, turn: Turn, params: object) -> None:
        """Store decode's ``params`` as the conversation's entry for its next turn, expiring
        before decode frees the blocks (by its published expiry, less the margin), or, without
        params, where the turn ran (its replicas' prefix caches still serve the next turn); and
        settle the turn's leases: the new one held, the one the turn took released. A turn
        without a number (no conversation, or no store) commits nothing."""
        key, start, decode = turn.key, turn.start, turn.decode
        if key is None or start is None or turn.seq == 0:
            return
        assert decode is not None, "decode comes first"
        kv = routable(params, decode.host)
        prefill_url = turn.prefill.url if turn.prefill is not None else None
        offered: TurnEntry | None = None
        stored: bool | None = None
        try:
            if kv is None:
                await self._store.place(key, turn.seq, decode.url, prefill_url)
            else:
                now = time.time()
                expires_at = now + self._config.conversation_ttl_s
                published = kv.get(EXPIRES_AT_KEY)
                if isinstance(published, int | float) and not isinstance(published, bool):
                    expires_at = min(expires_at, published - EXPIRY_MARGIN_S)
                offered = TurnEntry(kv, decode.url, now, expires_at, turn.seq, prefill_url)
                stored = await self._store.commit(key, offered)
        except Exception as exc:
            self._store_failed("commit", exc)
        self._leases.turn_finished(key, turn.seq, start.entry, offered, stored)

    def _finished(self, turn: Turn, outcome: str) -> None:
        """Count a turn whose answer started."""
        self._metrics.requests.labels(turn.endpoint.value, outcome).inc()
        if outcome == "success":
            self._metrics.e2e_seconds.observe(time.perf_counter() - turn.started)


@asynccontextmanager
async def _cancelled_if_client_leaves(receive: Receive) -> AsyncIterator[None]:
    """Cancel the running block when the client disconnects; that cancellation ends the block
    quietly (any other propagates)."""
    task = asyncio.current_task()
    assert task is not None, "ASGI apps run in a task"
    left = False

    async def watch() -> None:
        nonlocal left
        while (await receive())["type"] != "http.disconnect":
            pass
        left = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        yield
    except asyncio.CancelledError:
        if not left:
            raise
        task.uncancel()
    finally:
        watcher.cancel()
