"""Calibration on the published P5en points: the fit, its errors, and the docs that state them.

The issue asks for every point within 20% (fit on both models) and GLM-5-FP8 within 25% (fit on
Qwen3-32B alone). The errors below are computed from the model, not assumed; docs/plan.md
quotes them verbatim (the last test keeps it in step) and explains why the bounds are not met.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from disagg.plan import calibration
from disagg.plan.calibration import (
    CALIBRATED,
    PUBLISHED_POINTS,
    Quantity,
    errors,
    max_abs_error,
    points_of,
)
from disagg.plan.physics import Efficiency
from disagg.plan.report import CalibrationReport, calibration_text

DOC = Path(__file__).resolve().parents[2] / "docs" / "plan.md"


@pytest.fixture(scope="module")
def report() -> CalibrationReport:
    return CalibrationReport.compute()


def test_every_published_number_is_a_point() -> None:
    assert len(PUBLISHED_POINTS) == 20
    by_key = {(p.model, p.quantity, p.prompt_tokens): p.ms for p in PUBLISHED_POINTS}
    assert by_key["qwen3-32b", Quantity.TTFT_OFF, 24000] == 778
    assert by_key["glm-5-fp8", Quantity.TTFT_ON, 20000] == 702
    assert by_key["glm-5-fp8", Quantity.KV_TRANSFER, 2000] == 29


def test_shipped_constants_are_the_joint_fit(report: CalibrationReport) -> None:
    assert report.joint.compute == pytest.approx(CALIBRATED.compute, rel=1e-3)
    assert report.joint.link == pytest.approx(CALIBRATED.link, rel=1e-3)
    assert report.joint.fixed_overhead_s == pytest.approx(CALIBRATED.fixed_overhead_s, abs=5e-5)
    assert report.joint_max_error() == pytest.approx(calibration.CALIBRATED_WORST_ERROR, abs=0.005)


@pytest.mark.parametrize("fit_name", ["joint", "qwen_only"])
def test_fit_is_minimax_optimal_locally(report: CalibrationReport, fit_name: str) -> None:
    fitted: Efficiency = getattr(report, fit_name)
    points = PUBLISHED_POINTS if fit_name == "joint" else points_of("qwen3-32b")
    best = max_abs_error(errors(fitted, points))
    for field in ("compute", "link", "fixed_overhead_s"):
        for factor in (0.98, 1.02):
            value = getattr(fitted, field) * factor
            if field != "fixed_overhead_s":
                value = min(value, 1.0)
            moved = dataclasses.replace(fitted, **{field: value})
            assert max_abs_error(errors(moved, points)) >= best - 1e-6


def test_acceptance_errors_are_computed_from_the_model(report: CalibrationReport) -> None:
    joint = errors(report.joint)
    assert report.joint_max_error() == max(abs(e.relative_error) for e in joint)
    glm = points_of("glm-5-fp8")
    cross = errors(report.qwen_only, glm)
    assert report.cross_model_max_error() == max(abs(e.relative_error) for e in cross)
    for err in joint:
        assert err.predicted_ms == pytest.approx(
            calibration.point_cost(err.point).seconds(report.joint) * 1e3
        )


def test_docs_state_the_computed_errors(report: CalibrationReport) -> None:
    text = calibration_text(report)
    assert text in DOC.read_text(encoding="utf-8"), (
        "docs/plan.md must quote `disagg plan --calibration-report` verbatim; regenerate it"
    )
