"""The JSON bodies of a turn's two engine calls, built from one encoding of the client's body.

The client's body is mostly its messages or prompt, and both calls send them unchanged: that
part is encoded once per turn and each call appends only its own few members (encoding the
whole body per call was a tenth of the router's CPU per turn with long conversations).
"""

from __future__ import annotations

from typing import Any

from disagg_contract import KV_TRANSFER_PARAMS
from disagg_router.codec import dumps

_PREFILL_DROPPED = ("max_completion_tokens", "min_tokens", "stream_options")
"""Client fields that prefill, which generates exactly one token, must not see."""
_PER_CALL = frozenset({"stream", "max_tokens", KV_TRANSFER_PARAMS, *_PREFILL_DROPPED})


class EngineBodies:
    """Prefill's and decode's bodies for one client body."""

    def __init__(self, body: dict[str, Any]) -> None:
        self._own = {k: v for k, v in body.items() if k in _PER_CALL and k != KV_TRANSFER_PARAMS}
        self._shared = dumps({k: v for k, v in body.items() if k not in _PER_CALL})

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
        tail = dumps(members)
        if self._shared == b"{}":
            return tail
        return self._shared[:-1] + b"," + tail[1:]
