"""The chart's crds/ is the top-level crds/, byte for byte, and Helm keeps the CRDs."""

from __future__ import annotations

import os
import subprocess

import yaml

from helm_chart import CHART, REPO, helm_binary

TOP = REPO / "crds"
COPY = CHART / "crds"
DEPLOY = REPO / "deploy" / "disagg-operator.yaml"


def test_chart_crds_are_the_top_level_crds() -> None:
    top = {path.name: path.read_bytes() for path in TOP.glob("*.yaml")}
    copy = {path.name: path.read_bytes() for path in COPY.glob("*.yaml")}
    assert top, "crds/ is empty"
    assert sorted(copy) == sorted(top), "chart crds/ differs from crds/: run `make chart-sync`"
    for name, text in top.items():
        assert copy[name] == text, f"chart crds/{name} is stale: run `make chart-sync`"


def test_every_crd_is_kept_by_helm() -> None:
    for path in sorted(TOP.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            annotations = crd["metadata"].get("annotations", {})
            assert annotations.get("helm.sh/resource-policy") == "keep", path.name


def test_plain_manifest_is_the_rendered_chart() -> None:
    rendered = subprocess.run(
        ["bash", str(REPO / "deploy" / "render.sh")],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "HELM": str(helm_binary())},
    ).stdout
    assert DEPLOY.read_text() == rendered, "deploy/disagg-operator.yaml is stale: make chart-sync"
    kinds = [doc["kind"] for doc in yaml.safe_load_all(rendered) if doc]
    assert kinds[0] == "Namespace" and "Deployment" in kinds and "ClusterRole" in kinds
