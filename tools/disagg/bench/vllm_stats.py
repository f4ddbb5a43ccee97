"""Read vLLM's multi-turn benchmark ``--stats-json-output`` files as records of one leg.

That file is a JSON array with one object per request; the fields used here are ``ttft_ms``,
``input_num_tokens``, ``conversation_id`` and (when present) ``input_num_turns``,
``latency_ms`` and ``output_num_tokens``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from disagg.bench.records import Leg, TurnRecord

_REQUIRED = ("ttft_ms", "input_num_tokens", "conversation_id")


def _number(item: dict[str, Any], name: str, where: str) -> float:
    value = item.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}: field '{name}' must be a number, got {value!r}")
    return float(value)


def read_vllm_stats(path: Path, leg: Leg) -> list[TurnRecord]:
    """Records of ``leg`` from one stats file; requests that failed (ttft_ms < 0) are dropped."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc}); pass the --stats-json-output file") from None
    if not isinstance(data, list):
        raise ValueError(
            f"{path}: expected a JSON array of per-request stats (--stats-json-output)"
        )
    records = []
    for index, item in enumerate(data):
        where = f"{path}[{index}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected an object with fields {', '.join(_REQUIRED)}")
        missing = [name for name in _REQUIRED if name not in item]
        if missing:
            raise ValueError(f"{where}: missing field '{missing[0]}' (vLLM writes it per request)")
        ttft = _number(item, "ttft_ms", where)
        if ttft < 0:
            continue
        latency = item.get("latency_ms")
        output = item.get("output_num_tokens")
        records.append(
            TurnRecord(
                leg=leg,
                conversation=str(item["conversation_id"]),
                turn=int(item.get("input_num_turns") or 0),
                prompt_tokens=int(_number(item, "input_num_tokens", where)),
                ttft_ms=ttft,
                e2e_ms=float(latency) if isinstance(latency, int | float) else None,
                output_tokens=int(output) if isinstance(output, int) else None,
            )
        )
    return records
