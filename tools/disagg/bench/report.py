"""The summary table printed at the end of a run, and the files a run writes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from disagg.bench.aggregate import Pair, headline, pairs, points, turn_key
from disagg.bench.records import BenchResult, Leg, TurnRecord

_COLUMNS = (
    "prompt tokens",
    "TTFT off",
    "TTFT on",
    "off/on",
    "prefill off",
    "prefill on",
    "KV xfer on",
    "reused on",
)


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.0f} ms"


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def table(paired: list[Pair]) -> str:
    """A fixed-width table with one row per prompt length and the headline numbers below."""
    rows = [
        (
            f"{pair.on.prompt_tokens:.0f}",
            _ms(pair.off.ttft_ms),
            _ms(pair.on.ttft_ms),
            f"{pair.gain:.2f}x",
            _ms(pair.off.prefill_ms),
            _ms(pair.on.prefill_ms),
            _ms(pair.on.kv_transfer_ms),
            _count(pair.on.reused_tokens),
        )
        for pair in paired
    ]
    widths = [max(len(row[i]) for row in [_COLUMNS, *rows]) for i in range(len(_COLUMNS))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
             for row in [_COLUMNS, *rows]]  # fmt: skip
    lines.insert(1, "  ".join("-" * width for width in widths))
    if paired:
        top = headline(paired)
        lines.append(
            f"OFF/ON at {top.longest_tokens:.0f} tokens: {top.gain_at_longest:.2f}x; "
            f"ON flatness (TTFT at longest / shortest): {top.on_flatness:.2f}; "
            f"OFF growth: {top.off_growth:.2f}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Outputs:
    """Where a run's files went."""

    json_path: Path | None
    figures: list[Path]


def write_outputs(
    result: BenchResult,
    json_dir: Path | None,
    figure_dir: Path,
    key: Callable[[TurnRecord], int] = turn_key,
    subtitle: str = "",
) -> Outputs:
    """JSON (when ``json_dir`` is set) and the figures: TTFT always, prefill when measured."""
    from disagg.bench.plots import prefill_figure, save, slug, ttft_figure

    name = slug(result.model)
    json_path = None
    if json_dir is not None:
        json_path = json_dir / f"ttft-{name}.json"
        result.save(json_path)
    on = points(result.leg(Leg.ON), key)
    off = points(result.leg(Leg.OFF), key)
    figures = [save(ttft_figure(on, off, result.model, subtitle), figure_dir / f"ttft-{name}.png")]
    if any(p.prefill_ms is not None for p in on + off):
        figure = prefill_figure(on, off, result.model, subtitle)
        figures.append(save(figure, figure_dir / f"prefill-{name}.png"))
    return Outputs(json_path, figures)


def summary(result: BenchResult, key: Callable[[TurnRecord], int] = turn_key) -> str:
    """The table for ``result`` (ON/OFF pairs per length)."""
    return table(pairs(result.records, key))
