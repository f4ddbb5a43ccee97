"""From per-request records to per-length points, rows of the legs and the headline numbers."""

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
    kv_bytes: float | None = None
    cached_tokens: float | None = None
    queue_ms: float | None = None
    engine_prefill_ms: float | None = None

    @property
    def compute_ms(self) -> float | None:
        """Prefill time not spent reading KV (compute and overheads)."""
        if self.prefill_ms is None:
            return None
        return max(self.prefill_ms - (self.kv_transfer_ms or 0.0), 0.0)


@dataclass(frozen=True)
class Row:
    """The legs' points at one prompt length: ON always, OFF and FLOOR where they ran."""

    on: Point
    off: Point | None = None
    floor: Point | None = None

    @property
    def gain(self) -> float | None:
        """TTFT off / TTFT on."""
        return None if self.off is None else self.off.ttft_ms / self.on.ttft_ms

    @property
    def floor_ms(self) -> float | None:
        """The reuse path's floor: FLOOR's TTFT plus the time ON's D->P read took.

        FLOOR computes what ON computes (the prefix sits in prefill's own cache); what it
        skips is moving the prefix's bytes, so ON's measured link time is added back.
        """
        if self.floor is None:
            return None
        return self.floor.ttft_ms + (self.on.kv_transfer_ms or 0.0)

    @property
    def over_floor(self) -> float | None:
        """TTFT on / the floor."""
        floor = self.floor_ms
        return None if floor is None else self.on.ttft_ms / floor


@dataclass(frozen=True)
class Headline:
    """The numbers the README quotes (``None`` where the leg they need did not run)."""

    longest_tokens: float
    shortest_tokens: float
    on_flatness: float
    gain_at_longest: float | None
    off_growth: float | None
    over_floor_at_longest: float | None


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
            kv_bytes=_median_or_none(r.kv_bytes for r in members),
            cached_tokens=_median_or_none(r.cached_tokens for r in members),
            queue_ms=_median_or_none(r.queue_ms for r in members),
            engine_prefill_ms=_median_or_none(r.engine_prefill_ms for r in members),
        )
        for group, members in groups.items()
    ]
    return sorted(result, key=lambda point: point.prompt_tokens)


def rows(records: Iterable[TurnRecord], key: Callable[[TurnRecord], int] = turn_key) -> list[Row]:
    """One row per group the ON leg measured, with OFF's and FLOOR's points of that group."""
    records = list(records)
    by_leg = {
        leg: {p.key: p for p in points((r for r in records if r.leg is leg), key)} for leg in Leg
    }
    result = [
        Row(on, by_leg[Leg.OFF].get(group), by_leg[Leg.FLOOR].get(group))
        for group, on in by_leg[Leg.ON].items()
    ]
    return sorted(result, key=lambda row: row.on.prompt_tokens)


def headline(measured: list[Row]) -> Headline:
    """ON flatness (longest / shortest TTFT), and at the longest length the gain and ON/floor."""
    if not measured:
        raise ValueError("no prompt length was measured in the ON leg (need ON records)")
    first, last = measured[0], measured[-1]
    off_growth = None
    if first.off is not None and last.off is not None:
        off_growth = last.off.ttft_ms / first.off.ttft_ms
    return Headline(
        longest_tokens=last.on.prompt_tokens,
        shortest_tokens=first.on.prompt_tokens,
        on_flatness=last.on.ttft_ms / first.on.ttft_ms,
        gain_at_longest=last.gain,
        off_growth=off_growth,
        over_floor_at_longest=last.over_floor,
    )
