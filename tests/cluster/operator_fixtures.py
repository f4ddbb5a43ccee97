"""pytest fixtures for the operator's cluster tests (imported by the test_operator_* modules)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import kube
from operator_harness import OperatorProcess, apply_crds

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "unit"))

from dmodel_samples import INVALID_SPECS, resource, spec_with  # noqa: E402

__all__ = [
    "INVALID_SPECS",
    "StartOperator",
    "crds",
    "resource",
    "small_model",
    "spec_with",
    "start_operator",
]

StartOperator = Callable[..., OperatorProcess]


@pytest.fixture(scope="session")
def crds(kubectl: kube.Kubectl) -> None:
    """The DisaggregatedModel and kopf peering CRDs, applied and Established."""
    apply_crds(kubectl, REPO / "crds")


@pytest.fixture
def start_operator(
    crds: None, kubeconfig: Path, namespace: str, tmp_path: Path
) -> Iterator[StartOperator]:
    """Start `disagg operator` on the test namespace; every one still running at the end must
    stop cleanly (SIGTERM -> exit 0, no traceback)."""
    started: list[OperatorProcess] = []

    def start(*extra: str, kubeconfig_path: Path | None = None) -> OperatorProcess:
        log = tmp_path / f"operator-{len(started)}.log"
        proc = OperatorProcess(kubeconfig_path or kubeconfig, [namespace], log, *extra)
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        if not proc.proc_exited():
            proc.assert_clean_stop()


def small_model(name: str, namespace: str, **patch: Any) -> dict[str, Any]:
    """A model that fits the fake nodes many times over: no EFA, UCX, 1 GPU, small requests."""
    small = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    spec = spec_with(
        {
            "efa": {"enabled": False},
            "kvTransfer": {"backend": "UCX"},
            "prefill": {"resources": small},
            "decode": {"resources": small},
            "router": {"resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}},
            **patch,
        }
    )
    return resource(spec, name=name, namespace=namespace)


def example_prerequisites(kubectl: kube.Kubectl, namespace: str, example: dict[str, Any]) -> None:
    """The token Secret and the model-cache claim (bound to a hostPath volume) it names."""
    model = example["spec"]["model"]
    secret = model["tokenSecret"]
    kubectl("-n", namespace, "create", "secret", "generic", secret["name"],
            f"--from-literal={secret['key']}=hf_dummy")  # fmt: skip
    claim = model["cache"]["pvc"]["claimName"]
    volume = f"{namespace}-{claim}"
    size = {"storage": "100Gi"}
    kubectl.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": volume},
                "spec": {
                    "capacity": size,
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "hostPath": {"path": "/models"},
                    "claimRef": {"namespace": namespace, "name": claim},
                    "persistentVolumeReclaimPolicy": "Delete",
                },
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": namespace},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "volumeName": volume,
                    "resources": {"requests": size},
                },
            },
        ]
    )
