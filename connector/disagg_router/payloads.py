"""What the router writes into and reads out of the engine calls' JSON bodies.

Prefill gets the client's body as a one-token request with ``do_remote_decode: true`` plus, on
a conversation hit, decode's params from the previous turn (prefill reads decode's blocks:
D->P); decode gets the client's body with what prefill returned (decode reads prefill's
blocks: P->D). Shapes follow vLLM's NIXL pull connector; extra keys an engine adds pass
through untouched, but for prefill's read report (``READ_REPORT_KEY``), which is the router's
and goes no further. Decode's own params are taken out of its answer before the client sees it.

Both calls carry the tenant's ``cache_salt`` (``salts``) in place of any the client sent.

Two fast paths keep this cheap per turn: the client's body is encoded once and each call
appends only its own few members, and in a streamed answer only the event that carries
params with a value is decoded (a null field is cut out as bytes).
"""

from __future__ import annotations

import json
from typing import Any

from disagg_contract import (
    CACHE_SALT_KEY,
    KV_TRANSFER_PARAMS,
    READ_REPORT_KEY,
    RETAIN_KEY,
    ReadReport,
)
from disagg_router.conversation import TurnEntry

KV_MARKER = f'"{KV_TRANSFER_PARAMS}"'.encode()
_NULL_FIELD = KV_MARKER + b":null"
# vLLM >= 0.33 puts ``"kv_transfer_params":null`` on every streamed chunk (compact JSON). A raw
# quote cannot occur inside a JSON string, so these bytes are always the field itself.
_NULL_FIELD_FORMS = (b"," + _NULL_FIELD, _NULL_FIELD + b",")
_UNROUTABLE_HOSTS = frozenset({"", "0.0.0.0", "::", "localhost", "127.0.0.1", "::1"})
_PREFILL_DROPPED = ("max_completion_tokens", "min_tokens", "stream_options")
"""Client fields that prefill, which generates exactly one token, must not see."""
_PER_CALL = frozenset({"stream", "max_tokens", KV_TRANSFER_PARAMS, *_PREFILL_DROPPED})


def dumps(data: object) -> bytes:
    """Compact JSON bytes."""
    return json.dumps(data, separators=(",", ":")).encode()


def json_object(content: bytes) -> dict[str, Any] | None:
    """``content`` decoded when it is a JSON object, else None."""
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


class EngineBodies:
    """Prefill's and decode's bodies for one client body, which is encoded once with
    ``cache_salt`` (whatever salt the body had)."""

    def __init__(self, body: dict[str, Any], cache_salt: str) -> None:
        self._own = {k: v for k, v in body.items() if k in _PER_CALL and k != KV_TRANSFER_PARAMS}
        shared = {k: v for k, v in body.items() if k not in _PER_CALL}
        shared[CACHE_SALT_KEY] = cache_salt
        self._shared = dumps(shared)

    def prefill(self, params: dict[str, Any]) -> bytes:
        """The client's body as a non-streamed one-token request carrying ``params``."""
        return self._extended({"stream": False, "max_tokens": 1, KV_TRANSFER_PARAMS: params})

    def decode(self, params: dict[str, Any] | None) -> bytes:
        """The client's body, with prefill's ``params`` when there are any."""
        return self._extended(
            self._own if params is None else {**self._own, KV_TRANSFER_PARAMS: params}
        )

    def _extended(self, members: dict[str, Any]) -> bytes:
        if not members:
            return self._shared
        return self._shared[:-1] + b"," + dumps(members)[1:]


def prefill_params(entry: TurnEntry | None) -> dict[str, Any]:
    """Prefill's params: a plain remote-decode request, or one that reads decode's blocks."""
    if entry is None:
        return {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        }
    return {**entry.kv_transfer_params, "do_remote_decode": True, "do_remote_prefill": False}


def decode_params(params: dict[str, Any] | None, retain: bool) -> dict[str, Any] | None:
    """Prefill's ``params`` for decode, without prefill's read report, asking decode to retain
    the turn's KV when ``retain`` (a conversation turn the router will commit; any other turn's
    KV is freed at once)."""
    if params is None:
        return None
    sent = {key: value for key, value in params.items() if key != READ_REPORT_KEY}
    if retain:
        sent[RETAIN_KEY] = True
    return sent


def read_report(params: object) -> ReadReport | None:
    """Prefill's report of the D->P offer in its answer's ``params``, or None when it has none
    (or one that is not counts of tokens)."""
    report = params.get(READ_REPORT_KEY) if isinstance(params, dict) else None
    if not isinstance(report, dict):
        return None
    counts = {key: report.get(key) for key in ReadReport.__annotations__}
    if not all(type(value) is int and value >= 0 for value in counts.values()):
        return None
    return ReadReport(
        offered=report["offered"],
        verified=report["verified"],
        diverged=report["diverged"],
        read=report["read"],
    )


def routable(params: object, replica_host: str) -> dict[str, Any] | None:
    """``params`` as a dict whose ``remote_host`` can be reached from other pods.

    An engine reports its NIXL side-channel host; when that is a wildcard or loopback address
    (the vLLM default), the replica's own address is used instead, as upstream's proxy does.
    """
    if not isinstance(params, dict):
        return None
    host = params.get("remote_host")
    if (host is None or host in _UNROUTABLE_HOSTS) and replica_host:
        return {**params, "remote_host": replica_host}
    return params


def prompt_usage(response: dict[str, Any]) -> tuple[int, int]:
    """Prompt tokens of an engine's answer and how many of them came from cache (prefix
    cache or KV read from decode); (0, 0) when its ``usage`` does not say."""
    usage = response.get("usage")
    if not isinstance(usage, dict) or not isinstance(usage.get("prompt_tokens"), int):
        return 0, 0
    prompt_tokens: int = usage["prompt_tokens"]
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    reused = min(cached, prompt_tokens) if isinstance(cached, int) and cached > 0 else 0
    return prompt_tokens, reused


def strip_from_events(events: bytes) -> tuple[bytes, dict[str, Any] | None]:
    """Remove ``kv_transfer_params`` from SSE ``data:`` events; return them and the params.

    Only events that mention the field with a value are decoded; a null field (every chunk
    but the last from vLLM >= 0.33) is cut out as bytes, so the common chunk costs a search.
    """
    if KV_MARKER not in events:
        return events, None
    if events.count(KV_MARKER) == events.count(_NULL_FIELD):
        for form in _NULL_FIELD_FORMS:
            events = events.replace(form, b"")
        if KV_MARKER not in events:
            return events, None
    found: dict[str, Any] | None = None
    out: list[bytes] = []
    for event in events.split(b"\n\n"):
        if KV_MARKER in event and event.startswith(b"data: "):
            try:
                chunk = json.loads(event[6:])
            except ValueError:
                out.append(event)
                continue
            if isinstance(chunk, dict) and KV_TRANSFER_PARAMS in chunk:
                value = chunk.pop(KV_TRANSFER_PARAMS)
                found = value if isinstance(value, dict) else found
                event = b"data: " + dumps(chunk)
        out.append(event)
    return b"\n\n".join(out), found
