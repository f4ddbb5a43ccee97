"""Chat turns through a router as a client sends them, how two runs' answers compare, and a
router served in the test's own process."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx
import uvicorn

from conversations import ANSWER_TOKENS, LOGPROB_TOLERANCE
from disagg.rig.engine import MODEL_NAME
from disagg.rig.router import RouterProcess, free_port
from disagg_contract import Role
from disagg_router.app import create_app
from disagg_router.config import RouterConfig

SYSTEM = {"role": "system", "content": "Answer tersely."}


@dataclass
class Answer:
    """One turn's answer as the client sees it."""

    request_id: str
    token_ids: list[int]
    text: str
    first_logprob: float


def ask(
    router: RouterProcess,
    conversation: str | None,
    messages: list[dict[str, str]],
    stream: bool,
    max_tokens: int = ANSWER_TOKENS,
) -> Answer:
    """Send one greedy chat turn of ``max_tokens`` through ``router`` (a one-shot request
    without a conversation)."""
    request_id = f"router-{uuid.uuid4().hex[:12]}"
    body: dict[str, Any] = {
        "model": MODEL_NAME,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": 1,
        "stream": stream,
    }
    if conversation is not None:
        body["conversation_id"] = conversation
    headers = {"X-Request-Id": request_id}
    with httpx.Client(timeout=300) as client:
        response = client.post(router.url + "/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert "kv_transfer_params" not in response.text, "internal params leaked to the client"
    if not stream:
        choice = response.json()["choices"][0]
        logprob = choice["logprobs"]["content"][0]["logprob"]
        return Answer(request_id, choice["token_ids"], choice["message"]["content"], logprob)
    token_ids: list[int] = []
    text: list[str] = []
    logprobs: list[float] = []
    for block in response.text.split("\n\n"):
        if not block.startswith("data: ") or block == "data: [DONE]":
            continue
        chunk = json.loads(block[len("data: ") :])
        assert "error" not in chunk, chunk
        for choice in chunk.get("choices", []):
            token_ids.extend(choice.get("token_ids") or [])
            text.append((choice.get("delta") or {}).get("content") or "")
            content = (choice.get("logprobs") or {}).get("content") or []
            if content and not logprobs:
                logprobs.append(content[0]["logprob"])
    return Answer(request_id, token_ids, "".join(text), logprobs[0])


def converse(
    router: RouterProcess, conversation: str, users: list[str], stream: bool
) -> list[Answer]:
    """Chat turns as a client sends them, each carrying the previous answers."""
    messages: list[dict[str, str]] = [SYSTEM]
    replies: list[Answer] = []
    for user in users:
        if replies:
            messages.append({"role": "assistant", "content": replies[-1].text})
        messages.append({"role": "user", "content": user})
        replies.append(ask(router, conversation, messages, stream))
    return replies


def assert_same(on: list[Answer], off: list[Answer]) -> None:
    assert len(on) == len(off)
    for index, (a, b) in enumerate(zip(on, off, strict=True)):
        assert a.token_ids == b.token_ids, f"turn {index + 1}: answers differ"
        assert abs(a.first_logprob - b.first_logprob) <= LOGPROB_TOLERANCE, f"turn {index + 1}"


@dataclass
class RouterThread:
    """``disagg router``'s app on its own event loop on a thread of the test's process: the
    test changes the pools' membership on that loop, as the router's EndpointSlice discovery
    does (e.g. a decode whose endpoint turns terminating)."""

    app: Any
    server: uvicorn.Server
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    url: str

    @classmethod
    def start(cls, prefill: list[str], decode: list[str], **overrides: Any) -> RouterThread:
        """Serve a router over ``prefill`` and ``decode`` (static discovery) until ``stop``;
        ``overrides`` patch its config."""
        base = RouterConfig(
            prefill_urls=tuple(prefill),
            decode_urls=tuple(decode),
            health_interval_s=0.5,
            health_max_backoff_s=2.0,
        )
        app = create_app(replace(base, **overrides).validate())
        port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        server = uvicorn.Server(config)
        loop = asyncio.new_event_loop()
        thread = threading.Thread(
            target=loop.run_until_complete, args=(server.serve(),), daemon=True
        )
        router = cls(app, server, loop, thread, f"http://127.0.0.1:{port}")
        thread.start()
        deadline = time.monotonic() + 60
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                router.stop()
                raise RuntimeError("the router thread did not start")
            time.sleep(0.05)
        return router

    def set_members(self, role: Role, urls: Sequence[str], draining: Sequence[str] = ()) -> None:
        """Make ``urls`` the members of ``role``'s pool, ``draining`` ones leaving, on the
        router's loop (what discovery hands the pool when EndpointSlices change)."""
        pool = self.app.state.prefill if role is Role.PREFILL else self.app.state.decode

        async def apply() -> None:
            pool.set_urls(urls, draining)

        asyncio.run_coroutine_threadsafe(apply(), self.loop).result(timeout=10)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
        if not self.thread.is_alive():
            self.loop.close()
