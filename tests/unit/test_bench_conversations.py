"""``disagg bench --workload conversations``: who goes next, the run against a real router in
front of engine stand-ins (not vLLM), and how configurations are compared."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

from disagg.bench.conversations import RunResult, TurnOutcome, TurnQueue
from disagg.bench.conversations_report import (
    ConfigResult,
    comparisons,
    figure,
    load,
    result_json,
    summarize,
    unequal_outputs,
)
from disagg.bench.workload import ConversationsWorkload
from disagg.cli import main
from router_harness import router_rig


def drain(queue: TurnQueue, in_flight: int) -> list[tuple[int, int]]:
    """Take turns ``in_flight`` at a time, answering the oldest first; the order handed out."""
    order: list[tuple[int, int]] = []
    flying: list[tuple[int, int]] = []
    for _ in range(1000):
        while len(flying) < in_flight and (taken := queue.poll()) is not None:
            order.append(taken)
            flying.append(taken)
        if not flying:
            assert queue.take() is None
            return order
        queue.done(*flying.pop(0))
    raise AssertionError("the queue did not run dry")


def test_turns_go_round_by_round_one_per_conversation_at_a_time() -> None:
    queue = TurnQueue(ConversationsWorkload(conversations=3, turns=2), time.monotonic)
    order = drain(queue, in_flight=2)
    assert order == [(0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (2, 2)]


def test_a_conversation_never_has_two_turns_in_flight() -> None:
    queue = TurnQueue(ConversationsWorkload(conversations=1, turns=3), time.monotonic)
    assert queue.take() == (0, 1)
    assert queue.poll() is None, "turn 2 waits for turn 1's answer"
    queue.stop()
    assert queue.take() is None


def test_think_time_holds_the_next_turn_back() -> None:
    queue = TurnQueue(ConversationsWorkload(conversations=1, turns=2, think_s=0.2), time.monotonic)
    assert queue.take() == (0, 1)
    queue.done(0, 1)
    started = time.monotonic()
    assert queue.take() == (0, 2)
    assert time.monotonic() - started >= 0.15
    queue.done(0, 2)
    assert queue.take() is None


@pytest.mark.parametrize(
    ("option", "value"),
    [("--concurrency", "0"), ("--turns", "0"), ("--tool-tokens", "0"), ("--think-s", "-1")],
)
def test_bad_workload_options_exit_2_naming_the_option(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "--workload", "conversations", "--router", "http://127.0.0.1:9"]
    assert main([*argv, option, value]) == 2
    assert option in capsys.readouterr().err


def test_the_workload_runs_through_a_router_and_histories_grow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    with router_rig(prefills=1, decodes=1) as rig:
        argv = ["bench", "--workload", "conversations", "--router", rig.routers[0].url]
        argv += ["--conversations", "3", "--turns", "3", "--concurrency", "2"]
        argv += ["--system-tokens", "100", "--tool-tokens", "50", "--answer-tokens", "4"]
        assert main([*argv, "--json-dir", str(out), "--figure-dir", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "conversations-standin-model.json",
        "conversations-standin-model.png",
    ]
    _, _, [config] = load(out / "conversations-standin-model.json")
    turns = config.run.turns
    assert [(t.conversation, t.turn) for t in turns] == [
        (c, t) for c in range(3) for t in (1, 2, 3)
    ]
    for conversation in range(3):
        prompts = [t.prompt_tokens for t in turns if t.conversation == conversation]
        # The stand-in counts a token per word: each turn adds a tool result and an answer.
        assert [b - a for a, b in itertools.pairwise(prompts)] == [pytest.approx(54, abs=3)] * 2
        assert prompts[0] == pytest.approx(150, abs=10)
    assert config.run.usage["router_turns"] == 9
    assert config.run.usage["router_hits"] == 6, "every later turn found decode's offer"
    printed = capsys.readouterr().out
    assert "| run: http://127.0.0.1" in printed and "unequal outputs: none" in printed


def outcome(conversation: int, turn: int, ttft_ms: float, answer: str = "a") -> TurnOutcome:
    return TurnOutcome(conversation, turn, 0.0, 100 * turn, ttft_ms, ttft_ms + 10, answer)


def config(name: str, ttfts: dict[int, list[float]], answer: str = "a") -> ConfigResult:
    turns = [
        outcome(c, turn, ms, answer)
        for turn, values in ttfts.items()
        for c, ms in enumerate(values)
    ]
    return ConfigResult(name, name, RunResult(turns, {}, 1.0, [2.0, 4.0]))


def test_outputs_that_differ_from_the_first_configuration_are_named() -> None:
    same, other = config("B", {1: [1.0]}), config("D", {1: [1.0]}, answer="b")
    assert unequal_outputs([same, config("C", {1: [2.0]})]) == []
    assert unequal_outputs([same, other]) == ["D conversation 0 turn 1"]


def test_comparisons_state_ratios_and_the_turns_where_d_is_slower() -> None:
    configs = [
        config("B", {1: [1000.0, 1000.0], 2: [4000.0, 4000.0]}),
        config("D", {1: [1200.0, 1200.0], 2: [1000.0, 1000.0]}),
        config("E-B", {1: [1000.0, 1000.0], 2: [4000.0, 4000.0]}),
        config("E-D", {1: [1000.0, 1000.0], 2: [2000.0, 2000.0]}),
    ]
    summaries = {c.name: summarize(c) for c in configs}
    assert summaries["D"]["ttft_p50_by_turn_ms"] == {"1": 1200.0, "2": 1000.0}
    assert summaries["D"]["decode_retained_blocks_mean"] == 3.0
    found = comparisons(summaries)
    assert found["D/B ttft_p50"] == pytest.approx(1100 / 2500, abs=1e-3)
    assert found["turns where D is slower than B"] == [1]
    assert found["turns where E-D is slower than E-B"] == []
    assert found["(E-D/E-B)/(D/B)"] == pytest.approx((1500 / 2500) / (1100 / 2500), abs=1e-2)
    assert "C/A ttft_p50" not in found, "a ratio needs both configurations"


def test_json_round_trips_and_draws(tmp_path: Path) -> None:
    configs = [config("B", {1: [1000.0], 2: [3000.0]}), config("D", {1: [1000.0], 2: [900.0]})]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(result_json("m", {"subtitle": "s"}, configs)))
    model, setup, loaded = load(path)
    assert (model, setup["subtitle"]) == ("m", "s")
    assert [c.run.turns for c in loaded] == [c.run.turns for c in configs]
    assert len(figure(loaded, model).axes[0].lines) == 2
