"""The CPU demo model as the e2e tests deploy it: its example and name, how long it takes to
come up here, its manifest on the images built here, and prefill's count of KV read back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import yaml

from disagg.bench import prometheus
from disagg.bench.client import REUSED_TOKENS

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "demo-cpu.yaml"
MODEL = "demo-cpu"
READY_TIMEOUT_S = 1200
"""vLLM's CPU build starts in a few minutes on 2 shared cores; a first start also compiles."""
ANSWER_TOKENS = 8
"""A short answer: the tests compare answers and reuse, not generation."""
TURN_TIMEOUT_S = 300


def demo_model(images: dict[str, str], namespace: str) -> dict[str, Any]:
    """The demo's DisaggregatedModel (demo/model.py) on the images built here, in `namespace`."""
    manifest = subprocess.run(
        [
            sys.executable, str(REPO / "demo" / "model.py"), str(EXAMPLE),
            "--serving-image", images["SERVING_IMAGE"], "--router-image", images["ROUTER_IMAGE"],
            "--namespace", namespace,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout  # fmt: skip
    model: dict[str, Any] = yaml.safe_load(manifest)
    return model


def reused_tokens(prefill: str) -> float:
    """Prompt tokens prefill (its base URL) has read back from decode so far, by its counter."""
    text = httpx.get(f"{prefill}/metrics", timeout=10).text
    return prometheus.total(prometheus.parse(text), REUSED_TOKENS)
