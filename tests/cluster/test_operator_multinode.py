"""Multi-node servers on the local control plane: the two-node example becomes LeaderWorkerSets
that the LeaderWorkerSet controller (lws-up.sh) reconciles for real onto the fake p5en nodes.

As in the other cluster tests, kwok fakes the kubelet: pods are bound, started and marked
Ready without running a container, so "Ready" is the scheduler's placement plus the
LeaderWorkerSet and StatefulSet controllers' counts, not vLLM's health (tests/engine).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import kube
from disagg_contract import Role
from disagg_operator.render import LWS_NAME_LABEL, LWS_WORKER_INDEX_LABEL
from disagg_router.discovery.kubernetes import EndpointSliceDiscovery
from disagg_router.replicas import ReplicaPool
from operator_fixtures import (  # noqa: F401
    REPO,
    StartOperator,
    crds,
    example_prerequisites,
    start_operator,
)
from operator_harness import children, condition, dmodel, rendered_children, wait_ready

EXAMPLE = REPO / "examples" / "kimi-k2-2node-p5en.yaml"
ROLES = ("prefill", "decode")


def _example(kubectl: kube.Kubectl, namespace: str) -> dict[str, Any]:
    example: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    example["metadata"]["namespace"] = namespace
    example_prerequisites(kubectl, namespace, example)
    return example


Served = tuple[dict[str, Any], dict[str, Any]]


@pytest.fixture
def served(
    kubectl: kube.Kubectl,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
) -> Served:
    """The two-node example applied with the operator running: it and the model once Ready."""
    example = _example(kubectl, namespace)
    start_operator()
    kubectl.apply(example)
    return example, wait_ready(kubectl, namespace, example["metadata"]["name"], timeout_s=240)


def _group_pods(kubectl: kube.Kubectl, namespace: str, lws: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = kubectl.json(
        "-n", namespace, "get", "pods", "-l", f"{LWS_NAME_LABEL}={lws}"
    )["items"]
    return sorted(pods, key=lambda p: p["metadata"]["labels"][LWS_WORKER_INDEX_LABEL])


def _lws(kubectl: kube.Kubectl, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = kubectl.json("-n", namespace, "get", "leaderworkerset", name)
    return obj


def _leader_endpoints(kubectl: kube.Kubectl, namespace: str, service: str) -> list[str]:
    slices = kubectl.json("-n", namespace, "get", "endpointslices", "-l",
                          f"kubernetes.io/service-name={service}")["items"]  # fmt: skip
    return sorted(a for s in slices for e in s.get("endpoints") or [] for a in e["addresses"])


def _discovered(kubeconfig: Path, namespace: str, service: str) -> list[str]:
    """What the router's EndpointSlice discovery puts in the role's pool."""

    async def scenario() -> list[str]:
        pool = ReplicaPool(Role.PREFILL, 1.0, 5.0)
        discovery = EndpointSliceDiscovery(namespace, {service: pool}, "http", str(kubeconfig))
        await discovery.start()
        try:
            for _ in range(100):
                if pool.members():
                    break
                await asyncio.sleep(0.1)
            return sorted(replica.url for replica in pool.members())
        finally:
            await discovery.stop()

    return asyncio.run(scenario())


def test_two_node_example_runs_as_leaderworkersets_on_distinct_p5en_nodes(
    kubectl: kube.Kubectl, kubeconfig: Path, namespace: str, served: Served
) -> None:
    example, model = served
    name = example["metadata"]["name"]
    uid = model["metadata"]["uid"]

    live = children(kubectl, namespace, name)
    assert sorted(f"{c['kind']}/{c['metadata']['name']}" for c in live) == rendered_children(
        example
    )
    nodes = []
    for role in ROLES:
        lws = _lws(kubectl, namespace, f"{name}-{role}")
        assert [r["uid"] for r in lws["metadata"]["ownerReferences"]] == [uid]
        assert lws["status"]["readyReplicas"] == 1 and lws["status"]["replicas"] == 1
        assert model["status"][role] == {"desiredReplicas": 1, "readyReplicas": 1}
        pods = _group_pods(kubectl, namespace, f"{name}-{role}")
        assert [p["metadata"]["labels"][LWS_WORKER_INDEX_LABEL] for p in pods] == ["0", "1"]
        leader, worker = pods
        assert leader["spec"]["containers"][0]["command"][:2] == ["disagg", "serve"]
        worker_command = worker["spec"]["containers"][0]["command"]
        assert worker_command[:2] == ["disagg", "serve"] and "--headless-worker" in worker_command
        env = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
        assert env["LWS_WORKER_INDEX"] == "1" and env["LWS_GROUP_SIZE"] == "2"
        assert env["LWS_LEADER_ADDRESS"].startswith(f"{name}-{role}-0.{name}-{role}-0.")
        for pod in pods:
            assert pod["status"]["phase"] == "Running" and kube.condition_true(pod, "Ready")
            node = kubectl.json("get", "node", pod["spec"]["nodeName"])
            assert node["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "p5en.48xlarge"
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            assert limits["nvidia.com/gpu"] == "8" and limits["vpc.amazonaws.com/efa"] == "16"
            assert node["status"]["allocatable"]["vpc.amazonaws.com/efa"] == "16"
            nodes.append(pod["spec"]["nodeName"])

        # The router's Service (and so its EndpointSlices and the router's pool) holds the
        # leader only; the group's own headless Service (from the LWS controller) every pod.
        ip = leader["status"]["podIP"]
        assert _leader_endpoints(kubectl, namespace, f"{name}-{role}") == [ip]
        assert _discovered(kubeconfig, namespace, f"{name}-{role}") == [f"http://{ip}:8000"]
        group_service = kubectl.json("-n", namespace, "get", "service", f"{name}-{role}-0")
        assert group_service["spec"]["publishNotReadyAddresses"] is True
    assert len(set(nodes)) == 4, f"every pod of both groups on its own p5en node: {nodes}"
    assert condition(model, "Ready")["status"] == "True"


def test_a_lost_worker_restarts_its_group_and_drift_is_repaired(
    kubectl: kube.Kubectl, namespace: str, served: Served
) -> None:
    example, model = served
    name = example["metadata"]["name"]
    ready_since = condition(model, "Ready")["lastTransitionTime"]
    lws = f"{name}-decode"
    leader, worker = _group_pods(kubectl, namespace, lws)

    kubectl("-n", namespace, "delete", "pod", worker["metadata"]["name"], "--wait=false")

    def restarted() -> bool:
        pods = _group_pods(kubectl, namespace, lws)
        uids = {p["metadata"]["uid"] for p in pods}
        return (
            len(pods) == 2
            and not uids & {leader["metadata"]["uid"], worker["metadata"]["uid"]}
            and all(kube.condition_true(p, "Ready") for p in pods)
        )

    kube.wait_for(restarted, what="the decode group recreated, leader included", timeout_s=120)

    def ready_again() -> dict[str, Any] | None:
        obj = dmodel(kubectl, namespace, name)
        ready = condition(obj, "Ready")
        return (
            obj if ready["status"] == "True" and ready["lastTransitionTime"] > ready_since else None
        )

    # Ready turned False while the group restarted, then True again (a new transition time).
    again = kube.wait_for(ready_again, what="the model Ready again after the restart",
                          timeout_s=120)  # fmt: skip
    assert again["status"]["decode"] == {"desiredReplicas": 1, "readyReplicas": 1}

    # Drift on a LeaderWorkerSet: the group size and restart policy edited by hand.
    kubectl("-n", namespace, "patch", "leaderworkerset", lws, "--type=merge", "-p", json.dumps(
        {"spec": {"leaderWorkerTemplate": {"restartPolicy": "None"}, "replicas": 2}}))  # fmt: skip

    def repaired() -> bool:
        spec = _lws(kubectl, namespace, lws)["spec"]
        return spec["replicas"] == 1 and spec["leaderWorkerTemplate"]["restartPolicy"] == (
            "RecreateGroupOnPodRestart"
        )

    kube.wait_for(repaired, what="the LeaderWorkerSet edit undone", timeout_s=60)
    wait_ready(kubectl, namespace, name, timeout_s=120)
    events = kubectl.json("-n", namespace, "get", "events", "--field-selector",
                          "reason=DriftRepaired")["items"]  # fmt: skip
    assert any(f"LeaderWorkerSet {lws}" in e["message"] for e in events), events


def test_switching_a_role_between_one_and_two_nodes_replaces_its_workload(
    kubectl: kube.Kubectl, namespace: str, served: Served
) -> None:
    example, _ = served
    name = example["metadata"]["name"]
    decode = f"{name}-decode"

    def patch_decode(nodes: int, tp: int) -> None:
        patch = {"spec": {"decode": {"nodesPerReplica": nodes, "tensorParallelSize": tp}}}
        kubectl("-n", namespace, "patch", "dmodel", name, "--type=merge", "-p", json.dumps(patch))

    def kinds() -> set[str]:
        found = children(kubectl, namespace, name, kinds="statefulsets.apps,leaderworkersets")
        return {c["kind"] for c in found if c["metadata"]["name"] == decode}

    patch_decode(1, 8)
    model = wait_ready(kubectl, namespace, name, timeout_s=180)
    assert kinds() == {"StatefulSet"}
    pods = kubectl.json(
        "-n",
        namespace,
        "get",
        "pods",
        "-l",
        f"app.kubernetes.io/instance={name},app.kubernetes.io/component=decode",
    )
    assert [p["metadata"]["name"] for p in pods["items"]] == [f"{decode}-0"]
    assert LWS_NAME_LABEL not in pods["items"][0]["metadata"]["labels"]
    assert model["status"]["decode"] == {"desiredReplicas": 1, "readyReplicas": 1}

    patch_decode(2, 16)
    model = wait_ready(kubectl, namespace, name, timeout_s=180)
    assert kinds() == {"LeaderWorkerSet"}
    assert len(_group_pods(kubectl, namespace, decode)) == 2
    reasons = {e["reason"] for e in kubectl.json("-n", namespace, "get", "events")["items"]}
    assert "Replaced" in reasons
    assert condition(model, "Degraded")["status"] == "False"


PLACEMENT_KEY = "test.disagg.dev/placement-group"
"""A node label standing in for an EC2 placement group (set on the fake p5en nodes here)."""


def _label_nodes(kubectl: kube.Kubectl, values: dict[str, str | None]) -> None:
    for node, value in values.items():
        label = f"{PLACEMENT_KEY}-" if value is None else f"{PLACEMENT_KEY}={value}"
        kubectl("label", "node", node, label, "--overwrite")


def test_the_pods_of_a_group_stay_on_nodes_sharing_its_topology_key(
    kubectl: kube.Kubectl,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
) -> None:
    """One prefill group of two pods (decode scaled to none) with `groupTopologyKey` on a
    label of the fake nodes: while every node has a value of its own the worker cannot join
    its leader and stays Pending; once one other node shares the leader's value the scheduler
    puts the worker there, not on either node of the other value."""
    p5en = kubectl.json("get", "nodes", "-l", "node.kubernetes.io/instance-type=p5en.48xlarge")
    gpu_nodes = sorted(node["metadata"]["name"] for node in p5en["items"])
    assert len(gpu_nodes) >= 4, gpu_nodes
    example = _example(kubectl, namespace)
    name = example["metadata"]["name"]
    example["spec"]["prefill"]["groupTopologyKey"] = PLACEMENT_KEY
    example["spec"]["decode"]["replicas"] = 0
    lws = f"{name}-prefill"
    _label_nodes(kubectl, {node: f"pg-{i}" for i, node in enumerate(gpu_nodes)})
    try:
        start_operator()
        kubectl.apply(example)

        def worker_unschedulable() -> dict[str, Any] | None:
            pods = _group_pods(kubectl, namespace, lws)
            if len(pods) != 2 or not pods[0]["spec"].get("nodeName"):
                return None
            scheduled = [c for c in pods[1].get("status", {}).get("conditions") or []
                         if c["type"] == "PodScheduled"]  # fmt: skip
            refused = scheduled and scheduled[0]["status"] == "False"
            return pods[1] if refused and "affinity" in scheduled[0]["message"] else None

        worker = kube.wait_for(worker_unschedulable, what="the worker refused by its affinity",
                               timeout_s=120)  # fmt: skip
        # The API server merged the group's own key into the worker's affinity term.
        terms = worker["spec"]["affinity"]["podAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        (together,) = [t for t in terms if t["topologyKey"] == PLACEMENT_KEY]
        group_key = worker["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-key"]
        assert {"key": "leaderworkerset.sigs.k8s.io/group-key", "operator": "In",
                "values": [group_key]} in together["labelSelector"]["matchExpressions"]  # fmt: skip
        home = _group_pods(kubectl, namespace, lws)[0]["spec"]["nodeName"]
        others = [node for node in gpu_nodes if node != home]
        partner = others[1]
        _label_nodes(kubectl, {home: "pg-a", partner: "pg-a",
                               **{node: "pg-b" for node in others if node != partner}})  # fmt: skip

        def placed() -> str | None:
            pods = _group_pods(kubectl, namespace, lws)
            return pods[1]["spec"].get("nodeName") if len(pods) == 2 else None

        assert kube.wait_for(placed, what="the worker scheduled", timeout_s=120) == partner
        wait_ready(kubectl, namespace, name, timeout_s=120)
    finally:
        _label_nodes(kubectl, dict.fromkeys(gpu_nodes))
