"""Text and JSON renderings of a plan, of the published-points calibration and of a fit on a run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from disagg.plan import calibration
from disagg.plan.calibration import PointError, PublishedPoint, Quantity
from disagg.plan.feasibility import GrowthCheck, growth_checks
from disagg.plan.measured import HELD_OUT_BOUND, MeasuredError, RunFit
from disagg.plan.physics import Efficiency, kv_bytes_per_token_per_gpu
from disagg.plan.predict import Deployment, Prediction


@dataclass(frozen=True)
class Plan:
    """Everything `disagg plan` reports for one deployment."""

    deployment: Deployment
    efficiency: Efficiency
    predictions: Sequence[Prediction]
    recompute_threshold: int | None
    source: str | None = None
    """Where the constants come from when not the command line or the shipped calibration."""


def _align(rows: Sequence[Sequence[str]]) -> list[str]:
    """Right-align columns of text cells."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]


def _describe_model(deployment: Deployment) -> str:
    spec = deployment.model
    per_token = kv_bytes_per_token_per_gpu(spec, deployment.tp)
    moe = f", MoE {spec.moe.experts_per_token}/{spec.moe.experts} experts" if spec.moe else ""
    sparse = f", sparse attention top-{spec.sparse.top_k}" if spec.sparse else ""
    return (
        f"model {spec.name}: {spec.attention.value.upper()}{moe}{sparse}, "
        f"{spec.params / 1e9:.1f}B params ({spec.active_params / 1e9:.1f}B active), "
        f"weights {spec.weight_dtype}, KV {spec.kv_dtype}: {per_token / 1024:.1f} KiB/token per GPU"
    )


def _describe_deployment(deployment: Deployment) -> str:
    gb_s = deployment.fabric.bytes_per_s_per_gpu / 1e9
    return (
        f"deployment: TP {deployment.tp} x {deployment.gpu.name}, {deployment.fabric.name}: "
        f"{gb_s:.0f} GB/s per GPU; {deployment.suffix_tokens} new tokens per turn, "
        f"KV block {deployment.block} tokens"
    )


def describe_efficiency(eff: Efficiency) -> str:
    """The three constants in words."""
    return (
        f"compute {eff.compute:.1%} of the roofline, link {eff.link:.1%} of line rate, "
        f"fixed overhead {eff.fixed_overhead_s * 1e3:.1f} ms per step"
    )


def _calibration_note(eff: Efficiency) -> str:
    shipped = calibration.CALIBRATED
    if not all(
        math.isclose(getattr(eff, field), getattr(shipped, field), rel_tol=1e-9)
        for field in ("compute", "link", "fixed_overhead_s")
    ):
        return "constants set on the command line (not the published-point calibration)"
    return (
        "calibrated on the published P5en points of Qwen3-32B and GLM-5-FP8; worst point off by "
        f"{calibration.CALIBRATED_WORST_ERROR:.0%} (disagg plan --calibration-report)"
    )


def _threshold_text(threshold: int | None) -> str:
    if threshold is None:
        return (
            "never: on this fabric a KV read never beats recompute; leave bidirectional reuse off"
        )
    return f"{threshold} tokens (below it recompute is cheaper than a KV read)"


def plan_text(plan: Plan) -> str:
    """The plan as a table with its header and the suggested threshold."""
    header = [
        _describe_model(plan.deployment),
        _describe_deployment(plan.deployment),
        f"constants: {describe_efficiency(plan.efficiency)}",
        plan.source or _calibration_note(plan.efficiency),
        "",
    ]
    columns = ("prompt", "reused", "TTFT off", "TTFT on", "off/on", "KV/GPU", "KV read", "floor")
    units = ("tokens", "tokens", "ms", "ms", "", "MB", "ms", "ms")
    rows = [columns, units]
    rows += [
        (
            str(p.prompt_tokens),
            str(p.reused_tokens),
            f"{p.ttft_off_ms:.0f}",
            f"{p.ttft_on_ms:.0f}",
            f"{p.speedup:.2f}x",
            f"{p.kv_bytes_per_gpu / 1e6:.1f}",
            f"{p.kv_transfer_ms:.1f}",
            f"{p.kv_floor_ms:.1f}",
        )
        for p in plan.predictions
    ]
    table = _align(rows)
    footer = [
        "",
        "floor = KV bytes per GPU / the GPU's RDMA line rate (no overhead, 100% of the link)",
        f"suggested recomputeThresholdTokens: {_threshold_text(plan.recompute_threshold)}",
    ]
    return "\n".join(header + table + footer) + "\n"


def plan_json(plan: Plan) -> dict[str, Any]:
    """The plan as JSON-ready data."""
    deployment = plan.deployment
    spec = deployment.model
    return {
        "model": {
            "name": spec.name,
            "attention": spec.attention.value,
            "params": spec.params,
            "active_params": spec.active_params,
            "weight_dtype": spec.weight_dtype,
            "kv_dtype": spec.kv_dtype,
            "kv_bytes_per_token_per_gpu": kv_bytes_per_token_per_gpu(spec, deployment.tp),
        },
        "deployment": {
            "gpu": deployment.gpu.name,
            "tp": deployment.tp,
            "fabric": deployment.fabric.name,
            "link_bytes_per_s_per_gpu": deployment.fabric.bytes_per_s_per_gpu,
            "suffix_tokens": deployment.suffix_tokens,
            "block_tokens": deployment.block,
        },
        "efficiency": {
            "compute": plan.efficiency.compute,
            "link": plan.efficiency.link,
            "fixed_overhead_ms": plan.efficiency.fixed_overhead_s * 1e3,
        },
        "predictions": [
            {
                "prompt_tokens": p.prompt_tokens,
                "reused_tokens": p.reused_tokens,
                "ttft_off_ms": p.ttft_off_ms,
                "ttft_on_ms": p.ttft_on_ms,
                "prefill_off_ms": p.prefill_off_ms,
                "prefill_on_ms": p.prefill_on_ms,
                "kv_transfer_ms": p.kv_transfer_ms,
                "kv_floor_ms": p.kv_floor_ms,
                "kv_bytes_per_gpu": p.kv_bytes_per_gpu,
            }
            for p in plan.predictions
        ],
        "recompute_threshold_tokens": plan.recompute_threshold,
    }


@dataclass(frozen=True)
class CalibrationReport:
    """Both acceptance fits, each model fitted alone, and every point's error."""

    joint: Efficiency
    qwen_only: Efficiency
    alone: dict[str, Efficiency]

    @classmethod
    def compute(cls) -> CalibrationReport:
        """Run the fits on the published points."""
        qwen, glm = calibration.PUBLISHED_MODELS
        return cls(
            joint=calibration.fit(calibration.PUBLISHED_POINTS),
            qwen_only=calibration.fit(calibration.points_of(qwen)),
            alone={glm: calibration.fit(calibration.points_of(glm))},
        )

    def joint_max_error(self) -> float:
        """Largest |error| of the joint fit over every published point."""
        return calibration.max_abs_error(calibration.errors(self.joint))

    def cross_model_max_error(self) -> float:
        """Largest |error| on GLM-5-FP8's points of the fit on Qwen3-32B's points alone."""
        glm_points = calibration.points_of(calibration.PUBLISHED_MODELS[1])
        return calibration.max_abs_error(calibration.errors(self.qwen_only, glm_points))


def _verdict(error: float, bound: float) -> str:
    return f"{error:.0%} (bound {bound:.0%}: {'met' if error <= bound else 'NOT met'})"


def _row(point: PublishedPoint, errs: Sequence[PointError]) -> list[str]:
    cells = [point.model, point.quantity.value, str(point.prompt_tokens), f"{point.ms:.0f}"]
    for err in errs:
        cells += [f"{err.predicted_ms:.0f}", f"{err.relative_error:+.0%}"]
    return cells


def _interval(low: float, high: float) -> str:
    return f"{max(low, 0):.2f}x..{high:.2f}x" if math.isfinite(high) else f">= {low:.2f}x"


def growth_text() -> list[str]:
    """Why no constants meet the bounds: each single-term growth ratio against its window."""
    bounds = (calibration.JOINT_BOUND, calibration.CROSS_MODEL_BOUND)
    by_bound: list[list[GrowthCheck]] = [growth_checks(bound) for bound in bounds]
    rows = [
        ["quantity", "grows by", "published", *(f"within {b:.0%} needs" for b in bounds), "physics"]
    ]
    for checks in zip(*by_bound, strict=True):
        first = checks[0]
        rows.append(
            [
                first.quantity.value,
                first.term,
                f"{first.published_ratio:.2f}x",
                *(_interval(*check.allowed) for check in checks),
                f"{first.model_ratio:.2f}x",
            ]
        )
    return [
        "growth from 2k to the longest prompt, GLM-5-FP8 over Qwen3-32B: each quantity below",
        "grows by one physical term over one constant, so the constants cancel from the ratio;",
        "predictions within the bound of every point need the ratio inside the window",
        *_align(rows),
    ]


def _worst_text(errs: Sequence[PointError]) -> str:
    worst = max(errs, key=lambda e: abs(e.relative_error))
    point = worst.point
    return (
        f"{abs(worst.relative_error):.0%} ({point.quantity.value} at {point.prompt_tokens} "
        f"tokens, {worst.relative_error:+.0%})"
    )


def calibration_text(report: CalibrationReport) -> str:
    """Every published point with its predictions under the joint fit, the fit on Qwen3-32B
    and its own model's fit alone, then the verdicts and each model's worst point alone."""
    qwen, glm = calibration.PUBLISHED_MODELS
    glm_alone = report.alone[glm]
    points = calibration.PUBLISHED_POINTS
    joint = calibration.errors(report.joint, points)
    cross = calibration.errors(report.qwen_only, points)
    own_fit = {qwen: report.qwen_only, glm: glm_alone}
    alone = [calibration.errors(own_fit[p.model], [p])[0] for p in points]
    glm_self = [e for e in alone if e.point.model == glm]
    qwen_self = [e for e in alone if e.point.model == qwen]
    rows = [
        ["model", "quantity", "tokens", "published", "fit both", "error", "fit Qwen", "error",
         "fit alone", "error"],
        ["", "", "", "ms", "ms", "", "ms", "", "ms", ""],
    ]  # fmt: skip
    rows += [_row(p, (a, b, c)) for p, a, b, c in zip(points, joint, cross, alone, strict=True)]
    table = _align(rows)
    lines = [
        "Calibration on the published AWS P5en points (1P1D, 8 x H200 per node, TP 8, EFA)",
        f"fit both models:     {describe_efficiency(report.joint)}",
        f"fit Qwen3-32B alone: {describe_efficiency(report.qwen_only)}",
        f"fit GLM-5-FP8 alone: {describe_efficiency(glm_alone)}",
        "",
        *table,
        "",
        f"fitted on both models, worst point: "
        f"{_verdict(report.joint_max_error(), calibration.JOINT_BOUND)}",
        f"fitted on Qwen3-32B alone, worst GLM-5-FP8 point: "
        f"{_verdict(report.cross_model_max_error(), calibration.CROSS_MODEL_BOUND)}",
        f"Qwen3-32B fitted alone, worst own point: {_worst_text(qwen_self)}",
        f"GLM-5-FP8 fitted alone, worst own point: {_worst_text(glm_self)}",
        f"implied compute efficiency: Qwen3-32B {report.qwen_only.compute:.1%}, "
        f"GLM-5-FP8 {glm_alone.compute:.1%} of the roofline",
        "",
        *growth_text(),
    ]
    return "\n".join(lines) + "\n"


def _measured_row(err: MeasuredError) -> list[str]:
    point = err.point
    return [
        point.quantity.value,
        str(point.prompt_tokens),
        str(point.reused_tokens),
        f"{point.ms:.0f}",
        f"{err.predicted_ms:.0f}",
        f"{err.relative_error:+.0%}",
        "fit" if err.fitted else "held out",
    ]


def _where(err: MeasuredError | None) -> str:
    if err is None:
        return "none"
    point = err.point
    return f"{err.relative_error:+.0%} ({point.quantity.value} at {point.prompt_tokens} tokens)"


_TTFT = (Quantity.TTFT_OFF, Quantity.TTFT_ON)


def held_out_ttft_error(fitted: RunFit) -> float | None:
    """Largest |error| of TTFT off and on over the held-out lengths (``None``: none held out)."""
    held = [e for e in fitted.errors if not e.fitted and e.point.quantity in _TTFT]
    return max((abs(e.relative_error) for e in held), default=None)


def run_fit_text(fitted: RunFit, source: str) -> str:
    """The constants fitted on a run, every point's error, the worst fitted and held out."""
    deployment = fitted.deployment
    fit_range = (
        f"all {fitted.lengths} lengths"
        if fitted.fit_lengths == fitted.lengths
        else f"the {fitted.fit_lengths} shortest of {fitted.lengths} lengths"
    )
    rows = [
        ["quantity", "prompt", "reused", "measured", "predicted", "error", ""],
        ["", "tokens", "tokens", "ms", "ms", "", ""],
    ]
    rows += [_measured_row(err) for err in fitted.errors]
    lines = [
        f"Calibration on {source} (least squares of the relative errors)",
        _describe_model(deployment),
        f"measured on: TP {deployment.tp} x {deployment.gpu.name}, {deployment.fabric.name}",
        f"fitted on {fit_range}: {describe_efficiency(fitted.efficiency)}",
        "",
        *_align(rows),
        "",
        f"worst fitted point: {_where(fitted.worst(fitted=True))}",
    ]
    held = held_out_ttft_error(fitted)
    if held is not None:
        lines += [
            f"worst held-out point: {_where(fitted.worst(fitted=False))}",
            f"held-out TTFT off and on, worst: {_verdict(held, HELD_OUT_BOUND)}",
        ]
    eff = fitted.efficiency
    lines += [
        "the same constants for another shape: disagg plan --model ... --gpu ... --tp ... "
        f"--compute-efficiency {eff.compute:.4f} --link-efficiency {eff.link:.4f} "
        f"--fixed-overhead-ms {eff.fixed_overhead_s * 1e3:.2f}",
    ]
    return "\n".join(lines) + "\n"


def run_fit_json(fitted: RunFit, source: str) -> dict[str, Any]:
    """The fit on a run as JSON-ready data."""
    eff = fitted.efficiency
    return {
        "run": source,
        "fit_lengths": fitted.fit_lengths,
        "lengths": fitted.lengths,
        "efficiency": {
            "compute": eff.compute,
            "link": eff.link,
            "fixed_overhead_ms": eff.fixed_overhead_s * 1e3,
        },
        "points": [
            {
                "quantity": err.point.quantity.value,
                "prompt_tokens": err.point.prompt_tokens,
                "reused_tokens": err.point.reused_tokens,
                "measured_ms": err.point.ms,
                "predicted_ms": err.predicted_ms,
                "relative_error": err.relative_error,
                "fitted": err.fitted,
            }
            for err in fitted.errors
        ],
        "held_out_ttft_max_error": held_out_ttft_error(fitted),
    }
