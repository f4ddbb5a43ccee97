"""`disagg plan` through the real entry point: table, JSON, errors, user configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disagg.cli import main
from disagg.plan.calibration import CALIBRATED, published_deployment
from disagg.plan.predict import predict
from plan_samples import LLAMA_8B

QWEN_ARGS = ["plan", "--model", "qwen3-32b", "--gpu", "h200", "--tp", "8", "--fabric", "p5en-efa"]


def test_prints_a_table_per_length(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*QWEN_ARGS, "--lengths", "2k,8k,24k"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["2000", "8000", "24000"]
    expected = predict(published_deployment("qwen3-32b"), CALIBRATED, 24000)
    assert rows[-1][2] == f"{expected.ttft_off_ms:.0f}"
    assert rows[-1][3] == f"{expected.ttft_on_ms:.0f}"
    assert rows[-1][7] == f"{expected.kv_floor_ms:.1f}"
    assert "suggested recomputeThresholdTokens:" in out


def test_json_file_holds_the_predictions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "plan.json"
    assert main([*QWEN_ARGS, "--lengths", "2k,24k", "--json", str(target)]) == 0
    assert "TTFT off" in capsys.readouterr().out
    document = json.loads(target.read_text(encoding="utf-8"))
    assert [p["prompt_tokens"] for p in document["predictions"]] == [2000, 24000]
    expected = predict(published_deployment("qwen3-32b"), CALIBRATED, 2000)
    assert document["predictions"][0]["ttft_on_ms"] == pytest.approx(expected.ttft_on_ms)
    assert document["recompute_threshold_tokens"] % 16 == 0


def test_json_to_stdout_is_only_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*QWEN_ARGS, "--lengths", "4096", "--json", "-"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["predictions"][0]["prompt_tokens"] == 4096


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--model", "llama-9000", "known: glm-5-fp8, qwen3-32b"),
        ("--gpu", "b200", "known: epyc-zen5-core, h100, h200"),
        ("--fabric", "ib", "known: loopback-tcp, p5-efa, p5en-efa"),
        ("--kv-dtype", "int3", "--kv-dtype: unknown dtype"),
        ("--tp", "0", "--tp must be >= 1"),
        ("--link-efficiency", "2", "link efficiency must be in"),
    ],
)
def test_bad_input_names_the_problem(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    args = [*QWEN_ARGS, flag, value] if flag != "--model" else ["plan", "--model", value]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_fabric_overrides_change_the_floor(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*QWEN_ARGS, "--lengths", "24k", "--json", "-"]) == 0
    base = json.loads(capsys.readouterr().out)["predictions"][0]
    assert main([*QWEN_ARGS, "--lengths", "24k", "--rails-per-gpu", "4", "--json", "-"]) == 0
    wider = json.loads(capsys.readouterr().out)
    assert wider["deployment"]["link_bytes_per_s_per_gpu"] == 100e9
    assert wider["predictions"][0]["kv_floor_ms"] == pytest.approx(base["kv_floor_ms"] / 2)
    assert main([*QWEN_ARGS, "--rail-gbps", "0"]) == 2
    assert "--rail-gbps must be > 0" in capsys.readouterr().err


def test_bad_length_is_an_argument_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([*QWEN_ARGS, "--lengths", "2k,lots"])
    assert "'lots' is not a token count" in capsys.readouterr().err


def test_model_is_required_without_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 2
    assert "--model is required" in capsys.readouterr().err


def test_user_config_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "my-model.json"
    path.write_text(json.dumps(LLAMA_8B), encoding="utf-8")
    assert main(["plan", "--model", str(path), "--gpu", "h100", "--fabric", "p5-efa"]) == 0
    out = capsys.readouterr().out
    assert "model my-model: GQA" in out
    assert "NVIDIA H100 SXM" in out


def test_calibration_report_states_both_verdicts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--calibration-report"]) == 0
    out = capsys.readouterr().out
    assert "fitted on both models, worst point:" in out
    assert "fitted on Qwen3-32B alone, worst GLM-5-FP8 point:" in out
    assert sum(1 for line in out.splitlines() if line.lstrip().startswith(("qwen3", "glm-5"))) == 20
