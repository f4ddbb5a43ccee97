"""Engine stand-in: a tiny server speaking the OpenAI subset a vLLM prefill or decode serves.

It is *not* vLLM: it answers instantly with deterministic words, and fakes the NIXL
``kv_transfer_params`` of vLLM's pull connector (prefill returns P->D params; decode returns
the params of the blocks it "retains", on the final stream chunk as vLLM >= 0.33 does, or in
the body). Given a lease port, a decode retains and offers only when the router asks
(``RETAIN_KEY``), names the retention as the connector's decode does (``LEASE_KEY``, an offer
id) and records it in ``retained`` (and ``offers``), which a test's lease-service stand-in
serves. A prefill that receives decode params with blocks reports those tokens as cached,
which is how the router's reuse metrics are checked (``prefix_cached_tokens`` plays prefill's
prefix cache), and answers with a read report as the connector's prefill does
(``READ_REPORT_KEY``; ``diverged_tokens`` plays a history that differs from decode's).
Tests steer it through ``StandinState`` (injected failures, delays) and read back what it
received.

Run alone (benchmarks): ``python tests/unit/engine_standin.py --role decode --port 8200``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from disagg_contract import (
    EXPIRES_AT_KEY,
    KV_TRANSFER_PARAMS,
    LEASE_KEY,
    OFFER_KEY,
    OFFER_WIRE_VERSION,
    READ_REPORT_KEY,
    RETAIN_KEY,
    SIDE_CHANNEL_PORT,
)

MODEL = "standin-model"
DEFAULT_MAX_TOKENS = 8
BLOCK_SIZE = 16


@dataclass
class StandinState:
    """Behaviour switches and a record of what the stand-in received."""

    role: str
    name: str
    side_channel_host: str = "localhost"
    side_channel_port: int = SIDE_CHANNEL_PORT
    record: bool = True
    stream_kv: bool = True
    publish_expiry_s: float | None = None
    delay_s: float = 0.0
    token_delay_s: float = 0.0
    break_stream_after: int | None = None
    fail_statuses: list[int] = field(default_factory=list)
    api_key: str | None = None
    prefix_cached_tokens: int = 0
    diverged_tokens: int = 0
    retains: bool = True
    """Decode answers with KV params; False: with none, as vLLM's decode does with bidirectional
    transfer off (it keeps no KV for the next turn)."""
    lease_port: int | None = None
    lease_term_s: float = 30.0
    retained: set[tuple[str, str]] = field(default_factory=set)
    offers: list[tuple[str, str]] = field(default_factory=list)
    received: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[tuple[str, str | None]] = field(default_factory=list)
    reads: list[dict[str, Any]] = field(default_factory=list)
    counter: itertools.count[int] = field(default_factory=itertools.count)


def count_prompt_tokens(body: dict[str, Any]) -> int:
    """Words of all message contents, or of the prompt (token-id prompts count their ids)."""
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"]) + 2
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        return len(prompt)
    return len(str(prompt).split())


def answer_words(body: dict[str, Any], count: int) -> list[str]:
    """Deterministic words derived from the prompt (same prompt, same answer)."""
    seed = hashlib.sha256(json.dumps(body.get("messages", body.get("prompt"))).encode()).digest()
    return [f"w{seed[i % len(seed)]}" for i in range(count)]


def _blocks(tokens: int, first: int) -> list[list[int]]:
    return [list(range(first, first + max(1, -(-tokens // BLOCK_SIZE))))]


def _kv_params(state: StandinState, request_id: str, tokens: int) -> dict[str, Any]:
    decode = state.role == "decode"
    published = {}
    if decode and state.publish_expiry_s is not None:
        published[EXPIRES_AT_KEY] = time.time() + state.publish_expiry_s
    return {
        **published,
        "do_remote_prefill": not decode,
        "do_remote_decode": decode,
        "remote_block_ids": _blocks(tokens, 100 if decode else 1),
        "remote_engine_id": f"{state.name}-engine",
        "remote_request_id": request_id,
        "remote_host": state.side_channel_host,
        "remote_port": state.side_channel_port,
        "tp_size": 1,
        "remote_num_tokens": tokens if decode else 0,
        "remote_blocks_expiry_time": time.monotonic() + 480 if decode else None,
    }


def _leased(
    state: StandinState, body: dict[str, Any], request_id: str, kv: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Decode's offer with a lease service: only when the router asked it to retain the KV."""
    params = body.get(KV_TRANSFER_PARAMS)
    if kv is None or not isinstance(params, dict) or params.get(RETAIN_KEY) is not True:
        return None
    offer = f"offer-{request_id}"
    state.retained.add((request_id, offer))
    state.offers.append((request_id, offer))
    lease = {"port": state.lease_port, "term_s": state.lease_term_s}
    return {**kv, LEASE_KEY: lease, OFFER_KEY: {"v": OFFER_WIRE_VERSION, "id": offer}}


def _refused(state: StandinState, request: Request) -> Response | None:
    """vLLM's answer when ``--api-key`` is set and the request lacks it (it guards /v1/*);
    the ``Authorization`` header of every /v1 request is recorded."""
    if state.api_key is None and not state.record:
        return None
    authorization = request.headers.get("authorization")
    if state.record:
        state.authorizations.append((request.url.path, authorization))
    if state.api_key is None or authorization == f"Bearer {state.api_key}":
        return None
    return JSONResponse({"error": "Unauthorized"}, status_code=401)


def build_app(state: StandinState) -> Starlette:
    """The stand-in's ASGI app for ``state``."""

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def models(request: Request) -> Response:
        if refused := _refused(state, request):
            return refused
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def generate(request: Request) -> Response:
        if refused := _refused(state, request):
            return refused
        body = await request.json()
        if state.record:
            state.received.append(body)
        if state.delay_s:
            await asyncio.sleep(state.delay_s)
        if state.fail_statuses:
            status = state.fail_statuses.pop(0)
            error = {"message": f"stand-in failure {status}", "type": "error", "code": status}
            return JSONResponse({"error": error}, status_code=status)
        if body.get("model", MODEL) != MODEL:
            error = {"message": "model not found", "type": "NotFoundError", "code": 404}
            return JSONResponse({"error": error}, status_code=404)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens is not None and not (isinstance(max_tokens, int) and 0 < max_tokens <= 4096):
            error = {"message": "max_tokens out of range", "type": "BadRequestError", "code": 400}
            return JSONResponse({"error": error}, status_code=400)
        chat = request.url.path.endswith("/chat/completions")
        request_id = f"{state.name}-{next(state.counter)}"
        prompt_tokens = count_prompt_tokens(body)
        if state.role == "prefill":
            return JSONResponse(_prefill(state, body, chat, request_id, prompt_tokens))
        words = answer_words(body, max_tokens or DEFAULT_MAX_TOKENS)
        kv: dict[str, Any] | None = None
        if state.retains:
            kv = _kv_params(state, request_id, prompt_tokens + len(words))
        if state.lease_port is not None:
            kv = _leased(state, body, request_id, kv)
        if body.get("stream"):
            chunks = _stream(state, body, chat, request_id, prompt_tokens, words, kv)
            return StreamingResponse(chunks, media_type="text/event-stream")
        return JSONResponse(_complete(body, chat, request_id, prompt_tokens, words, kv))

    routes = [
        Route("/health", health),
        Route("/v1/models", models),
        Route("/v1/chat/completions", generate, methods=["POST"]),
        Route("/v1/completions", generate, methods=["POST"]),
    ]
    return Starlette(routes=routes)


def _usage(prompt_tokens: int, completion_tokens: int, cached: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _choice(chat: bool, text: str, finish: str | None) -> dict[str, Any]:
    if chat:
        return {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish,
        }
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}


def _prefill(
    state: StandinState, body: dict[str, Any], chat: bool, request_id: str, prompt_tokens: int
) -> dict[str, Any]:
    params = body.get(KV_TRANSFER_PARAMS) or {}
    cached = min(state.prefix_cached_tokens, prompt_tokens)
    published = _kv_params(state, request_id, prompt_tokens)
    if params.get("do_remote_decode") and params.get("remote_block_ids"):
        offered = int(params.get("remote_num_tokens") or 0)
        diverged = min(state.diverged_tokens, offered)
        read = min(offered - diverged, prompt_tokens)
        cached = max(cached, read)
        state.reads.append(params)
        published[READ_REPORT_KEY] = {
            "offered": offered,
            "verified": offered - diverged,
            "diverged": diverged,
            "read": read,
        }
    return {
        "id": request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [_choice(chat, answer_words(body, 1)[0], "length")],
        "usage": _usage(prompt_tokens, 1, cached),
        KV_TRANSFER_PARAMS: published,
    }


def _complete(
    body: dict[str, Any],
    chat: bool,
    request_id: str,
    prompt_tokens: int,
    words: list[str],
    kv: dict[str, Any] | None,
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [_choice(chat, " ".join(words), "length")],
        "usage": _usage(prompt_tokens, len(words)),
        KV_TRANSFER_PARAMS: kv,
    }


async def _stream(
    state: StandinState,
    body: dict[str, Any],
    chat: bool,
    request_id: str,
    prompt_tokens: int,
    words: list[str],
    kv: dict[str, Any] | None,
) -> AsyncIterator[bytes]:
    kind = "chat.completion.chunk" if chat else "text_completion"
    base = {"id": request_id, "object": kind, "created": int(time.time()), "model": MODEL}

    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + json.dumps({**base, "choices": choices, **extra}).encode() + b"\n\n"

    def piece(text: str, finish: str | None, role: bool = False) -> dict[str, Any]:
        if not chat:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        delta = {"role": "assistant", "content": text} if role else {"content": text}
        return {"index": 0, "delta": delta, "finish_reason": finish}

    if chat:
        yield event([piece("", None, role=True)])
    for index, word in enumerate(words):
        if index == state.break_stream_after:
            raise ConnectionAbortedError("stand-in breaks the stream off")
        if state.token_delay_s:
            await asyncio.sleep(state.token_delay_s)
        last = index == len(words) - 1
        text = word if index == 0 else " " + word
        extra = {KV_TRANSFER_PARAMS: kv} if last and state.stream_kv else {}
        yield event([piece(text, "length" if last else None)], **extra)
    options = body.get("stream_options") or {}
    if options.get("include_usage"):
        yield event([], usage=_usage(prompt_tokens, len(words)))
    yield b"data: [DONE]\n\n"


def main() -> None:
    """Serve one stand-in engine (used by benchmarks/router_overhead.py)."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--role", choices=["prefill", "decode"], required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    state = StandinState(role=args.role, name=f"{args.role}-{args.port}", record=False)
    uvicorn.run(build_app(state), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
