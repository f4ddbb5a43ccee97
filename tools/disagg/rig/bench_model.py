"""The rig's larger model, served 1P1D behind ``disagg router``, for TTFT measurements.

A random-weight Llama (``MODEL_SIZE``) large enough that prefill compute dominates on CPU; used
by benchmarks/local_ttft.py and by ``make demo`` (demo/local_pd.py). Prefill on core 0 without
prefix caching, decode on core 1.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from disagg.rig.engine import CACHE, EngineServer, ServerSpec, ensure_model, start_all
from disagg.rig.router import RouterProcess
from disagg_contract import Role

MODEL_SIZE = {
    "hidden": 1024,
    "intermediate": 4096,
    "layers": 8,
    "heads": 16,
    "kv-heads": 4,
    "max-positions": 32768,
}
MODEL_NAME = "llama-h1024-l8-fp32-random"
MODEL_DIR = CACHE / "models" / "bench-llama-h1024-l8-v1"
MAX_MODEL_LEN = 32768
KV_CACHE_BYTES = 1536 * 2**20
PREFILL_CORE, DECODE_CORE = 0, 1
PREFILL_PORT, DECODE_PORT = 18300, 18400
DESCRIPTION = "random Llama h1024 L8 fp32"


def ensure_bench_model() -> Path:
    """Make the model once into the cache."""
    options = [item for key, value in MODEL_SIZE.items() for item in (f"--{key}", str(value))]
    return ensure_model(MODEL_DIR, *options)


def bench_pair(
    log_dir: Path,
    name: str,
    bidirectional: bool = True,
    kv_configs: dict[Role, dict[str, Any]] | None = None,
) -> list[EngineServer]:
    """Prefill and decode servers of the model; ``kv_configs`` (by role) replaces the rig's
    own ``--kv-transfer-config`` (e.g. the one the operator rendered)."""
    specs = [
        ServerSpec(
            f"{name}-prefill", Role.PREFILL, PREFILL_PORT, 15700, PREFILL_CORE, bidirectional
        ),
        ServerSpec(f"{name}-decode", Role.DECODE, DECODE_PORT, 15701, DECODE_CORE, bidirectional),
    ]
    return [
        EngineServer(
            spec,
            MODEL_DIR,
            log_dir,
            served_name=MODEL_NAME,
            max_model_len=MAX_MODEL_LEN,
            kv_cache_bytes=KV_CACHE_BYTES,
            kv_config=(kv_configs or {}).get(spec.role),
        )
        for spec in specs
    ]


@contextmanager
def serving(
    servers: list[EngineServer], name: str, log_dir: Path, *router_args: str
) -> Iterator[RouterProcess]:
    """Start the servers and a router (with ``router_args``) in front of them, each in its
    role's pool; yield the router; stop everything."""
    started = time.monotonic()
    start_all(servers)
    print(f"{name}: servers healthy in {time.monotonic() - started:.0f} s", file=sys.stderr)
    try:
        pools = {role: [s.url for s in servers if s.spec.role is role] for role in Role}
        router = RouterProcess.start(
            f"{name}-router", pools[Role.PREFILL], pools[Role.DECODE], log_dir, *router_args
        )
        try:
            yield router
        finally:
            router.stop()
    finally:
        for server in servers:
            server.stop()
