"""What a benchmark run records: one ``TurnRecord`` per request, grouped in a ``BenchResult``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

SCHEMA = "disagg-bench/v1"


class Leg(StrEnum):
    """The legs of a run: KV reuse on (bidirectional), off (recompute), and the reuse floor.

    FLOOR is the reuse path's floor: a prefill that finds the previous turn's prompt in its own
    prefix cache computes only what ON computes, with no D->P read and no coordination.
    """

    ON = "on"
    OFF = "off"
    FLOOR = "floor"


@dataclass(frozen=True)
class TurnRecord:
    """One request of one conversation, as measured by the client and the servers' metrics.

    ``prefill_ms`` is the router's prefill call duration, ``kv_transfer_ms`` the time prefill's
    NIXL reads of decode's KV took (D->P), ``kv_bytes`` their bytes, ``reused_tokens`` the
    prompt tokens they covered and ``cached_tokens`` those prefill found in its own prefix
    cache. ``queue_ms`` is the prefill engine's time from the request's arrival to its first
    computing step (an asynchronous D->P read included), ``engine_prefill_ms`` from there to its
    first token. ``None`` where the source was not available.
    """

    leg: Leg
    conversation: str
    turn: int
    prompt_tokens: int
    ttft_ms: float
    e2e_ms: float | None = None
    output_tokens: int | None = None
    prefill_ms: float | None = None
    kv_transfer_ms: float | None = None
    kv_bytes: float | None = None
    reused_tokens: float | None = None
    cached_tokens: float | None = None
    queue_ms: float | None = None
    engine_prefill_ms: float | None = None
    lookup: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["leg"] = self.leg.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TurnRecord:
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values["leg"] = Leg(values["leg"])
        return cls(**values)


@dataclass
class BenchResult:
    """A whole run: the model, how each leg was run, and every request's record."""

    model: str
    records: list[TurnRecord] = field(default_factory=list)
    setup: dict[str, Any] = field(default_factory=dict)

    def leg(self, leg: Leg) -> list[TurnRecord]:
        """The records of one leg, in the order they were taken."""
        return [record for record in self.records if record.leg is leg]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "model": self.model,
            "setup": self.setup,
            "records": [record.to_json() for record in self.records],
        }

    def save(self, path: Path) -> None:
        """Write the result as indented JSON (parents created)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> BenchResult:
        """Read a result written by :meth:`save`."""
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object with field 'schema' {SCHEMA!r}")
        if data.get("schema") != SCHEMA:
            raise ValueError(
                f"{path}: field 'schema' must be {SCHEMA!r}, got {data.get('schema')!r}"
            )
        records = [TurnRecord.from_json(item) for item in data["records"]]
        return cls(data["model"], records, dict(data.get("setup", {})))
