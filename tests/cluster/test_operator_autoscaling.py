"""An autoscaled role on the real control plane, with the real operator and the real
HorizontalPodAutoscaler controller (kube-controller-manager): the operator never writes the
role's replica count, whoever changes it, while it still repairs every other field; turning
autoscaling on keeps the count the role had; turning it off deletes the autoscaler; and an
engine whose CRD the cluster lacks (KEDA) is a clear condition, not a crash. A multi-node role
is scaled through its LeaderWorkerSet (the real LeaderWorkerSet controller).

There is no metrics pipeline here: the HorizontalPodAutoscaler cannot read its signal, so it
only holds the count inside [minReplicas, maxReplicas]. A stand-in for the autoscaler writes
other counts through the scale subresource, under a field manager of its own, as the
HorizontalPodAutoscaler does.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

import kube
from disagg_operator.kubeapi import FIELD_MANAGER, HANDOVER_MANAGER
from operator_fixtures import (  # noqa: F401
    REPO,
    StartOperator,
    crds,
    example_prerequisites,
    small_model,
    start_operator,
)
from operator_harness import ApiProxy, Request, condition, dmodel, wait_ready

NAME = "m"
DECODE = f"{NAME}-decode"
AUTOSCALER = "autoscaler-stand-in"
"""The field manager the stand-in for an autoscaler writes the scale subresource as."""
AUTOSCALING = {"maxReplicas": 4, "signal": "kvCacheUsage", "target": 0.8}
QUIET_S = 15
"""How long a count must stay as set: one HorizontalPodAutoscaler sync period."""
MULTI_NODE_EXAMPLE = REPO / "examples" / "kimi-k2-2node-p5en.yaml"


def _model(namespace: str, decode: dict[str, Any]) -> dict[str, Any]:
    model = small_model(NAME, namespace)
    model["spec"]["decode"].update(decode)
    return model


def _statefulset(kubectl: kube.Kubectl, namespace: str) -> dict[str, Any]:
    obj: dict[str, Any] = kubectl.json("-n", namespace, "get", "statefulset", DECODE,
                                       "--show-managed-fields")  # fmt: skip
    return obj


def _replica_owners(sts: dict[str, Any]) -> set[str]:
    """The field managers owning the StatefulSet's spec.replicas."""
    return {
        entry["manager"]
        for entry in sts["metadata"].get("managedFields") or []
        if "f:replicas" in (entry.get("fieldsV1") or {}).get("f:spec", {})
    }


def _scale(kubectl: kube.Kubectl, namespace: str, replicas: int) -> None:
    """Write the count as an autoscaler does: the scale subresource, its own field manager."""
    kubectl("-n", namespace, "patch", "statefulset", DECODE, "--subresource=scale",
            "--type=merge", "-p", json.dumps({"spec": {"replicas": replicas}}),
            f"--field-manager={AUTOSCALER}")  # fmt: skip


def _replicas(kubectl: kube.Kubectl, namespace: str) -> int:
    return int(_statefulset(kubectl, namespace)["spec"]["replicas"])


def _decode_writes(proxy: ApiProxy, since: float) -> list[Request]:
    """The operator's writes to the decode StatefulSet (or its scale subresource)."""
    path = f"/statefulsets/{DECODE}"
    return [w for w in proxy.writes(since) if w.path.endswith(path) or f"{path}/" in w.path]


def _sets_replicas(write: Request) -> bool:
    return "replicas" in (json.loads(write.body or b"{}").get("spec") or {})


def _stays(kubectl: kube.Kubectl, namespace: str, replicas: int) -> None:
    deadline = time.monotonic() + QUIET_S
    while time.monotonic() < deadline:
        assert _replicas(kubectl, namespace) == replicas
        time.sleep(1)


def test_the_autoscalers_count_is_never_reverted_and_other_drift_is_repaired(
    kubectl: kube.Kubectl,
    kubeconfig: Path,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
    tmp_path: Path,
) -> None:
    with ApiProxy(kubeconfig, tmp_path) as proxy:
        operator = start_operator(kubeconfig_path=proxy.kubeconfig)
        kubectl.apply(_model(namespace, {"autoscaling": AUTOSCALING}))
        wait_ready(kubectl, namespace, NAME)
        hpa = kubectl.json("-n", namespace, "get", "horizontalpodautoscaler", DECODE)
        assert hpa["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "name": DECODE,
        }
        kube.wait_for(lambda: _able_to_scale(kubectl, namespace), what="AbleToScale", timeout_s=60)
        sts = _statefulset(kubectl, namespace)
        assert FIELD_MANAGER not in _replica_owners(sts)

        # Someone else (the autoscaler) sets 3; someone edits a field the operator sets.
        mark = time.monotonic()
        _scale(kubectl, namespace, 3)
        kubectl("-n", namespace, "label", "statefulset", DECODE, "app.kubernetes.io/part-of-")

        def repaired() -> bool:
            labels = _statefulset(kubectl, namespace)["metadata"]["labels"]
            return labels.get("app.kubernetes.io/part-of") == "disagg"

        kube.wait_for(repaired, what="the removed label restored", timeout_s=60)
        _stays(kubectl, namespace, 3)
        model = wait_ready(kubectl, namespace, NAME)
        assert model["status"]["decode"]["desiredReplicas"] == 3

        # Above maxReplicas: the real HorizontalPodAutoscaler controller brings it to 4 and
        # the operator lets it.
        _scale(kubectl, namespace, 6)
        capped = "the HorizontalPodAutoscaler to cap the count"
        kube.wait_for(lambda: _replicas(kubectl, namespace) == 4, what=capped, timeout_s=90)
        _stays(kubectl, namespace, 4)
        owners = _replica_owners(_statefulset(kubectl, namespace))
        writes = _decode_writes(proxy, mark)
        operator.assert_clean_stop()  # before the proxy it talks through goes

    assert FIELD_MANAGER not in owners and HANDOVER_MANAGER not in owners, owners
    assert writes, "the operator repaired the label through the proxy"
    assert all(w.method == "PATCH" and "/scale" not in w.path for w in writes), writes
    assert not [w for w in writes if _sets_replicas(w)], [w.body for w in writes]


def test_turning_autoscaling_on_keeps_the_count_and_off_deletes_the_autoscaler(
    kubectl: kube.Kubectl,
    kubeconfig: Path,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
    tmp_path: Path,
) -> None:
    with ApiProxy(kubeconfig, tmp_path) as proxy:
        operator = start_operator(kubeconfig_path=proxy.kubeconfig)
        kubectl.apply(_model(namespace, {"replicas": 2}))
        wait_ready(kubectl, namespace, NAME)
        assert FIELD_MANAGER in _replica_owners(_statefulset(kubectl, namespace))

        mark = time.monotonic()
        patch = [
            {"op": "remove", "path": "/spec/decode/replicas"},
            {"op": "add", "path": "/spec/decode/autoscaling", "value": AUTOSCALING},
        ]
        kubectl("-n", namespace, "patch", "dmodel", NAME, "--type=json", "-p", json.dumps(patch))
        kube.wait_for(
            lambda: kubectl.run("-n", namespace, "get", "hpa", DECODE, check=False).returncode == 0,
            what="the HorizontalPodAutoscaler",
            timeout_s=60,
        )
        wait_ready(kubectl, namespace, NAME)
        _stays(kubectl, namespace, 2)
        owners = _replica_owners(_statefulset(kubectl, namespace))
        handed = [w for w in _decode_writes(proxy, mark) if _sets_replicas(w)]

        # Fixed again: the autoscaler goes, the operator's count is back.
        patch = [
            {"op": "remove", "path": "/spec/decode/autoscaling"},
            {"op": "add", "path": "/spec/decode/replicas", "value": 1},
        ]
        kubectl("-n", namespace, "patch", "dmodel", NAME, "--type=json", "-p", json.dumps(patch))
        kube.wait_for(
            lambda: kubectl.run("-n", namespace, "get", "hpa", DECODE, check=False).returncode != 0,
            what="the HorizontalPodAutoscaler deleted",
            timeout_s=60,
        )
        kube.wait_for(lambda: _replicas(kubectl, namespace) == 1, what="1 replica", timeout_s=60)
        wait_ready(kubectl, namespace, NAME)
        operator.assert_clean_stop()

    assert owners == {HANDOVER_MANAGER}, owners
    assert [(w.query, json.loads(w.body)["spec"]) for w in handed] == [
        (f"fieldManager={HANDOVER_MANAGER}", {"replicas": 2})
    ]


def test_an_engine_the_cluster_lacks_is_a_condition_naming_what_installs_it(
    kubectl: kube.Kubectl,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
) -> None:
    operator = start_operator()
    keda = {**AUTOSCALING, "engine": "keda", "prometheusAddress": "http://prometheus:9090"}
    kubectl.apply(_model(namespace, {"autoscaling": keda}))

    def degraded() -> dict[str, Any] | None:
        found = condition(dmodel(kubectl, namespace, NAME), "Degraded")
        return found if found.get("reason") == "KindNotInstalled" else None

    found = kube.wait_for(degraded, what="Degraded KindNotInstalled", timeout_s=60)
    assert found["status"] == "True"
    assert "install KEDA, or set the role's autoscaling.engine to hpa" in found["message"]
    assert kubectl.json("-n", namespace, "get", "statefulset", DECODE)["spec"]["replicas"] == 1
    assert not operator.proc_exited()


def _able_to_scale(kubectl: kube.Kubectl, namespace: str) -> dict[str, Any] | None:
    """The HorizontalPodAutoscaler's AbleToScale condition once true: it read its target's
    scale subresource."""
    hpa = kubectl.json("-n", namespace, "get", "horizontalpodautoscaler", DECODE)
    conditions = {c["type"]: c for c in hpa.get("status", {}).get("conditions") or []}
    able = conditions.get("AbleToScale", {})
    return able if able.get("status") == "True" else None


def test_a_multi_node_role_is_scaled_through_its_leaderworkerset(
    kubectl: kube.Kubectl,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
) -> None:
    example: dict[str, Any] = yaml.safe_load(MULTI_NODE_EXAMPLE.read_text())
    example["metadata"] = {"name": NAME, "namespace": namespace}
    example_prerequisites(kubectl, namespace, example)
    decode = example["spec"]["decode"]
    decode.pop("replicas", None)
    decode["autoscaling"] = {**AUTOSCALING, "maxReplicas": 2}
    start_operator()
    kubectl.apply(example)
    wait_ready(kubectl, namespace, NAME, timeout_s=240)
    hpa = kubectl.json("-n", namespace, "get", "horizontalpodautoscaler", DECODE)
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "LeaderWorkerSet"
    kube.wait_for(lambda: _able_to_scale(kubectl, namespace), what="AbleToScale", timeout_s=60)

    kubectl("-n", namespace, "patch", "leaderworkerset", DECODE, "--subresource=scale",
            "--type=merge", "-p", json.dumps({"spec": {"replicas": 2}}),
            f"--field-manager={AUTOSCALER}")  # fmt: skip
    deadline = time.monotonic() + QUIET_S
    while time.monotonic() < deadline:
        lws = kubectl.json("-n", namespace, "get", "leaderworkerset", DECODE)
        assert lws["spec"]["replicas"] == 2
        time.sleep(1)
    assert dmodel(kubectl, namespace, NAME)["status"]["decode"]["desiredReplicas"] == 2
