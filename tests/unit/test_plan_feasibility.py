"""The growth-ratio proof that no three shared constants meet the issue's calibration bounds.

docs/plan.md states these ratios; the tests compute them from the model and check that the
proof's premise holds: the constants cancel from a single-term growth ratio.
"""

from __future__ import annotations

import dataclasses

import pytest

from disagg.plan import catalog
from disagg.plan.calibration import (
    CALIBRATED,
    CROSS_MODEL_BOUND,
    JOINT_BOUND,
    PUBLISHED_POINTS,
    PublishedPoint,
    Quantity,
    errors,
    max_abs_error,
    point_cost,
)
from disagg.plan.feasibility import growth_check, growth_checks
from disagg.plan.physics import Efficiency
from disagg.plan.predict import Deployment

LONGEST = {"qwen3-32b": 24000, "glm-5-fp8": 20000}


def _growth_ratios(gpu: catalog.Gpu, glm_kv_dtype: str | None = None) -> tuple[float, float]:
    """GLM over Qwen growth, 2k to the longest prompt: (prefill compute, KV bytes per GPU)."""
    compute, kv = [], []
    for name, longest in LONGEST.items():
        spec = catalog.model(name, glm_kv_dtype if name == "glm-5-fp8" else None)
        deployment = Deployment(spec, gpu, 8, catalog.fabric("p5en-efa"))
        compute.append(
            deployment.compute(0, longest).compute_s - deployment.compute(0, 2000).compute_s
        )
        reused = (deployment.reused_tokens(longest), deployment.reused_tokens(2000))
        kv.append(deployment.kv_bytes_per_gpu(reused[0]) - deployment.kv_bytes_per_gpu(reused[1]))
    return compute[1] / compute[0], kv[1] / kv[0]


@pytest.mark.parametrize("bound", [JOINT_BOUND, CROSS_MODEL_BOUND])
def test_off_prefill_growth_rules_out_both_bounds(bound: float) -> None:
    for quantity in (Quantity.PREFILL_OFF, Quantity.TTFT_OFF):
        check = growth_check(quantity, bound)
        assert check is not None
        assert check.term == "compute"
        assert check.model_ratio == pytest.approx(0.693, abs=0.001)
        assert check.published_ratio > 2.9
        assert check.model_ratio < check.allowed[0]
        assert not check.feasible
    prefill = growth_check(Quantity.PREFILL_OFF, bound)
    assert prefill is not None
    assert prefill.allowed[0] == pytest.approx(1.64 if bound == JOINT_BOUND else 1.38, abs=0.005)


def test_kv_transfer_growth_rules_out_the_joint_bound_with_a_bf16_cache() -> None:
    check = growth_check(Quantity.KV_TRANSFER, JOINT_BOUND)
    assert check is not None
    assert check.term == "link"
    assert check.model_ratio == pytest.approx(2.50, abs=0.005)
    assert check.allowed[1] == pytest.approx(1.60, abs=0.005)
    assert not check.feasible


def test_docs_what_ifs_fp8_matmuls_at_bf16_rate_and_an_fp8_kv_cache() -> None:
    h200 = catalog.gpu("h200")
    no_fp8_credit = dataclasses.replace(
        h200, peak_flops={"fp8": h200.peak_flops["bf16"], "bf16": h200.peak_flops["bf16"]}
    )
    compute_ratio, _ = _growth_ratios(no_fp8_credit)
    assert compute_ratio == pytest.approx(1.06, abs=0.005)
    widest = growth_check(Quantity.PREFILL_OFF, CROSS_MODEL_BOUND)
    assert widest is not None
    assert compute_ratio < widest.allowed[0]
    _, kv_ratio = _growth_ratios(h200, glm_kv_dtype="fp8")
    joint_kv = growth_check(Quantity.KV_TRANSFER, JOINT_BOUND)
    assert joint_kv is not None
    assert kv_ratio == pytest.approx(1.38, abs=0.01)
    assert joint_kv.allowed[0] <= kv_ratio <= joint_kv.allowed[1]


@pytest.mark.parametrize(
    "eff",
    [CALIBRATED, Efficiency(compute=0.05, link=0.9, fixed_overhead_s=0.3)],
    ids=["calibrated", "arbitrary"],
)
def test_constants_cancel_from_the_growth_ratio(eff: Efficiency) -> None:
    for check in growth_checks(JOINT_BOUND):
        grown = []
        for model, longest in LONGEST.items():
            ends = [
                point_cost(PublishedPoint(model, check.quantity, tokens, 1.0)).seconds(eff)
                for tokens in (2000, longest)
            ]
            grown.append(ends[1] - ends[0])
        assert grown[1] / grown[0] == pytest.approx(check.model_ratio, rel=1e-9)


def test_points_the_model_itself_predicts_pass_the_check() -> None:
    eff = Efficiency(compute=0.4, link=0.5, fixed_overhead_s=0.03)
    synthetic = tuple(
        dataclasses.replace(p, ms=point_cost(p).seconds(eff) * 1e3) for p in PUBLISHED_POINTS
    )
    assert max_abs_error(errors(eff, synthetic)) == pytest.approx(0, abs=1e-12)
    checks = [growth_check(q, JOINT_BOUND, synthetic) for q in Quantity]
    decided = [c for c in checks if c is not None]
    assert {c.quantity for c in decided} == {
        Quantity.TTFT_OFF,
        Quantity.PREFILL_OFF,
        Quantity.KV_TRANSFER,
    }
    for check in decided:
        assert check.feasible
        assert check.published_ratio == pytest.approx(check.model_ratio, rel=1e-9)


def test_quantities_mixing_read_and_compute_are_not_decided() -> None:
    assert growth_check(Quantity.PREFILL_ON, JOINT_BOUND) is None
    assert growth_check(Quantity.TTFT_ON, JOINT_BOUND) is None
