"""Relaying decode's answer to the client while taking decode's ``kv_transfer_params`` out.

A streamed answer is its own ASGI response: SSE bytes go to the client as they arrive, cut at
event boundaries; only events that contain ``KV_MARKER`` are decoded (the final one). A client
that leaves mid-stream cancels the relay, which closes the decode connection (vLLM then aborts
the request).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from disagg_contract import KV_TRANSFER_PARAMS
from disagg_router.errors import REQUEST_ID_HEADER, error_body, upstream_error
from disagg_router.payloads import KV_MARKER, dumps, json_object, strip_from_events
from disagg_router.replicas import Replica
from disagg_router.turn import Turn
from disagg_router.upstream import EngineResponse, UpstreamFailure

_SSE_CONTENT_TYPE = b"text/event-stream; charset=utf-8"
_END = {"type": "http.response.body", "body": b"", "more_body": False}


class TurnRecorder(Protocol):
    """Where the relay reports a turn's progress (the proxy service)."""

    async def commit(self, turn: Turn, replica: Replica, params: object) -> None:
        """Keep decode's params for the conversation's next turn."""

    def first_byte(self, turn: Turn) -> None:
        """Decode's first byte arrived."""

    def finished(self, turn: Turn, outcome: str) -> None:
        """The turn ended with ``outcome``."""

    def upstream_failed(self, replica: Replica, kind: str, detail: object) -> None:
        """Decode failed after its response started."""


class DecodeRelay:
    """Relays one decode response and releases it (and its outstanding count) exactly once."""

    def __init__(
        self, recorder: TurnRecorder, turn: Turn, replica: Replica, response: EngineResponse
    ) -> None:
        self._recorder = recorder
        self._turn = turn
        self._replica = replica
        self._response = response
        self._released = False
        self._streaming = False
        self._client_left = False

    def release(self) -> None:
        """Release the decode response and stop counting it as outstanding."""
        if not self._released:
            self._released = True
            self._replica.outstanding -= 1
            self._response.release()

    async def complete(self) -> Response:
        """Read the whole (non-streamed) answer, keep its params, return it without them."""
        try:
            content = await self._response.read()
        except UpstreamFailure as exc:
            self._recorder.upstream_failed(self._replica, exc.kind, exc)
            raise upstream_error(502, "Decode transport error.", "decode") from None
        finally:
            self.release()
        data = json_object(content)
        if data is None:
            self._recorder.upstream_failed(self._replica, "bad_response", content[:200])
            raise upstream_error(502, "Decode returned a malformed response.", "decode_failed")
        await self._recorder.commit(self._turn, self._replica, data.pop(KV_TRANSFER_PARAMS, None))
        self._recorder.finished(self._turn, "success")
        return Response(
            dumps(data),
            media_type="application/json",
            headers={REQUEST_ID_HEADER: self._turn.request_id},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stream the answer as an SSE response to the client."""
        task = asyncio.current_task()
        assert task is not None, "ASGI apps run in a task"
        watcher = asyncio.ensure_future(self._cancel_when_client_leaves(receive, task))
        outcome = "cancelled"
        self._streaming = True
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", _SSE_CONTENT_TYPE),
                        (REQUEST_ID_HEADER.lower().encode(), self._turn.request_id.encode()),
                    ],
                }
            )
            outcome = await self._relay(send)
        except asyncio.CancelledError:
            if not self._client_left:
                raise
            task.uncancel()
        finally:
            self._streaming = False
            watcher.cancel()
            self.release()
            self._recorder.finished(self._turn, outcome)

    async def _cancel_when_client_leaves(self, receive: Receive, task: asyncio.Task[None]) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if self._streaming:
            self._client_left = True
            task.cancel()

    async def _relay(self, send: Send) -> str:
        """Forward whole SSE events; return the turn's outcome."""
        pending = b""
        first = True
        outcome = "success"
        try:
            async for chunk in self._response.chunks():
                if first:
                    self._recorder.first_byte(self._turn)
                    first = False
                pending += chunk
                cut = pending.rfind(b"\n\n") + 2
                if cut < 2:
                    continue
                ready, pending = pending[:cut], pending[cut:]
                if KV_MARKER in ready:
                    ready = await self._strip(ready)
                await send({"type": "http.response.body", "body": ready, "more_body": True})
            if pending:
                body = await self._strip(pending)
                await send({"type": "http.response.body", "body": body, "more_body": True})
        except UpstreamFailure as exc:
            outcome = "upstream_error"
            self._recorder.upstream_failed(self._replica, "stream", exc)
            error = error_body("Decode stream broke off.", "upstream_error", code="decode")
            event = b"data: " + dumps(error) + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send(_END)
        self._streaming = False
        return outcome

    async def _strip(self, events: bytes) -> bytes:
        events, params = strip_from_events(events)
        if params is not None:
            await self._recorder.commit(self._turn, self._replica, params)
        return events
