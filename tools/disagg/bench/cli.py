"""``disagg bench``: options and the two modes (drive a router, or plot vLLM's stats files)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from disagg.bench.records import BenchResult, Leg
from disagg.bench.workload import ConversationsWorkload

if TYPE_CHECKING:
    from disagg.bench.runner import LegTarget

DEFAULT_LENGTHS = "2k:24k:2k"
CONVERSATIONS = ConversationsWorkload()


def parse_legs(text: str) -> frozenset[Leg]:
    """``on,off,floor`` (any of them, comma-separated) or ``both`` (on and off)."""
    if text.strip() == "both":
        return frozenset({Leg.ON, Leg.OFF})
    names = [name.strip() for name in text.split(",") if name.strip()]
    known = ", ".join(leg.value for leg in Leg)
    try:
        legs = frozenset(Leg(name) for name in names)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--legs: {text!r} must name legs from {known} (or 'both')"
        ) from None
    if not legs:
        raise argparse.ArgumentTypeError(f"--legs: name at least one of {known}")
    return legs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``disagg bench``'s options (no heavy imports)."""
    target = parser.add_argument_group("what to measure")
    target.add_argument(
        "--workload",
        choices=("sweep", "conversations"),
        default="sweep",
        help="sweep: conversations one at a time through growing prompt lengths, ON vs OFF "
        "(--lengths); conversations: many conversations at once with a shared system prompt "
        "(--concurrency, --turns, ...) through --router (default %(default)s)",
    )
    target.add_argument("--router", metavar="URL", help="router of the deployment (ON leg)")
    target.add_argument(
        "--off-router",
        metavar="URL",
        help="router of a second deployment with bidirectional transfer off (OFF leg); "
        "default: the --router deployment without conversation_id, so prefill recomputes",
    )
    target.add_argument(
        "--floor-router",
        metavar="URL",
        help="router of a deployment whose prefill has prefix caching on (FLOOR leg: each turn "
        "finds the previous prompt in prefill's own cache, the floor of the reuse path)",
    )
    target.add_argument(
        "--legs",
        type=parse_legs,
        default=None,
        help="legs to run, comma-separated from on, off, floor ('both': on,off); default on,off "
        "and floor when --floor-router is set",
    )
    target.add_argument(
        "--prefill-metrics",
        action="append",
        default=[],
        metavar="URL",
        help="a prefill engine's base URL, read for D->P transfer time and reused tokens "
        "(repeat per prefill replica; without it the figures show prefill time only)",
    )
    target.add_argument(
        "--off-prefill-metrics",
        action="append",
        default=[],
        metavar="URL",
        help="prefill engines of the --off-router deployment",
    )
    target.add_argument(
        "--floor-prefill-metrics",
        action="append",
        default=[],
        metavar="URL",
        help="prefill engines of the --floor-router deployment (their prefix-cache hits)",
    )
    target.add_argument(
        "--decode-metrics",
        action="append",
        default=[],
        metavar="URL",
        help="with --workload conversations: a decode engine's base URL, sampled for the KV its "
        "retention holds (repeat per decode replica)",
    )
    target.add_argument("--model", help="model name to request (default: the router's first)")

    sweep = parser.add_argument_group("sweep")
    sweep.add_argument(
        "--lengths",
        default=DEFAULT_LENGTHS,
        help="prompt length per turn: START:STOP:STEP or a list like 2k,4k,8k "
        "(default %(default)s, the published sweep)",
    )
    sweep.add_argument(
        "--conversations",
        type=int,
        default=None,
        help="conversations per leg (default 1; with --workload conversations, "
        f"{CONVERSATIONS.conversations})",
    )
    sweep.add_argument("--answer-tokens", type=int, default=32, help="tokens per answer")
    sweep.add_argument("--seed", default="disagg-bench", help="seed of the user texts")

    add_conversations_arguments(parser.add_argument_group("conversations workload"))

    output = parser.add_argument_group("output")
    output.add_argument("--json-dir", type=Path, default=Path("bench-results"))
    output.add_argument("--figure-dir", type=Path, default=Path("bench-results"))
    output.add_argument("--subtitle", default="", help="second title line of the figures")
    output.add_argument(
        "--from-vllm-stats",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="plot vLLM multi-turn benchmark --stats-json-output files instead of running: "
        "ON_FILE [OFF_FILE]",
    )
    output.add_argument(
        "--from-json",
        type=Path,
        metavar="FILE",
        help="redraw the figures and the table of a saved run (ttft-<model>.json) without running",
    )
    output.add_argument(
        "--bin-tokens",
        type=int,
        default=1000,
        help="with --from-vllm-stats: group requests by prompt length in bins of this many "
        "tokens (default %(default)s)",
    )


def add_conversations_arguments(group: argparse._ActionsContainer) -> None:
    """The conversations workload's own options (``--conversations``, ``--answer-tokens`` and
    ``--seed`` are shared with the sweep)."""
    group.add_argument(
        "--turns", type=int, default=CONVERSATIONS.turns, help="turns of each conversation"
    )
    group.add_argument(
        "--system-tokens",
        type=int,
        default=CONVERSATIONS.system_tokens,
        help="the system prompt every conversation shares (default %(default)s)",
    )
    group.add_argument(
        "--tool-tokens",
        type=int,
        default=CONVERSATIONS.tool_tokens,
        help="new user text (a tool result) per turn (default %(default)s)",
    )
    group.add_argument(
        "--concurrency",
        type=int,
        default=CONVERSATIONS.concurrency,
        help="turns in flight at once (default %(default)s)",
    )
    group.add_argument(
        "--think-s",
        type=float,
        default=CONVERSATIONS.think_s,
        help="seconds between an answer and the conversation's next turn (default %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the selected mode; bad options exit with a message naming the option."""
    try:
        if args.from_vllm_stats:
            return _plot_vllm_stats(args)
        if args.from_json:
            return _replot(args)
        if not args.router:
            raise ValueError("--router URL is required (or --from-vllm-stats FILE)")
        if args.workload == "conversations":
            return _run_conversations(args)
        return _run_router(args)
    except ValueError as exc:
        print(f"disagg bench: {exc}", file=sys.stderr)
        return 2


def _plot_vllm_stats(args: argparse.Namespace) -> int:
    from disagg.bench.aggregate import bin_key
    from disagg.bench.report import summary, write_outputs
    from disagg.bench.vllm_stats import read_vllm_stats

    files: list[Path] = args.from_vllm_stats
    if len(files) > 2:
        raise ValueError("--from-vllm-stats takes ON_FILE and optionally OFF_FILE")
    records = read_vllm_stats(files[0], Leg.ON)
    if len(files) == 2:
        records += read_vllm_stats(files[1], Leg.OFF)
    model = args.model or files[0].stem
    result = BenchResult(model, records, {"source": [str(f) for f in files]})
    key = bin_key(args.bin_tokens)
    outputs = write_outputs(result, args.json_dir, args.figure_dir, key, args.subtitle)
    if len(files) == 2:
        print(summary(result, key))
    _print_outputs(outputs.json_path, outputs.figures)
    return 0


def _replot(args: argparse.Namespace) -> int:
    from disagg.bench.report import summary, write_outputs

    try:
        result = BenchResult.load(args.from_json)
    except (OSError, KeyError, TypeError) as exc:
        raise ValueError(
            f"--from-json {args.from_json}: not a disagg bench result ({exc})"
        ) from None
    subtitle = args.subtitle or str(result.setup.get("subtitle", ""))
    outputs = write_outputs(result, None, args.figure_dir, subtitle=subtitle)
    print(summary(result))
    _print_outputs(None, outputs.figures)
    return 0


def _run_router(args: argparse.Namespace) -> int:
    from disagg.bench.client import ChatClient
    from disagg.bench.progress import Progress
    from disagg.bench.report import summary, write_outputs
    from disagg.bench.runner import Sweep, calibrate, plan_sweep, run_interleaved, run_leg
    from disagg.bench.workload import parse_lengths

    conversations = 1 if args.conversations is None else args.conversations
    if conversations < 1 or args.answer_tokens < 1:
        raise ValueError("--conversations and --answer-tokens must be at least 1")
    sweep = Sweep(parse_lengths(args.lengths), conversations, args.answer_tokens, args.seed)
    targets = bench_targets(args)
    client = ChatClient(targets[0].router_url)
    try:
        model = args.model or client.model()
        calibration, plans = plan_sweep(client, model, sweep)
    finally:
        client.close()
    for url in {t.router_url for t in targets} - {targets[0].router_url}:
        warm_up = ChatClient(url)
        try:
            calibrate(warm_up, model, sweep)
        finally:
            warm_up.close()
    progress = Progress(len(targets) * sweep.conversations * len(plans))
    run_id = uuid.uuid4().hex[:8]
    result = BenchResult(
        model,
        setup={
            "lengths": sweep.lengths,
            "conversations": sweep.conversations,
            "answer_tokens": sweep.answer_tokens,
            "tokens_per_word": calibration.tokens_per_word,
            "legs": {t.leg.value: t.describe() for t in targets},
            "subtitle": args.subtitle,
        },
    )
    for target in targets:
        if target.leg is Leg.OFF:
            result.records += run_leg(target, model, sweep, plans, progress, run_id)
    together = [target for target in targets if target.leg is not Leg.OFF]
    result.records += run_interleaved(together, model, sweep, plans, progress, run_id)
    outputs = write_outputs(result, args.json_dir, args.figure_dir, subtitle=args.subtitle)
    print(summary(result))
    _print_outputs(outputs.json_path, outputs.figures)
    return 0


def conversations_workload(args: argparse.Namespace) -> ConversationsWorkload:
    """The conversations workload the options describe (a bad value names its option)."""
    return ConversationsWorkload(
        conversations=CONVERSATIONS.conversations
        if args.conversations is None
        else args.conversations,
        turns=args.turns,
        system_tokens=args.system_tokens,
        tool_tokens=args.tool_tokens,
        answer_tokens=args.answer_tokens,
        concurrency=args.concurrency,
        think_s=args.think_s,
        seed=args.seed,
    )


def _run_conversations(args: argparse.Namespace) -> int:
    from disagg.bench.client import ChatClient
    from disagg.bench.conversations import Deployment, make_texts, run_conversations
    from disagg.bench.conversations_report import ConfigResult, write

    workload = conversations_workload(args)
    client = ChatClient(args.router)
    try:
        model = args.model or client.model()
        texts = make_texts(client, model, workload)
    finally:
        client.close()
    deployment = Deployment(args.router, list(args.prefill_metrics), list(args.decode_metrics))
    run_id = uuid.uuid4().hex[:8]
    run = run_conversations(deployment, model, workload, texts, f"bench-{run_id}-")
    setup = {
        "router": args.router,
        "workload": dataclasses.asdict(workload),
        "subtitle": args.subtitle,
    }
    write(model, setup, [ConfigResult("run", args.router, run)], args.json_dir, args.figure_dir)
    return 0


def bench_targets(args: argparse.Namespace) -> list[LegTarget]:
    """The legs to run: OFF first (it never leaves KV behind for the ON leg to find), then ON
    and FLOOR turn by turn (each on its own deployment)."""
    from disagg.bench import runner

    legs: frozenset[Leg] = args.legs or frozenset(
        {Leg.ON, Leg.OFF, *([Leg.FLOOR] if args.floor_router else [])}
    )
    if Leg.FLOOR in legs and not args.floor_router:
        raise ValueError(
            "--legs floor needs --floor-router URL: a deployment whose prefill has prefix "
            "caching on"
        )
    on = runner.LegTarget(Leg.ON, args.router, True, list(args.prefill_metrics))
    if args.off_router:
        off = runner.LegTarget(Leg.OFF, args.off_router, True, list(args.off_prefill_metrics))
    else:
        off = runner.LegTarget(Leg.OFF, args.router, False, list(args.prefill_metrics))
    floor = runner.LegTarget(
        Leg.FLOOR, args.floor_router or "", False, list(args.floor_prefill_metrics)
    )
    return [target for target in (off, on, floor) if target.leg in legs]


def _print_outputs(json_path: Path | None, figures: list[Path]) -> None:
    if json_path is not None:
        print(f"results: {json_path}")
    for figure in figures:
        print(f"figure:  {figure}")
