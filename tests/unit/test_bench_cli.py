"""``disagg bench`` options: registration stays light, legs and their honest descriptions."""

from __future__ import annotations

import subprocess
import sys

import pytest

from disagg.bench.cli import bench_targets, parse_legs
from disagg.bench.records import Leg
from disagg.cli import build_parser


def test_building_the_cli_imports_neither_http_nor_plotting() -> None:
    code = (
        "import sys; from disagg.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('matplotlib', 'httpx', 'vllm', 'kopf') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def parse(*argv: str) -> list[tuple[Leg, str, bool]]:
    args = build_parser().parse_args(["bench", *argv])
    return [(t.leg, t.router_url, t.send_conversation_id) for t in bench_targets(args)]


def test_off_leg_defaults_to_the_same_router_without_conversation_id() -> None:
    assert parse("--router", "http://r:8000") == [
        (Leg.OFF, "http://r:8000", False),
        (Leg.ON, "http://r:8000", True),
    ]


def test_off_leg_on_a_second_deployment_keeps_the_conversation_id() -> None:
    targets = parse("--router", "http://on", "--off-router", "http://off", "--legs", "off")
    assert targets == [(Leg.OFF, "http://off", True)]


@pytest.mark.parametrize(
    ("off_router", "described"),
    [(None, "without conversation_id"), ("http://off", "bidirectional transfer off")],
)
def test_each_leg_says_how_it_was_run(off_router: str | None, described: str) -> None:
    argv = ["bench", "--router", "http://on"] + (["--off-router", off_router] if off_router else [])
    off, on = bench_targets(build_parser().parse_args(argv))
    assert described in off.describe()
    assert "conversation_id" in on.describe() and on.leg is Leg.ON


def test_bad_sweep_options_exit_2_naming_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    from disagg.cli import main

    assert main(["bench", "--router", "http://127.0.0.1:9", "--lengths", "4k,2k"]) == 2
    assert "--lengths" in capsys.readouterr().err
    assert main(["bench", "--router", "http://127.0.0.1:9", "--conversations", "0"]) == 2
    assert "--conversations" in capsys.readouterr().err


def test_a_floor_router_adds_the_floor_leg_without_conversation_id() -> None:
    assert parse("--router", "http://on", "--floor-router", "http://floor") == [
        (Leg.OFF, "http://on", False),
        (Leg.ON, "http://on", True),
        (Leg.FLOOR, "http://floor", False),
    ]
    assert parse("--router", "http://on", "--floor-router", "http://f", "--legs", "on,floor") == [
        (Leg.ON, "http://on", True),
        (Leg.FLOOR, "http://f", False),
    ]


@pytest.mark.parametrize(("text", "legs"), [("both", {Leg.ON, Leg.OFF}), ("off", {Leg.OFF})])
def test_legs_are_named(text: str, legs: set[Leg]) -> None:
    assert parse_legs(text) == legs


def test_an_unknown_leg_is_an_argument_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--router", "http://r", "--legs", "on,ceiling"])
    assert "must name legs from on, off, floor" in capsys.readouterr().err
