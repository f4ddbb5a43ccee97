"""What the engine tests read off running servers: Prometheus samples and idle CPU."""

from __future__ import annotations

import re
import time

import httpx
import psutil

from disagg.rig.engine import EngineServer
from disagg.rig.router import RouterProcess


def counter(server: EngineServer, name: str) -> float:
    """Sum of an engine's Prometheus counter over its label sets (0 when absent)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", re.M)
    return sum(float(value) for value in pattern.findall(text))


def metric(router: RouterProcess, name: str, **labels: str) -> float:
    """One sample of the router's /metrics (0 when absent)."""
    text = httpx.get(router.url + "/metrics", timeout=10).text
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{re.escape(name)}(?:\{{{re.escape(wanted)}\}})? ([0-9.e+-]+)$"
    match = re.search(pattern, text, re.M)
    return float(match.group(1)) if match else 0.0


def lookups(router: RouterProcess, result: str) -> float:
    """The router's conversation lookups with this result (hit, miss, stale, expired)."""
    return metric(router, "disagg_router_conversation_lookups_total", result=result)


def idle_cpu_percent(server: EngineServer, seconds: float) -> float:
    """CPU used by the server's process tree over ``seconds`` of idling, in % of one core."""
    assert server.process is not None
    root = psutil.Process(server.process.pid)
    processes = [root, *root.children(recursive=True)]

    def total() -> float:
        used = 0.0
        for process in processes:
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            used += times.user + times.system
        return used

    start = total()
    time.sleep(seconds)
    return 100.0 * (total() - start) / seconds


def sample(server: EngineServer, name: str, **labels: str) -> float:
    """Sum of an engine's Prometheus samples of ``name`` whose labels include ``labels``."""
    return _summed(httpx.get(f"{server.url}/metrics", timeout=10).text, name, labels)


def retention_ledger(server: EngineServer) -> float:
    """Decode's retentions held now plus those it ever freed, from one ``/metrics`` read: it
    grows by one with each new retention and by nothing else (a free moves one from the first
    term to the second in the same stats report)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return _summed(text, "vllm:disagg_kv_retained_requests", {}) + _summed(
        text, "vllm:disagg_kv_retention_frees_total", {}
    )


def _summed(text: str, name: str, labels: dict[str, str]) -> float:
    total = 0.0
    for match in re.finditer(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? ([0-9.e+-]+)$", text, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(found.get(key) == value for key, value in labels.items()):
            total += float(match.group(2))
    return total
