"""The operator image's Dockerfile: slim Python, non-root, the `operator` extra only, and a
default command the `disagg` parser accepts. (No Docker engine here: the file itself is checked.)"""

from __future__ import annotations

import json
import re
from importlib.metadata import requires
from pathlib import Path

from disagg.cli import build_parser

DOCKERFILE = Path(__file__).resolve().parents[2] / "operator" / "Dockerfile"


def _final_stage() -> str:
    return DOCKERFILE.read_text().split("\nFROM ")[-1]


def test_base_is_python_slim() -> None:
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.\d+-slim$", DOCKERFILE.read_text(), re.M)


def test_runs_as_a_numeric_non_root_user() -> None:
    users = re.findall(r"^USER (\d+):(\d+)$", _final_stage(), re.M)
    assert users and all(int(uid) > 0 and int(gid) > 0 for uid, gid in users)


def test_installs_the_operator_extra_only() -> None:
    installs = [line for line in _final_stage().splitlines() if "pip install" in line]
    assert installs and all(re.findall(r"\[(\w+)\]", line) == ["operator"] for line in installs)
    operator = [r for r in requires("disagg") or [] if re.search(r"extra == .operator.", r)]
    assert {"kopf", "kubernetes", "pydantic"} <= {re.split(r"[<>=;\[ ]", r)[0] for r in operator}
    assert not [r for r in operator if r.startswith(("vllm", "nixl", "torch", "fastapi"))]


def test_default_command_is_a_valid_operator_invocation() -> None:
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", _final_stage(), re.M)
    cmd = re.search(r"^CMD (\[.*\])$", _final_stage(), re.M)
    assert entrypoint and cmd and json.loads(entrypoint.group(1)) == ["disagg"]
    args = build_parser().parse_args(json.loads(cmd.group(1)))
    assert args.command == "operator" and args.all_namespaces
