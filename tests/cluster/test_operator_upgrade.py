"""Upgrading the operator leaves the engines alone: `helm upgrade` from the previous release's
chart and operator to this checkout's, with an unchanged DisaggregatedModel, rolls no pod and
writes nothing to the model's children.

The previous release is built from git (tests/unit/previous_release.py says which commit and
why): its chart, CRDs and operator sources are archived into a temporary directory and used as
they were. kwok runs no containers, so the operator runs as a local process (as in every
operator test) with the arguments the installed chart gives its container, less the pod's
probe and metrics ports: first the previous release's sources ahead of the installed ones on
PYTHONPATH, then this checkout's. The upgrade is the documented procedure (docs/upgrades.md):
the new CRDs applied server-side, `helm upgrade`, then the new operator.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kube
from operator_fixtures import REPO, small_model
from operator_harness import (
    ApiProxy,
    OperatorProcess,
    Request,
    apply_crds,
    children,
    is_peering,
    wait_ready,
)
from previous_release import archive, imported_from, pythonpath

CHART_DIR = Path("charts") / "disagg-operator"
NAME = "m"
WORKLOADS = "statefulsets.apps,deployments.apps"
"""The engine (StatefulSet) and router (Deployment) workloads of a model."""
CONTAINER_ONLY = ("--liveness=", "--metrics-port=")
"""Chart arguments that open ports in the operator's pod, left out of a local process."""
SCOPE = ("--namespace=", "--all-namespaces")
"""Chart arguments OperatorProcess sets itself."""
VOLATILE = ("resourceVersion",)
"""Metadata a status update changes; everything else of a child stays as it was."""


@pytest.fixture
def previous(tmp_path: Path, kubectl: kube.Kubectl) -> Iterator[Path]:
    """The previous release's tree (chart, CRDs, sources); this checkout's CRDs afterwards."""
    tree = archive(tmp_path / "previous", CHART_DIR)
    assert imported_from(tree).is_relative_to(tree), "the archived sources are not imported"
    yield tree
    apply_crds(kubectl, REPO / CHART_DIR / "crds")


def _chart_args(kubectl: kube.Kubectl, namespace: str, release: str) -> list[str]:
    """The operator arguments the installed chart gives its container, as a local process's."""
    deployment = kubectl.json("-n", namespace, "get", "deployment", f"{release}-disagg-operator")
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "operator", args
    return [a for a in args[1:] if not a.startswith(CONTAINER_ONLY + SCOPE)]


def _helm_chart(helm: kube.Tool, verb: str, chart: Path, namespace: str, release: str) -> None:
    """`helm install` or `helm upgrade` (with the same values) of the release on `namespace`."""
    reset = ["--reset-values"] if verb == "upgrade" else []
    helm(
        verb, release, str(chart), "-n", namespace, "--wait", "--timeout", "120s", *reset,
        "--set", f"watch.namespaces={{{namespace}}}",
    )  # fmt: skip


def _quiet(proxy: ApiProxy, seconds: float) -> bool:
    """No write but peering keep-alives for the last `seconds`."""
    since = time.monotonic() - seconds
    return not [w for w in proxy.writes(since) if not is_peering(w)]


def _settled(kubectl: kube.Kubectl, namespace: str) -> bool:
    """Every engine and router workload rolled out: one revision, all replicas on it."""
    for workload in children(kubectl, namespace, NAME, kinds=WORKLOADS):
        spec, status = workload["spec"], workload.get("status", {})
        if status.get("observedGeneration") != workload["metadata"]["generation"]:
            return False
        if status.get("updatedReplicas", 0) != spec["replicas"]:
            return False
        if workload["kind"] == "StatefulSet" and (
            status.get("currentRevision") != status.get("updateRevision")
        ):
            return False
    return True


def _snapshot(kubectl: kube.Kubectl, namespace: str) -> dict[str, Any]:
    """What an upgrade must not change: every child less its status, the workloads' revisions,
    the ControllerRevisions and ReplicaSets, and the pods' UIDs."""

    def bare(obj: dict[str, Any]) -> dict[str, Any]:
        meta = {k: v for k, v in obj["metadata"].items() if k not in VOLATILE}
        return {**{k: v for k, v in obj.items() if k != "status"}, "metadata": meta}

    def names(kinds: str) -> list[str]:
        return sorted(
            f"{o['kind']}/{o['metadata']['name']}/{o['metadata']['uid']}"
            for o in children(kubectl, namespace, NAME, kinds=kinds)
        )

    live = children(kubectl, namespace, NAME)
    return {
        "children": {f"{c['kind']}/{c['metadata']['name']}": bare(c) for c in live},
        "revisions": {
            w["metadata"]["name"]: (
                w["status"].get("currentRevision"),
                w["status"].get("updateRevision"),
            )
            for w in children(kubectl, namespace, NAME, kinds="statefulsets.apps")
        },
        "controller revisions": names("controllerrevisions.apps"),
        "replica sets": names("replicasets.apps"),
        "pods": names("pods"),
    }


def _non_status_writes(proxy: ApiProxy, namespace: str) -> list[Request]:
    """The new operator's writes other than the model's status, events and its peering."""

    def allowed(write: Request) -> bool:
        status = write.path.endswith(f"/namespaces/{namespace}/disaggregatedmodels/{NAME}/status")
        return status or is_peering(write) or "/events" in write.path

    return [w for w in proxy.writes() if not allowed(w)]


def test_upgrade_from_the_previous_release_rolls_no_pod_and_writes_only_status(
    kubectl: kube.Kubectl,
    helm: kube.Tool,
    kubeconfig: Path,
    namespace: str,
    tmp_path: Path,
    previous: Path,
) -> None:
    release = f"r{namespace[-6:]}"

    # The previous release, installed as its docs said: CRDs, chart, then a model.
    apply_crds(kubectl, previous / CHART_DIR / "crds")
    _helm_chart(helm, "install", previous / CHART_DIR, namespace, release)
    old = OperatorProcess(
        kubeconfig, [namespace], tmp_path / "operator-previous.log",
        *_chart_args(kubectl, namespace, release), pythonpath=pythonpath(previous),
    ).start()  # fmt: skip
    try:
        kubectl.apply(small_model(NAME, namespace))
        wait_ready(kubectl, namespace, NAME, timeout_s=240)
    finally:
        old.assert_clean_stop()
    kube.wait_for(lambda: _settled(kubectl, namespace), what="the workloads to roll out")
    before = _snapshot(kubectl, namespace)
    assert before["revisions"] and before["pods"], before

    # The upgrade: this checkout's CRDs, chart and operator.
    apply_crds(kubectl, REPO / CHART_DIR / "crds")
    _helm_chart(helm, "upgrade", REPO / CHART_DIR, namespace, release)
    with ApiProxy(kubeconfig, tmp_path) as proxy:
        new = OperatorProcess(
            proxy.kubeconfig, [namespace], tmp_path / "operator-current.log",
            *_chart_args(kubectl, namespace, release),
        ).start()  # fmt: skip
        try:
            new.wait_log("Handler 'reconcile' succeeded", timeout_s=120)
            wait_ready(kubectl, namespace, NAME)
            kube.wait_for(lambda: _quiet(proxy, 5), what="the operator's writes to stop")
        finally:
            new.assert_clean_stop()
        writes = _non_status_writes(proxy, namespace)
    assert not writes, "\n".join(f"{w.method} {w.path}: {w.body[:300]!r}" for w in writes)
    after = _snapshot(kubectl, namespace)
    for key, was in before.items():
        assert after[key] == was, f"{key} changed by the upgrade"
    helm("uninstall", release, "-n", namespace, "--wait")
