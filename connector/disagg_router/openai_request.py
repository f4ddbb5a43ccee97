"""Reading and checking client requests (the OpenAI subset the router needs to understand).

Only the fields the router acts on are checked; everything else reaches the engines untouched,
and their own 4xx answers are relayed to the client.
"""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from disagg_contract import CACHE_SALT_KEY, KV_TRANSFER_PARAMS
from disagg_router.conversation import MAX_CONVERSATION_ID_CHARS, SESSION_HEADER
from disagg_router.errors import RouterError, bad_request


class Endpoint(enum.StrEnum):
    """The generation endpoints the router serves."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"


ENGINE_ONLY_PARAMS = (KV_TRANSFER_PARAMS, "ec_transfer_params")
"""Params only the router and the engines exchange (KV and encoder-cache transfer): taken out
of a client's body and of ``vllm_xargs``, which vLLM copies into the same request arguments."""
XARGS = "vllm_xargs"
_CLOSE = {"Connection": "close"}


@dataclass(frozen=True)
class ClientRequest:
    """A checked request; ``body`` is what the engines receive (router fields removed: the
    conversation id, and the client's ``cache_salt``, which the router scopes under the
    client's tenant)."""

    endpoint: Endpoint
    body: dict[str, Any]
    conversation_id: str | None
    stream: bool
    cache_salt: str | None = None


async def read_body(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    """Read the body, refusing more than ``max_bytes`` with a 413 and a body still arriving
    after ``timeout_s`` with a 408 (a slow sender would hold its request slot and buffers);
    both close the connection, as the rest of that body is never read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise _too_large(max_bytes)
                chunks.append(chunk)
    except TimeoutError:
        raise RouterError(
            408,
            f"The request body did not arrive within {timeout_s:g} s (--body-timeout).",
            code="request_timeout",
            headers=_CLOSE,
        ) from None
    return b"".join(chunks)


def _too_large(max_bytes: int) -> RouterError:
    return RouterError(
        413,
        f"Request body exceeds the router's limit of {max_bytes} bytes "
        "(raise --max-body-bytes if such prompts are expected).",
        code="request_too_large",
        headers=_CLOSE,
    )


def parse_request(
    endpoint: Endpoint,
    raw: bytes,
    session_header: str | None,
    known_models: Collection[str],
) -> ClientRequest:
    """Decode and check ``raw``; raise ``RouterError`` (4xx) naming the offending field."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"Request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("Request body must be a JSON object.")
    for carrier in (body, body.get(XARGS)):
        if isinstance(carrier, dict):
            for name in ENGINE_ONLY_PARAMS:
                carrier.pop(name, None)
    conversation_id = _conversation_id(body.pop("conversation_id", None), session_header)
    cache_salt = body.pop(CACHE_SALT_KEY, None)
    if cache_salt is not None and not (isinstance(cache_salt, str) and cache_salt):
        raise bad_request(f"`{CACHE_SALT_KEY}` must be a non-empty string.", CACHE_SALT_KEY)
    _check_model(body.get("model"), known_models)
    if endpoint is Endpoint.CHAT:
        _check_messages(body.get("messages"))
    else:
        _check_prompt(body.get("prompt"))
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("`stream` must be true or false.", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("`stream_options` must be an object.", "stream_options")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (not _is_int(value) or value < 1):
            raise bad_request(f"`{name}` must be a positive integer.", name)
    n = body.get("n")
    if n is not None and n != 1:
        raise bad_request("`n` must be 1: disaggregated serving generates one choice.", "n")
    return ClientRequest(endpoint, body, conversation_id, bool(stream), cache_salt)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _conversation_id(value: object, header: str | None) -> str | None:
    if value is None:
        if header is None:
            return None
        return checked_conversation_id(header, SESSION_HEADER)
    return checked_conversation_id(value, "conversation_id")


def checked_conversation_id(value: object, field: str) -> str:
    """``value`` when it can be a conversation id, else a 400 naming ``field``."""
    if (
        not isinstance(value, str)
        or not value
        or len(value) > MAX_CONVERSATION_ID_CHARS
        or not value.isprintable()
    ):
        raise bad_request(
            f"`{field}` must be a non-empty string of at most {MAX_CONVERSATION_ID_CHARS} "
            "printable characters (letters, digits, punctuation, symbols, the space; no control "
            "characters, other whitespace or lone surrogates).",
            field,
        )
    return value


def _check_model(model: object, known_models: Collection[str]) -> None:
    if model is None:
        return
    if not isinstance(model, str) or not model:
        raise bad_request("`model` must be a non-empty string.", "model")
    if known_models and model not in known_models:
        raise RouterError(
            404,
            f"The model `{model}` does not exist. "
            f"Served models: {', '.join(sorted(known_models))}.",
            param="model",
            code="model_not_found",
        )


def _check_messages(messages: object) -> None:
    if not isinstance(messages, list) or not messages:
        raise bad_request("`messages` is required: a non-empty list of messages.", "messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(
                f"`messages[{index}]` must be an object with a string `role`.", "messages"
            )


def _check_prompt(prompt: object) -> None:
    if isinstance(prompt, str) and prompt:
        return
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt) or all(_is_int(p) for p in prompt):
            return
        if all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt):
            return
    raise bad_request(
        "`prompt` is required: a non-empty string, list of strings, list of token ids or "
        "list of token-id lists.",
        "prompt",
    )
