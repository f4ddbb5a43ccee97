"""Whether any three shared constants can fit both models' published growth within a bound.

From the 2k point to the longest one, a quantity predicted as ``t0 + term / eta`` (one step,
one physical term) grows by ``term growth / eta``; ``t0`` cancels, and the ratio of GLM-5-FP8's
growth to Qwen3-32B's is the ratio of their physical terms, whatever the constants. Every
point within ``bound`` of the published one confines that ratio to an interval; when the
physics lands outside it, no fit of the constants can meet the bound. Quantities whose growth
mixes two terms (the ON leg: a read and a suffix) are not decided this way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from disagg.plan.calibration import (
    PUBLISHED_MODELS,
    PUBLISHED_POINTS,
    PublishedPoint,
    Quantity,
    point_cost,
)
from disagg.plan.physics import Cost


@dataclass(frozen=True)
class GrowthCheck:
    """One quantity's growth ratio (GLM-5-FP8 over Qwen3-32B): published, allowed, physical."""

    quantity: Quantity
    term: str
    published_ratio: float
    allowed: tuple[float, float]
    model_ratio: float

    @property
    def feasible(self) -> bool:
        """Whether the physics' ratio lies where every point can be within the bound."""
        low, high = self.allowed
        return low <= self.model_ratio <= high


def _endpoints(
    model: str, quantity: Quantity, points: tuple[PublishedPoint, ...]
) -> tuple[PublishedPoint, PublishedPoint]:
    mine = sorted(
        (p for p in points if p.model == model and p.quantity is quantity),
        key=lambda p: p.prompt_tokens,
    )
    return mine[0], mine[-1]


def _single_term_growth(short: PublishedPoint, long: PublishedPoint) -> tuple[str, float] | None:
    """The one physical term the prediction grows by, and that growth; None if it mixes terms."""
    low, high = point_cost(short), point_cost(long)
    growth = Cost(high.steps - low.steps, high.compute_s - low.compute_s, high.link_s - low.link_s)
    terms = {"compute": growth.compute_s, "link": growth.link_s}
    nonzero = [(name, value) for name, value in terms.items() if value != 0]
    if growth.steps != 0 or len(nonzero) != 1:
        return None
    return nonzero[0]


def growth_check(
    quantity: Quantity, bound: float, points: tuple[PublishedPoint, ...] = PUBLISHED_POINTS
) -> GrowthCheck | None:
    """The check for ``quantity`` at relative ``bound``; None when its growth mixes terms."""
    qwen, glm = PUBLISHED_MODELS
    q_short, q_long = _endpoints(qwen, quantity, points)
    g_short, g_long = _endpoints(glm, quantity, points)
    q_growth = _single_term_growth(q_short, q_long)
    g_growth = _single_term_growth(g_short, g_long)
    if q_growth is None or g_growth is None or q_growth[0] != g_growth[0]:
        return None
    up, down = 1 + bound, 1 - bound
    lowest = (down * g_long.ms - up * g_short.ms) / (up * q_long.ms - down * q_short.ms)
    smallest_q_growth = down * q_long.ms - up * q_short.ms
    highest = (
        (up * g_long.ms - down * g_short.ms) / smallest_q_growth
        if smallest_q_growth > 0
        else math.inf
    )
    return GrowthCheck(
        quantity=quantity,
        term=q_growth[0],
        published_ratio=(g_long.ms - g_short.ms) / (q_long.ms - q_short.ms),
        allowed=(lowest, highest),
        model_ratio=g_growth[1] / q_growth[1],
    )


def growth_checks(bound: float) -> list[GrowthCheck]:
    """The check of every quantity that grows by a single physical term."""
    checks = (growth_check(quantity, bound) for quantity in Quantity)
    return [check for check in checks if check is not None]
