"""Per-length medians, rows of the legs (ON, OFF, FLOOR), the floor and the headline numbers."""

from __future__ import annotations

import pytest

from disagg.bench.aggregate import Point, Row, bin_key, headline, points, rows
from disagg.bench.records import Leg, TurnRecord


def record(
    leg: Leg,
    conversation: str,
    turn: int,
    tokens: int,
    ttft: float,
    prefill_ms: float | None = None,
    kv_transfer_ms: float | None = None,
    reused_tokens: float | None = None,
) -> TurnRecord:
    return TurnRecord(
        leg,
        conversation,
        turn,
        tokens,
        ttft,
        prefill_ms=prefill_ms,
        kv_transfer_ms=kv_transfer_ms,
        reused_tokens=reused_tokens,
    )


RECORDS = [
    record(Leg.OFF, "a", 1, 2000, 100, prefill_ms=80),
    record(Leg.OFF, "b", 1, 2010, 120, prefill_ms=90),
    record(Leg.OFF, "c", 1, 2020, 500, prefill_ms=400),
    record(Leg.OFF, "a", 2, 4000, 400, prefill_ms=300),
    record(Leg.ON, "a", 1, 2000, 110, prefill_ms=85),
    record(Leg.ON, "a", 2, 4000, 160, prefill_ms=120, kv_transfer_ms=30, reused_tokens=1920),
    record(Leg.ON, "a", 3, 6000, 200, prefill_ms=150, kv_transfer_ms=40),
]


def test_points_are_medians_per_turn_ordered_by_length() -> None:
    off = points(r for r in RECORDS if r.leg is Leg.OFF)
    assert [(p.key, p.prompt_tokens, p.ttft_ms, p.samples) for p in off] == [
        (1, 2010, 120, 3),
        (2, 4000, 400, 1),
    ]
    assert off[0].prefill_ms == 90 and off[0].kv_transfer_ms is None
    assert off[0].compute_ms == 90


def test_compute_is_prefill_minus_transfer() -> None:
    on = points(r for r in RECORDS if r.leg is Leg.ON)
    assert [(p.compute_ms, p.kv_transfer_ms) for p in on] == [(85, None), (90, 30), (110, 40)]


def test_rows_follow_the_on_leg_with_off_where_measured() -> None:
    measured = rows(RECORDS)
    assert [(r.on.key, r.off.key if r.off else None) for r in measured] == [
        (1, 1),
        (2, 2),
        (3, None),
    ]
    assert measured[1].gain == pytest.approx(400 / 160)
    assert measured[2].gain is None and measured[2].floor_ms is None
    top = headline(measured[:2])
    assert top.gain_at_longest == pytest.approx(2.5)
    assert top.on_flatness == pytest.approx(160 / 110)
    assert top.off_growth == pytest.approx(400 / 120)
    assert (top.shortest_tokens, top.longest_tokens) == (2000, 4000)
    assert top.over_floor_at_longest is None, "no FLOOR leg in these records"


def test_headline_needs_the_on_leg() -> None:
    with pytest.raises(ValueError, match="ON leg"):
        headline(rows(r for r in RECORDS if r.leg is Leg.OFF))
    assert headline(rows(r for r in RECORDS if r.leg is Leg.ON)).gain_at_longest is None


def test_floor_is_floor_ttft_plus_on_read_time() -> None:
    floor = [
        record(Leg.FLOOR, "f", 1, 2000, 105, prefill_ms=84),
        record(Leg.FLOOR, "f", 2, 4000, 130, prefill_ms=100),
    ]
    measured = rows(RECORDS + floor)
    assert measured[0].floor_ms == 105, "turn 1 reads nothing: the floor is FLOOR's TTFT"
    assert measured[1].floor_ms == 130 + 30
    assert measured[1].over_floor == pytest.approx(160 / 160)
    assert measured[0].over_floor == pytest.approx(110 / 105)
    assert headline(measured[:2]).over_floor_at_longest == pytest.approx(1.0)


def test_a_row_without_floor_has_no_ratio() -> None:
    row = Row(Point(1, 2000, 100, 1, kv_transfer_ms=5))
    assert (row.floor_ms, row.over_floor, row.gain) == (None, None, None)


def test_bins_group_unequal_conversations_by_length() -> None:
    grouped = points(RECORDS[:4], bin_key(1000))
    assert [(p.key, p.samples) for p in grouped] == [(2000, 3), (4000, 1)]
    with pytest.raises(ValueError, match="bin width"):
        bin_key(0)
