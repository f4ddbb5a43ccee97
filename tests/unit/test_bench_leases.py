"""The lease benchmark's pure parts: its workload's schedule, the summary math, the JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from disagg.bench.lease_report import (
    LegResult,
    MemorySample,
    TurnResult,
    figure,
    load,
    percentile,
    ratios,
    result_json,
    summarize,
    time_weighted_mean,
)
from disagg.bench.leases import Step, Workload, idle_conversations, leg_configs, schedule
from disagg_contract import lease_term_s


def turn(
    t_s: float, conversation: int | None, index: int, ttft_ms: float, reused: float = 0.0
) -> TurnResult:
    return TurnResult(t_s, conversation, index, 900, ttft_ms, reused, decode_queue_ms=5.0)


def test_idle_conversations_are_spread_among_the_others() -> None:
    assert idle_conversations(Workload(conversations=10, idle=4)) == {1, 3, 6, 8}
    assert idle_conversations(Workload(conversations=10, idle=0)) == set()
    assert idle_conversations(Workload(conversations=4, idle=4)) == {0, 1, 2, 3}


def test_schedule_is_round_robin_and_idle_conversations_stop() -> None:
    workload = Workload(conversations=4, idle=1, idle_after=2, rounds=3, one_shots=1)
    assert schedule(workload) == [
        Step(0, 1),
        Step(1, 1),
        Step(None, 0),
        Step(2, 1),
        Step(3, 1),
        *(Step(c, 2) for c in range(4)),
        Step(0, 3),
        Step(1, 3),
        Step(3, 3),
    ]
    assert idle_conversations(workload) == {2}


def test_schedule_puts_one_shots_in_the_middle_of_spread_rounds() -> None:
    steps = schedule(Workload(conversations=10, idle=4, rounds=6, one_shots=4))
    assert len(steps) == 4 * 2 + 6 * 6 + 4
    one_shots = [i for i, s in enumerate(steps) if s.conversation is None]
    rounds = [steps[i + 1].turn for i in one_shots]
    assert rounds == [1, 2, 4, 5]
    assert steps[one_shots[0] - 1] == Step(4, 1)
    assert steps[one_shots[0] + 1] == Step(5, 1)


@pytest.mark.parametrize(
    ("changes", "option"),
    [
        ({"idle": 11}, "--idle"),
        ({"idle_after": 9}, "--idle-after"),
        ({"idle_after": 0}, "--idle-after"),
        ({"one_shots": -1}, "--one-shots"),
    ],
)
def test_bad_workloads_name_the_option(changes: dict[str, int], option: str) -> None:
    with pytest.raises(ValueError, match=option):
        Workload(**changes)  # type: ignore[arg-type]


def test_the_fixed_timer_never_releases_for_idleness_within_the_run() -> None:
    configs = leg_configs(idle_timeout_s=10, ttl_s=120)
    assert configs["lease"].describe()["lease_term_s"] == lease_term_s(10)
    assert configs["fixed"].describe()["lease_term_s"] is None
    assert configs["fixed"].idle_timeout_s > 120
    assert configs["fixed"].ttl_s == configs["lease"].ttl_s


def test_time_weighted_mean_holds_each_value_until_the_next_sample() -> None:
    assert time_weighted_mean([0, 1, 3], [10, 4, 99]) == pytest.approx((10 * 1 + 4 * 2) / 3)
    assert time_weighted_mean([5], [7]) == 7
    assert time_weighted_mean([], []) == 0
    with pytest.raises(ValueError):
        time_weighted_mean([0, 1], [1])


def test_percentile_interpolates_between_order_statistics() -> None:
    values = [400.0, 100.0, 300.0, 200.0]
    assert percentile(values, 50) == 250
    assert percentile(values, 90) == pytest.approx(370)
    assert percentile(values, 0) == 100 and percentile(values, 100) == 400
    assert percentile([5.0], 90) == 5
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile(values, 101)


def leg(name: str, blocks: list[float], turns: list[TurnResult]) -> LegResult:
    samples = [MemorySample(float(i), b, b / 10, b / 100) for i, b in enumerate(blocks)]
    return LegResult(name, {"label": name}, samples, turns, 3.0, total_blocks=100)


def test_summary_counts_hits_on_later_turns_and_waits() -> None:
    turns = [
        turn(0, 0, 1, 2000),
        turn(1, 0, 2, 400, reused=800),
        turn(2, None, 0, 1500),
        turn(3, 1, 2, 2100),
        TurnResult(4, 1, 3, 900, 3000, 0.0, decode_queue_ms=1500),
    ]
    figures = summarize(leg("lease", [0, 20, 40, 0], turns))
    assert figures["mean_retained_blocks"] == 20
    assert figures["peak_retained_blocks"] == 40
    assert figures["mean_retained_share"] == 0.2
    assert figures["peak_kv_usage"] == 0.4
    assert (figures["later_turns"], figures["hits"], figures["hit_ratio"]) == (3, 1, 0.333)
    assert figures["waited"] == 1
    assert figures["ttft_p50_ms"] == 2000
    assert figures["ttft_max_ms"] == 3000


def test_the_workload_window_leaves_the_tail_out() -> None:
    lease = leg("lease", [10, 30, 50, 0, 0], [turn(0, 0, 1, 2000)])
    lease.workload_s = 2.0
    figures = summarize(lease)
    assert figures["mean_retained_blocks_workload"] == 20
    assert figures["mean_retained_blocks"] == pytest.approx(22.5)
    assert figures["mean_kv_usage_workload"] == 0.2


def test_ratios_are_the_fixed_timer_over_the_lease() -> None:
    fixed = {"mean_retained_blocks": 60.0, "peak_retained_blocks": 80, "ttft_p50_ms": 900.0}
    lease = {"mean_retained_blocks": 20.0, "peak_retained_blocks": 0, "ttft_p50_ms": 600.0}
    result = ratios(fixed, lease)
    assert result["fixed/lease mean_retained_blocks"] == 3.0
    assert result["fixed/lease ttft_p50_ms"] == 1.5
    assert result["fixed/lease peak_retained_blocks"] is None
    assert result["fixed/lease hits"] is None


def test_json_round_trips_and_draws(tmp_path: Path) -> None:
    legs = [
        leg("fixed", [0, 60, 60, 60], [turn(0, 0, 1, 2000), turn(1, 0, 2, 1900)]),
        leg("lease", [0, 30, 30, 0], [turn(0, 0, 1, 2000), turn(1, 0, 2, 500, reused=700)]),
    ]
    data = result_json("tiny", {"subtitle": "test"}, legs)
    assert data["summary"]["fixed"]["mean_retained_blocks"] == 40
    assert data["ratios"]["fixed/lease mean_retained_blocks"] == 2.0
    assert data["ratios"]["fixed/lease ttft_p50_ms"] == pytest.approx(round(1950 / 1250, 2))
    path = tmp_path / "leases.json"
    path.write_text(json.dumps(data))
    model, setup, loaded = load(path)
    assert (model, setup) == ("tiny", {"subtitle": "test"})
    assert loaded == legs
    assert len(figure(loaded, model).axes) == 2
    path.write_text('{"schema": "other"}')
    with pytest.raises(ValueError, match="schema"):
        load(path)
