"""The two figures per model: TTFT vs prompt length, and prefill duration as stacked bars.

Both show the FLOOR leg when the run has one: the TTFT figure its floor line (FLOOR's TTFT plus
ON's D->P read time), the prefill figure a third bar per length.

Built on ``matplotlib.figure.Figure`` (no pyplot, no global backend state).
"""

from __future__ import annotations

import re
from pathlib import Path

from matplotlib.figure import Figure

from disagg.bench.aggregate import Point, Row

ON_COLOR, OFF_COLOR, XFER_COLOR, FLOOR_COLOR = "#1f77b4", "#7f7f7f", "#ff7f0e", "#2ca02c"
_SECONDS_ABOVE_MS = 5000.0


def slug(model: str) -> str:
    """A file-name-safe form of a model name (``Qwen/Qwen3-32B`` -> ``qwen-qwen3-32b``)."""
    return re.sub(r"[^a-z0-9.]+", "-", model.lower()).strip("-") or "model"


def _time_unit(values: list[float]) -> tuple[str, float]:
    """Seconds for slow runs (CPU), milliseconds otherwise."""
    return ("s", 1000.0) if max(values, default=0.0) > _SECONDS_ABOVE_MS else ("ms", 1.0)


def _tokens_label(tokens: float) -> str:
    return f"{tokens / 1000:.1f}k" if tokens >= 1000 else f"{tokens:.0f}"


def floor_points(on: list[Point], floor: list[Point]) -> list[tuple[float, float]]:
    """(prompt tokens, floor ms) where both legs measured a group: FLOOR's TTFT + ON's read."""
    by_key = {p.key: p for p in floor}
    result = []
    for point in on:
        floor_ms = Row(point, floor=by_key.get(point.key)).floor_ms
        if floor_ms is not None:
            result.append((point.prompt_tokens, floor_ms))
    return result


def ttft_figure(
    on: list[Point],
    off: list[Point],
    model: str,
    subtitle: str = "",
    floor: list[Point] | None = None,
) -> Figure:
    """TTFT (median per length) against prompt length, one line per leg, and ON's floor."""
    floor_line = floor_points(on, floor or [])
    unit, scale = _time_unit([p.ttft_ms for p in on + off] + [ms for _, ms in floor_line])
    figure = Figure(figsize=(8, 5), dpi=110)
    axes = figure.add_subplot()
    for leg_points, label, color, marker in (
        (off, "OFF: prefill recomputes the history", OFF_COLOR, "s"),
        (on, "ON: bidirectional KV reuse (D->P read)", ON_COLOR, "o"),
    ):
        if leg_points:
            axes.plot(
                [p.prompt_tokens for p in leg_points],
                [p.ttft_ms / scale for p in leg_points],
                marker=marker,
                color=color,
                label=label,
            )
    if floor_line:
        axes.plot(
            [tokens for tokens, _ in floor_line],
            [ms / scale for _, ms in floor_line],
            marker="^",
            linestyle="--",
            color=FLOOR_COLOR,
            label="floor: prefix in prefill's own cache + ON's D->P read time",
        )
    if on and off:
        longest_on, longest_off = on[-1], off[-1]
        axes.annotate(
            f"OFF/ON {longest_off.ttft_ms / longest_on.ttft_ms:.1f}x",
            xy=(longest_on.prompt_tokens, longest_on.ttft_ms / scale),
            xytext=(-8, 12),
            textcoords="offset points",
            ha="right",
        )
    if floor_line and floor_line[-1][0] == on[-1].prompt_tokens:
        tokens, floor_ms = floor_line[-1]
        axes.annotate(
            f"ON/floor {on[-1].ttft_ms / floor_ms:.2f}x",
            xy=(tokens, floor_ms / scale),
            xytext=(-8, -16),
            textcoords="offset points",
            ha="right",
        )
    axes.set_xlabel("prompt length (tokens)")
    axes.set_ylabel(f"time to first token ({unit})")
    axes.set_title(f"{model}: TTFT vs prompt length" + (f"\n{subtitle}" if subtitle else ""))
    axes.set_ylim(bottom=0)
    axes.set_xlim(left=0)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="upper left")
    figure.tight_layout()
    return figure


def prefill_figure(
    on: list[Point],
    off: list[Point],
    model: str,
    subtitle: str = "",
    floor: list[Point] | None = None,
) -> Figure:
    """Bars per length (per group key, labelled by ON's prompt length): OFF prefill, ON
    prefill (compute + KV transfer) and FLOOR's prefill, for the legs that ran.

    FLOOR's bar carries ON's D->P read time on top, as the floor does.
    """
    floor = floor or []
    legs = [
        (leg, leg_points, color)
        for leg, leg_points, color in (
            ("off", off, OFF_COLOR),
            ("on", on, ON_COLOR),
            ("floor", floor, FLOOR_COLOR),
        )
        if leg_points
    ]
    by_key = {leg: {p.key: p for p in leg_points} for leg, leg_points, _ in legs}
    tokens: dict[int, float] = {}
    for leg in ("on", "off", "floor"):
        for key, point in by_key.get(leg, {}).items():
            tokens.setdefault(key, point.prompt_tokens)
    lengths = sorted(tokens, key=tokens.__getitem__)
    unit, scale = _time_unit([p.prefill_ms or 0.0 for p in on + off + floor])
    figure = Figure(figsize=(9, 5), dpi=110)
    axes = figure.add_subplot()
    width = 0.76 / len(legs)
    positions = list(range(len(lengths)))
    measured = any(p.kv_transfer_ms is not None for p in on)
    part = "compute" if measured else "prefill"
    transfer_ms = [_transfer(by_key.get("on", {}).get(n)) for n in lengths]
    leg_labels = {
        "off": f"OFF: {part}",
        "on": f"ON: {part}",
        "floor": "FLOOR: prefill, prefix in its own cache",
    }
    for index, (leg, _, color) in enumerate(legs):
        offset = (index - (len(legs) - 1) / 2) * width
        compute = [_compute(by_key[leg].get(n)) / scale for n in lengths]
        xs = [x + offset for x in positions]
        axes.bar(xs, compute, width, color=color, label=leg_labels[leg])
        if leg == "on" and measured:
            stacked = axes.bar(
                xs,
                [ms / scale for ms in transfer_ms],
                width,
                bottom=compute,
                color=XFER_COLOR,
                label="ON: KV transfer D->P",
            )
            texts = [f"KV {ms:.0f} ms" if ms else "" for ms in transfer_ms]
            axes.bar_label(stacked, labels=texts, fontsize=7, padding=3, rotation=90)
        if leg == "floor" and measured:
            axes.bar(
                xs,
                [ms / scale for ms in transfer_ms],
                width,
                bottom=compute,
                color=XFER_COLOR,
                hatch="//",
                label="FLOOR: + ON's D->P read time",
            )
    axes.set_xticks(positions, [_tokens_label(tokens[n]) for n in lengths])
    axes.set_xlabel("prompt length (tokens)")
    axes.set_ylabel(f"prefill duration ({unit})")
    title = "OFF vs ON vs floor" if floor else "OFF vs ON"
    axes.set_title(
        f"{model}: prefill duration, {title} (compute + KV transfer)"
        + (f"\n{subtitle}" if subtitle else "")
    )
    axes.grid(True, axis="y", alpha=0.3)
    axes.margins(y=0.12)
    axes.legend(loc="upper left")
    figure.tight_layout()
    return figure


def _compute(point: Point | None) -> float:
    return point.compute_ms or 0.0 if point is not None else 0.0


def _transfer(point: Point | None) -> float:
    return point.kv_transfer_ms or 0.0 if point is not None else 0.0


def save(figure: Figure, path: Path) -> Path:
    """Write ``figure`` as PNG (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path
