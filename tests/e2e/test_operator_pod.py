"""The operator as its own pod: the chart installed with the operator image built for the real
node, the pod Ready on that node through its real /healthz probes, reaching the API server
through the `kubernetes` Service, and reconciling a DisaggregatedModel into its children."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import kube

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "qwen3-32b-p5en.yaml"


@pytest.fixture
def operator(
    helm: kube.Tool, namespace: str, install_operator: Callable[[str, str], None]
) -> Iterator[str]:
    """The chart released in `namespace`, watching it, its pod on the real node; yields the
    operator's Deployment name."""
    install_operator("op", namespace)
    yield "op-disagg-operator"
    helm.run("uninstall", "op", "-n", namespace, "--wait", check=False)


def _example(namespace: str) -> dict[str, Any]:
    model: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    model["metadata"]["namespace"] = namespace
    return model


def test_operator_pod_runs_on_the_real_node_and_reconciles(
    kubectl: kube.Kubectl, namespace: str, operator: str, node_env: dict[str, str]
) -> None:
    (pod,) = kubectl.json(
        "-n", namespace, "get", "pods", "-l", "app.kubernetes.io/name=disagg-operator"
    )["items"]
    assert pod["spec"]["nodeName"] == node_env["NODE_NAME"]
    assert kube.condition_true(pod, "Ready"), pod["status"]
    (status,) = pod["status"]["containerStatuses"]
    assert status["restartCount"] == 0, status
    model = _example(namespace)
    for secret in ("hf-token",):
        kubectl("-n", namespace, "create", "secret", "generic", secret, "--from-literal=token=x")
    kubectl("-n", namespace, "create", "-f", "-", input=yaml.safe_dump(_pvc()))
    kubectl.apply(model, "-n", namespace)
    name = model["metadata"]["name"]
    kube.wait_for(
        lambda: (
            {"prefill", "decode"}
            <= {
                s["metadata"]["labels"].get("app.kubernetes.io/component")
                for s in kubectl.json("-n", namespace, "get", "statefulsets")["items"]
            }
        ),
        what=f"the operator pod to render {name}'s StatefulSets",
        timeout_s=120,
    )
    logs = kubectl("-n", namespace, "logs", f"deployment/{operator}")
    assert name in logs, logs[-2000:]


def _pvc() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "model-cache"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
