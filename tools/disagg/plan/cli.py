"""`disagg plan`: arguments and the run function (registered by ``disagg_connector.commands``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from disagg.bench.records import BenchResult
from disagg.plan import calibration, catalog, measured
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
    run_fit_json,
    run_fit_text,
)

DEFAULT_GPU, DEFAULT_TP, DEFAULT_FABRIC = "h200", 8, "p5en-efa"


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
    parser.add_argument(
        "--gpu", help=f"one of {', '.join(sorted(catalog.GPUS))} (default {DEFAULT_GPU})"
    )
    parser.add_argument("--tp", type=int, help=f"tensor-parallel size (default {DEFAULT_TP})")
    parser.add_argument(
        "--fabric",
        help=f"one of {', '.join(sorted(catalog.FABRICS))} (default {DEFAULT_FABRIC})",
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
        help="new tokens per turn, computed even with reuse "
        f"(default {DEFAULT_SUFFIX_TOKENS}; with --calibrate, the run's)",
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
    parser.add_argument(
        "--calibrate",
        metavar="RUN.json",
        type=Path,
        help="fit the three constants on a `disagg bench` run of your deployment (its JSON), "
        "print every point's error, then the plan with the fitted constants; --model, --gpu, "
        "--tp and --fabric describe the measured deployment when the run does not record it, "
        "and otherwise change the shape the plan predicts",
    )
    parser.add_argument(
        "--fit-shortest",
        type=int,
        metavar="N",
        help="with --calibrate: fit on the run's N shortest lengths and report the longer ones "
        "as held-out predictions (default: fit on all)",
    )


def _fabric(args: argparse.Namespace, base: catalog.Fabric) -> catalog.Fabric:
    """``base`` with the rails and rate overrides applied."""
    rails = base.rails_per_gpu if args.rails_per_gpu is None else args.rails_per_gpu
    gbps = base.rail_gbit_per_s if args.rail_gbps is None else args.rail_gbps
    if rails < 1:
        raise ValueError(f"--rails-per-gpu must be >= 1, got {rails}")
    if gbps <= 0:
        raise ValueError(f"--rail-gbps must be > 0, got {gbps}")
    if (rails, gbps) == (base.rails_per_gpu, base.rail_gbit_per_s):
        return base
    name = args.fabric or base.name
    return catalog.Fabric(f"{name}: {rails} x {gbps:g} Gb/s per GPU", rails, gbps)


def _deployment(args: argparse.Namespace, base: Deployment | None = None) -> Deployment:
    """The deployment the flags describe; a flag not given keeps ``base``'s value (or the
    default without a base)."""
    kv_dtype = parse_dtype(args.kv_dtype, "--kv-dtype") if args.kv_dtype else None
    if args.model:
        model = catalog.model(args.model, kv_dtype)
    elif base is not None:
        model = base.model
    else:
        raise ModelConfigError("--model is required (or use --calibration-report or --calibrate)")
    if args.gpu:
        gpu = catalog.gpu(args.gpu)
    else:
        gpu = base.gpu if base is not None else catalog.gpu(DEFAULT_GPU)
    if args.fabric:
        fabric = catalog.fabric(args.fabric)
    else:
        fabric = base.fabric if base is not None else catalog.fabric(DEFAULT_FABRIC)
    tp = args.tp if args.tp is not None else (base.tp if base is not None else DEFAULT_TP)
    suffix = args.suffix_tokens
    if suffix is None:
        suffix = base.suffix_tokens if base is not None else DEFAULT_SUFFIX_TOKENS
    block = args.block_size or (base.block_tokens if base is not None else 0)
    passes = args.max_batched_tokens
    if passes is None:
        passes = base.max_batched_tokens if base is not None else DEFAULT_MAX_BATCHED_TOKENS
    return Deployment(
        model=model,
        gpu=gpu,
        tp=tp,
        fabric=_fabric(args, fabric),
        suffix_tokens=suffix,
        block_tokens=block,
        max_batched_tokens=passes,
    )


def make_plan(
    deployment: Deployment, eff: Efficiency, lengths: list[int], source: str | None = None
) -> Plan:
    """Predictions at ``lengths`` and the suggested threshold; ``source`` names the constants'."""
    predictions = [predict(deployment, eff, n) for n in lengths]
    return Plan(deployment, eff, predictions, recompute_threshold(deployment, eff), source)


def build_plan(args: argparse.Namespace) -> Plan:
    """The plan the arguments describe; bad values raise ``ModelConfigError`` or ``ValueError``."""
    eff = Efficiency(args.compute_efficiency, args.link_efficiency, args.fixed_overhead_ms / 1e3)
    return make_plan(_deployment(args), eff, args.lengths)


def calibrate(args: argparse.Namespace) -> tuple[measured.RunFit, Plan]:
    """Fit on the ``--calibrate`` run, then plan the (possibly reshaped) deployment with it."""
    path: Path = args.calibrate
    try:
        result = BenchResult.load(path)
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"--calibrate {path}: not a disagg bench result ({exc})") from None
    recorded = measured.run_deployment(result)
    if recorded is not None:
        measured_on = measured.deployment_from(recorded, result.model)
        fitted = measured.fit_run(result, measured_on, args.fit_shortest)
        base = dataclasses.replace(measured_on, suffix_tokens=fitted.suffix_tokens)
        target = _deployment(args, base)
    else:
        measured_on = _deployment(args)
        fitted = measured.fit_run(result, measured_on, args.fit_shortest)
        suffix = args.suffix_tokens or fitted.suffix_tokens
        target = dataclasses.replace(measured_on, suffix_tokens=suffix)
    source = f"fitted on {path.name} (disagg plan --calibrate)"
    return fitted, make_plan(target, fitted.efficiency, args.lengths, source)


def run(args: argparse.Namespace) -> int:
    """Print the plan (and write JSON), the calibration on a run, or the published-points
    report; 2 on bad input."""
    if args.calibration_report:
        sys.stdout.write(calibration_text(CalibrationReport.compute()))
        return 0
    if args.fit_shortest is not None and not args.calibrate:
        print("disagg plan: --fit-shortest needs --calibrate RUN.json", file=sys.stderr)
        return 2
    fitted = None
    try:
        if args.calibrate:
            fitted, plan = calibrate(args)
        else:
            plan = build_plan(args)
    except ValueError as exc:
        print(f"disagg plan: {exc}", file=sys.stderr)
        return 2
    data = plan_json(plan)
    if fitted is not None:
        data["calibration"] = run_fit_json(fitted, str(args.calibrate))
    document = json.dumps(data, indent=2) + "\n"
    if args.json == "-":
        sys.stdout.write(document)
        return 0
    if fitted is not None:
        sys.stdout.write(run_fit_text(fitted, str(args.calibrate)) + "\n")
    sys.stdout.write(plan_text(plan))
    if args.json:
        Path(args.json).write_text(document, encoding="utf-8")
    return 0
