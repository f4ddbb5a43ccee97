"""The GitOps examples stay deployable: the kustomize overlay renders (kubectl's kustomize) to a
valid DisaggregatedModel, the Argo CD component puts health.lua into argocd-cm, and every Git
path the Argo CD and Flux manifests point at exists."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from disagg_operator.loading import load_resource
from helm_chart import REPO, toolchain

GITOPS = REPO / "gitops"
OVERLAY = GITOPS / "kustomize" / "overlays" / "production"
HEALTH_KEY = "resource.customizations.health.disagg.dev_DisaggregatedModel"


def kustomize(path: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize path` as objects."""
    out = subprocess.run(
        [str(toolchain().kubectl), "kustomize", str(path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_overlay_renders_a_valid_model_with_its_patches() -> None:
    (obj,) = kustomize(OVERLAY)
    model = load_resource(obj)
    assert model.metadata.namespace == "inference"
    assert model.spec.decode.replicas == 2
    assert model.spec.kv_transfer.decoder_kv_blocks_ttl_seconds == 600
    assert model.spec.prefill.replicas == 1
    assert obj["metadata"]["labels"]["environment"] == "production"


def test_argocd_component_adds_the_health_check_to_argocd_cm(tmp_path: Path) -> None:
    # Like Argo CD's install.yaml: no namespace in the objects, the kustomization sets it.
    argocd_cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "argocd-cm"},
        "data": {"url": "https://argocd.example.com"},
    }
    (tmp_path / "argocd-cm.yaml").write_text(yaml.safe_dump(argocd_cm))
    component = os.path.relpath(GITOPS / "argocd", tmp_path)
    install = {"namespace": "argocd", "resources": ["argocd-cm.yaml"], "components": [component]}
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(install))
    (merged,) = kustomize(tmp_path)
    assert merged["metadata"] == {"name": "argocd-cm", "namespace": "argocd"}
    assert merged["data"]["url"] == "https://argocd.example.com"
    assert merged["data"][HEALTH_KEY] == (GITOPS / "argocd" / "health.lua").read_text()


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_argocd_and_flux_manifests_point_at_existing_paths() -> None:
    paths = []
    for path in sorted((GITOPS / "argocd").glob("application-*.yaml")):
        (app,) = _documents(path)
        assert app["kind"] == "Application"
        paths.append(app["spec"]["source"]["path"])
    for path in sorted((GITOPS / "flux").glob("*.yaml")):
        for doc in _documents(path):
            if doc["kind"] == "Kustomization":
                paths.append(doc["spec"]["path"])
            elif doc["kind"] == "HelmRelease":
                paths.append(doc["spec"]["chart"]["spec"]["chart"])
    assert len(paths) == 4
    for path_in_repo in paths:
        assert (REPO / path_in_repo).is_dir(), f"{path_in_repo} does not exist"
