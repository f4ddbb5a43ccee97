"""The published P5en points, the fit of the three efficiency constants, and its errors.

Source: the seed article (``shared/seed``), "Données de performance": 1 prefill + 1 decode
p5en.48xlarge (8 x H200, EFA), TP 8, prefix caching off on prefill. Each published range runs
from the 2k prompt to the longest one (24k for Qwen3-32B, 20k for GLM-5-FP8); "2k" is read
as 2,000 tokens.

Every prediction is ``steps * t0 + compute_s / eta_f + link_s / eta_l``: linear in
``(t0, 1/eta_f, 1/eta_l)``. The fit minimizes the largest relative error over the chosen
points (a convex problem), by nested golden-section search.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from disagg.plan import catalog
from disagg.plan.physics import Cost, Efficiency
from disagg.plan.predict import Deployment, TurnCosts, turn_costs


class Quantity(enum.Enum):
    """A published quantity and the seed's name for where it was measured."""

    TTFT_OFF = "TTFT off"
    TTFT_ON = "TTFT on"
    PREFILL_OFF = "prefill off"
    PREFILL_ON = "prefill on"
    KV_TRANSFER = "KV transfer"


COST_OF: dict[Quantity, Callable[[TurnCosts], Cost]] = {
    # Which of a turn's cost terms each quantity is.
    Quantity.TTFT_OFF: lambda c: c.ttft_off,
    Quantity.TTFT_ON: lambda c: c.ttft_on,
    Quantity.PREFILL_OFF: lambda c: c.prefill_off,
    Quantity.PREFILL_ON: lambda c: c.prefill_on,
    Quantity.KV_TRANSFER: lambda c: c.kv_transfer,
}


@dataclass(frozen=True)
class PublishedPoint:
    """One number the seed publishes for a model at a prompt length."""

    model: str
    quantity: Quantity
    prompt_tokens: int
    ms: float


def _ranges(
    model: str, longest: int, values: dict[Quantity, tuple[float, float]]
) -> list[PublishedPoint]:
    return [
        PublishedPoint(model, quantity, tokens, ms)
        for quantity, pair in values.items()
        for tokens, ms in zip((2000, longest), pair, strict=True)
    ]


PUBLISHED_POINTS: tuple[PublishedPoint, ...] = (
    *_ranges(
        "qwen3-32b",
        24000,
        {
            Quantity.TTFT_OFF: (158, 778),
            Quantity.TTFT_ON: (122, 460),
            Quantity.PREFILL_OFF: (153, 744),
            Quantity.PREFILL_ON: (128, 414),
            Quantity.KV_TRANSFER: (30, 130),
        },
    ),
    *_ranges(
        "glm-5-fp8",
        20000,
        {
            Quantity.TTFT_OFF: (500, 2334),
            Quantity.TTFT_ON: (358, 702),
            Quantity.PREFILL_OFF: (500, 2331),
            Quantity.PREFILL_ON: (316, 541),
            Quantity.KV_TRANSFER: (29, 110),
        },
    ),
)

PUBLISHED_MODELS = ("qwen3-32b", "glm-5-fp8")


def published_deployment(model: str) -> Deployment:
    """The seed's deployment for ``model``: H200, TP 8, p5en EFA."""
    return Deployment(catalog.model(model), catalog.gpu("h200"), 8, catalog.fabric("p5en-efa"))


def point_cost(point: PublishedPoint) -> Cost:
    """The model's cost terms for a published point."""
    costs = turn_costs(published_deployment(point.model), point.prompt_tokens)
    return COST_OF[point.quantity](costs)


@dataclass(frozen=True)
class PointError:
    """A published point next to its prediction."""

    point: PublishedPoint
    predicted_ms: float

    @property
    def relative_error(self) -> float:
        """(predicted - published) / published."""
        return self.predicted_ms / self.point.ms - 1


def errors(
    eff: Efficiency, points: Iterable[PublishedPoint] = PUBLISHED_POINTS
) -> list[PointError]:
    """Prediction and relative error of every point under ``eff``."""
    return [PointError(p, point_cost(p).seconds(eff) * 1e3) for p in points]


def max_abs_error(errs: Sequence[PointError]) -> float:
    """The largest |relative error|."""
    return max(abs(e.relative_error) for e in errs)


_GOLDEN = (math.sqrt(5) - 1) / 2
_ITERATIONS = 48
# Search boxes: t0 in [0, 2 s]; 1/eta in [1, 1000] (eta from 0.1% to 100% of peak).
_T0_RANGE = (0.0, 2.0)
_INVERSE_RANGE = (1.0, 1000.0)


def _golden_min(f: Callable[[float], float], low: float, high: float) -> tuple[float, float]:
    """Minimum of a convex function on [low, high]: (argmin, value)."""
    a, b = low, high
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(_ITERATIONS):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = f(d)
    best = min(((low, f(low)), (c, fc), (d, fd), (high, f(high))), key=lambda pair: pair[1])
    return best


def fit(points: Sequence[PublishedPoint]) -> Efficiency:
    """The constants that minimize the largest relative error over ``points``."""
    return fit_costs([(point_cost(p), p.ms / 1e3) for p in points])


def fit_costs(rows: Sequence[tuple[Cost, float]]) -> Efficiency:
    """The constants that minimize the largest relative error of ``(cost, seconds)`` rows."""
    if not rows:
        raise ValueError("no point to fit the constants on")

    def worst(t0: float, inv_compute: float, inv_link: float) -> float:
        return max(
            abs((c.steps * t0 + c.compute_s * inv_compute + c.link_s * inv_link) / v - 1)
            for c, v in rows
        )

    def best_t0(inv_compute: float, inv_link: float) -> tuple[float, float]:
        return _golden_min(lambda t0: worst(t0, inv_compute, inv_link), *_T0_RANGE)

    def best_link(inv_compute: float) -> tuple[float, float]:
        return _golden_min(lambda w: best_t0(inv_compute, w)[1], *_INVERSE_RANGE)

    inv_compute, _ = _golden_min(lambda u: best_link(u)[1], *_INVERSE_RANGE)
    inv_link, _ = best_link(inv_compute)
    t0, _ = best_t0(inv_compute, inv_link)
    return Efficiency(compute=1 / inv_compute, link=1 / inv_link, fixed_overhead_s=t0)


def points_of(*models: str) -> tuple[PublishedPoint, ...]:
    """The published points of the given models."""
    return tuple(p for p in PUBLISHED_POINTS if p.model in models)


# The acceptance bounds: fitted on both models, every point within 20%; fitted on
# Qwen3-32B alone, every GLM-5-FP8 point within 25%.
JOINT_BOUND = 0.20
CROSS_MODEL_BOUND = 0.25

# The fit over both models' published points (`disagg plan --calibration-report` refits it;
# tests/unit/test_plan_calibration.py checks these digits against a fresh fit).
CALIBRATED = Efficiency(compute=0.3171, link=0.4916, fixed_overhead_s=0.04175)
# Its worst relative error over those points (the same test checks it), printed with every plan.
CALIBRATED_WORST_ERROR = 0.70
