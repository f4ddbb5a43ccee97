"""The two figures hold the measured data with axes, units and legends, and save as PNG."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy
import pytest
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from disagg.bench.aggregate import Point
from disagg.bench.plots import prefill_figure, save, slug, ttft_figure

OFF = [Point(1, 2000, 800, 1, prefill_ms=700), Point(2, 4000, 1600, 1, prefill_ms=1500)]
ON = [
    Point(1, 2000, 810, 1, prefill_ms=700),
    Point(2, 4000, 900, 1, prefill_ms=780, kv_transfer_ms=80),
]


def legend(axes: Axes) -> list[str]:
    box = axes.get_legend()
    assert box is not None, "the figure has no legend"
    return [text.get_text() for text in box.get_texts()]


def line_data(line: Line2D) -> tuple[list[float], list[float]]:
    data = numpy.asarray(line.get_xydata())
    return data[:, 0].tolist(), data[:, 1].tolist()


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_ttft_figure_plots_both_legs_against_prompt_length(tmp_path: Path) -> None:
    figure = ttft_figure(ON, OFF, "Qwen/Qwen3-32B", "1P1D")
    axes = figure.axes[0]
    assert axes.get_xlabel() == "prompt length (tokens)"
    assert axes.get_ylabel() == "time to first token (ms)"
    assert axes.get_title() == "Qwen/Qwen3-32B: TTFT vs prompt length\n1P1D"
    assert legend(axes) == [
        "OFF: prefill recomputes the history",
        "ON: bidirectional KV reuse (D->P read)",
    ]
    off_line, on_line = axes.get_lines()
    assert line_data(off_line) == ([2000, 4000], [800, 1600])
    assert line_data(on_line) == ([2000, 4000], [810, 900])
    assert any(text.get_text() == "OFF/ON 1.8x" for text in axes.texts)
    width, height = png_size(save(figure, tmp_path / "out" / "ttft.png"))
    assert (width, height) == (880, 550)


def test_slow_runs_are_plotted_in_seconds() -> None:
    slow = [Point(1, 8000, 9000, 1)]
    axes = ttft_figure(slow, slow, "m").axes[0]
    assert axes.get_ylabel() == "time to first token (s)"
    assert line_data(axes.get_lines()[0])[1] == [9.0]


def test_prefill_figure_pairs_stacked_bars_per_length(tmp_path: Path) -> None:
    figure = prefill_figure(ON, OFF, "m")
    axes = figure.axes[0]
    assert axes.get_ylabel() == "prefill duration (ms)"
    assert [label.get_text() for label in axes.get_xticklabels()] == ["2.0k", "4.0k"]
    assert legend(axes) == ["OFF: compute", "ON: compute", "ON: KV transfer D->P"]
    off_bars, on_compute, on_transfer = axes.containers
    assert [bar.get_height() for bar in off_bars] == [700, 1500]
    assert [bar.get_height() for bar in on_compute] == [700, 700]
    assert [bar.get_height() for bar in on_transfer] == [0, 80]
    assert [bar.get_y() for bar in on_transfer] == [700, 700], "transfer stacks on compute"
    assert [text.get_text() for text in axes.texts] == ["", "KV 80 ms"], "transfer in ms on top"
    assert png_size(save(figure, tmp_path / "prefill.png")) == (990, 550)


def test_prefill_figure_without_transfer_data_says_prefill_only() -> None:
    on = [Point(1, 2000, 810, 1, prefill_ms=700)]
    axes = prefill_figure(on, OFF, "m").axes[0]
    assert legend(axes) == ["OFF: prefill", "ON: prefill"]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("Qwen/Qwen3-32B", "qwen-qwen3-32b"),
        ("zai-org/GLM-5-FP8", "zai-org-glm-5-fp8"),
        ("//", "model"),
    ],
)
def test_slug(model: str, expected: str) -> None:
    assert slug(model) == expected


FLOOR = [Point(1, 2000, 805, 1, prefill_ms=690), Point(2, 4000, 600, 1, prefill_ms=500)]


def test_ttft_figure_draws_the_floor_as_floor_ttft_plus_on_read() -> None:
    axes = ttft_figure(ON, OFF, "m", floor=FLOOR).axes[0]
    assert legend(axes)[-1] == "floor: prefix in prefill's own cache + ON's D->P read time"
    floor_line = axes.get_lines()[-1]
    assert line_data(floor_line) == ([2000, 4000], [805, 680])
    assert any(text.get_text() == "ON/floor 1.32x" for text in axes.texts)


def test_prefill_figure_has_a_third_bar_per_length_for_the_floor() -> None:
    axes = prefill_figure(ON, OFF, "m", floor=FLOOR).axes[0]
    assert legend(axes) == [
        "OFF: compute",
        "ON: compute",
        "ON: KV transfer D->P",
        "FLOOR: prefill, prefix in its own cache",
        "FLOOR: + ON's D->P read time",
    ]
    off_bars, on_compute, _, floor_bars, floor_read = axes.containers
    assert [bar.get_height() for bar in floor_bars] == [690, 500]
    assert [bar.get_height() for bar in floor_read] == [0, 80]
    assert [bar.get_y() for bar in floor_read] == [690, 500]
    centres = [
        bar.get_x() + bar.get_width() / 2 for bar in (off_bars[0], on_compute[0], floor_bars[0])
    ]
    assert centres == pytest.approx([-0.76 / 3, 0, 0.76 / 3])
    assert "OFF vs ON vs floor" in axes.get_title()
