"""Router overhead and throughput against engine stand-ins, figures as JSON.

Starts a prefill and a decode *engine stand-in* (tests/unit/engine_standin.py: instant fake
engines, not vLLM) and ``disagg router`` in front of them, each in its own process, then at
each concurrency level runs streamed multi-turn chat requests three ways:

* ``direct_decode``: the client calls the decode stand-in once (the engine alone);
* ``direct_pd``: the client itself calls prefill (max_tokens=1) then decode, the least any
  P/D setup does;
* ``router``: the client calls the router, which does prefill + decode + conversation upkeep.

Latency is request start to the last byte of the stream. Reported per level: p50/p99 of each
mode, the router's added p50/p99 over both direct modes, requests/s, errors, and the router
process's CPU (cores busy) and peak RSS read from /proc. Run under the heavy-job lock:

    flock /tmp/disagg-heavy.lock .venv/bin/python benchmarks/router_overhead.py
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests" / "unit" / "engine_standin.py"
MODEL = "standin-model"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ROUNDS = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def process(args: list[str], url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``args`` (output to ``log``) until the block ends; wait until ``url``/health answers."""
    with log.open("wb") as out:
        child = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{args[:3]} did not become healthy")
            time.sleep(0.1)
        yield child
    finally:
        child.terminate()
        child.wait(timeout=20)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def read_stream(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> str | None:
    """Stream one answer; None when it completed, else what went wrong."""
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            return f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
        tail = b""
        async for chunk in response.aiter_bytes():
            tail = (tail + chunk)[-300:]
        return None if tail.endswith(b"data: [DONE]\n\n") else f"incomplete: {tail!r}"


Call = Callable[[httpx.AsyncClient, dict[str, Any]], Awaitable[str | None]]


@dataclass
class Samples:
    """Latencies, errors and busy time of one mode at one concurrency level."""

    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "requests": len(self.latencies),
            "errors": len(self.errors),
            "error_kinds": sorted(set(self.errors))[:5],
            "p50_ms": round(statistics.median(self.latencies) * 1000, 3),
            "p99_ms": round(percentile(self.latencies, 0.99) * 1000, 3),
            "requests_per_s": round(len(self.latencies) / self.wall_s, 1),
        }


async def run_batch(
    call: Call, concurrency: int, requests: int, tokens: int, tag: str, samples: Samples
) -> None:
    """``requests`` streamed turns over ``concurrency`` conversations, added to ``samples``."""
    per_worker = max(1, requests // concurrency)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=concurrency * 2)

    async def worker(index: int, client: httpx.AsyncClient) -> None:
        messages = [{"role": "user", "content": f"conversation {index} opening question"}]
        for turn in range(per_worker):
            body = {
                "model": MODEL,
                "messages": messages,
                "stream": True,
                "max_tokens": tokens,
                "conversation_id": f"bench-{tag}-{index}",
            }
            started = time.perf_counter()
            try:
                error = await call(client, body)
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            samples.latencies.append(time.perf_counter() - started)
            if error is not None:
                samples.errors.append(error)
            messages = [*messages, {"role": "user", "content": f"follow-up {turn}"}]

    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(i, client) for i in range(concurrency)))
        samples.wall_s += time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--requests", type=int, default=512, help="requests per level and mode")
    parser.add_argument("--tokens", type=int, default=16, help="streamed tokens per answer")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "router_overhead.json")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/router-bench-logs"))
    args = parser.parse_args()
    args.log_dir.mkdir(parents=True, exist_ok=True)

    ports = {name: free_port() for name in ("prefill", "decode", "router")}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    standin = [sys.executable, str(STANDIN)]
    router_cmd = [
        sys.executable, "-m", "disagg.cli", "router", "--host", "127.0.0.1",
        "--port", str(ports["router"]), "--prefill", urls["prefill"], "--decode", urls["decode"],
    ]  # fmt: skip
    chat = "/v1/chat/completions"

    async def direct_decode(client: httpx.AsyncClient, body: dict[str, Any]) -> str | None:
        plain = {k: v for k, v in body.items() if k != "conversation_id"}
        return await read_stream(client, urls["decode"] + chat, plain)

    async def direct_pd(client: httpx.AsyncClient, body: dict[str, Any]) -> str | None:
        plain = {k: v for k, v in body.items() if k != "conversation_id"}
        prefill = {**plain, "stream": False, "max_tokens": 1}
        response = await client.post(urls["prefill"] + chat, json=prefill)
        params = response.json().get("kv_transfer_params")
        return await read_stream(
            client, urls["decode"] + chat, {**plain, "kv_transfer_params": params}
        )

    async def via_router(client: httpx.AsyncClient, body: dict[str, Any]) -> str | None:
        return await read_stream(client, urls["router"] + chat, body)

    levels = []
    with (
        process(
            [*standin, "--role", "prefill", "--port", str(ports["prefill"])],
            urls["prefill"],
            args.log_dir / "prefill.log",
        ),
        process(
            [*standin, "--role", "decode", "--port", str(ports["decode"])],
            urls["decode"],
            args.log_dir / "decode.log",
        ),
        process(router_cmd, urls["router"], args.log_dir / "router.log") as router,
    ):
        modes = {"direct_decode": direct_decode, "direct_pd": direct_pd, "router": via_router}
        for call in modes.values():
            asyncio.run(run_batch(call, 4, 64, args.tokens, "warm-up", Samples()))
        for concurrency in args.levels:
            batch = max(args.requests // ROUNDS, concurrency * 2)
            samples = {name: Samples() for name in modes}
            router_cpu_s = 0.0
            for round_index in range(ROUNDS):  # modes interleaved: load drift hits all alike
                for name, call in modes.items():
                    cpu_before = cpu_seconds(router.pid)
                    tag = f"{concurrency}-{round_index}"
                    asyncio.run(
                        run_batch(call, concurrency, batch, args.tokens, tag, samples[name])
                    )
                    if name == "router":
                        router_cpu_s += cpu_seconds(router.pid) - cpu_before
            level: dict[str, Any] = {"concurrency": concurrency}
            level.update({name: samples[name].summary() for name in modes})
            level["router"]["cpu_cores"] = round(router_cpu_s / samples["router"].wall_s, 2)
            level["router"]["cpu_ms_per_request"] = round(
                router_cpu_s * 1000 / len(samples["router"].latencies), 3
            )
            level["router"]["rss_mib"] = round(rss_mib(router.pid), 1)
            for base in ("direct_decode", "direct_pd"):
                for stat in ("p50_ms", "p99_ms"):
                    added = level["router"][stat] - level[base][stat]
                    level[f"added_{stat}_vs_{base}"] = round(added, 3)
            levels.append(level)
            print(json.dumps(level), flush=True)
    report = {
        "benchmark": "router_overhead",
        "engines": "engine stand-ins (tests/unit/engine_standin.py), not vLLM",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "server_stack": {
            "uvloop": importlib.util.find_spec("uvloop") is not None,
            "httptools": importlib.util.find_spec("httptools") is not None,
            "engine_client": f"aiohttp {version('aiohttp')}",
        },
        "settings": {
            "tokens": args.tokens,
            "requests_per_level_and_mode": args.requests,
            "rounds": ROUNDS,
        },
        "levels": levels,
    }
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
