"""The two figures per model: TTFT vs prompt length, and prefill duration as stacked bars.

Built on ``matplotlib.figure.Figure`` (no pyplot, no global backend state).
"""

from __future__ import annotations

import re
from pathlib import Path

from matplotlib.figure import Figure

from disagg.bench.aggregate import Point

ON_COLOR, OFF_COLOR, XFER_COLOR = "#1f77b4", "#7f7f7f", "#ff7f0e"
_SECONDS_ABOVE_MS = 5000.0


def slug(model: str) -> str:
    """A file-name-safe form of a model name (``Qwen/Qwen3-32B`` -> ``qwen-qwen3-32b``)."""
    return re.sub(r"[^a-z0-9.]+", "-", model.lower()).strip("-") or "model"


def _time_unit(values: list[float]) -> tuple[str, float]:
    """Seconds for slow runs (CPU), milliseconds otherwise."""
    return ("s", 1000.0) if max(values, default=0.0) > _SECONDS_ABOVE_MS else ("ms", 1.0)


def _tokens_label(tokens: float) -> str:
    return f"{tokens / 1000:.1f}k" if tokens >= 1000 else f"{tokens:.0f}"


def ttft_figure(on: list[Point], off: list[Point], model: str, subtitle: str = "") -> Figure:
    """TTFT (median per length) against prompt length, one line per leg."""
    unit, scale = _time_unit([p.ttft_ms for p in on + off])
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
    if on and off:
        longest_on, longest_off = on[-1], off[-1]
        axes.annotate(
            f"OFF/ON {longest_off.ttft_ms / longest_on.ttft_ms:.1f}x",
            xy=(longest_on.prompt_tokens, longest_on.ttft_ms / scale),
            xytext=(-8, 12),
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


def prefill_figure(on: list[Point], off: list[Point], model: str, subtitle: str = "") -> Figure:
    """Paired bars per length: OFF prefill (compute) and ON prefill (compute + KV transfer)."""
    lengths = sorted({round(p.prompt_tokens) for p in on + off})
    by_length = {
        leg: {round(p.prompt_tokens): p for p in leg_points}
        for leg, leg_points in (("on", on), ("off", off))
    }
    unit, scale = _time_unit([p.prefill_ms or 0.0 for p in on + off])
    figure = Figure(figsize=(9, 5), dpi=110)
    axes = figure.add_subplot()
    width = 0.38
    positions = list(range(len(lengths)))
    measured = any(p.kv_transfer_ms is not None for p in on)
    part = "compute" if measured else "prefill"
    for offset, leg, color in ((-width / 2, "off", OFF_COLOR), (width / 2, "on", ON_COLOR)):
        compute = [_compute(by_length[leg].get(n)) / scale for n in lengths]
        xs = [x + offset for x in positions]
        axes.bar(xs, compute, width, color=color, label=f"{leg.upper()}: {part}")
        if leg == "on" and measured:
            transfer_ms = [_transfer(by_length[leg].get(n)) for n in lengths]
            stacked = axes.bar(
                xs,
                [ms / scale for ms in transfer_ms],
                width,
                bottom=compute,
                color=XFER_COLOR,
                label="ON: KV transfer D->P",
            )
            labels = [f"KV {ms:.0f} ms" if ms else "" for ms in transfer_ms]
            axes.bar_label(stacked, labels=labels, fontsize=7, padding=3, rotation=90)
    axes.set_xticks(positions, [_tokens_label(n) for n in lengths])
    axes.set_xlabel("prompt length (tokens)")
    axes.set_ylabel(f"prefill duration ({unit})")
    axes.set_title(
        f"{model}: prefill duration, OFF vs ON (compute + KV transfer)"
        + (f"\n{subtitle}" if subtitle else "")
    )
    axes.grid(True, axis="y", alpha=0.3)
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
