"""A real S3-compatible server for the tests: versitygw (POSIX backend), built from its pinned Go
module by s3/build-versitygw.sh, started on a given address with an access key the test makes.

`s3_server(...)` builds it when needed (a no-op once cached), starts it over a fresh folder,
waits until it answers and stops it afterwards; `S3Server.put_folder` uploads a model's files
with boto3. Used by the launcher's weights check (tests/unit), the e2e test that serves the
demo model from s3:// (tests/e2e) and benchmarks/s3_load.py.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

S3_SCRIPTS = Path(__file__).resolve().parent / "s3"
BUILD_TIMEOUT_S = 1800
"""Bound of the build: cold, about two minutes of compile on two cores, after the heavy lock."""
START_TIMEOUT_S = 30
REGION = "us-east-1"


def _env() -> dict[str, str]:
    out = subprocess.run(
        ["bash", str(S3_SCRIPTS / "env.sh")], check=True, capture_output=True, text=True
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def versitygw() -> Path:
    """The versitygw binary, built from the pinned module when the cache lacks it."""
    subprocess.run(
        ["bash", str(S3_SCRIPTS / "build-versitygw.sh")],
        check=True,
        capture_output=True,
        timeout=BUILD_TIMEOUT_S,
    )
    return Path(_env()["VERSITYGW_BIN"]) / "versitygw"


@dataclass(frozen=True)
class S3Server:
    """A running server: its endpoint URL and its root access key."""

    endpoint: str
    access_key_id: str
    secret_access_key: str

    def client(self, access_key_id: str | None = None, secret_access_key: str | None = None) -> Any:
        """A boto3 S3 client of this server (path-style), with its key unless others are given."""
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=access_key_id or self.access_key_id,
            aws_secret_access_key=secret_access_key or self.secret_access_key,
            config=Config(s3={"addressing_style": "path"}),
        )

    def put_folder(self, folder: Path, bucket: str, prefix: str) -> None:
        """Create `bucket` (when missing) and upload every file of `folder` under `prefix`/."""
        client = self.client()
        if bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
            client.create_bucket(Bucket=bucket)
        for path in sorted(folder.iterdir()):
            if path.is_file():
                client.upload_file(str(path), bucket, f"{prefix}/{path.name}")


def _answers(client: Any) -> bool:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        client.list_buckets()
    except (BotoCoreError, ClientError):
        return False
    return True


@contextmanager
def s3_server(root: Path, host: str = "127.0.0.1", port: int = 7070) -> Iterator[S3Server]:
    """versitygw serving `root` (one folder per bucket) on host:port with a fresh access key."""
    binary = versitygw()
    root.mkdir(parents=True, exist_ok=True)
    server = S3Server(f"http://{host}:{port}", secrets.token_hex(8), secrets.token_hex(16))
    env = {
        "ROOT_ACCESS_KEY_ID": server.access_key_id,
        "ROOT_SECRET_ACCESS_KEY": server.secret_access_key,
        "VGW_REGION": REGION,
    }
    log = (root.parent / f"versitygw-{port}.log").open("w")
    proc = subprocess.Popen(
        [str(binary), "--port", f"{host}:{port}", "posix", str(root)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        client = server.client()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(client):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                raise RuntimeError(
                    f"versitygw on {host}:{port} did not answer (exit {proc.poll()}): "
                    + (root.parent / f"versitygw-{port}.log").read_text()[-2000:]
                )
            time.sleep(0.2)
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
