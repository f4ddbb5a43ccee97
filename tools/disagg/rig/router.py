"""``disagg router`` in front of the rig's servers: as a child process, or served on a thread
of the caller's process, where the caller reaches its replica pools as discovery does."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from disagg_contract import Role
from disagg_router.app import create_app
from disagg_router.config import RouterConfig


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class RouterProcess:
    """``disagg router`` as a child process, logging to a file."""

    name: str
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    @classmethod
    def start(
        cls, name: str, prefill: list[str], decode: list[str], log_dir: Path, *extra: str
    ) -> RouterProcess:
        port = free_port()
        log_path = log_dir / f"{name}.log"
        command = [
            sys.executable, "-m", "disagg.cli", "router",
            "--host", "127.0.0.1", "--port", str(port),
            "--prefill", *prefill, "--decode", *decode,
            "--health-interval", "0.5", "--health-max-backoff", "2", *extra,
        ]  # fmt: skip
        with log_path.open("wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        router = cls(name, process, f"http://127.0.0.1:{port}", log_path)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(router.url + "/health", timeout=2).status_code == 200:
                    return router
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                router.stop()
                raise RuntimeError(f"{name} did not become healthy:\n{log_path.read_text()}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)


@dataclass
class RouterThread:
    """``disagg router``'s app on its own event loop on a thread of this process: the caller
    changes the pools' membership on that loop, as the router's EndpointSlice discovery does
    (e.g. a decode whose endpoint turns terminating)."""

    app: Any
    server: uvicorn.Server
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    url: str

    @classmethod
    def start(cls, prefill: list[str], decode: list[str], **overrides: Any) -> RouterThread:
        """Serve a router over ``prefill`` and ``decode`` (static discovery) until ``stop``;
        ``overrides`` patch its config."""
        base = RouterConfig(
            prefill_urls=tuple(prefill),
            decode_urls=tuple(decode),
            health_interval_s=0.5,
            health_max_backoff_s=2.0,
        )
        app = create_app(replace(base, **overrides).validate())
        port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        server = uvicorn.Server(config)
        loop = asyncio.new_event_loop()
        thread = threading.Thread(
            target=loop.run_until_complete, args=(server.serve(),), daemon=True
        )
        router = cls(app, server, loop, thread, f"http://127.0.0.1:{port}")
        thread.start()
        deadline = time.monotonic() + 60
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                router.stop()
                raise RuntimeError("the router thread did not start")
            time.sleep(0.05)
        return router

    def set_members(self, role: Role, urls: Sequence[str], draining: Sequence[str] = ()) -> None:
        """Make ``urls`` the members of ``role``'s pool, ``draining`` ones leaving, on the
        router's loop (what discovery hands the pool when EndpointSlices change)."""
        pool = self.app.state.prefill if role is Role.PREFILL else self.app.state.decode

        async def apply() -> None:
            pool.set_urls(urls, draining)

        asyncio.run_coroutine_threadsafe(apply(), self.loop).result(timeout=10)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
        if not self.thread.is_alive():
            self.loop.close()
