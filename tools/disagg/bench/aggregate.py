"""From per-request records to per-length points, ON/OFF pairs and the headline numbers."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from statistics import median

from disagg.bench.records import Leg, TurnRecord


@dataclass(frozen=True)
class Point:
    """Median of one leg's requests at one prompt length (one turn index or length bin)."""

    key: int
    prompt_tokens: float
    ttft_ms: float
    samples: int
    prefill_ms: float | None = None
    kv_transfer_ms: float | None = None
    reused_tokens: float | None = None

    @property
    def compute_ms(self) -> float | None:
        """Prefill time not spent reading KV (compute and overheads)."""
        if self.prefill_ms is None:
            return None
        return max(self.prefill_ms - (self.kv_transfer_ms or 0.0), 0.0)


@dataclass(frozen=True)
class Pair:
    """The OFF and ON points at one prompt length."""

    off: Point
    on: Point

    @property
    def gain(self) -> float:
        """TTFT off / TTFT on."""
        return self.off.ttft_ms / self.on.ttft_ms


@dataclass(frozen=True)
class Headline:
    """The numbers the README quotes."""

    longest_tokens: float
    shortest_tokens: float
    gain_at_longest: float
    on_flatness: float
    off_growth: float


def _median_or_none(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return median(present) if present else None


def turn_key(record: TurnRecord) -> int:
    """Group by turn index: every conversation of a sweep has the same lengths per turn."""
    return record.turn


def bin_key(width: int) -> Callable[[TurnRecord], int]:
    """Group by prompt length rounded to ``width`` tokens (for runs of unequal conversations)."""
    if width <= 0:
        raise ValueError(f"bin width must be a positive number of tokens, got {width}")
    return lambda record: round(record.prompt_tokens / width) * width


def points(
    records: Iterable[TurnRecord], key: Callable[[TurnRecord], int] = turn_key
) -> list[Point]:
    """Median per group, ordered by prompt length."""
    groups: dict[int, list[TurnRecord]] = {}
    for record in records:
        groups.setdefault(key(record), []).append(record)
    result = [
        Point(
            key=group,
            prompt_tokens=median(r.prompt_tokens for r in members),
            ttft_ms=median(r.ttft_ms for r in members),
            samples=len(members),
            prefill_ms=_median_or_none(r.prefill_ms for r in members),
            kv_transfer_ms=_median_or_none(r.kv_transfer_ms for r in members),
            reused_tokens=_median_or_none(r.reused_tokens for r in members),
        )
        for group, members in groups.items()
    ]
    return sorted(result, key=lambda point: point.prompt_tokens)


def pairs(records: Iterable[TurnRecord], key: Callable[[TurnRecord], int] = turn_key) -> list[Pair]:
    """ON and OFF points that share a group, ordered by prompt length."""
    records = list(records)
    off = {p.key: p for p in points((r for r in records if r.leg is Leg.OFF), key)}
    on = {p.key: p for p in points((r for r in records if r.leg is Leg.ON), key)}
    shared = [Pair(off[k], on[k]) for k in off.keys() & on.keys()]
    return sorted(shared, key=lambda pair: pair.on.prompt_tokens)


def headline(paired: list[Pair]) -> Headline:
    """Gain at the longest length, ON flatness and OFF growth (longest / shortest TTFT)."""
    if not paired:
        raise ValueError("no prompt length was measured in both legs (need ON and OFF records)")
    first, last = paired[0], paired[-1]
    return Headline(
        longest_tokens=last.on.prompt_tokens,
        shortest_tokens=first.on.prompt_tokens,
        gain_at_longest=last.gain,
        on_flatness=last.on.ttft_ms / first.on.ttft_ms,
        off_growth=last.off.ttft_ms / first.off.ttft_ms,
    )
