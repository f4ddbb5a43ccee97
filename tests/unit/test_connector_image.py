"""The serving image's Python layout: the wheel it installs and the Dockerfile's pins.

No Docker engine here, so the test builds the same wheel the Dockerfile builds and checks
what the image would get from it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from disagg_connector.stream_params import NATIVE_STREAM_PARAMS_VERSION
from disagg_connector.vllm_version import parse_version

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "connector" / "Dockerfile"
MODULES = ("connector", "scheduler", "launcher", "commands", "stream_params", "prefix_digest")


def wheel_stage_copies() -> list[tuple[list[str], str]]:
    """``COPY`` sources and destination of the Dockerfile's wheel-building stage."""
    stage = DOCKERFILE.read_text().split("FROM ")[1]
    copies = []
    for line in stage.splitlines():
        if line.startswith("COPY "):
            *sources, destination = line.split()[1:]
            copies.append((sources, destination))
    return copies


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel built from exactly what the Dockerfile copies into its build stage."""
    context = tmp_path_factory.mktemp("context")
    for sources, destination in wheel_stage_copies():
        for source in sources:
            target = context / destination
            if destination.endswith("/") and not (ROOT / source).is_dir():
                target = target / Path(source).name
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / source, target)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "--wheel-dir",
            str(out),
            str(context),
        ],
        check=True,
    )
    (path,) = out.glob("disagg-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_holds_the_connector_package(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for module in MODULES:
        assert f"disagg_connector/{module}.py" in names
    assert "disagg_connector/py.typed" in names
    assert not any(name.startswith(("tests/", "operator/")) for name in names)


def test_wheel_declares_the_cli_and_the_vllm_plugin(wheel: zipfile.ZipFile) -> None:
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry_points).decode()
    assert re.search(r"^\[console_scripts\]\s*\ndisagg = disagg_operator\.cli:main", text, re.M)
    assert re.search(
        r"^\[vllm\.general_plugins\]\s*\n"
        r"disagg_stream_kv_params = disagg_connector\.stream_params:register",
        text,
        re.M,
    )


def test_dockerfile_pins_a_vllm_that_streams_params_and_runs_unprivileged() -> None:
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v([\d.]+)$", text, re.M)
    assert base is not None
    assert parse_version(base.group(1))[:2] >= NATIVE_STREAM_PARAMS_VERSION
    assert re.search(r"^ARG NIXL_VERSION=\d+\.\d+\.\d+$", text, re.M)
    assert re.search(r"^ARG NIXL_BACKEND=nixl-cu1[23]$", text, re.M)
    assert re.search(r"^USER 1000:1000$", text, re.M)
    for label in ("title", "description", "version", "licenses", "base.name"):
        assert f"org.opencontainers.image.{label}=" in text
    assert "/tmp/wheels/disagg-*.whl" in text
    assert "--no-deps" in text
