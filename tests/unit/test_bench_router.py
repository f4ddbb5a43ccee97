"""``disagg bench --router`` against a real router in front of engine stand-ins (not vLLM).

The stand-ins count one token per word, so the sweep's lengths are checked exactly; the
router's own /metrics give each request's prefill duration and cache lookup.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from disagg.bench.records import BenchResult, Leg
from disagg.cli import main
from router_harness import router_rig


def run_bench(tmp_path: Path, *extra: str) -> tuple[BenchResult, str, list[str]]:
    out = tmp_path / "out"
    with router_rig(prefills=1, decodes=1) as rig:
        argv = ["bench", "--router", rig.routers[0].url, "--lengths", "300:900:300"]
        argv += ["--answer-tokens", "8", "--conversations", "2"]
        status = main([*argv, "--json-dir", str(out), "--figure-dir", str(out), *extra])
    assert status == 0
    names = sorted(p.name for p in out.iterdir())
    return BenchResult.load(out / "ttft-standin-model.json"), str(out), names


def test_both_legs_reach_the_lengths_and_only_on_hits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result, _, names = run_bench(tmp_path)
    assert names == [
        "prefill-standin-model.png",
        "ttft-standin-model.json",
        "ttft-standin-model.png",
    ]
    on, off = result.leg(Leg.ON), result.leg(Leg.OFF)
    assert len(on) == len(off) == 6
    assert [r.turn for r in on] == [1, 2, 3, 1, 2, 3]
    for records in (on, off):
        assert all(
            r.prompt_tokens in range(t - 2, t + 3)
            for r, t in zip(records, [300, 600, 900] * 2, strict=True)
        )
    assert [r.lookup for r in on] == ["miss", "hit", "hit"] * 2
    assert {r.lookup for r in off} == {"no_key"}, "the OFF leg withholds the conversation id"
    for record in on + off:
        assert record.prefill_ms is not None and record.e2e_ms is not None
        assert 0 < record.prefill_ms < record.e2e_ms
    assert [r.conversation for r in on][:1] != [r.conversation for r in on][3:4]
    assert result.setup["legs"]["off"].endswith("prefill recomputes every prompt")
    printed = capsys.readouterr()
    assert re.search(r"OFF/ON at 89\d tokens: \d+\.\d\dx", printed.out), printed.out
    assert "12/12" in printed.err, "the progress bar counted every request"


def test_on_leg_only_writes_no_pairs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result, _, names = run_bench(tmp_path, "--legs", "on")
    assert {r.leg for r in result.records} == {Leg.ON}
    assert "ttft-standin-model.png" in names
    assert "OFF/ON" not in capsys.readouterr().out


def test_off_leg_on_a_second_deployment_sends_the_id_and_misses(tmp_path: Path) -> None:
    """A deployment with bidirectional off: its decode publishes no KV, so its router misses."""
    out = tmp_path / "out"
    with router_rig(prefills=1, decodes=1) as on, router_rig(prefills=1, decodes=1) as off:
        for engine in off.decode:
            engine.state.stream_kv = False
        argv = ["bench", "--router", on.routers[0].url, "--off-router", off.routers[0].url]
        argv += ["--lengths", "200,400", "--answer-tokens", "4"]
        assert main([*argv, "--json-dir", str(out), "--figure-dir", str(out)]) == 0
        received = list(off.prefill[0].state.received)
        warmed = len(on.prefill[0].state.received)
    result = BenchResult.load(out / "ttft-standin-model.json")
    assert [r.lookup for r in result.leg(Leg.OFF)] == ["miss", "miss"]
    assert [r.lookup for r in result.leg(Leg.ON)] == ["miss", "hit"]
    assert "bidirectional transfer off" in result.setup["legs"]["off"]
    assert len(received) == 4, "two probes and two turns reached the OFF prefill"
    assert warmed == 4, "the ON deployment got the same two warm-up probes"
    assert all("conversation_id" not in body for body in received), "stripped by the router"


def test_floor_leg_runs_on_its_own_deployment_without_the_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The FLOOR leg: no conversation id, and a system prompt naming the run (no stale cache)."""
    out = tmp_path / "out"
    with router_rig(prefills=1, decodes=1) as on, router_rig(prefills=1, decodes=1) as floor:
        argv = ["bench", "--router", on.routers[0].url, "--floor-router", floor.routers[0].url]
        argv += ["--lengths", "200,400", "--answer-tokens", "4"]
        assert main([*argv, "--json-dir", str(out), "--figure-dir", str(out)]) == 0
        received = list(floor.prefill[0].state.received)
        on_received = list(on.prefill[0].state.received)
    result = BenchResult.load(out / "ttft-standin-model.json")
    legs = [r.leg for r in result.records]
    assert legs == [Leg.OFF, Leg.OFF, Leg.ON, Leg.FLOOR, Leg.FLOOR, Leg.ON], "turn by turn"
    assert [r.lookup for r in result.leg(Leg.FLOOR)] == ["no_key", "no_key"]
    assert "prefix caching on" in result.setup["legs"]["floor"]
    turns = received[2:]
    assert len(turns) == 2 and all("conversation_id" not in body for body in turns)
    run_id = result.records[-1].conversation.split("-")[1]
    assert all(body["messages"][0]["content"].endswith(f"Run {run_id}.") for body in turns)
    assert all("Run " not in body["messages"][0]["content"] for body in on_received)
    printed = capsys.readouterr().out
    assert re.search(r"ON/floor at 39\d tokens: \d+\.\d\dx", printed), printed
    assert "TTFT floor" in printed


def test_floor_leg_needs_its_router(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--router", "http://127.0.0.1:9", "--legs", "on,floor"]) == 2
    assert "--legs floor needs --floor-router" in capsys.readouterr().err


def test_interleaved_legs_swap_places_at_each_turn_and_conversation(tmp_path: Path) -> None:
    """Two conversations of two turns: ON first, FLOOR first; then FLOOR first, ON first."""
    out = tmp_path / "out"
    with router_rig(prefills=1, decodes=1) as on, router_rig(prefills=1, decodes=1) as floor:
        argv = ["bench", "--router", on.routers[0].url, "--floor-router", floor.routers[0].url]
        argv += ["--lengths", "200,400", "--answer-tokens", "4", "--legs", "on,floor"]
        argv += ["--conversations", "2"]
        assert main([*argv, "--json-dir", str(out), "--figure-dir", str(out)]) == 0
    result = BenchResult.load(out / "ttft-standin-model.json")
    order = [(r.leg.value, r.conversation[-1], r.turn) for r in result.records]
    assert order == [
        ("on", "0", 1), ("floor", "0", 1), ("floor", "0", 2), ("on", "0", 2),
        ("floor", "1", 1), ("on", "1", 1), ("on", "1", 2), ("floor", "1", 2),
    ]  # fmt: skip
