"""How runs of the conversations workload sum up: per configuration, across them, as JSON,
a table and a figure (TTFT per turn index, one line per configuration).

Outputs are compared across every configuration run on the same texts: greedy answers must be
equal, whatever reuse did. The ratios the benchmark states are TTFT p50s of one configuration
over another's (below 1: the first is faster).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from disagg.bench.conversations import RunResult, TurnOutcome
from disagg.bench.lease_report import percentile
from disagg.bench.plots import save, slug

SCHEMA = "disagg-bench-conversations/v1"
LAST_TURNS = 2
"""The summary's "last turns" TTFT: the turns where histories are longest."""


@dataclass
class ConfigResult:
    """One configuration: its name (``A``..), what it is, and its run."""

    name: str
    label: str
    run: RunResult


def by_turn(turns: list[TurnOutcome]) -> dict[int, list[float]]:
    """TTFTs (ms) per turn index."""
    result: dict[int, list[float]] = {}
    for outcome in turns:
        result.setdefault(outcome.turn, []).append(outcome.ttft_ms)
    return dict(sorted(result.items()))


def summarize(config: ConfigResult) -> dict[str, Any]:
    """TTFT percentiles (all turns, per turn index, the last turns), tokens and divergence."""
    ttfts = [o.ttft_ms for o in config.run.turns]
    turns = by_turn(config.run.turns)
    last = [ms for turn, values in turns.items() if turn > len(turns) - LAST_TURNS for ms in values]
    blocks = config.run.decode_retained_blocks
    return {
        "turns": len(ttfts),
        "wall_s": config.run.wall_s,
        "ttft_p50_ms": round(percentile(ttfts, 50), 1),
        "ttft_p90_ms": round(percentile(ttfts, 90), 1),
        "last_turns_p50_ms": round(percentile(last, 50), 1),
        "ttft_p50_by_turn_ms": {str(t): round(percentile(v, 50), 1) for t, v in turns.items()},
        "decode_retained_blocks_mean": round(sum(blocks) / len(blocks), 1) if blocks else None,
        "decode_retained_blocks_peak": max(blocks, default=None),
        **config.run.usage,
    }


def unequal_outputs(configs: list[ConfigResult]) -> list[str]:
    """Every (conversation, turn) whose answer differs from the first configuration's."""
    if not configs:
        return []
    reference = {(o.conversation, o.turn): o.answer for o in configs[0].run.turns}
    found = []
    for config in configs[1:]:
        for outcome in config.run.turns:
            key = (outcome.conversation, outcome.turn)
            if reference.get(key) != outcome.answer:
                found.append(
                    f"{config.name} conversation {outcome.conversation} turn {outcome.turn}"
                )
    return found


def ratio(summaries: dict[str, dict[str, Any]], a: str, b: str, key: str) -> float | None:
    """``a``'s figure over ``b``'s, when both configurations ran."""
    x, y = summaries.get(a, {}).get(key), summaries.get(b, {}).get(key)
    if not isinstance(x, int | float) or not isinstance(y, int | float) or not y:
        return None
    return round(x / y, 3)


def worse_turns(summaries: dict[str, dict[str, Any]], a: str, b: str) -> list[int] | None:
    """Turn indexes where ``a``'s TTFT p50 is above ``b``'s (None: one of them did not run)."""
    if a not in summaries or b not in summaries:
        return None
    ours, theirs = summaries[a]["ttft_p50_by_turn_ms"], summaries[b]["ttft_p50_by_turn_ms"]
    return [int(turn) for turn, ms in ours.items() if turn in theirs and ms > theirs[turn]]


COMPARISONS = (
    ("D", "B", "ttft_p50"),
    ("D", "B", "last_turns_p50"),
    ("C", "A", "ttft_p50"),
    ("E-D", "E-B", "ttft_p50"),
    ("E-D-least-loaded", "E-D", "ttft_p50"),
    ("E-B-least-loaded", "E-B", "ttft_p50"),
)
"""The ratios the benchmark states: (numerator, denominator, figure), named ``A/B figure``."""


def comparisons(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The stated ratios, turn indexes where D is worse than B, and E's ratio over the one-prefill
    ratio (how much of D's advantage over B two prefills with affinity keep)."""
    result: dict[str, Any] = {}
    for a, b, key in COMPARISONS:
        value = ratio(summaries, a, b, f"{key}_ms")
        if value is not None:
            result[f"{a}/{b} {key}"] = value
    for a, b in (("D", "B"), ("E-D", "E-B")):
        worse = worse_turns(summaries, a, b)
        if worse is not None:
            result[f"turns where {a} is slower than {b}"] = worse
    one, two = result.get("D/B ttft_p50"), result.get("E-D/E-B ttft_p50")
    if isinstance(one, float) and isinstance(two, float) and one:
        result["(E-D/E-B)/(D/B)"] = round(two / one, 3)
    return result


def result_json(model: str, setup: dict[str, Any], configs: list[ConfigResult]) -> dict[str, Any]:
    """The whole run: setup, each configuration's summary and turns, ratios, output check."""
    summaries = {c.name: summarize(c) for c in configs}
    return {
        "schema": SCHEMA,
        "model": model,
        "setup": setup,
        "summary": summaries,
        "comparisons": comparisons(summaries),
        "unequal_outputs": unequal_outputs(configs),
        "configs": [
            {
                "name": c.name,
                "label": c.label,
                "wall_s": c.run.wall_s,
                "usage": c.run.usage,
                "decode_retained_blocks": c.run.decode_retained_blocks,
                "turns": [asdict(o) for o in c.run.turns],
            }
            for c in configs
        ],
    }


def load(path: Path) -> tuple[str, dict[str, Any], list[ConfigResult]]:
    """A run written by :func:`result_json`, read back (to redraw its figure and table)."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: field 'schema' must be {SCHEMA!r}")
    configs = [
        ConfigResult(
            item["name"],
            item["label"],
            RunResult(
                [TurnOutcome(**o) for o in item["turns"]],
                item["usage"],
                item["wall_s"],
                item["decode_retained_blocks"],
            ),
        )
        for item in data["configs"]
    ]
    return data["model"], data["setup"], configs


def _cell(value: object, scale: float = 1.0, digits: int = 1) -> str:
    if not isinstance(value, int | float) or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value / scale:,.{digits}f}" if digits else f"{value / scale:,.0f}"


def table(configs: list[ConfigResult]) -> str:
    """A Markdown table: one row per configuration."""
    lines = [
        "| configuration | TTFT p50 / p90 (s) | last two turns p50 (s) | prefill computed / "
        "cached / read (tokens) | offered / diverged (tokens) | read mean (ms) | decode KV "
        "held (blocks, mean) |",
        "|---|---|---|---|---|---|---|",
    ]
    for config in configs:
        s = summarize(config)
        lines.append(
            f"| {config.name}: {config.label} | {_cell(s['ttft_p50_ms'], 1000)} / "
            f"{_cell(s['ttft_p90_ms'], 1000)} | {_cell(s['last_turns_p50_ms'], 1000)} | "
            f"{_cell(s['prefill_computed_tokens'], digits=0)} / "
            f"{_cell(s['prefill_cached_tokens'], digits=0)} / "
            f"{_cell(s['prefill_read_tokens'], digits=0)} | "
            f"{_cell(s.get('router_offered_tokens'), digits=0)} / "
            f"{_cell(s.get('router_diverged_tokens'), digits=0)} | "
            f"{_cell(s['read_mean_ms'])} | {_cell(s['decode_retained_blocks_mean'])} |"
        )
    return "\n".join(lines)


def figure(configs: list[ConfigResult], model: str, subtitle: str = "") -> Figure:
    """TTFT p50 per turn index, one line per configuration (p10-p90 as a band)."""
    fig = Figure(figsize=(9, 5.5), dpi=110)
    axes = fig.add_subplot()
    for config in configs:
        turns = by_turn(config.run.turns)
        index = list(turns)
        p50 = [percentile(v, 50) / 1000 for v in turns.values()]
        line = axes.plot(index, p50, marker="o", label=f"{config.name}: {config.label}")[0]
        axes.fill_between(
            index,
            [percentile(v, 10) / 1000 for v in turns.values()],
            [percentile(v, 90) / 1000 for v in turns.values()],
            color=line.get_color(),
            alpha=0.12,
        )
    axes.set_xlabel("turn of the conversation")
    axes.set_ylabel("TTFT p50 (s; band: p10-p90)")
    axes.set_title(f"{model}: many conversations at once" + (f"\n{subtitle}" if subtitle else ""))
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    fig.tight_layout()
    return fig


def write(
    model: str,
    setup: dict[str, Any],
    configs: list[ConfigResult],
    json_dir: Path | None,
    figure_dir: Path,
    tag: str = "",
) -> dict[str, Any]:
    """Write ``conversations[-tag]-<model>.json`` (unless ``json_dir`` is None) and the figure,
    print the table, the comparisons and the output check; return the JSON."""
    name = "-".join(part for part in ("conversations", tag, slug(model)) if part)
    data = result_json(model, setup, configs)
    print(table(configs))
    for key, value in data["comparisons"].items():
        print(f"{key}: {value}")
    print(f"unequal outputs: {', '.join(data['unequal_outputs']) or 'none'}")
    if json_dir is not None:
        json_path = json_dir / f"{name}.json"
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(data, indent=2) + "\n")
        print(f"results: {json_path}")
    subtitle = str(setup.get("subtitle", ""))
    print(f"figure:  {save(figure(configs, model, subtitle), figure_dir / f'{name}.png')}")
    return data
