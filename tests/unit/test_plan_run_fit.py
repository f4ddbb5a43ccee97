"""`disagg plan --calibrate`: the fit on a `disagg bench` run, its points, and the CPU leg's run.

The last tests are the issue's acceptance: fitted on the shorter half of the committed CPU-leg
run's lengths, the model predicts TTFT off and on of the longer half within 20%.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median
from typing import Any

import pytest

from disagg.bench.records import BenchResult, Leg, TurnRecord
from disagg.cli import main
from disagg.plan import catalog
from disagg.plan.calibration import Quantity
from disagg.plan.measured import (
    HELD_OUT_BOUND,
    deployment_from,
    fit_least_squares,
    fit_run,
    point_cost,
    run_deployment,
    run_points,
)
from disagg.plan.physics import Cost, Efficiency
from disagg.plan.predict import Deployment, turn_costs
from disagg.plan.report import held_out_ttft_error, run_fit_text

RUN = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
CPU_RUN = RUN / "ttft-llama-h1024-l8-fp32-random.json"
DOC = Path(__file__).resolve().parents[2] / "docs" / "plan.md"

LLAMA_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_attention_heads": 16,
    "num_hidden_layers": 8,
    "num_key_value_heads": 4,
    "torch_dtype": "float32",
    "vocab_size": 2053,
}
RIG = {"model": LLAMA_CONFIG, "gpu": "epyc-zen5-core", "tp": 1, "fabric": "loopback-tcp"}
TRUE = Efficiency(compute=0.45, link=0.2, fixed_overhead_s=0.03)


def rig() -> Deployment:
    return deployment_from({**RIG, "block_tokens": 128}, "llama")


def synthetic_run(eff: Efficiency = TRUE, deployment: dict[str, Any] | None = None) -> BenchResult:
    """A run whose every median is the model's prediction under ``eff`` (turn N reuses N-1)."""
    on_rig = rig()
    records = []
    previous = 0
    for turn, prompt in enumerate(range(2000, 16001, 2000), start=1):
        reused = previous // 128 * 128
        costs = turn_costs(on_rig, prompt, reused, prompt - reused)
        ms = {name: getattr(costs, name).seconds(eff) * 1e3 for name in
              ("ttft_off", "ttft_on", "prefill_off", "prefill_on", "kv_transfer")}  # fmt: skip
        records.append(
            TurnRecord(Leg.OFF, "off", turn, prompt, ms["ttft_off"], prefill_ms=ms["prefill_off"])
        )
        records.append(
            TurnRecord(
                Leg.ON,
                "on",
                turn,
                prompt,
                ms["ttft_on"],
                prefill_ms=ms["prefill_on"],
                kv_transfer_ms=ms["kv_transfer"] if reused else 0.0,
                reused_tokens=reused,
            )
        )
        previous = prompt + 16
    setup = {"deployment": deployment} if deployment is not None else {}
    return BenchResult("llama", records, setup)


def test_least_squares_recovers_the_constants_of_exact_data() -> None:
    fitted = fit_run(synthetic_run(), rig())
    assert fitted.efficiency.compute == pytest.approx(TRUE.compute, rel=1e-6)
    assert fitted.efficiency.link == pytest.approx(TRUE.link, rel=1e-6)
    assert fitted.efficiency.fixed_overhead_s == pytest.approx(TRUE.fixed_overhead_s, rel=1e-6)
    assert max(abs(e.relative_error) for e in fitted.errors) < 1e-9


def test_constants_stay_physical() -> None:
    """Data faster than the peak fits at 100%; a run without reads leaves the link at its bound."""
    fast = [(Cost(steps=1, compute_s=2.0), 1.0), (Cost(steps=1, compute_s=4.0), 2.0)]
    eff = fit_least_squares(fast)
    assert eff.compute == 1.0 and eff.link == 1.0
    assert eff.fixed_overhead_s >= 0
    with pytest.raises(ValueError, match="no point"):
        fit_least_squares([])


def test_run_points_carry_each_turn_s_own_token_counts() -> None:
    measured = run_points(synthetic_run())
    first = [p for p in measured if p.key == 1]
    assert {p.quantity for p in first} == {
        Quantity.TTFT_OFF,
        Quantity.PREFILL_OFF,
        Quantity.TTFT_ON,
        Quantity.PREFILL_ON,
    }, "turn 1 reads nothing, so it has no KV transfer point"
    second = {p.quantity: p for p in measured if p.key == 2}
    assert second[Quantity.TTFT_ON].reused_tokens == 1920
    assert second[Quantity.TTFT_OFF].reused_tokens == 0
    assert second[Quantity.KV_TRANSFER].suffix_tokens == 4000 - 1920
    assert point_cost(rig(), second[Quantity.KV_TRANSFER]).link_s > 0


def test_fit_on_the_shortest_lengths_holds_out_the_rest() -> None:
    fitted = fit_run(synthetic_run(), rig(), fit_lengths=4)
    assert (fitted.fit_lengths, fitted.lengths) == (4, 8)
    held = {e.point.prompt_tokens for e in fitted.errors if not e.fitted}
    assert held == {10000, 12000, 14000, 16000}
    assert held_out_ttft_error(fitted) == pytest.approx(0, abs=1e-9)
    suffixes = [p - (p - 2000 + 16) // 128 * 128 for p in range(4000, 16001, 2000)]
    assert fitted.suffix_tokens == round(median(suffixes)), "new tokens of the turns that reused"
    with pytest.raises(ValueError, match=r"--fit-shortest must be in 1\.\.8"):
        fit_run(synthetic_run(), rig(), fit_lengths=9)


def test_the_run_records_its_deployment() -> None:
    assert run_deployment(synthetic_run()) is None
    recorded = run_deployment(synthetic_run(deployment=RIG))
    assert recorded is not None
    deployment = deployment_from(recorded, "llama")
    assert deployment.gpu is catalog.gpu("epyc-zen5-core")
    assert deployment.peak_flops == pytest.approx(64 * 2.6e9)
    with pytest.raises(ValueError, match="lacks 'fabric'"):
        deployment_from({"model": LLAMA_CONFIG, "gpu": "h200", "tp": 1}, "llama")


def save(result: BenchResult, tmp_path: Path) -> str:
    path = tmp_path / "run.json"
    result.save(path)
    return str(path)


def test_cli_calibrates_on_a_recorded_deployment_and_reshapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = save(synthetic_run(deployment=RIG), tmp_path)
    assert main(["plan", "--calibrate", path, "--fit-shortest", "4", "--lengths", "32k"]) == 0
    out = capsys.readouterr().out
    assert "fitted on the 4 shortest of 8 lengths: compute 45.0% of the roofline" in out
    assert "held-out TTFT off and on, worst: 0% (bound 20%: met)" in out
    assert sum(1 for line in out.splitlines() if line.endswith("held out")) == 4 * 5
    assert "fitted on run.json (disagg plan --calibrate)" in out
    assert main(["plan", "--calibrate", path, "--tp", "2", "--lengths", "32k", "--json", "-"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["deployment"]["tp"] == 2
    assert document["calibration"]["efficiency"]["compute"] == pytest.approx(0.45)
    assert document["deployment"]["suffix_tokens"] > 1000, "the run's turns, not the default"


def test_cli_needs_the_deployment_when_the_run_lacks_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = save(synthetic_run(), tmp_path)
    assert main(["plan", "--calibrate", path]) == 2
    assert "--model is required" in capsys.readouterr().err
    config = tmp_path / "llama.json"
    config.write_text(json.dumps(LLAMA_CONFIG))
    argv = ["plan", "--calibrate", path, "--model", str(config), "--gpu", "epyc-zen5-core"]
    argv += ["--tp", "1", "--fabric", "loopback-tcp", "--block-size", "128"]
    assert main(argv) == 0
    assert "link 20.0% of line rate" in capsys.readouterr().out
    assert main(["plan", "--model", "qwen3-32b", "--fit-shortest", "2"]) == 2
    assert "--fit-shortest needs --calibrate" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("[]")
    assert main(["plan", "--calibrate", str(tmp_path / "bad.json")]) == 2
    assert "not a disagg bench result" in capsys.readouterr().err


def test_cpu_leg_run_predicts_its_longer_half_within_the_bound() -> None:
    """The issue's acceptance, on the committed `make bench-local` run."""
    result = BenchResult.load(CPU_RUN)
    recorded = run_deployment(result)
    assert recorded is not None, "bench-local records the rig's deployment"
    lengths = len(result.setup["lengths"])
    fitted = fit_run(result, deployment_from(recorded, result.model), lengths // 2)
    held = [e for e in fitted.errors if not e.fitted]
    assert {e.point.quantity for e in held} >= {Quantity.TTFT_OFF, Quantity.TTFT_ON}
    worst = held_out_ttft_error(fitted)
    assert worst is not None and worst <= HELD_OUT_BOUND


def test_cli_on_the_cpu_leg_run_states_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    lengths = len(BenchResult.load(CPU_RUN).setup["lengths"])
    assert main(["plan", "--calibrate", str(CPU_RUN), "--fit-shortest", str(lengths // 2)]) == 0
    assert "(bound 20%: met)" in capsys.readouterr().out


def test_docs_quote_the_fit_on_the_cpu_leg_run() -> None:
    result = BenchResult.load(CPU_RUN)
    recorded = run_deployment(result)
    assert recorded is not None
    lengths = len(result.setup["lengths"])
    fitted = fit_run(result, deployment_from(recorded, result.model), lengths // 2)
    text = run_fit_text(fitted, "docs/benchmarks/" + CPU_RUN.name)
    assert text in DOC.read_text(encoding="utf-8"), (
        "docs/plan.md must quote `disagg plan --calibrate` on the committed run verbatim"
    )
