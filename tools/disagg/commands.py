"""The tools package's `disagg` subcommands: `plan` and `bench` (heavy imports stay lazy)."""

from __future__ import annotations

from typing import Any


def register(subparsers: Any) -> None:
    """Add `disagg plan` and `disagg bench` to the `disagg` parser."""
    from disagg.bench.cli import add_arguments as add_bench_arguments
    from disagg.bench.cli import run as run_bench
    from disagg.plan.cli import add_arguments as add_plan_arguments
    from disagg.plan.cli import run as run_plan

    plan = subparsers.add_parser(
        "plan",
        help="predict TTFT with and without KV reuse for a model, GPU and fabric",
        description="Capacity model: predicted TTFT off/on, KV transfer time and its physical "
        "floor per prompt length, and a suggested recomputeThresholdTokens. Pure Python.",
    )
    add_plan_arguments(plan)
    plan.set_defaults(func=run_plan)

    bench = subparsers.add_parser(
        "bench",
        help="multi-turn TTFT benchmark, KV reuse ON vs OFF, with figures",
        description="Drive multi-turn conversations through a router with a prompt-length "
        "sweep, once with bidirectional KV reuse (ON) and once without (OFF); record TTFT, "
        "prefill duration and D->P transfer time per request; write JSON, two PNG figures and "
        "a summary table. Or plot vLLM's multi-turn benchmark stats (--from-vllm-stats).",
    )
    add_bench_arguments(bench)
    bench.set_defaults(func=run_bench)
