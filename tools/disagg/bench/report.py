"""The summary table printed at the end of a run, and the files a run writes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from disagg.bench.aggregate import Row, headline, points, rows, turn_key
from disagg.bench.records import BenchResult, Leg, TurnRecord


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.0f} ms"


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _megabytes(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:.0f} MB"


_Column = tuple[str, Callable[[Row], str]]

_COLUMNS: tuple[_Column, ...] = (
    ("prompt tokens", lambda row: f"{row.on.prompt_tokens:.0f}"),
    ("TTFT off", lambda row: _ms(row.off.ttft_ms if row.off else None)),
    ("TTFT on", lambda row: _ms(row.on.ttft_ms)),
    ("off/on", lambda row: _ratio(row.gain)),
    ("prefill off", lambda row: _ms(row.off.prefill_ms if row.off else None)),
    ("prefill on", lambda row: _ms(row.on.prefill_ms)),
    ("KV xfer on", lambda row: _ms(row.on.kv_transfer_ms)),
    ("queue on", lambda row: _ms(row.on.queue_ms)),
    ("KV bytes on", lambda row: _megabytes(row.on.kv_bytes)),
    ("reused on", lambda row: _count(row.on.reused_tokens)),
)
_FLOOR_COLUMNS: tuple[_Column, ...] = (
    ("TTFT floor", lambda row: _ms(row.floor.ttft_ms if row.floor else None)),
    ("cached floor", lambda row: _count(row.floor.cached_tokens if row.floor else None)),
    ("floor", lambda row: _ms(row.floor_ms)),
    ("on/floor", lambda row: _ratio(row.over_floor)),
)


def table(measured: list[Row]) -> str:
    """A fixed-width table with one row per prompt length and the headline numbers below.

    ``queue on`` is ON's time in the prefill engine before its first computing step: the D->P
    read and the coordination around it (the scheduling, the polling for its completion).

    The floor columns appear when the run has a FLOOR leg: its TTFT, the prompt tokens its
    prefill found in its own cache, the floor (its TTFT plus ON's D->P read) and ON / floor.
    """
    columns = _COLUMNS
    if any(row.floor is not None for row in measured):
        columns += _FLOOR_COLUMNS
    cells = [[name for name, _ in columns]]
    cells += [[cell(row) for _, cell in columns] for row in measured]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True))
             for line in cells]  # fmt: skip
    lines.insert(1, "  ".join("-" * width for width in widths))
    if measured:
        lines.append(_headline_text(measured))
    return "\n".join(lines)


def _headline_text(measured: list[Row]) -> str:
    top = headline(measured)
    at = f"at {top.longest_tokens:.0f} tokens"
    parts = []
    if top.gain_at_longest is not None:
        parts.append(f"OFF/ON {at}: {top.gain_at_longest:.2f}x")
    if top.over_floor_at_longest is not None:
        parts.append(f"ON/floor {at}: {top.over_floor_at_longest:.2f}x")
    parts.append(f"ON flatness (TTFT at longest / shortest): {top.on_flatness:.2f}")
    if top.off_growth is not None:
        parts.append(f"OFF growth: {top.off_growth:.2f}")
    return "; ".join(parts)


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
    on, off, floor = (points(result.leg(leg), key) for leg in (Leg.ON, Leg.OFF, Leg.FLOOR))
    ttft = ttft_figure(on, off, result.model, subtitle, floor)
    figures = [save(ttft, figure_dir / f"ttft-{name}.png")]
    if any(p.prefill_ms is not None for p in on + off + floor):
        figure = prefill_figure(on, off, result.model, subtitle, floor)
        figures.append(save(figure, figure_dir / f"prefill-{name}.png"))
    return Outputs(json_path, figures)


def summary(result: BenchResult, key: Callable[[TurnRecord], int] = turn_key) -> str:
    """The table for ``result`` (one row per length the ON leg measured)."""
    return table(rows(result.records, key))
