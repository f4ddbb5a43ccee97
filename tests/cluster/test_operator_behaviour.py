"""What users expect of an operator, each checked on the real control plane with the real
operator process: no writes in steady state, drift repair (the router Service's annotations
and source ranges too), config rollouts that touch only what changed, per-role scaling, node
drains that evict one pod per component at a time, Degraded-then-recovered on a missing Secret,
and invalid objects that never reach the operator.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import kube
from disagg_operator.connector_config import config_hash, config_map_data
from disagg_operator.loading import load_spec
from disagg_operator.names import CONFIG_HASH_ANNOTATION
from operator_fixtures import (  # noqa: F401
    INVALID_SPECS,
    StartOperator,
    crds,
    resource,
    small_model,
    spec_with,
    start_operator,
)
from operator_harness import (
    CHILD_KINDS,
    ApiProxy,
    Samples,
    children,
    condition,
    dmodel,
    free_port,
    is_peering,
    rendered_children,
    sample,
    scrape,
    total,
    wait_ready,
)

NAME = "m"
STEADY_WINDOW_S = 20


def _get(kubectl: kube.Kubectl, namespace: str, kind: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = kubectl.json("-n", namespace, "get", kind, name)
    return obj


def _patch_spec(kubectl: kube.Kubectl, namespace: str, patch: dict[str, Any]) -> None:
    kubectl(
        "-n", namespace, "patch", "dmodel", NAME, "--type=merge", "-p", json.dumps({"spec": patch})
    )


def _pods(kubectl: kube.Kubectl, namespace: str, component: str) -> dict[str, str]:
    """Pod name -> uid of one component."""
    selector = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component={component}"
    pods = kubectl.json("-n", namespace, "get", "pods", "-l", selector)["items"]
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


def _ready_model(kubectl: kube.Kubectl, namespace: str, **patch: Any) -> dict[str, Any]:
    kubectl.apply(small_model(NAME, namespace, **patch))
    return wait_ready(kubectl, namespace, NAME)


def _events(kubectl: kube.Kubectl, namespace: str, reason: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind=DisaggregatedModel,reason={reason}"
    items: list[dict[str, Any]] = kubectl.json(
        "-n", namespace, "get", "events", "--field-selector", selector
    )["items"]
    return items


def test_steady_state_issues_no_writes(
    kubectl: kube.Kubectl,
    kubeconfig: Path,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
    tmp_path: Path,
) -> None:
    with ApiProxy(kubeconfig, tmp_path) as proxy:
        first = start_operator(kubeconfig_path=proxy.kubeconfig)
        _ready_model(kubectl, namespace)
        creation_writes = [w for w in proxy.writes() if not is_peering(w)]
        assert creation_writes, "the first operator created the children through the proxy"
        first.assert_clean_stop()

        # A restarted operator resumes the model and every child event re-checks it; on top,
        # label every child and pod by hand: more events, nothing for the operator to change.
        # (A label, not an annotation: annotating a Deployment bumps its generation, a real
        # change the status reports while the deployment controller catches up.)
        mark = time.monotonic()
        second = start_operator(kubeconfig_path=proxy.kubeconfig)
        second.wait_log("Resuming is processed")
        selector = f"app.kubernetes.io/instance={NAME}"
        kubectl("-n", namespace, "label", f"{CHILD_KINDS},pods", "-l", selector,
                "example.com/poked=yes", "--overwrite")  # fmt: skip
        time.sleep(STEADY_WINDOW_S)
        writes = proxy.writes(since=mark)
        reads = [r for r in proxy.requests if r.at >= mark and r.method == "GET"]
        log = second.log()
        second.assert_clean_stop()

    assert reads, "the second operator talked to the API server through the proxy"
    others = [(w.method, w.path) for w in writes if not is_peering(w)]
    assert others == [], f"writes in steady state: {others}"
    assert all(w.method == "PATCH" for w in writes), writes  # only kopf's peering keep-alives
    assert "applied " not in log


def test_drift_is_repaired(
    kubectl: kube.Kubectl,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
) -> None:
    metrics_port = free_port()
    start_operator(f"--metrics-port={metrics_port}")
    _ready_model(kubectl, namespace)
    ns = ("-n", namespace)
    service_uid = _get(kubectl, namespace, "service", f"{NAME}-decode")["metadata"]["uid"]
    config = _get(kubectl, namespace, "configmap", f"{NAME}-connector")["data"]

    kubectl(*ns, "scale", "statefulset", f"{NAME}-prefill", "--replicas=3")
    kubectl(*ns, "delete", "service", f"{NAME}-decode")
    kubectl(*ns, "patch", "configmap", f"{NAME}-connector", "--type=merge",
            "-p", json.dumps({"data": {"prefill.json": "{}"}}))  # fmt: skip
    kubectl(*ns, "delete", "role", f"{NAME}-router")
    # maxUnavailable 0 is how a hand edit would block every node drain.
    kubectl(*ns, "patch", "poddisruptionbudget", f"{NAME}-decode", "--type=merge",
            "-p", json.dumps({"spec": {"maxUnavailable": 0}}))  # fmt: skip

    def repaired() -> bool:
        sts = _get(kubectl, namespace, "statefulset", f"{NAME}-prefill")
        svc = kubectl.run(*ns, "get", "service", f"{NAME}-decode", "-o", "json", check=False)
        role = kubectl.run(*ns, "get", "role", f"{NAME}-router", check=False)
        data = _get(kubectl, namespace, "configmap", f"{NAME}-connector")["data"]
        budget = _get(kubectl, namespace, "poddisruptionbudget", f"{NAME}-decode")
        return (
            sts["spec"]["replicas"] == 1
            and svc.returncode == 0
            and json.loads(svc.stdout)["metadata"]["uid"] != service_uid
            and role.returncode == 0
            and data == config
            and budget["spec"]["maxUnavailable"] == 1
        )

    kube.wait_for(repaired, what="every hand edit undone", timeout_s=60)
    wait_ready(kubectl, namespace, NAME)
    repairs = " ".join(e["message"] for e in _events(kubectl, namespace, "DriftRepaired"))
    assert f"StatefulSet {NAME}-prefill" in repairs and f"ConfigMap {NAME}-connector" in repairs
    assert f"PodDisruptionBudget {NAME}-decode (.spec.maxUnavailable)" in repairs
    recreated = " ".join(e["message"] for e in _events(kubectl, namespace, "Created"))
    assert f"Service {NAME}-decode" in recreated and f"Role {NAME}-router" in recreated

    # The same story in the operator's /metrics: every child created, then the deleted Service
    # and Role created again; the hand edits repaired; every pass ended without an error.
    def counted_ready() -> Samples | None:
        samples = scrape(metrics_port)
        return samples if sample(samples, "disagg_operator_models", ready="true") == 1 else None

    metrics = kube.wait_for(counted_ready, what="the model counted Ready in /metrics")
    applies = "disagg_operator_child_applies_total"
    created = len(rendered_children(small_model(NAME, namespace))) + 2
    assert total(metrics, applies, action="create") == created, metrics
    assert sample(metrics, applies, kind="Service", action="create") == 4
    assert sample(metrics, applies, kind="Role", action="create") == 2
    assert sample(metrics, applies, kind="StatefulSet", action="repair") >= 1
    assert sample(metrics, applies, kind="ConfigMap", action="repair") >= 1
    assert sample(metrics, applies, kind="PodDisruptionBudget", action="repair") >= 1
    assert total(metrics, applies, action="update") == 0
    passes = "disagg_operator_reconcile_passes_total"
    assert sample(metrics, passes, result="applied") >= 2
    assert sample(metrics, passes, result="error") == 0
    assert sample(metrics, passes, result="blocked") == 0
    assert sample(metrics, "disagg_operator_models", ready="false") == 0
    assert sample(metrics, "disagg_operator_reconcile_duration_seconds_count") == total(
        metrics, passes
    )
    assert total(metrics, "disagg_operator_api_errors_total") == 0


SCHEME = "service.beta.kubernetes.io/aws-load-balancer-scheme"
TEAM = "example.com/team"


def test_router_service_annotations_and_source_ranges_are_applied_and_repaired(
    kubectl: kube.Kubectl,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
) -> None:
    start_operator()
    router = {
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "serviceType": "LoadBalancer",
        "service": {
            "annotations": {SCHEME: "internal", TEAM: "serving"},
            "loadBalancerSourceRanges": ["10.0.0.0/8", "fd00::/8"],
        },
    }
    _ready_model(kubectl, namespace, router=router)
    ns = ("-n", namespace)
    service = f"{NAME}-router"

    def exposed() -> bool:
        live = _get(kubectl, namespace, "service", service)
        annotations = live["metadata"].get("annotations", {})
        return (
            annotations.get(SCHEME) == "internal"
            and annotations.get(TEAM) == "serving"
            and live["spec"].get("loadBalancerSourceRanges") == ["10.0.0.0/8", "fd00::/8"]
        )

    assert exposed(), _get(kubectl, namespace, "service", service)

    # Hand edits: one annotation changed, one removed, the ranges opened to everyone.
    kubectl(*ns, "annotate", "service", service, f"{SCHEME}=internet-facing", "--overwrite")
    kubectl(*ns, "annotate", "service", service, f"{TEAM}-")
    kubectl(*ns, "patch", "service", service, "--type=merge",
            "-p", json.dumps({"spec": {"loadBalancerSourceRanges": ["0.0.0.0/0"]}}))  # fmt: skip
    kube.wait_for(exposed, what="the router Service's hand edits undone", timeout_s=60)
    repairs = " ".join(e["message"] for e in _events(kubectl, namespace, "DriftRepaired"))
    assert f"Service {service}" in repairs, repairs

    # An annotation dropped from the spec leaves the Service; the other stays.
    _patch_spec(kubectl, namespace, {"router": {"service": {"annotations": {TEAM: None}}}})

    def dropped() -> bool:
        annotations = _get(kubectl, namespace, "service", service)["metadata"]["annotations"]
        return TEAM not in annotations and annotations.get(SCHEME) == "internal"

    kube.wait_for(dropped, what=f"{TEAM} removed from the router Service", timeout_s=60)
    wait_ready(kubectl, namespace, NAME)


def _rolled_out(kubectl: kube.Kubectl, namespace: str, role: str, hash_: str) -> bool:
    sts = _get(kubectl, namespace, "statefulset", f"{NAME}-{role}")
    template = sts["spec"]["template"]["metadata"]["annotations"]
    status = sts["status"]
    return (
        template[CONFIG_HASH_ANNOTATION] == hash_
        and status.get("observedGeneration") == sts["metadata"]["generation"]
        and status.get("updateRevision") == status.get("currentRevision")
        and status.get("updatedReplicas") == status.get("readyReplicas") == 1
    )


def test_connector_change_rolls_engines_and_router_change_does_not(
    kubectl: kube.Kubectl,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
) -> None:
    start_operator()
    _ready_model(kubectl, namespace)
    changes = [
        ("decoder_kv_blocks_ttl", {"kvTransfer": {"decoderKvBlocksTtlSeconds": 600}}, 600),
        ("kv_recompute_threshold", {"kvTransfer": {"recomputeThresholdTokens": 128}}, 128),
        ("bidirectional_kv_xfer", {"kvTransfer": {"bidirectional": False}}, False),
    ]
    for key, patch, value in changes:
        before = {role: _pods(kubectl, namespace, role) for role in ("prefill", "decode")}
        _patch_spec(kubectl, namespace, patch)
        spec = load_spec(dmodel(kubectl, namespace, NAME)["spec"])
        hash_ = config_hash(config_map_data(spec))

        def config_updated(key: str = key, value: object = value) -> bool:
            data = _get(kubectl, namespace, "configmap", f"{NAME}-connector")["data"]
            return all(
                json.loads(data[f"{role}.json"])["kv_connector_extra_config"][key] == value
                for role in ("prefill", "decode")
            )

        kube.wait_for(config_updated, what=f"{key}={value} in the connector ConfigMap")
        for role in ("prefill", "decode"):
            kube.wait_for(
                lambda role=role, hash_=hash_: _rolled_out(kubectl, namespace, role, hash_),
                what=f"{role} rolled to config {hash_}",
                timeout_s=120,
            )
            after = _pods(kubectl, namespace, role)
            assert after.keys() == before[role].keys()
            assert set(after.values()).isdisjoint(before[role].values()), (
                f"{role} pods not replaced"
            )
        model = wait_ready(kubectl, namespace, NAME)
        assert model["status"]["connectorConfigHash"] == hash_

    engines = {
        role: _get(kubectl, namespace, "statefulset", f"{NAME}-{role}")
        for role in ("prefill", "decode")
    }
    pods = {role: _pods(kubectl, namespace, role) for role in ("prefill", "decode")}
    router_generation = _get(kubectl, namespace, "deployment", f"{NAME}-router")["metadata"][
        "generation"
    ]
    _patch_spec(kubectl, namespace, {"router": {"conversationTtlSeconds": 400}})
    kube.wait_for(
        lambda: (
            _get(kubectl, namespace, "deployment", f"{NAME}-router")["metadata"]["generation"]
            > router_generation
        ),
        what="the router Deployment updated",
    )
    wait_ready(kubectl, namespace, NAME)
    for role, sts in engines.items():
        now = _get(kubectl, namespace, "statefulset", f"{NAME}-{role}")
        assert now["metadata"]["generation"] == sts["metadata"]["generation"], role
        assert _pods(kubectl, namespace, role) == pods[role], f"{role} pods rolled"


def test_scaling_one_role_scales_only_that_statefulset(
    kubectl: kube.Kubectl,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
) -> None:
    start_operator()
    _ready_model(kubectl, namespace)
    prefill = _get(kubectl, namespace, "statefulset", f"{NAME}-prefill")
    decode = _get(kubectl, namespace, "statefulset", f"{NAME}-decode")
    router = _get(kubectl, namespace, "deployment", f"{NAME}-router")

    _patch_spec(kubectl, namespace, {"decode": {"replicas": 2}})
    model = wait_ready(kubectl, namespace, NAME)

    assert model["status"]["decode"] == {"desiredReplicas": 2, "readyReplicas": 2}
    assert model["status"]["prefill"] == {"desiredReplicas": 1, "readyReplicas": 1}
    scaled = _get(kubectl, namespace, "statefulset", f"{NAME}-decode")
    assert scaled["spec"]["replicas"] == 2
    assert scaled["metadata"]["generation"] == decode["metadata"]["generation"] + 1
    assert len(_pods(kubectl, namespace, "decode")) == 2
    for kind, before in (("statefulset", prefill), ("deployment", router)):
        after = _get(kubectl, namespace, kind, before["metadata"]["name"])
        assert after["metadata"]["generation"] == before["metadata"]["generation"], kind
        assert after["spec"] == before["spec"], kind


@contextmanager
def _cordoned(kubectl: kube.Kubectl, node: str) -> Iterator[None]:
    """The first step of a node drain: nothing new is scheduled on `node` (undone on exit)."""
    kubectl("cordon", node)
    try:
        yield
    finally:
        kubectl("uncordon", node)


def _evict(core: client.CoreV1Api, namespace: str, pod: str) -> None:
    """What a node drain (kubectl drain, EKS node group upgrades, Karpenter) asks per pod."""
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
    core.create_namespaced_pod_eviction(pod, namespace, eviction)


def test_drains_evict_one_pod_per_component_at_a_time(
    kubectl: kube.Kubectl,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
    k8s_api: client.ApiClient,
) -> None:
    # Prefill and decode on one node, the node a drain empties. kwok makes a replacement pod
    # Ready within milliseconds where vLLM takes minutes: the cordon keeps it Pending instead.
    node = kubectl("get", "nodes", "-l", "nvidia.com/gpu.present=true",
                   "-o", "jsonpath={.items[0].metadata.name}")  # fmt: skip
    on_node = {"nodeSelector": {"kubernetes.io/hostname": node}}
    start_operator()
    _ready_model(kubectl, namespace, prefill=on_node, decode={**on_node, "replicas": 2})
    replicas = {"prefill": 1, "decode": 2, "router": 1}

    def one_each() -> bool:
        """The disruption controller counts each component's pods (exactly those, through the
        budget's selector) all healthy, and lets one go in each: the lone prefill and router
        pods too (a budget never blocks a drain for good)."""
        for component, count in replicas.items():
            budget = _get(kubectl, namespace, "poddisruptionbudget", f"{NAME}-{component}")
            status = budget.get("status", {})
            counted = status.get("expectedPods") == status.get("currentHealthy") == count
            if not counted or status.get("disruptionsAllowed") != 1:
                return False
        return True

    kube.wait_for(one_each, what="one disruption allowed per component, every pod counted")

    core = client.CoreV1Api(k8s_api)
    first, second = sorted(_pods(kubectl, namespace, "decode"))
    with _cordoned(kubectl, node):
        _evict(core, namespace, first)
        with pytest.raises(ApiException) as refused:
            _evict(core, namespace, second)
        assert refused.value.status == 429, refused.value
        assert "disruption budget" in str(refused.value.body), refused.value.body
        _evict(core, namespace, f"{NAME}-prefill-0")

    # Back in service, the replacements turn Ready and the next decode pod may go. (A
    # replacement keeps its pod's name; the controller may count it as disrupted for up to
    # 2 min after the eviction.)
    kube.wait_for(one_each, what="the evicted pods replaced and counted", timeout_s=180)
    _evict(core, namespace, second)
    kube.wait_for(one_each, what=f"{second} replaced and counted", timeout_s=180)
    model = wait_ready(kubectl, namespace, NAME)
    assert model["status"]["decode"] == {"desiredReplicas": 2, "readyReplicas": 2}


@pytest.mark.parametrize(
    ("patch", "field", "literal"),
    [
        ({"model": {"tokenSecret": {"name": "hf-token"}}}, "spec.model.tokenSecret", "token=x"),
        (
            {"auth": {"apiKeySecret": {"name": "hf-token", "key": "api-key"}}},
            "spec.auth.apiKeySecret",
            "api-key=sk-x",
        ),
    ],
    ids=["token-secret", "api-key-secret"],
)
def test_missing_secret_degrades_and_recovers_by_itself(
    kubectl: kube.Kubectl,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
    patch: dict[str, Any],
    field: str,
    literal: str,
) -> None:
    start_operator()
    kubectl.apply(small_model(NAME, namespace, **patch))

    def degraded() -> dict[str, Any] | None:
        obj = dmodel(kubectl, namespace, NAME)
        return obj if condition(obj, "Degraded").get("status") == "True" else None

    model = kube.wait_for(degraded, what="Degraded", timeout_s=60)
    cond = condition(model, "Degraded")
    assert cond["reason"] == "SecretNotFound"
    assert "hf-token" in cond["message"] and "kubectl" in cond["message"]
    assert field in cond["message"]
    assert condition(model, "Ready")["status"] == "False"
    assert condition(model, "Progressing")["reason"] == "Blocked"
    statefulsets = kubectl.json("-n", namespace, "get", "statefulsets")["items"]
    assert statefulsets == [], "no pods are started that could not get their token"
    warnings = _events(kubectl, namespace, "SecretNotFound")
    assert warnings and warnings[0]["type"] == "Warning"

    kubectl("-n", namespace, "create", "secret", "generic", "hf-token", f"--from-literal={literal}")
    model = wait_ready(kubectl, namespace, NAME, timeout_s=120)
    assert condition(model, "Degraded")["status"] == "False"


def test_invalid_objects_are_refused_by_the_api_server_and_never_reach_the_operator(
    kubectl: kube.Kubectl,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
) -> None:
    operator = start_operator()
    assert len(INVALID_SPECS) >= 20
    for case in INVALID_SPECS:
        obj = resource(
            spec_with(case.patch), name=f"bad-{INVALID_SPECS.index(case)}", namespace=namespace
        )
        proc = kubectl.run("apply", "-f", "-", input=json.dumps(obj), check=False)
        assert proc.returncode != 0, (case.id, proc.stdout)
        assert case.path in proc.stderr, (case.id, proc.stderr)
    assert kubectl.json("-n", namespace, "get", "dmodel")["items"] == []
    assert "bad-" not in operator.log()


def test_deleting_the_model_leaves_cleanup_to_the_garbage_collector(
    kubectl: kube.Kubectl,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
) -> None:
    start_operator()
    model = _ready_model(kubectl, namespace)
    assert not model["metadata"].get("finalizers"), "nothing blocks deletion"
    kubectl("-n", namespace, "delete", "dmodel", NAME, "--wait=false")

    def all_gone() -> bool:
        return not children(kubectl, namespace, NAME, kinds=f"{CHILD_KINDS},pods")

    kube.wait_for(all_gone, what="the garbage collector to remove every child", timeout_s=120)
    time.sleep(3)
    assert all_gone(), "the operator re-created a child of a deleted model"
