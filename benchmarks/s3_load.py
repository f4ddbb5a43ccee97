"""How long the demo model's weights take to reach memory from S3, two ways, on the tests' S3
server (versitygw on 127.0.0.1, tests/cluster/s3_server.py):

* ``runai``: vLLM's Run:ai model streamer, what an ``s3://`` spec.model.source renders
  (``--load-format runai_streamer``): concurrent ranged GETs straight into the tensors' memory;
* ``awscli``: what an init container would do instead: ``aws s3 cp --recursive`` into a local
  folder (an emptyDir), then safetensors' own load from it, as vLLM's default loader does.

Each round times both, alternating which goes first, so load drift on the shared machine hits
both alike; the figures go to benchmarks/s3_load.json. Needs a Python with torch, safetensors,
``runai-model-streamer[s3]`` and ``awscli`` (the engine venv with those two added; see
benchmarks/README.md), and the demo model made (``make engine-env`` or ``make demo``). Run it
under the heavy-job lock: ``flock /tmp/disagg-heavy.lock <python> benchmarks/s3_load.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "cluster"))
from s3_server import REGION, S3Server, s3_server  # noqa: E402

MODEL = Path.home() / ".cache" / "disagg" / "models" / "bench-llama-h1024-l8-v1"
BUCKET = "models"
OUT = REPO / "benchmarks" / "s3_load.json"


def _aws_env(server: S3Server) -> dict[str, str]:
    """The environment the operator renders for the server (endpoint, path-style, key)."""
    return {
        **os.environ,
        "AWS_ENDPOINT_URL": server.endpoint,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": server.access_key_id,
        "AWS_SECRET_ACCESS_KEY": server.secret_access_key,
        "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
    }


def runai(uri: str, files: list[str]) -> int:
    """Stream every safetensors file of `uri` into memory; return the bytes read."""
    from runai_model_streamer import SafetensorsStreamer

    total = 0
    with SafetensorsStreamer() as streamer:
        streamer.stream_files([f"{uri}/{name}" for name in files])
        for _, tensor in streamer.get_tensors():
            total += tensor.numel() * tensor.element_size()
    return total


def awscli(uri: str, files: list[str]) -> int:
    """Copy `uri` to a local folder with awscli, then load its safetensors files."""
    from safetensors.torch import load_file

    folder = Path(tempfile.mkdtemp(prefix="s3-load-"))
    try:
        subprocess.run(["aws", "s3", "cp", "--recursive", "--quiet", uri, str(folder)], check=True)
        total = 0
        for name in files:
            for tensor in load_file(str(folder / name)).values():
                total += tensor.numel() * tensor.element_size()
        return total
    finally:
        shutil.rmtree(folder)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    files = sorted(p.name for p in MODEL.glob("*.safetensors"))
    if not files:
        print(f"no model at {MODEL}: make engine-env first", file=sys.stderr)
        return 1
    import torch  # noqa: F401 - imported once, before any timing

    ways: dict[str, Callable[[str, list[str]], int]] = {"runai": runai, "awscli": awscli}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    with tempfile.TemporaryDirectory() as tmp, s3_server(Path(tmp) / "root", port=7079) as server:
        server.put_folder(MODEL, BUCKET, MODEL.name)
        os.environ.update(_aws_env(server))
        uri = f"s3://{BUCKET}/{MODEL.name}"
        size = 0
        for index in range(args.rounds):
            order = list(ways) if index % 2 == 0 else list(reversed(ways))
            for name in order:
                start = time.monotonic()
                size = ways[name](uri, files)
                seconds[name].append(round(time.monotonic() - start, 3))
    result = {
        "model": MODEL.name,
        "weights_bytes": size,
        "server": "versitygw (tests/cluster/go/versitygw) on 127.0.0.1, POSIX backend",
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, shared",
        "seconds": seconds,
        "median_seconds": {name: statistics.median(v) for name, v in seconds.items()},
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
