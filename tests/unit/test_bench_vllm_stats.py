"""``disagg bench --from-vllm-stats``: vLLM's multi-turn per-request stats become figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disagg.bench.records import Leg
from disagg.bench.vllm_stats import read_vllm_stats
from disagg.cli import main


def stats(ttfts: list[float], tokens: list[int]) -> list[dict[str, object]]:
    """Requests as vLLM's benchmark writes them (RequestStats fields)."""
    return [
        {
            "ttft_ms": ttft,
            "tpot_ms": 10.0,
            "latency_ms": ttft + 300,
            "start_time_ms": 1000.0 * index,
            "input_num_turns": 2 * index + 1,
            "input_num_tokens": count,
            "output_num_tokens": 32,
            "output_num_chunks": 31,
            "output_num_first_chunk_tokens": 1,
            "approx_cached_percent": 50.0,
            "conversation_id": "CONV_ID_0",
            "client_id": 0,
        }
        for index, (ttft, count) in enumerate(zip(ttfts, tokens, strict=True))
    ]


def write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_reads_per_request_stats_and_drops_failed_requests(tmp_path: Path) -> None:
    data = stats([122.0, -1.0, 460.0], [2048, 4096, 24000])
    records = read_vllm_stats(write(tmp_path / "on.json", data), Leg.ON)
    assert [(r.prompt_tokens, r.ttft_ms, r.turn) for r in records] == [
        (2048, 122.0, 1),
        (24000, 460.0, 5),
    ]
    assert records[0].conversation == "CONV_ID_0" and records[0].leg is Leg.ON
    assert records[0].e2e_ms == 422.0 and records[0].output_tokens == 32


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"ttft_ms": 1}, "JSON array"),
        ([{"ttft_ms": 1.0, "input_num_tokens": 5}], "missing field 'conversation_id'"),
        ([{"ttft_ms": "fast", "input_num_tokens": 5, "conversation_id": "c"}], "field 'ttft_ms'"),
        (["x"], r"\[0\]: expected an object"),
    ],
)
def test_bad_files_name_the_field(tmp_path: Path, data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_vllm_stats(write(tmp_path / "s.json", data), Leg.ON)


def test_cli_plots_on_and_off_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    on = write(tmp_path / "on.json", stats([122.0, 300.0, 460.0], [2000, 12000, 24000]))
    off = write(tmp_path / "off.json", stats([158.0, 420.0, 778.0], [2010, 11990, 24020]))
    out = tmp_path / "out"
    argv = ["bench", "--from-vllm-stats", str(on), str(off), "--model", "Qwen/Qwen3-32B"]
    assert main([*argv, "--json-dir", str(out), "--figure-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "OFF/ON at 24000 tokens: 1.69x" in printed
    assert "ON flatness (TTFT at longest / shortest): 3.77" in printed
    assert sorted(p.name for p in out.iterdir()) == [
        "ttft-qwen-qwen3-32b.json",
        "ttft-qwen-qwen3-32b.png",
    ]


def test_cli_refuses_a_bad_file_with_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write(tmp_path / "bad.json", [{"ttft_ms": 1.0}])
    assert main(["bench", "--from-vllm-stats", str(bad), "--figure-dir", str(tmp_path)]) == 2
    assert "missing field 'input_num_tokens'" in capsys.readouterr().err


def test_cli_needs_a_router_or_stats(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench"]) == 2
    assert "--router URL is required" in capsys.readouterr().err
