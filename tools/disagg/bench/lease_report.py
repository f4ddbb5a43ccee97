"""What the lease benchmark records and how it sums up: decode memory over time, turns, figure.

One leg is one deployment run through the workload: decode's retained blocks and KV usage
sampled at a fixed interval, and one record per turn (TTFT, whether prefill read decode's KV
back, decode's queue time). The summary of a leg is the time-weighted mean and the peak of what
retention held, TTFT percentiles, hits, and the turns that waited in decode's queue; the ratios
compare the fixed timer's leg with the lease's.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

SCHEMA = "disagg-bench-leases/v1"
WAITED_MS = 1000.0
"""A turn waited when decode queued it this long before its first step (room for its KV)."""
LEG_COLORS = {"lease": "#1f77b4", "fixed": "#7f7f7f"}
LEG_WIDTHS = {"fixed": 3.0}
"""The fixed timer's line is drawn wider, so that it shows where the lease's runs over it."""


@dataclass(frozen=True)
class MemorySample:
    """Decode's retention at one instant, ``t_s`` seconds after the leg's workload began."""

    t_s: float
    retained_blocks: float
    retained_requests: float
    kv_usage: float
    """vLLM's ``kv_cache_usage_perc`` (1.0: every block in use)."""


@dataclass(frozen=True)
class TurnResult:
    """One request of the workload; ``conversation`` None for a one-shot request."""

    t_s: float
    conversation: int | None
    turn: int
    prompt_tokens: int
    ttft_ms: float
    reused_tokens: float
    decode_queue_ms: float
    lookup: str | None = None

    @property
    def hit(self) -> bool:
        """Prefill read part of the prompt back from decode."""
        return self.reused_tokens > 0

    @property
    def waited(self) -> bool:
        return self.decode_queue_ms >= WAITED_MS


@dataclass
class LegResult:
    """One leg: how it was configured, what decode held over time, and every turn."""

    name: str
    config: dict[str, Any]
    samples: list[MemorySample] = field(default_factory=list)
    turns: list[TurnResult] = field(default_factory=list)
    workload_s: float = 0.0
    """Seconds from the first turn to the end of the last (the tail after it is sampled too)."""
    total_blocks: int | None = None
    frees: dict[str, float] = field(default_factory=dict)
    """Decode's retention frees by reason over the leg."""
    router_reuse: dict[str, Any] = field(default_factory=dict)
    """The router's reuse summary at the end of the leg."""


def time_weighted_mean(times: list[float], values: list[float]) -> float:
    """Mean of a step function that holds each value until the next time (0 for no span)."""
    if len(times) != len(values):
        raise ValueError("times and values differ in length")
    span = times[-1] - times[0] if times else 0.0
    if span <= 0:
        return values[0] if values else 0.0
    area = sum(v * (t1 - t0) for v, t0, t1 in zip(values, times, times[1:], strict=False))
    return area / span


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100), interpolated linearly between order statistics."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(leg: LegResult) -> dict[str, Any]:
    """The leg's figures: retention held (mean over the sampled window, tail included, and over
    the workload alone; peak), TTFT percentiles, hits on turns after the first, waits."""
    times = [s.t_s for s in leg.samples]
    blocks = [s.retained_blocks for s in leg.samples]
    usage = [s.kv_usage for s in leg.samples]
    conversation_turns = [t for t in leg.turns if t.conversation is not None]
    later_turns = [t for t in conversation_turns if t.turn > 1]
    ttfts = [t.ttft_ms for t in leg.turns]
    mean_blocks = time_weighted_mean(times, blocks)
    during = [s for s in leg.samples if s.t_s <= leg.workload_s]
    during_times = [s.t_s for s in during]
    result: dict[str, Any] = {
        "sampled_s": round(times[-1] - times[0], 1) if times else 0.0,
        "mean_retained_blocks": round(mean_blocks, 2),
        "peak_retained_blocks": max(blocks, default=0.0),
        "mean_retained_blocks_workload": round(
            time_weighted_mean(during_times, [s.retained_blocks for s in during]), 2
        ),
        "mean_kv_usage": round(time_weighted_mean(times, usage), 4),
        "mean_kv_usage_workload": round(
            time_weighted_mean(during_times, [s.kv_usage for s in during]), 4
        ),
        "peak_kv_usage": round(max(usage, default=0.0), 4),
        "turns": len(leg.turns),
        "later_turns": len(later_turns),
        "hits": sum(t.hit for t in later_turns),
        "hit_ratio": round(sum(t.hit for t in later_turns) / len(later_turns), 3)
        if later_turns
        else None,
        "reused_tokens": sum(t.reused_tokens for t in leg.turns),
        "waited": sum(t.waited for t in leg.turns),
        "ttft_p50_ms": round(percentile(ttfts, 50), 1),
        "ttft_p90_ms": round(percentile(ttfts, 90), 1),
        "ttft_max_ms": round(max(ttfts, default=math.nan), 1),
    }
    if leg.total_blocks:
        result["mean_retained_share"] = round(mean_blocks / leg.total_blocks, 4)
    return result


def ratios(fixed: dict[str, Any], lease: dict[str, Any]) -> dict[str, float | None]:
    """The fixed timer's figures over the lease's (above 1: the fixed timer costs more)."""

    def over(key: str) -> float | None:
        a, b = fixed.get(key), lease.get(key)
        if not isinstance(a, int | float) or not isinstance(b, int | float) or b == 0:
            return None
        return round(a / b, 2)

    keys = (
        "mean_retained_blocks",
        "mean_retained_blocks_workload",
        "peak_retained_blocks",
        "mean_kv_usage",
        "mean_kv_usage_workload",
        "ttft_p50_ms",
        "ttft_p90_ms",
        "hits",
    )
    return {f"fixed/lease {key}": over(key) for key in keys}


def result_json(model: str, setup: dict[str, Any], legs: list[LegResult]) -> dict[str, Any]:
    """The whole run as JSON: setup, each leg's summary and series, and the ratios."""
    summaries = {leg.name: summarize(leg) for leg in legs}
    data: dict[str, Any] = {"schema": SCHEMA, "model": model, "setup": setup}
    data["summary"] = summaries
    if "fixed" in summaries and "lease" in summaries:
        data["ratios"] = ratios(summaries["fixed"], summaries["lease"])
    data["legs"] = [
        {
            "name": leg.name,
            "config": leg.config,
            "workload_s": round(leg.workload_s, 1),
            "total_blocks": leg.total_blocks,
            "frees": leg.frees,
            "router_reuse": leg.router_reuse,
            "samples": [asdict(s) for s in leg.samples],
            "turns": [{**asdict(t), "hit": t.hit, "waited": t.waited} for t in leg.turns],
        }
        for leg in legs
    ]
    return data


def load(path: Path) -> tuple[str, dict[str, Any], list[LegResult]]:
    """Read a run written from :func:`result_json` back (to redraw its figure)."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: field 'schema' must be {SCHEMA!r}")
    legs = []
    for item in data["legs"]:
        turns = []
        for turn in item["turns"]:
            values = {k: v for k, v in turn.items() if k not in ("hit", "waited")}
            turns.append(TurnResult(**values))
        legs.append(
            LegResult(
                item["name"],
                item["config"],
                [MemorySample(**s) for s in item["samples"]],
                turns,
                item["workload_s"],
                item["total_blocks"],
                item["frees"],
                item["router_reuse"],
            )
        )
    return data["model"], data["setup"], legs


def figure(legs: list[LegResult], model: str, subtitle: str = "") -> Figure:
    """Top: decode blocks held by retention over time per leg; bottom: each turn's TTFT."""
    fig = Figure(figsize=(9, 7), dpi=110)
    memory, ttft = fig.subplots(2, 1, sharex=True)
    for leg in legs:
        color = LEG_COLORS.get(leg.name, "#2ca02c")
        label = str(leg.config.get("label", leg.name))
        memory.step(
            [s.t_s for s in leg.samples],
            [s.retained_blocks for s in leg.samples],
            where="post",
            color=color,
            linewidth=LEG_WIDTHS.get(leg.name, 1.5),
            label=label,
        )
        memory.axvline(leg.workload_s, color=color, linestyle=":", alpha=0.6)
        kinds = (
            ("read back", "o", [t for t in leg.turns if t.hit]),
            ("recomputed", "x", [t for t in leg.turns if not t.hit and t.conversation is not None]),
            ("one-shot", "^", [t for t in leg.turns if t.conversation is None]),
        )
        for kind, marker, chosen in kinds:
            ttft.scatter(
                [t.t_s for t in chosen],
                [t.ttft_ms / 1000 for t in chosen],
                marker=marker,
                color=color,
                label=f"{leg.name}: {kind}",
            )
    if legs and legs[0].total_blocks:
        memory.axhline(legs[0].total_blocks, color="black", linewidth=0.8, alpha=0.5)
        memory.text(0, legs[0].total_blocks, " decode's KV blocks", va="bottom", fontsize=8)
    memory.set_ylabel("decode blocks held by retention")
    names = " and ".join(leg.name for leg in legs)
    what = "with a lease vs the fixed timer" if len(legs) > 1 else f"of the {names} leg"
    memory.set_title(f"{model}: decode retention {what}" + (f"\n{subtitle}" if subtitle else ""))
    memory.grid(True, alpha=0.3)
    memory.legend(loc="lower center", fontsize=8)
    ttft.set_ylabel("TTFT (s)")
    ttft.set_xlabel("seconds since the first turn (dotted: last turn ended)")
    ttft.grid(True, alpha=0.3)
    ttft.legend(loc="upper right", fontsize=8, ncols=len(legs))
    fig.tight_layout()
    return fig
