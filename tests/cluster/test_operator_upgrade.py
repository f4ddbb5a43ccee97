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

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import kube
from operator_fixtures import REPO, example_prerequisites, small_model
from operator_harness import (
    CHILD_KINDS,
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
MULTI_NODE_EXAMPLE = Path("examples") / "kimi-k2-2node-p5en.yaml"
"""The previous release's two-node example: its engines are LeaderWorkerSets."""
WORKLOADS = "statefulsets.apps,deployments.apps,leaderworkersets.leaderworkerset.x-k8s.io"
"""The engine (StatefulSet, LeaderWorkerSet) and router (Deployment) workloads of a model."""
CONTAINER_ONLY = ("--liveness=", "--metrics-port=")
"""Chart arguments that open ports in the operator's pod, left out of a local process."""
SCOPE = ("--namespace=", "--all-namespaces")
"""Chart arguments OperatorProcess sets itself."""
VOLATILE = ("resourceVersion",)
"""Metadata a status update changes; everything else of a child stays as it was."""


@pytest.fixture
def previous(tmp_path: Path, kubectl: kube.Kubectl) -> Iterator[Path]:
    """The previous release's tree (chart, CRDs, sources); this checkout's CRDs afterwards."""
    tree = archive(tmp_path / "previous", CHART_DIR, MULTI_NODE_EXAMPLE)
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


def _model(kubectl: kube.Kubectl, namespace: str, previous: Path, engines: str) -> dict[str, Any]:
    """A model in `namespace` whose engines are `engines`: a small one for StatefulSets, the
    previous release's two-node example (with the Secret and claim it names) for
    LeaderWorkerSets. The fake cluster's GPU nodes hold one of them at a time."""
    if engines == "StatefulSet":
        return small_model(NAME, namespace)
    example: dict[str, Any] = yaml.safe_load((previous / MULTI_NODE_EXAMPLE).read_text())
    example["metadata"]["namespace"] = namespace
    example_prerequisites(kubectl, namespace, example)
    return example


def _rolled_out(workload: dict[str, Any]) -> bool:
    """A workload whose every replica runs its current template."""
    spec, status = workload["spec"], workload.get("status", {})
    if workload["kind"] == "LeaderWorkerSet":
        counts = (status.get("updatedReplicas"), status.get("readyReplicas"))
        return counts == (spec["replicas"], spec["replicas"])
    if status.get("observedGeneration") != workload["metadata"]["generation"]:
        return False
    if status.get("updatedReplicas", 0) != spec["replicas"]:
        return False
    return workload["kind"] != "StatefulSet" or (
        status.get("currentRevision") == status.get("updateRevision")
    )


def _settled(kubectl: kube.Kubectl, namespace: str, name: str) -> bool:
    """Every engine and router workload of the model rolled out."""
    return all(_rolled_out(w) for w in children(kubectl, namespace, name, kinds=WORKLOADS))


def _snapshot(kubectl: kube.Kubectl, namespace: str, name: str) -> dict[str, Any]:
    """What an upgrade must not change: every child of the model less its status, the pods'
    UIDs and ReplicaSets, and every StatefulSet's revisions and ControllerRevision in the
    namespace (those the LeaderWorkerSets own included)."""

    def bare(obj: dict[str, Any]) -> dict[str, Any]:
        meta = {k: v for k, v in obj["metadata"].items() if k not in VOLATILE}
        return {**{k: v for k, v in obj.items() if k != "status"}, "metadata": meta}

    def key(obj: dict[str, Any]) -> str:
        return f"{obj['kind']}/{obj['metadata']['name']}"

    def of_models(kinds: str) -> list[dict[str, Any]]:
        return children(kubectl, namespace, name, kinds=kinds)

    def in_namespace(kinds: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = kubectl.json("-n", namespace, "get", kinds)["items"]
        return items

    return {
        "children": {key(c): bare(c) for c in of_models(CHILD_KINDS)},
        "pods": sorted(f"{key(o)}/{o['metadata']['uid']}" for o in of_models("pods")),
        "replica sets": sorted(key(o) for o in of_models("replicasets.apps")),
        "controller revisions": sorted(
            f"{key(o)}/{o['revision']}" for o in in_namespace("controllerrevisions.apps")
        ),
        "revisions": {
            key(w): (w["status"].get("currentRevision"), w["status"].get("updateRevision"))
            for w in in_namespace("statefulsets.apps")
        },
    }


def _non_status_writes(proxy: ApiProxy, namespace: str) -> list[Request]:
    """The new operator's writes other than the model's status, events and its peering."""
    status = re.compile(rf"/namespaces/{namespace}/disaggregatedmodels/[^/]+/status$")

    def allowed(write: Request) -> bool:
        return bool(status.search(write.path)) or is_peering(write) or "/events" in write.path

    return [w for w in proxy.writes() if not allowed(w)]


@pytest.mark.parametrize("engines", ["StatefulSet", "LeaderWorkerSet"])
def test_upgrade_from_the_previous_release_rolls_no_pod_and_writes_only_status(
    engines: str,
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
    model = _model(kubectl, namespace, previous, engines)
    name = model["metadata"]["name"]
    try:
        kubectl.apply(model)
        wait_ready(kubectl, namespace, name, timeout_s=240)
    finally:
        old.assert_clean_stop()
    kube.wait_for(lambda: _settled(kubectl, namespace, name), what="the workloads to roll out")
    before = _snapshot(kubectl, namespace, name)
    kinds = {k.split("/")[0] for k in before["children"]}
    assert engines in kinds, kinds
    assert before["pods"] and before["controller revisions"] and before["revisions"], before

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
            wait_ready(kubectl, namespace, name)
            kube.wait_for(lambda: _quiet(proxy, 5), what="the operator's writes to stop")
        finally:
            new.assert_clean_stop()
        writes = _non_status_writes(proxy, namespace)
    assert not writes, "\n".join(f"{w.method} {w.path}: {w.body[:300]!r}" for w in writes)
    after = _snapshot(kubectl, namespace, name)
    for key, was in before.items():
        assert after[key] == was, f"{key} changed by the upgrade"
    helm("uninstall", release, "-n", namespace, "--wait")
