"""``disagg router`` as a child process, in front of the rig's servers."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


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
