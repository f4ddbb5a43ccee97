"""Acceptance: the Qwen3-32B example on the local control plane, reconciled by the operator
running as a ServiceAccount that holds exactly the generated RBAC rules.

Honesty note on readiness: kwok fakes the kubelet. It binds, starts and marks pods Running and
Ready without running any container, so vLLM's /health probes never execute here. "Ready" in
these tests means: every child exists as rendered, the scheduler placed each pod on a node that
fits (p5en GPUs, EFA, hugepages), and the StatefulSet/Deployment controllers report the pods
ready - the operator's part of the job. Engine health is covered by tests/engine.
"""

from __future__ import annotations

from pathlib import Path

import yaml

import kube
from disagg_operator.children import APPLIED_HASH_ANNOTATION
from disagg_operator.kubeapi import FIELD_MANAGER
from gen_rbac import namespaced_rules, peering_rules
from operator_fixtures import (  # noqa: F401
    REPO,
    StartOperator,
    crds,
    example_prerequisites,
    start_operator,
)
from operator_harness import children, condition, rendered_children, wait_ready

EXAMPLE = REPO / "examples" / "qwen3-32b-p5en.yaml"
OPERATOR_SA = "disagg-operator"


def _service_account_kubeconfig(
    kubectl: kube.Kubectl, kubeconfig: Path, namespace: str, path: Path
) -> Path:
    """A ServiceAccount bound to the generated rules, and a kubeconfig holding its token."""
    rules = [*namespaced_rules(), *peering_rules(clusterwide=False)]
    meta = {"name": OPERATOR_SA, "namespace": namespace}
    kubectl.apply(
        [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": meta,
                "rules": rules,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": meta,
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": OPERATOR_SA,
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": namespace}
                ],
            },
        ]
    )
    token = kubectl("-n", namespace, "create", "token", OPERATOR_SA, "--duration=1h").strip()
    admin = yaml.safe_load(kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "sa", "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}],
                "current-context": "sa",
            }
        )
    )
    return path


def test_example_becomes_ready_on_p5en_with_least_privilege(
    kubectl: kube.Kubectl,
    kubeconfig: Path,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
    tmp_path: Path,
) -> None:
    example = yaml.safe_load(EXAMPLE.read_text())
    example["metadata"]["namespace"] = namespace
    name = example["metadata"]["name"]
    example_prerequisites(kubectl, namespace, example)
    sa_kubeconfig = _service_account_kubeconfig(
        kubectl, kubeconfig, namespace, tmp_path / "sa-kubeconfig.yaml"
    )
    operator = start_operator(kubeconfig_path=sa_kubeconfig)
    kubectl.apply(example)

    model = wait_ready(kubectl, namespace, name, timeout_s=240)
    uid = model["metadata"]["uid"]

    live = children(kubectl, namespace, name, "--show-managed-fields")
    found = sorted(f"{c['kind']}/{c['metadata']['name']}" for c in live)
    assert found == rendered_children(example)
    assert f"PodDisruptionBudget/{name}-decode" in found
    for child in live:
        meta = child["metadata"]
        assert [(r["uid"], r["controller"]) for r in meta["ownerReferences"]] == [(uid, True)]
        assert APPLIED_HASH_ANNOTATION in meta["annotations"]
        appliers = {m["manager"] for m in meta["managedFields"] if m["operation"] == "Apply"}
        assert appliers == {FIELD_MANAGER}, (child["kind"], meta["managedFields"])

    pods = kubectl.json("-n", namespace, "get", "pods", "-l", f"app.kubernetes.io/instance={name}")[
        "items"
    ]
    engines = [
        p for p in pods if p["metadata"]["labels"]["app.kubernetes.io/component"] != "router"
    ]
    assert len(engines) == 2 and len(pods) == 3
    for pod in engines:
        assert pod["status"]["phase"] == "Running" and kube.condition_true(pod, "Ready")
        node = kubectl.json("get", "node", pod["spec"]["nodeName"])
        assert node["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "p5en.48xlarge"

    status = model["status"]
    config_map = next(c for c in live if c["kind"] == "ConfigMap")
    assert (
        status["connectorConfigHash"]
        == config_map["metadata"]["annotations"]["disagg.dev/connector-config-hash"]
    )
    assert status["routerEndpoint"] == f"http://{name}-router.{namespace}.svc:8000"
    assert status["prefill"] == {"desiredReplicas": 1, "readyReplicas": 1}
    assert status["decode"] == {"desiredReplicas": 1, "readyReplicas": 1}
    for kind in ("PrefillReady", "DecodeReady", "RouterReady"):
        assert condition(model, kind)["status"] == "True", condition(model, kind)
    assert condition(model, "Degraded")["status"] == "False"
    assert condition(model, "Progressing")["reason"] == "Complete"

    table = kubectl("-n", namespace, "get", "dmodel", name).splitlines()
    assert table[0].split() == [
        "NAME", "READY", "PREFILL", "DECODE", "BIDIR", "TTL", "REUSE", "AGE"
    ]  # fmt: skip
    assert table[1].split()[:6] == [name, "True", "1", "1", "true", "480"]
    assert "reuse" not in status, "kwok's router pods serve no reuse summary: nothing written"

    # kopf's bookkeeping stays under disagg.dev/, outside status, and adds no finalizer.
    annotations = model["metadata"].get("annotations", {})
    foreign = [
        k for k in annotations if not k.startswith(("disagg.dev/", "kubectl.kubernetes.io/"))
    ]
    assert not foreign, annotations
    assert "kopf" not in status and not model["metadata"].get("finalizers")

    events = kubectl.json("-n", namespace, "get", "events", "--field-selector",
                          f"involvedObject.uid={uid}")["items"]  # fmt: skip
    reasons = {e["reason"] for e in events}
    assert {"Created", "Ready"} <= reasons, reasons

    def can(verb: str, what: str) -> bool:
        sa = f"system:serviceaccount:{namespace}:{OPERATOR_SA}"
        probe = kubectl.run("auth", "can-i", verb, what, "-n", namespace, f"--as={sa}", check=False)
        return probe.stdout.strip() == "yes"

    assert can("patch", "statefulsets.apps") and can("get", "secrets")
    assert not can("list", "secrets") and not can("delete", "deployments.apps")
    assert can("delete", "statefulsets.apps"), "a role switched to nodesPerReplica > 1"
    assert can("patch", "poddisruptionbudgets.policy")
    assert not can("delete", "poddisruptionbudgets.policy")
    assert "Forbidden" not in operator.log() and "forbidden" not in operator.log(), operator.log()
