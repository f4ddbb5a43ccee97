"""Run results round-trip through their JSON file; a foreign file is refused by field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disagg.bench.records import BenchResult, Leg, TurnRecord
from disagg.cli import main


def test_result_round_trips(tmp_path: Path) -> None:
    result = BenchResult(
        "m",
        [
            TurnRecord(Leg.OFF, "c0", 1, 2000, 812.5, prefill_ms=700.0, lookup="no_key"),
            TurnRecord(Leg.ON, "c0", 2, 4000, 300.0, kv_transfer_ms=12.0, reused_tokens=1920),
            TurnRecord(Leg.FLOOR, "c1", 2, 4000, 280.0, cached_tokens=1904),
        ],
        {"lengths": [2000, 4000]},
    )
    path = tmp_path / "deep" / "r.json"
    result.save(path)
    data = json.loads(path.read_text())
    assert data["schema"] == "disagg-bench/v1"
    assert data["records"][1]["leg"] == "on"
    assert data["records"][2]["leg"] == "floor" and data["records"][2]["cached_tokens"] == 1904
    loaded = BenchResult.load(path)
    assert loaded == result
    assert [r.turn for r in loaded.leg(Leg.ON)] == [2]


def test_load_refuses_other_files(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"schema": "x", "records": []}))
    with pytest.raises(ValueError, match="field 'schema'"):
        BenchResult.load(path)


def test_cli_redraws_a_saved_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = BenchResult(
        "m",
        [
            TurnRecord(Leg.OFF, "c", 1, 2000, 900.0, prefill_ms=850.0),
            TurnRecord(Leg.ON, "c", 1, 2000, 450.0, prefill_ms=400.0, kv_transfer_ms=20.0),
        ],
        {"subtitle": "saved subtitle"},
    )
    saved = tmp_path / "ttft-m.json"
    result.save(saved)
    out = tmp_path / "figures"
    assert main(["bench", "--from-json", str(saved), "--figure-dir", str(out)]) == 0
    assert "OFF/ON at 2000 tokens: 2.00x" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["prefill-m.png", "ttft-m.png"]
    saved.write_text("{}")
    assert main(["bench", "--from-json", str(saved), "--figure-dir", str(out)]) == 2
    assert "field 'schema'" in capsys.readouterr().err


def test_a_run_with_a_floor_leg_prints_on_over_floor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = BenchResult(
        "m",
        [
            TurnRecord(Leg.OFF, "c", 2, 4000, 900.0, prefill_ms=850.0),
            TurnRecord(Leg.ON, "c", 2, 4000, 450.0, prefill_ms=400.0, kv_transfer_ms=50.0),
            TurnRecord(Leg.FLOOR, "f", 2, 4000, 250.0, prefill_ms=200.0, cached_tokens=1904),
        ],
    )
    saved = tmp_path / "ttft-m.json"
    result.save(saved)
    assert main(["bench", "--from-json", str(saved), "--figure-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    header, _, row, summary = out.splitlines()[:4]
    assert header.split()[-6:] == ["TTFT", "floor", "cached", "floor", "floor", "on/floor"]
    assert row.split()[-6:] == ["250", "ms", "1904", "300", "ms", "1.50x"]
    assert "OFF/ON at 4000 tokens: 2.00x; ON/floor at 4000 tokens: 1.50x" in summary
