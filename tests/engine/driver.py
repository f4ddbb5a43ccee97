"""A minimal prefill-then-decode driver, doing per turn what the router does.

Prefill gets the request with ``max_tokens=1``, non-streamed, carrying the previous turn's
decode ``kv_transfer_params`` (the D->P offer) when there is one; decode gets the request with
prefill's params (asking decode to retain the KV when the driver reuses it) and streams, and its
final chunk carries the params for the next turn.
Greedy decoding, ``ignore_eos`` so every answer has the asked length.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from disagg.rig.engine import MODEL_NAME
from disagg_contract import RETAIN_KEY
from disagg_router.payloads import prefill_params


@dataclass
class TurnResult:
    """What one P-then-D turn produced."""

    request_id: str
    token_ids: list[int]
    text: str
    first_logprob: float
    prefill_logprob: float
    decode_params: dict[str, Any] | None
    chunks_with_params: int = 0
    prefill_token_id: int = -1


@dataclass
class Conversation:
    """Per-conversation state the driver keeps between turns (the router's cache entry)."""

    offer: dict[str, Any] | None = None
    turns: list[TurnResult] = field(default_factory=list)


class PDDriver:
    """Runs chat or token-id turns through one prefill and one decode server."""

    def __init__(self, prefill_url: str, decode_url: str, *, reuse: bool = True) -> None:
        self.prefill_url = prefill_url
        self.decode_url = decode_url
        self.reuse = reuse
        self.client = httpx.Client(timeout=300)

    def chat_turn(
        self, conversation: Conversation, messages: list[dict[str, str]], max_tokens: int
    ) -> TurnResult:
        """One chat-API turn: ``messages`` as a client sends them."""
        body = {"messages": messages, "logprobs": True, "top_logprobs": 1}
        return self._turn("/v1/chat/completions", body, conversation, max_tokens)

    def token_turn(
        self, conversation: Conversation, prompt: list[int], max_tokens: int
    ) -> TurnResult:
        """One completions-API turn with the prompt as token ids."""
        body = {"prompt": prompt, "logprobs": 1}
        return self._turn("/v1/completions", body, conversation, max_tokens)

    def _turn(
        self, path: str, body: dict[str, Any], conversation: Conversation, max_tokens: int
    ) -> TurnResult:
        request_id = f"rig-{uuid.uuid4().hex[:12]}"
        common = {
            **body,
            "model": MODEL_NAME,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        offer = conversation.offer if (self.reuse and conversation.offer) else prefill_params(None)
        prefill = self.client.post(
            self.prefill_url + path,
            json={**common, "max_tokens": 1, "stream": False, "kv_transfer_params": dict(offer)},
            headers={"X-Request-Id": request_id},
        )
        prefill.raise_for_status()
        prefill_body = prefill.json()
        prefill_choice = prefill_body["choices"][0]
        decode_params = dict(prefill_body["kv_transfer_params"])
        if self.reuse:
            decode_params[RETAIN_KEY] = True
        result = self._stream_decode(
            path,
            {**common, "max_tokens": max_tokens, "stream": True,
             "kv_transfer_params": decode_params},
            request_id,
        )  # fmt: skip
        result.prefill_logprob = first_logprob(prefill_choice)
        result.prefill_token_id = prefill_choice["token_ids"][0]
        conversation.offer = result.decode_params
        conversation.turns.append(result)
        return result

    def _stream_decode(self, path: str, body: dict[str, Any], request_id: str) -> TurnResult:
        token_ids: list[int] = []
        text: list[str] = []
        logprobs: list[float] = []
        params: dict[str, Any] | None = None
        chunks_with_params = 0
        with self.client.stream(
            "POST", self.decode_url + path, json=body, headers={"X-Request-Id": request_id}
        ) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                if "error" in chunk:
                    raise RuntimeError(f"decode stream error: {chunk['error']}")
                if "kv_transfer_params" in chunk:
                    chunks_with_params += 1
                    params = chunk["kv_transfer_params"]
                for choice in chunk.get("choices", []):
                    token_ids.extend(choice.get("token_ids") or [])
                    text.append(
                        choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                    )
                    if choice.get("logprobs") and not logprobs:
                        logprobs.append(first_logprob(choice))
        return TurnResult(
            request_id=request_id,
            token_ids=token_ids,
            text="".join(text),
            first_logprob=logprobs[0],
            prefill_logprob=0.0,
            decode_params=params,
            chunks_with_params=chunks_with_params,
        )


def first_logprob(choice: dict[str, Any]) -> float:
    """Logprob of the first token of a chat or completions choice."""
    logprobs = choice["logprobs"]
    if "content" in logprobs:
        return float(logprobs["content"][0]["logprob"])
    return float(logprobs["token_logprobs"][0])
