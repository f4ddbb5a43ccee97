"""`disagg plan`: arguments and the run function (registered by ``disagg_connector.commands``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from disagg.plan import calibration, catalog
from disagg.plan.model_spec import ModelConfigError, parse_dtype
from disagg.plan.physics import Efficiency
from disagg.plan.predict import (
    DEFAULT_MAX_BATCHED_TOKENS,
    DEFAULT_SUFFIX_TOKENS,
    Deployment,
    predict,
    recompute_threshold,
)
from disagg.plan.report import (
    CalibrationReport,
    Plan,
    calibration_text,
    plan_json,
    plan_text,
)


def parse_lengths(text: str) -> list[int]:
    """'2k,8k,24k' -> [2000, 8000, 24000] (k = 1,000 tokens, as the published sweep)."""
    lengths = []
    for item in text.split(","):
        token = item.strip().lower()
        scale = 1000 if token.endswith("k") else 1
        digits = token.removesuffix("k")
        try:
            value = int(float(digits) * scale)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--lengths: {item!r} is not a token count (e.g. 2k,8k,24k or 2048)"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"--lengths: {item!r} must be at least 1 token")
        lengths.append(value)
    return lengths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `disagg plan`'s flags to ``parser``."""
    known_models = ", ".join(sorted(catalog.MODEL_CONFIGS))
    parser.add_argument(
        "--model", help=f"catalog model ({known_models}) or a path to a Hugging Face config.json"
    )
    parser.add_argument("--gpu", default="h200", help=f"one of {', '.join(sorted(catalog.GPUS))}")
    parser.add_argument("--tp", type=int, default=8, help="tensor-parallel size (default 8)")
    parser.add_argument(
        "--fabric", default="p5en-efa", help=f"one of {', '.join(sorted(catalog.FABRICS))}"
    )
    parser.add_argument(
        "--rails-per-gpu", type=int, help="override the fabric's RDMA rails per GPU"
    )
    parser.add_argument(
        "--rail-gbps", type=float, help="override the fabric's bandwidth per rail, Gb/s"
    )
    parser.add_argument(
        "--lengths",
        type=parse_lengths,
        default=parse_lengths("2k,8k,16k,24k"),
        help="prompt lengths, comma-separated (default 2k,8k,16k,24k; k = 1,000 tokens)",
    )
    parser.add_argument(
        "--suffix-tokens",
        type=int,
        default=DEFAULT_SUFFIX_TOKENS,
        help=f"new tokens per turn, computed even with reuse (default {DEFAULT_SUFFIX_TOKENS})",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=0,
        help="KV block size in tokens (default: vLLM's, 16; 64 for MLA)",
    )
    parser.add_argument(
        "--max-batched-tokens",
        type=int,
        default=DEFAULT_MAX_BATCHED_TOKENS,
        help="vLLM --max-num-batched-tokens: tokens per prefill pass "
        f"(default {DEFAULT_MAX_BATCHED_TOKENS}, vLLM's on 80+ GB GPUs)",
    )
    parser.add_argument("--kv-dtype", help="KV-cache dtype (default: the model's activation dtype)")
    calibrated = calibration.CALIBRATED
    parser.add_argument(
        "--compute-efficiency",
        type=float,
        default=calibrated.compute,
        help="achieved fraction of the roofline (peak FLOP/s or HBM bandwidth) "
        f"(calibrated: {calibrated.compute:.4f})",
    )
    parser.add_argument(
        "--link-efficiency",
        type=float,
        default=calibrated.link,
        help=f"achieved fraction of the link's line rate (calibrated: {calibrated.link:.4f})",
    )
    parser.add_argument(
        "--fixed-overhead-ms",
        type=float,
        default=calibrated.fixed_overhead_s * 1e3,
        help="fixed latency per serialized step, ms "
        f"(calibrated: {calibrated.fixed_overhead_s * 1e3:.2f})",
    )
    parser.add_argument(
        "--json", metavar="PATH", help="also write the plan as JSON ('-': stdout only)"
    )
    parser.add_argument(
        "--calibration-report",
        action="store_true",
        help="refit the constants on the published P5en points and print every point's error",
    )


def _fabric(args: argparse.Namespace) -> catalog.Fabric:
    fabric = catalog.fabric(args.fabric)
    rails = fabric.rails_per_gpu if args.rails_per_gpu is None else args.rails_per_gpu
    gbps = fabric.rail_gbit_per_s if args.rail_gbps is None else args.rail_gbps
    if rails < 1:
        raise ValueError(f"--rails-per-gpu must be >= 1, got {rails}")
    if gbps <= 0:
        raise ValueError(f"--rail-gbps must be > 0, got {gbps}")
    if (rails, gbps) == (fabric.rails_per_gpu, fabric.rail_gbit_per_s):
        return fabric
    return catalog.Fabric(f"{args.fabric}: {rails} x {gbps:g} Gb/s per GPU", rails, gbps)


def build_plan(args: argparse.Namespace) -> Plan:
    """The plan the arguments describe; bad values raise ``ModelConfigError`` or ``ValueError``."""
    if not args.model:
        raise ModelConfigError("--model is required (or use --calibration-report)")
    kv_dtype = parse_dtype(args.kv_dtype, "--kv-dtype") if args.kv_dtype else None
    deployment = Deployment(
        model=catalog.model(args.model, kv_dtype),
        gpu=catalog.gpu(args.gpu),
        tp=args.tp,
        fabric=_fabric(args),
        suffix_tokens=args.suffix_tokens,
        block_tokens=args.block_size,
        max_batched_tokens=args.max_batched_tokens,
    )
    eff = Efficiency(args.compute_efficiency, args.link_efficiency, args.fixed_overhead_ms / 1e3)
    predictions = [predict(deployment, eff, n) for n in args.lengths]
    return Plan(deployment, eff, predictions, recompute_threshold(deployment, eff))


def run(args: argparse.Namespace) -> int:
    """Print the plan (and write JSON), or the calibration report; 2 on bad input."""
    if args.calibration_report:
        sys.stdout.write(calibration_text(CalibrationReport.compute()))
        return 0
    try:
        plan = build_plan(args)
    except ValueError as exc:
        print(f"disagg plan: {exc}", file=sys.stderr)
        return 2
    document = json.dumps(plan_json(plan), indent=2) + "\n"
    if args.json == "-":
        sys.stdout.write(document)
        return 0
    sys.stdout.write(plan_text(plan))
    if args.json:
        Path(args.json).write_text(document, encoding="utf-8")
    return 0
