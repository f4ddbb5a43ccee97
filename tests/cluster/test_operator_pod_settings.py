"""Pod settings on the real control plane with the real operator: a model whose roles run as
their own ServiceAccount (IRSA) with an fsGroup, a PriorityClass, spreading, their own volumes,
annotations and labels, and a router with its own priority, spreading and labels. The API
server admits the pods (ServiceAccount and PriorityClass resolved), the operator repairs hand
edits of what it rendered, and the API server refuses a spec that collides with the
operator's own volumes, paths and keys, naming the field, before the operator sees it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

import kube
from operator_fixtures import (  # noqa: F401
    StartOperator,
    crds,
    small_model,
    start_operator,
)
from operator_harness import wait_ready

NAME = "m"
SERVICE_ACCOUNT = "serving"
PRIORITY = 1000
SMALL = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
TEAM = "example.com/team"


@pytest.fixture
def priority_class(kubectl: kube.Kubectl, namespace: str) -> Iterator[str]:
    """A PriorityClass (cluster-wide, so named after the test's namespace), deleted after."""
    name = f"{namespace}-serving"
    kubectl("create", "priorityclass", name, f"--value={PRIORITY}")
    yield name
    kubectl("delete", "priorityclass", name, "--wait=false")


def _role(priority_class: str) -> dict[str, Any]:
    return {
        "resources": SMALL,
        "serviceAccountName": SERVICE_ACCOUNT,
        "podSecurityContext": {"fsGroup": 1000, "fsGroupChangePolicy": "OnRootMismatch"},
        "priorityClassName": priority_class,
        "topologySpreadConstraints": [
            {"topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
        ],
        "volumes": [
            {"name": "aws", "secret": {"secretName": "aws-extra", "optional": True}},
            {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}},
        ],
        "volumeMounts": [
            {"name": "aws", "mountPath": "/mnt/aws", "readOnly": True},
            {"name": "scratch", "mountPath": "/scratch"},
        ],
        "podAnnotations": {TEAM: "ml"},
        "podLabels": {"cost-center": "42"},
    }


def _router(priority_class: str) -> dict[str, Any]:
    return {
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "priorityClassName": priority_class,
        "topologySpreadConstraints": [
            {"topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
        ],
        "podAnnotations": {TEAM: "ml"},
        "podLabels": {"cost-center": "42"},
    }


def _template(kubectl: kube.Kubectl, namespace: str, kind: str, name: str) -> dict[str, Any]:
    template: dict[str, Any] = kubectl.json("-n", namespace, "get", kind, name)["spec"]["template"]
    return template


def _role_settings_hold(template: dict[str, Any], priority_class: str) -> bool:
    pod = template["spec"]
    names = [volume["name"] for volume in pod.get("volumes", [])]
    mounts = [mount["mountPath"] for mount in pod["containers"][0].get("volumeMounts", [])]
    spread = pod.get("topologySpreadConstraints", [])
    return (
        pod.get("serviceAccountName") == SERVICE_ACCOUNT
        and pod.get("securityContext", {}).get("fsGroup") == 1000
        and pod.get("priorityClassName") == priority_class
        and [c.get("topologyKey") for c in spread] == ["kubernetes.io/hostname"]
        and names[-2:] == ["aws", "scratch"]
        and mounts[-2:] == ["/mnt/aws", "/scratch"]
        and template["metadata"].get("annotations", {}).get(TEAM) == "ml"
        and template["metadata"]["labels"].get("cost-center") == "42"
    )


def _router_settings_hold(template: dict[str, Any], priority_class: str) -> bool:
    pod = template["spec"]
    spread = pod.get("topologySpreadConstraints", [])
    return (
        pod.get("serviceAccountName") == f"{NAME}-router"
        and pod.get("priorityClassName") == priority_class
        and [c.get("topologyKey") for c in spread] == ["topology.kubernetes.io/zone"]
        and template["metadata"].get("annotations", {}).get(TEAM) == "ml"
        and template["metadata"]["labels"].get("cost-center") == "42"
    )


def _json_patch(kubectl: kube.Kubectl, namespace: str, kind: str, ops: list[Any]) -> None:
    kubectl("-n", namespace, "patch", kind, "--type=json", "-p", json.dumps(ops))


def test_pod_settings_are_rendered_repaired_and_refused_on_collision(
    kubectl: kube.Kubectl,
    namespace: str,
    priority_class: str,
    start_operator: StartOperator,  # noqa: F811
) -> None:
    kubectl("-n", namespace, "create", "serviceaccount", SERVICE_ACCOUNT)
    start_operator()
    role = _role(priority_class)
    kubectl.apply(
        small_model(NAME, namespace, prefill=role, decode=role, router=_router(priority_class))
    )
    wait_ready(kubectl, namespace, NAME)

    # Rendered: the pod templates carry every setting, and the API server admitted pods that
    # run as the ServiceAccount at the PriorityClass's priority.
    for role_name in ("prefill", "decode"):
        template = _template(kubectl, namespace, "statefulset", f"{NAME}-{role_name}")
        assert _role_settings_hold(template, priority_class), template
    router = _template(kubectl, namespace, "deployment", f"{NAME}-router")
    assert _router_settings_hold(router, priority_class), router
    selector = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=prefill"
    pods = kubectl.json("-n", namespace, "get", "pods", "-l", selector)["items"]
    assert pods and all(
        p["spec"]["serviceAccountName"] == SERVICE_ACCOUNT and p["spec"]["priority"] == PRIORITY
        for p in pods
    ), [p["spec"] for p in pods]

    # Repaired: hand edits of what the operator rendered are undone.
    sts = f"statefulset/{NAME}-prefill"
    _json_patch(kubectl, namespace, sts, [
        {"op": "replace", "path": "/spec/template/spec/serviceAccountName", "value": "default"},
        {"op": "replace", "path": "/spec/template/spec/securityContext", "value": {}},
        {"op": "remove", "path": "/spec/template/spec/topologySpreadConstraints"},
        {"op": "remove", "path": "/spec/template/metadata/annotations/example.com~1team"},
    ])  # fmt: skip
    _json_patch(kubectl, namespace, f"deployment/{NAME}-router", [
        {"op": "remove", "path": "/spec/template/spec/priorityClassName"},
        {"op": "replace", "path": "/spec/template/metadata/labels/cost-center", "value": "7"},
    ])  # fmt: skip

    def repaired() -> bool:
        prefill = _template(kubectl, namespace, "statefulset", f"{NAME}-prefill")
        router = _template(kubectl, namespace, "deployment", f"{NAME}-router")
        return _role_settings_hold(prefill, priority_class) and _router_settings_hold(
            router, priority_class
        )

    kube.wait_for(repaired, what="the pod settings' hand edits undone", timeout_s=60)
    selector = "involvedObject.kind=DisaggregatedModel,reason=DriftRepaired"
    events = kubectl.json("-n", namespace, "get", "events", "--field-selector", selector)
    repairs = " ".join(event["message"] for event in events["items"])
    assert f"StatefulSet {NAME}-prefill" in repairs and f"Deployment {NAME}-router" in repairs
    wait_ready(kubectl, namespace, NAME)

    # Refused on collision: the API server names the field; nothing reaches the operator.
    generation = kubectl.json("-n", namespace, "get", "dmodel", NAME)["metadata"]["generation"]
    collisions = [
        (
            {"prefill": {"volumeMounts": [{"name": "scratch", "mountPath": "/etc/disagg"}]}},
            "spec.prefill.volumeMounts",
            "must not mount at a path the operator mounts",
        ),
        (
            {"decode": {"volumes": [{"name": "dshm", "emptyDir": {}}], "volumeMounts": []}},
            "spec.decode.volumes",
            "must not use a volume name the operator gives every pod",
        ),
        (
            {"decode": {"volumeMounts": [{"name": "scratch", "mountPath": "/models"}]}},
            "spec.decode.volumeMounts",
            "must not mount at the model cache's path",
        ),
        (
            {"router": {"podLabels": {"app.kubernetes.io/component": "x"}}},
            "spec.router.podLabels",
            "must not set app.kubernetes.io/ labels",
        ),
        (
            {"prefill": {"podAnnotations": {"disagg.dev/config-hash": "0"}}},
            "spec.prefill.podAnnotations",
            "must not set disagg.dev/ annotations",
        ),
    ]
    for patch, path, says in collisions:
        proc = kubectl.run(
            "-n", namespace, "patch", "dmodel", NAME, "--type=merge",
            "-p", json.dumps({"spec": patch}), check=False,
        )  # fmt: skip
        assert proc.returncode != 0, (patch, proc.stdout)
        assert path in proc.stderr and says in proc.stderr, proc.stderr
    stored = kubectl.json("-n", namespace, "get", "dmodel", NAME)
    assert stored["metadata"]["generation"] == generation
