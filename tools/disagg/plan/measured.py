"""`disagg plan --calibrate`: the model's constants fitted on a `disagg bench` run of your own.

A run's JSON (``disagg bench`` or ``make bench-local``) holds every request; per prompt length
the medians of each leg become points: TTFT and prefill duration OFF and ON, and ON's D->P read
time. Each point is costed with what that turn measured (the prompt tokens, the tokens ON read
back, the new tokens handed to decode), on the deployment the run was made on: the run's
``setup.deployment`` (``make bench-local`` writes the rig's) or the one given on the command
line. The constants minimize the sum of squared relative errors (a run has many medians, each
with its own noise: under the published points' minimax fit one noisy point would set them), on
the run's shortest lengths when asked, and every point's error is reported, fitted or held out.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from disagg.bench.aggregate import Point, points
from disagg.bench.records import BenchResult, Leg
from disagg.plan import catalog
from disagg.plan.calibration import COST_OF, Quantity
from disagg.plan.model_spec import ModelConfigError, spec_from_hf_config
from disagg.plan.physics import Cost, Efficiency
from disagg.plan.predict import DEFAULT_MAX_BATCHED_TOKENS, Deployment, TurnCosts, turn_costs


@dataclass(frozen=True)
class MeasuredPoint:
    """One median a run measured, with the turn's token counts."""

    quantity: Quantity
    key: int
    prompt_tokens: int
    reused_tokens: int
    suffix_tokens: int
    ms: float


@dataclass(frozen=True)
class MeasuredError:
    """A measured point next to its prediction; ``fitted`` says whether the fit used it."""

    point: MeasuredPoint
    predicted_ms: float
    fitted: bool

    @property
    def relative_error(self) -> float:
        """(predicted - measured) / measured."""
        return self.predicted_ms / self.point.ms - 1


@dataclass(frozen=True)
class RunFit:
    """The constants fitted on a run, and every point's error under them."""

    deployment: Deployment
    efficiency: Efficiency
    errors: list[MeasuredError]
    fit_lengths: int
    lengths: int
    suffix_tokens: int

    def worst(self, fitted: bool) -> MeasuredError | None:
        """The largest |error| among the fitted (or the held-out) points."""
        chosen = [e for e in self.errors if e.fitted is fitted]
        return max(chosen, key=lambda e: abs(e.relative_error), default=None)


def _tokens(value: float | None) -> int:
    return round(value or 0.0)


def run_points(result: BenchResult) -> list[MeasuredPoint]:
    """Per prompt length (``key``: the turn), the medians of the OFF and ON legs as points."""
    on = {p.key: p for p in points(result.leg(Leg.ON))}
    off = {p.key: p for p in points(result.leg(Leg.OFF))}
    measured = []
    for key in sorted(on.keys() | off.keys()):
        on_point, off_point = on.get(key), off.get(key)
        reference = on_point or off_point
        assert reference is not None
        prompt = round(reference.prompt_tokens)
        reused = _tokens(on_point.reused_tokens) if on_point else 0
        suffix = prompt - reused
        legs: list[tuple[Point | None, Quantity, Quantity, int]] = [
            (off_point, Quantity.TTFT_OFF, Quantity.PREFILL_OFF, 0),
            (on_point, Quantity.TTFT_ON, Quantity.PREFILL_ON, reused),
        ]
        for point, ttft, prefill, leg_reused in legs:
            if point is None:
                continue
            tokens = round(point.prompt_tokens)
            measured.append(MeasuredPoint(ttft, key, tokens, leg_reused, suffix, point.ttft_ms))
            if point.prefill_ms is not None:
                measured.append(
                    MeasuredPoint(prefill, key, tokens, leg_reused, suffix, point.prefill_ms)
                )
        if on_point is not None and reused and on_point.kv_transfer_ms:
            measured.append(
                MeasuredPoint(
                    Quantity.KV_TRANSFER, key, prompt, reused, suffix, on_point.kv_transfer_ms
                )
            )
    return measured


def point_cost(deployment: Deployment, point: MeasuredPoint) -> Cost:
    """The model's cost terms for a measured point, with the turn's own token counts."""
    costs: TurnCosts = turn_costs(
        deployment, point.prompt_tokens, point.reused_tokens, point.suffix_tokens
    )
    return COST_OF[point.quantity](costs)


def run_deployment(result: BenchResult) -> dict[str, Any] | None:
    """The run's ``setup.deployment`` (model, gpu, tp, fabric, block_tokens,
    max_batched_tokens), if it has one."""
    recorded = result.setup.get("deployment")
    return dict(recorded) if isinstance(recorded, Mapping) else None


def deployment_from(recorded: Mapping[str, Any], name: str) -> Deployment:
    """A ``Deployment`` from a run's record: ``model`` is a catalog name or a config.json."""
    model = recorded.get("model")
    if isinstance(model, Mapping):
        spec = spec_from_hf_config(model, name)
    elif isinstance(model, str):
        spec = catalog.model(model)
    else:
        raise ModelConfigError("the run's setup.deployment.model must be a name or a config")
    try:
        return Deployment(
            model=spec,
            gpu=catalog.gpu(str(recorded["gpu"])),
            tp=int(recorded["tp"]),
            fabric=catalog.fabric(str(recorded["fabric"])),
            block_tokens=int(recorded.get("block_tokens", 0)),
            max_batched_tokens=int(recorded.get("max_batched_tokens", DEFAULT_MAX_BATCHED_TOKENS)),
        )
    except KeyError as exc:
        raise ModelConfigError(f"the run's setup.deployment lacks {exc.args[0]!r}") from None


# The acceptance bound: fitted on the shorter half of a CPU-leg run's lengths, TTFT off
# and on of the longer half predicted within 20%.
HELD_OUT_BOUND = 0.20
# Lower bounds of (t0, 1/eta_c, 1/eta_l): no negative overhead, no efficiency above 100%.
_LOWER = (0.0, 1.0, 1.0)


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; ``None`` when the system is singular."""
    size = len(vector)
    rows = [[*matrix[i], vector[i]] for i in range(size)]
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) < 1e-12 * max(1.0, max(abs(v) for v in rows[pivot][:size])):
            return None
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(size):
            if r != col:
                factor = rows[r][col] / rows[col][col]
                rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col], strict=True)]
    return [rows[i][size] / rows[i][i] for i in range(size)]


def fit_least_squares(rows: Sequence[tuple[Cost, float]]) -> Efficiency:
    """The constants that minimize the sum of squared relative errors of ``(cost, s)`` rows.

    A prediction is linear in ``x = (t0, 1/eta_c, 1/eta_l)``, so each row's relative error is
    ``a . x - 1`` with ``a = (steps, compute_s, link_s) / measured``: a bounded linear least-
    squares problem, solved exactly by trying each set of constants held at their bound.
    A constant no row depends on (no link time in a run without reads) stays at its bound.
    """
    if not rows:
        raise ValueError("no point to fit the constants on")
    design = [(c.steps / seconds, c.compute_s / seconds, c.link_s / seconds) for c, seconds in rows]

    def residual(x: Sequence[float]) -> float:
        return sum((sum(a * v for a, v in zip(row, x, strict=True)) - 1) ** 2 for row in design)

    best: tuple[float, list[float]] | None = None
    for held in itertools.chain.from_iterable(
        itertools.combinations(range(3), k) for k in range(4)
    ):
        free = [i for i in range(3) if i not in held]
        x = list(_LOWER)
        if free:
            targets = [1 - sum(row[i] * _LOWER[i] for i in held) for row in design]
            normal = [[sum(row[i] * row[j] for row in design) for j in free] for i in free]
            rhs = [sum(row[i] * t for row, t in zip(design, targets, strict=True)) for i in free]
            solved = _solve(normal, rhs)
            if solved is None or any(v < _LOWER[i] for i, v in zip(free, solved, strict=True)):
                continue
            for i, value in zip(free, solved, strict=True):
                x[i] = value
        score = residual(x)
        if best is None or score < best[0]:
            best = (score, x)
    assert best is not None, "holding every constant at its bound is always feasible"
    t0, inv_compute, inv_link = best[1]
    return Efficiency(compute=1 / inv_compute, link=1 / inv_link, fixed_overhead_s=t0)


def typical_suffix(measured: Sequence[MeasuredPoint]) -> int:
    """The run's median new tokens per turn (over the turns that reused a prefix)."""
    suffixes = [p.suffix_tokens for p in measured if p.reused_tokens]
    if not suffixes:
        suffixes = [p.suffix_tokens for p in measured]
    return round(median(suffixes))


def fit_run(result: BenchResult, deployment: Deployment, fit_lengths: int | None = None) -> RunFit:
    """Fit the constants on the run's ``fit_lengths`` shortest lengths (all by default)."""
    measured = run_points(result)
    if not measured:
        raise ValueError("the run has no ON or OFF record to fit on")
    first_prompt: dict[int, int] = {}
    for p in measured:
        first_prompt.setdefault(p.key, p.prompt_tokens)
    keys = sorted(first_prompt, key=first_prompt.__getitem__)
    count = len(keys) if fit_lengths is None else fit_lengths
    if not 1 <= count <= len(keys):
        raise ValueError(f"--fit-shortest must be in 1..{len(keys)} (the run's lengths)")
    chosen = set(keys[:count])
    fitted = [p for p in measured if p.key in chosen]
    eff = fit_least_squares([(point_cost(deployment, p), p.ms / 1e3) for p in fitted])
    errors = [
        MeasuredError(p, point_cost(deployment, p).seconds(eff) * 1e3, p.key in chosen)
        for p in measured
    ]
    return RunFit(deployment, eff, errors, count, len(keys), typical_suffix(measured))
