"""Session-scoped engine rig: the model, then the bidirectional (ON) and baseline (OFF) pairs.

Prefill servers share core 0 and decode servers core 1. Servers stay up for the session;
tests that need another decode config (short TTL, no 2-core hooks) start one more decode.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from disagg.rig.engine import CACHE, EngineServer, ServerSpec, ensure_model, start_all
from disagg_contract import CONNECTOR_CLASS, Role
from driver import PDDriver

MODEL_DIR = CACHE / "models" / "tiny-llama-h256-l4-v1"
PREFILL_CORE, DECODE_CORE = 0, 1
RIG_CONNECTOR_ENV = "DISAGG_RIG_CONNECTOR"
"""Set to ``NixlConnector`` to run the bidirectional servers with vLLM's stock connector."""


@dataclass
class Pair:
    """A prefill and a decode server and a driver over them."""

    prefill: EngineServer
    decode: EngineServer

    def driver(self, *, reuse: bool = True) -> PDDriver:
        return PDDriver(self.prefill.url, self.decode.url, reuse=reuse)


@dataclass
class Rig:
    """The session's servers: bidirectional ON pair and OFF pair."""

    on: Pair
    off: Pair
    log_dir: Path

    def decode_server(self, spec: ServerSpec) -> EngineServer:
        return EngineServer(spec, MODEL_DIR, self.log_dir)


@pytest.fixture(scope="session")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    model_dir = ensure_model(MODEL_DIR)
    log_dir = Path(os.environ.get("DISAGG_RIG_LOGS", tmp_path_factory.mktemp("engine-logs")))
    connector = os.environ.get(RIG_CONNECTOR_ENV, CONNECTOR_CLASS)
    specs = [
        ServerSpec("prefill-on", Role.PREFILL, 18100, 15600, PREFILL_CORE, connector=connector),
        ServerSpec("decode-on", Role.DECODE, 18200, 15601, DECODE_CORE, connector=connector),
        ServerSpec("prefill-off", Role.PREFILL, 18101, 15602, PREFILL_CORE, bidirectional=False),
        ServerSpec("decode-off", Role.DECODE, 18201, 15603, DECODE_CORE, bidirectional=False),
    ]
    servers = [EngineServer(spec, model_dir, log_dir) for spec in specs]
    start_all(servers)
    try:
        yield Rig(Pair(servers[0], servers[1]), Pair(servers[2], servers[3]), log_dir)
    finally:
        for server in servers:
            server.stop()
