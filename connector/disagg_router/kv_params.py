"""The ``kv_transfer_params`` the router passes between prefill and decode.

Shapes follow vLLM's NIXL pull connector: prefill gets ``do_remote_decode: true`` plus, on a
conversation hit, decode's metadata from the previous turn (the D->P read); decode gets what
prefill returned (the P->D read). Extra keys an engine adds are passed through untouched.
"""

from __future__ import annotations

import json
from typing import Any

from disagg_contract import KV_TRANSFER_PARAMS
from disagg_router.codec import dumps
from disagg_router.conversation import TurnEntry

KV_MARKER = f'"{KV_TRANSFER_PARAMS}"'.encode()
_NULL_FIELD = KV_MARKER + b":null"
# vLLM >= 0.33 puts ``"kv_transfer_params":null`` on every streamed chunk (compact JSON). A raw
# quote cannot occur inside a JSON string, so these bytes are always the field itself.
_NULL_FIELD_FORMS = (b"," + _NULL_FIELD, _NULL_FIELD + b",")
_UNROUTABLE_HOSTS = frozenset({"", "0.0.0.0", "::", "localhost", "127.0.0.1", "::1"})


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
