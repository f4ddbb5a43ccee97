"""The release workflow: actionlint (built from its pinned Go module) finds nothing in it, and
its version step, run here as the workflow runs it, agrees with pyproject, the chart, the
Dockerfiles and every image tag the examples name."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import yaml

from image_names import DOCKERFILES, IMAGES

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yaml"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
CHART = yaml.safe_load((ROOT / "charts" / "disagg-operator" / "Chart.yaml").read_text())


@functools.cache
def actionlint() -> str:
    """The pinned actionlint, built into the cache when missing."""
    built = subprocess.run(
        ["bash", str(ROOT / "tests" / "cluster" / "build-actionlint.sh")],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return built.stdout.splitlines()[-1]


def _workflow() -> dict[str, Any]:
    workflow: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text())
    return workflow


def _run_version_step(tmp_path: Path, tag: str) -> subprocess.CompletedProcess[str]:
    """The `version` job's step, with the environment GitHub Actions gives it."""
    (step,) = [s for s in _workflow()["jobs"]["version"]["steps"] if s.get("id") == "version"]
    env = {
        **os.environ,
        "GITHUB_REF_NAME": tag,
        "GITHUB_OUTPUT": str(tmp_path / "output"),
        "OWNER": "Disagg-Dev",
    }
    return subprocess.run(
        ["bash", "-c", step["run"]], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )


def test_actionlint_finds_nothing() -> None:
    result = subprocess.run(
        [actionlint(), str(WORKFLOW)], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_catches_an_undefined_output(tmp_path: Path) -> None:
    broken = tmp_path / ".github" / "workflows" / "release.yaml"
    broken.parent.mkdir(parents=True)
    broken.write_text(WORKFLOW.read_text().replace("outputs.serving_tag ||", "outputs.tag ||"))
    result = subprocess.run(
        [actionlint(), str(broken)], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 1
    assert 'property "tag" is not defined' in result.stdout


def test_pyproject_chart_and_dockerfiles_carry_one_version() -> None:
    assert CHART["version"] == CHART["appVersion"] == VERSION
    for dockerfile in DOCKERFILES:
        assert f"ARG DISAGG_VERSION={VERSION}\n" in (ROOT / dockerfile).read_text(), dockerfile


def _serving_images() -> list[tuple[str, str]]:
    """(repository, tag) of every published serving image the examples and GitOps base run."""
    paths = [*ROOT.glob("examples/*.yaml"), ROOT / "gitops/kustomize/base/disaggregatedmodel.yaml"]
    images = [
        doc["spec"]["image"]
        for path in paths
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "DisaggregatedModel"
    ]
    return [
        (image["repository"], image["tag"])
        for image in images
        if image["repository"].startswith("ghcr.io/")
    ]


def test_version_step_names_the_tags_every_example_uses(tmp_path: Path) -> None:
    result = _run_version_step(tmp_path, f"v{VERSION}")
    assert result.returncode == 0, result.stderr
    outputs = dict(line.split("=", 1) for line in (tmp_path / "output").read_text().splitlines())
    dockerfile = (ROOT / "connector" / "Dockerfile").read_text()
    vllm = re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v(\S+)$", dockerfile, re.MULTILINE)
    assert vllm is not None
    assert outputs == {
        "version": VERSION,
        "vllm": vllm.group(1),
        "serving_tag": f"{VERSION}-vllm{vllm.group(1)}",
        "registry": "ghcr.io/disagg-dev",
    }
    published = _serving_images()
    assert len(published) >= 3
    assert set(published) == {(f"{outputs['registry']}/disagg-serving", outputs["serving_tag"])}


def test_version_step_refuses_a_tag_the_sources_do_not_carry(tmp_path: Path) -> None:
    result = _run_version_step(tmp_path, "v9.9.9")
    assert result.returncode == 1
    assert f"::error::tag v9.9.9 is not v{VERSION} (pyproject.toml version)" in result.stdout


def test_the_workflow_builds_each_dockerfile_under_its_title() -> None:
    matrix = _workflow()["jobs"]["images"]["strategy"]["matrix"]["include"]
    assert {entry["image"]: entry["dockerfile"] for entry in matrix} == IMAGES
    assert [entry["image"] for entry in matrix if entry["serving"]] == ["disagg-serving"]
