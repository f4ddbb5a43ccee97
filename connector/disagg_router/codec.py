"""JSON to and from the bytes the router sends and receives."""

from __future__ import annotations

import json
from typing import Any


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
