"""Real servers for router tests: stand-in engines and routers under uvicorn, on threads.

Each server listens on its own loopback socket; stopping one closes its port, so the router
sees real connection failures. ``RouterRig`` wires stand-ins and a router together.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from disagg_router.app import create_app
from disagg_router.config import RouterConfig
from engine_standin import StandinState, build_app


def bind_loopback(port: int = 0) -> socket.socket:
    """A listening-ready TCP socket on 127.0.0.1 (``port`` 0 picks a free one)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


class ServerThread:
    """One ASGI app served by uvicorn on a background thread."""

    def __init__(self, app: Any, port: int = 0) -> None:
        self.app = app
        self._sock = bind_loopback(port)
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def start(self) -> ServerThread:
        """Start serving and wait until the app's startup finished."""
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"server on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def app_state(self) -> Any:
        """The served app's ``state`` (the router's pools, store and metrics)."""
        return self.app.state

    def stop(self) -> None:
        """Shut down (connections refused afterwards) and wait for the thread."""
        self.request_stop()
        self.join()

    def request_stop(self) -> None:
        """Ask the server to shut down without waiting."""
        self._server.should_exit = True

    def join(self) -> None:
        """Wait for a requested shutdown to finish."""
        self._thread.join(timeout=20)
        self._sock.close()


@dataclass
class Engine:
    """A running stand-in engine."""

    state: StandinState
    server: ServerThread

    @property
    def url(self) -> str:
        return self.server.url


def start_engine(role: str, name: str, port: int = 0, api_key: str | None = None) -> Engine:
    """Start a stand-in engine of ``role`` (refusing /v1 calls without ``api_key``, if set)."""
    state = StandinState(role=role, name=name, api_key=api_key)
    return Engine(state, ServerThread(build_app(state), port).start())


def router_config(prefill: list[str], decode: list[str], **overrides: Any) -> RouterConfig:
    """A router config for tests: fast health checks, static discovery."""
    base = RouterConfig(
        prefill_urls=tuple(prefill),
        decode_urls=tuple(decode),
        health_interval_s=0.2,
        health_max_backoff_s=0.4,
        connect_timeout_s=1.0,
        prefill_timeout_s=10.0,
        decode_timeout_s=10.0,
    )
    return replace(base, **overrides).validate()


@dataclass
class RouterRig:
    """Stand-in prefill and decode engines behind one or more routers."""

    prefill: list[Engine]
    decode: list[Engine]
    routers: list[ServerThread] = field(default_factory=list)

    def start_router(self, **overrides: Any) -> ServerThread:
        """Start a router in front of every engine; ``overrides`` patch its config."""
        config = router_config(
            [e.url for e in self.prefill], [e.url for e in self.decode], **overrides
        )
        router = ServerThread(create_app(config)).start()
        self.routers.append(router)
        return router

    def stop(self) -> None:
        """Stop routers, then engines (each group shutting down in parallel)."""
        for group in (self.routers, [e.server for e in self.prefill + self.decode]):
            for server in group:
                server.request_stop()
            for server in group:
                server.join()


@contextmanager
def router_rig(
    prefills: int = 2, decodes: int = 2, engine_api_key: str | None = None, **overrides: Any
) -> Iterator[RouterRig]:
    """A rig with one router started; stopped on exit."""
    rig = RouterRig(
        [start_engine("prefill", f"p{i}", api_key=engine_api_key) for i in range(prefills)],
        [start_engine("decode", f"d{i}", api_key=engine_api_key) for i in range(decodes)],
    )
    try:
        rig.start_router(**overrides)
        yield rig
    finally:
        rig.stop()


def metric(client: httpx.Client, name: str, **labels: str) -> float:
    """The value of one Prometheus sample on the router's /metrics (0 if absent)."""
    text = client.get("/metrics").text
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)", line)
        if not match or match.group(1) != name:
            continue
        found = ",".join(sorted((match.group(2) or "").split(","))) if match.group(2) else ""
        if found == wanted:
            return float(match.group(3))
    return 0.0


class SecretVolume:
    """A folder laid out as the kubelet mounts a Secret: every key a symlink through ``..data``
    into a timestamped folder, and an update swaps all keys at once by renaming a new
    ``..data`` symlink over the old one (keys no longer in the Secret are then unlinked)."""

    def __init__(self, path: Path, data: dict[str, str]) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.publish(data)

    def publish(self, data: dict[str, str]) -> None:
        """Make ``data`` (key name -> content) the Secret's keys, as one atomic update."""
        payload = self.path / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
        payload.mkdir()
        for name, value in data.items():
            (payload / name).write_text(value)
        staged = self.path / "..data_tmp"
        staged.symlink_to(payload.name)
        previous = (self.path / "..data").resolve() if (self.path / "..data").exists() else None
        staged.replace(self.path / "..data")
        for name in data:
            link = self.path / name
            if not link.is_symlink():
                link.symlink_to(Path("..data") / name)
        for link in self.path.iterdir():
            if not link.name.startswith("..") and link.name not in data:
                link.unlink()
        if previous is not None:
            for old in previous.iterdir():
                old.unlink()
            previous.rmdir()


REDIS_SCRIPT = Path(__file__).with_name("redis_server.sh")


@contextmanager
def redis_server() -> Iterator[str]:
    """A real redis-server on a free loopback port (installed if missing); yields its URL."""
    with bind_loopback() as sock:
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [str(REDIS_SCRIPT), str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                stderr = process.stderr.read().decode() if process.stderr else ""
                raise RuntimeError(f"redis-server did not start: {stderr}")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)


@dataclass(frozen=True)
class RouterProcess:
    """A ``disagg router`` process and its base URL."""

    url: str
    process: subprocess.Popen[bytes]


@contextmanager
def router_process(prefill: list[str], decode: list[str], *options: str) -> Iterator[RouterProcess]:
    """``disagg router`` as a separate process (SIGKILLed on exit if still running); its log
    goes to a file, which no amount of logging fills (a pipe nobody reads would, and block it)."""
    with bind_loopback() as sock:
        port = sock.getsockname()[1]
    command = [
        sys.executable, "-m", "disagg.cli", "router", "--host", "127.0.0.1",
        "--port", str(port), "--prefill", *prefill, "--decode", *decode, *options,
    ]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    process.wait(timeout=10)
                    log.seek(0)
                    stderr = log.read().decode(errors="replace")
                    raise RuntimeError(f"router process did not become healthy: {stderr[-2000:]}")
                time.sleep(0.1)
            yield RouterProcess(url, process)
        finally:
            process.kill()
            process.wait(timeout=10)
