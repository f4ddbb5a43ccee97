"""Session-scoped engine rig: the model, then the bidirectional (ON) and baseline (OFF) pairs.

Prefill servers share core 0 and decode servers core 1. Servers stay up for the session;
tests that need another decode config (short TTL, a key) start one more decode.
Tests that take the ``on_pair`` fixture run over each NIXL backend ``DISAGG_ENGINE_BACKENDS``
names: the rig's ON pair (UCX), or an ON pair over LIBFABRIC with libfabric's tcp provider,
which each such module starts.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from disagg.rig.engine import (
    CACHE,
    ENGINE_VENV,
    EngineServer,
    ServerSpec,
    ensure_model,
    libfabric_env,
    start_all,
)
from disagg_contract import CONNECTOR_CLASS, Role
from driver import PDDriver

MODEL_DIR = CACHE / "models" / "tiny-llama-h256-l4-v1"
PREFILL_CORE, DECODE_CORE = 0, 1
RIG_CONNECTOR_ENV = "DISAGG_RIG_CONNECTOR"
"""Set to ``NixlConnector`` to run the bidirectional servers with vLLM's stock connector."""
BACKENDS_ENV = "DISAGG_ENGINE_BACKENDS"
"""Comma-separated NIXL backends the ``on_pair`` tests run over, in order: UCX when unset (``make
test-engine``); ``make test-engine-libfabric`` sets LIBFABRIC."""
BACKENDS = tuple(
    name.strip() for name in os.environ.get(BACKENDS_ENV, "UCX").split(",") if name.strip()
)
LIBFABRIC = ("LIBFABRIC",)
"""A server's backends over LIBFABRIC alone (never beside UCX, which NIXL would pick first)."""
LIBFABRIC_PROBE = (
    "from nixl._api import nixl_agent, nixl_agent_config\n"
    "agent = nixl_agent('probe', nixl_agent_config(backends=['LIBFABRIC']))\n"
    "assert 'LIBFABRIC' in agent.backends, agent.backends\n"
)
"""Makes a NIXL agent with the LIBFABRIC backend, as a LIBFABRIC server's connector does."""
GLOG_PROBLEM = re.compile(r"[EW]\d{4} ")
"""NIXL's error and warning log lines."""


@dataclass
class Pair:
    """A prefill and a decode server and a driver over them."""

    prefill: EngineServer
    decode: EngineServer

    @property
    def backends(self) -> tuple[str, ...]:
        """The NIXL backends the pair moves KV over."""
        return self.decode.spec.backends

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


def libfabric_problem() -> str | None:
    """Why a LIBFABRIC server cannot start on this host, or None when it can: the probe's
    agent, made in the environment the rig gives LIBFABRIC servers, names what failed (for a
    plugin that does not load, the loader's own message)."""
    env = {**os.environ, "NIXL_LOG_LEVEL": "INFO"}
    env.update(libfabric_env(env))
    python = str(ENGINE_VENV / "bin" / "python")
    probe = subprocess.run(
        [python, "-c", LIBFABRIC_PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    if probe.returncode == 0:
        return None
    lines = probe.stderr.splitlines()
    cause = [line for line in lines if GLOG_PROBLEM.match(line) or "Failed to load plugin" in line]
    return "NIXL's LIBFABRIC backend cannot start here: " + " | ".join([*cause[:3], *lines[-1:]])


@pytest.fixture(scope="module")
def libfabric_on(rig: Rig) -> Iterator[Pair]:
    """The ON pair over LIBFABRIC, for one test module (two more servers beside the rig's four
    only while it runs); its tests fail, saying why, where the backend cannot start
    (tests/engine/setup_env.sh says what it needs)."""
    problem = libfabric_problem()
    if problem is not None:
        pytest.fail(problem)
    connector = os.environ.get(RIG_CONNECTOR_ENV, CONNECTOR_CLASS)
    specs = [
        ServerSpec("prefill-on", Role.PREFILL, 18120, 15620, PREFILL_CORE, connector=connector),
        ServerSpec("decode-on", Role.DECODE, 18220, 15621, DECODE_CORE, connector=connector),
    ]
    servers = [EngineServer(over(LIBFABRIC, spec), MODEL_DIR, rig.log_dir) for spec in specs]
    start_all(servers)
    try:
        yield Pair(servers[0], servers[1])
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="module", params=BACKENDS)
def on_pair(request: pytest.FixtureRequest, rig: Rig) -> Pair:
    """The bidirectional ON pair over each NIXL backend in turn (the test id names it)."""
    if request.param == "UCX":
        return rig.on
    pair: Pair = request.getfixturevalue("libfabric_on")
    return pair


def over(backends: tuple[str, ...], spec: ServerSpec) -> ServerSpec:
    """``spec`` on NIXL ``backends`` (a pair's, for a server that moves KV with the pair's),
    its log named after them when they are not the rig's default."""
    if backends == spec.backends:
        return spec
    return replace(spec, name=f"{spec.name}-{'-'.join(backends).lower()}", backends=backends)
