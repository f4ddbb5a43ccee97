"""The plain path for users without Helm: `kubectl apply -f crds/` and the committed
deploy/disagg-operator.yaml are accepted by a real API server. The CRDs are applied for real
(the same CRDs every cluster test uses); the manifest by server-side dry run, so the
cluster-wide objects of other tests are never touched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

import kube

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "deploy" / "disagg-operator.yaml"
PLAIN_NAMESPACE = "disagg-system"


def _into(doc: dict[str, Any], namespace: str) -> dict[str, Any]:
    """`doc` moved from the manifest's namespace to `namespace` (nothing else changes)."""
    if doc["metadata"].get("namespace") == PLAIN_NAMESPACE:
        doc["metadata"]["namespace"] = namespace
    for subject in doc.get("subjects", []):
        subject["namespace"] = namespace
    return doc


def test_crds_and_manifest_are_accepted(kubectl: kube.Kubectl, namespace: str) -> None:
    out = kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    assert out.count("serverside-applied") == len(list(REPO.glob("crds/*.yaml")))
    kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    docs = [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]
    assert docs[0] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": PLAIN_NAMESPACE, "labels": {"app.kubernetes.io/part-of": "disagg"}},
    }
    moved = [_into(doc, namespace) for doc in docs[1:]]
    out = kubectl.apply(moved, "--dry-run=server", "--validate=strict")
    kinds = {doc["kind"] for doc in moved}
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment"} <= kinds
    assert out.count("(server dry run)") == len(moved), out
