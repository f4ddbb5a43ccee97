"""A role whose servers span several nodes (`nodesPerReplica` > 1): a LeaderWorkerSet whose
leader runs `disagg serve` and the API server and whose workers join it with vLLM's multi-node
mode; the router's Service selects leaders only; switching a role between one pod and several
per server replaces its workload (the only children the operator deletes)."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Mapping
from typing import Any, cast

import pytest

from api_standin import StoreStandIn
from disagg.cli import build_parser
from disagg_connector.commands import group_rank
from disagg_connector.launcher import GroupRank
from disagg_contract import EXTRA_ARGS_MARKER, POD_IP_ENV
from disagg_operator.children import key
from disagg_operator.errors import SpecError
from disagg_operator.kubeapi import KubeApi
from disagg_operator.loading import load_spec
from disagg_operator.models import MAX_MULTI_NODE_NAME_LENGTH
from disagg_operator.reconcile import Live, Reconciler
from disagg_operator.render import (
    LWS_GROUP_KEY_LABEL,
    LWS_LEADER_ADDRESS,
    LWS_REVISION,
    LWS_REVISION_ENV,
    LWS_REVISION_LABEL,
    LWS_WORKER_INDEX,
    LWS_WORKER_INDEX_LABEL,
    render,
)
from disagg_operator.resources import ApiResource
from dmodel_samples import minimal_spec, spec_with

Manifest = dict[str, Any]
TWO_NODES = {"tensorParallelSize": 16, "nodesPerReplica": 2, "extraArgs": ["--enforce-eager"]}


def _children(patch: dict[str, Any]) -> dict[tuple[str, str], Manifest]:
    return {key(m): m for m in render("big", "ml", load_spec(spec_with(patch)))}


def _group(children: Mapping[tuple[str, str], Manifest], role: str) -> dict[str, Any]:
    group: dict[str, Any] = children[("LeaderWorkerSet", f"big-{role}")]["spec"]
    return group


def _container(template: Mapping[str, Any]) -> dict[str, Any]:
    (container,) = template["spec"]["containers"]
    found: dict[str, Any] = container
    return found


def _after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_one_node_per_server_stays_a_statefulset() -> None:
    children = _children({})
    assert ("StatefulSet", "big-prefill") in children
    assert not any(kind == "LeaderWorkerSet" for kind, _ in children)


def test_a_multi_node_role_is_a_leaderworkerset_restarted_as_a_group() -> None:
    children = _children({"prefill": TWO_NODES})
    assert ("StatefulSet", "big-prefill") not in children
    assert ("StatefulSet", "big-decode") in children
    spec = _group(children, "prefill")
    assert spec["replicas"] == 1
    assert spec["startupPolicy"] == "LeaderCreated"
    assert spec["networkConfig"] == {"subdomainPolicy": "UniquePerReplica"}
    template = spec["leaderWorkerTemplate"]
    assert template["size"] == 2
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"


def test_leader_runs_disagg_serve_as_rank_zero_and_workers_join_headless() -> None:
    children = _children({"prefill": TWO_NODES})
    template = _group(children, "prefill")["leaderWorkerTemplate"]
    leader = _container(template["leaderTemplate"])["command"]
    assert leader[:2] == ["disagg", "serve"]
    marker = leader.index("--")
    vllm = leader[marker + 1 :]
    own = vllm[: vllm.index(EXTRA_ARGS_MARKER)]
    assert _after(own, "--nnodes") == "2" and _after(own, "--node-rank") == "0"
    assert _after(own, "--master-addr") == LWS_LEADER_ADDRESS
    assert _after(own, "--tensor-parallel-size") == "16"
    assert "--headless" not in own
    assert vllm[vllm.index(EXTRA_ARGS_MARKER) + 1 :] == ["--enforce-eager"]

    worker = _container(template["workerTemplate"])["command"]
    assert worker[: worker.index("--")] == [*leader[: leader.index("--")], "--headless-worker"]
    vllm = worker[worker.index("--") + 1 :]
    own = vllm[: vllm.index(EXTRA_ARGS_MARKER)]
    assert "--headless" in own and _after(own, "--node-rank") == LWS_WORKER_INDEX
    assert _after(own, "--master-addr") == LWS_LEADER_ADDRESS
    assert vllm[vllm.index(EXTRA_ARGS_MARKER) + 1 :] == ["--enforce-eager"]


def test_every_rank_of_a_group_builds_its_engine_id_from_the_groups_leader() -> None:
    """The launcher gets the group's leader address and revision on every rank (its own pod
    IP on the leader, to check the address against), not an engine id of its own."""
    template = _group(_children({"prefill": TWO_NODES}), "prefill")["leaderWorkerTemplate"]
    leader = _container(template["leaderTemplate"])
    worker = _container(template["workerTemplate"])
    ranks = [
        group_rank(build_parser().parse_args(container["command"][1:]))
        for container in (leader, worker)
    ]
    assert ranks == [
        GroupRank(LWS_LEADER_ADDRESS, LWS_REVISION, headless_worker=False),
        GroupRank(LWS_LEADER_ADDRESS, LWS_REVISION, headless_worker=True),
    ]
    label = {"fieldRef": {"fieldPath": f"metadata.labels['{LWS_REVISION_LABEL}']"}}
    pod_ip = {"fieldRef": {"fieldPath": "status.podIP"}}
    for container in (leader, worker):
        assert {"name": LWS_REVISION_ENV, "valueFrom": label} in container["env"]
        assert {"name": POD_IP_ENV, "valueFrom": pod_ip} in container["env"]


def test_single_node_servers_keep_vllms_own_engine_id() -> None:
    children = _children({"prefill": TWO_NODES})
    (decode,) = children[("StatefulSet", "big-decode")]["spec"]["template"]["spec"]["containers"]
    assert group_rank(build_parser().parse_args(decode["command"][1:])) is None
    assert LWS_REVISION_ENV not in {var["name"] for var in decode["env"]}
    assert all("engine_id" not in json.loads(text) for text in
               children[("ConfigMap", "big-connector")]["data"].values())  # fmt: skip


def test_every_pod_of_a_group_gets_its_share_of_gpus_efa_and_its_own_node() -> None:
    children = _children({"decode": {"tensorParallelSize": 16, "nodesPerReplica": 2}})
    template = _group(children, "decode")["leaderWorkerTemplate"]
    for pod in (template["leaderTemplate"], template["workerTemplate"]):
        limits = _container(pod)["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == 8
        assert limits["vpc.amazonaws.com/efa"] == 16 and limits["hugepages-2Mi"] == "5120Mi"
        (apart,) = pod["spec"]["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert apart["topologyKey"] == "kubernetes.io/hostname"
        assert apart["labelSelector"]["matchLabels"] == {
            "leaderworkerset.sigs.k8s.io/name": "big-decode"
        }
        zone, together = pod["spec"]["affinity"]["podAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert zone["topologyKey"] == "topology.kubernetes.io/zone", "prefill and decode"
        assert together == {**apart, "matchLabelKeys": [LWS_GROUP_KEY_LABEL],
                            "topologyKey": "topology.kubernetes.io/zone"}  # fmt: skip
        assert "--pipeline-parallel-size" not in _container(pod)["command"]


def test_a_group_stays_on_nodes_sharing_its_topology_key_beside_the_users_affinity() -> None:
    mine = {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    role = {**TWO_NODES, "groupTopologyKey": "topology.k8s.aws/network-node-layer-3",
            "affinity": mine}  # fmt: skip
    template = _group(_children({"decode": role}), "decode")["leaderWorkerTemplate"]
    for pod in (template["leaderTemplate"], template["workerTemplate"]):
        affinity = pod["spec"]["affinity"]["podAffinity"]
        assert affinity["preferredDuringSchedulingIgnoredDuringExecution"] == []
        (together,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]
        assert together["topologyKey"] == "topology.k8s.aws/network-node-layer-3"
        assert together["matchLabelKeys"] == [LWS_GROUP_KEY_LABEL]
    assert mine == {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}


def test_workers_serve_no_api_and_carry_no_probe() -> None:
    template = _group(_children({"prefill": TWO_NODES}), "prefill")["leaderWorkerTemplate"]
    leader, worker = _container(template["leaderTemplate"]), _container(template["workerTemplate"])
    assert {"readinessProbe", "startupProbe", "livenessProbe"} <= set(leader)
    assert not {"readinessProbe", "startupProbe", "livenessProbe"} & set(worker)
    assert [p["name"] for p in worker["ports"]] == ["side-channel"]


def test_the_routers_service_selects_leaders_only() -> None:
    children = _children({"prefill": TWO_NODES})
    prefill = children[("Service", "big-prefill")]["spec"]["selector"]
    assert prefill[LWS_WORKER_INDEX_LABEL] == "0"
    assert LWS_WORKER_INDEX_LABEL not in children[("Service", "big-decode")]["spec"]["selector"]


def test_the_ranks_of_a_group_may_reach_each_other() -> None:
    children = _children({"prefill": TWO_NODES})
    ingress = children[("NetworkPolicy", "big-prefill")]["spec"]["ingress"]
    selector = children[("NetworkPolicy", "big-prefill")]["spec"]["podSelector"]
    own = {"podSelector": selector}
    assert {"from": [own]} in ingress
    decode = children[("NetworkPolicy", "big-decode")]["spec"]["ingress"]
    assert all("ports" in rule for rule in decode), "single-node roles stay port-filtered"


class WorkloadApi(StoreStandIn):
    """An API server holding children; deletes are recorded and leave the object terminating."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, str]] = []

    def apply(self, resource: ApiResource, manifest: dict[str, Any]) -> dict[str, Any]:
        self.writes.append(("apply", f"{manifest['kind']}/{manifest['metadata']['name']}"))
        return self._store(copy.deepcopy(manifest))

    def delete(self, resource: ApiResource, namespace: str, name: str, uid: str) -> None:
        self.writes.append(("delete", f"{resource.kind}/{name}"))
        assert self.objects[(resource.kind, name)]["metadata"]["uid"] == uid
        self.objects[(resource.kind, name)]["metadata"]["deletionTimestamp"] = "now"

    def patch_status(self, resource: ApiResource, namespace: str, name: str,
                     status: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
        return {"kind": "DisaggregatedModel", "metadata": {"name": name, "resourceVersion": "0"}}

    def get(self, resource: ApiResource, namespace: str, name: str) -> dict[str, Any] | None:
        return {"data": {"disagg-key": "a2V5"}}


def _owner(patch: dict[str, Any]) -> dict[str, Any]:
    spec = minimal_spec()
    spec.update(copy.deepcopy(patch))
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedModel",
        "metadata": {"name": "m", "namespace": "ml", "uid": "u-1", "resourceVersion": "1",
                     "generation": 1},
        "spec": spec,
    }  # fmt: skip


def test_switching_to_multi_node_deletes_the_statefulset_before_the_leaderworkerset() -> None:
    api = WorkloadApi()
    reconciler = Reconciler(cast(KubeApi, api))
    single = _owner({})
    asyncio.run(reconciler.reconcile(single, Live(children={})))
    assert ("StatefulSet", "m-decode") in api.objects

    api.writes.clear()
    multi = _owner({"decode": {"tensorParallelSize": 16, "nodesPerReplica": 2}})
    outcome = asyncio.run(reconciler.reconcile(multi, Live(children=copy.deepcopy(api.objects))))
    assert ("delete", "StatefulSet/m-decode") in api.writes
    assert ("apply", "LeaderWorkerSet/m-decode") not in api.writes, "waits for the old one"
    assert any(event.reason == "Replaced" for event in outcome.events)

    # Still terminating: no second delete, still no LeaderWorkerSet.
    api.writes.clear()
    asyncio.run(reconciler.reconcile(multi, Live(children=copy.deepcopy(api.objects))))
    assert not [w for w in api.writes if "m-decode" in w[1] and w[1].split("/")[0] in
                ("StatefulSet", "LeaderWorkerSet")]  # fmt: skip

    # Gone (its pods too): the LeaderWorkerSet takes its name.
    del api.objects[("StatefulSet", "m-decode")]
    reconciler.forget_child("u-1", ("StatefulSet", "m-decode"))
    api.writes.clear()
    asyncio.run(reconciler.reconcile(multi, Live(children=copy.deepcopy(api.objects))))
    assert ("apply", "LeaderWorkerSet/m-decode") in api.writes
    assert not [w for w in api.writes if w[0] == "delete"]


def test_a_workload_of_another_owner_is_never_deleted() -> None:
    api = WorkloadApi()
    reconciler = Reconciler(cast(KubeApi, api))
    foreign = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "m-decode", "namespace": "ml", "uid": "x", "resourceVersion": "1",
                     "ownerReferences": [{"uid": "other", "controller": True}]},
    }  # fmt: skip
    multi = _owner({"decode": {"tensorParallelSize": 16, "nodesPerReplica": 2}})
    asyncio.run(reconciler.reconcile(multi, Live(children={key(foreign): foreign})))
    assert not [w for w in api.writes if w[0] == "delete"]
    assert ("apply", "LeaderWorkerSet/m-decode") in api.writes


def test_the_operator_refuses_a_multi_node_name_its_groups_labels_cannot_carry() -> None:
    spec = load_spec(spec_with({"decode": TWO_NODES}))
    assert render("x" * MAX_MULTI_NODE_NAME_LENGTH, "ml", spec)
    with pytest.raises(SpecError, match=r"metadata\.name: must be at most 41 characters"):
        render("x" * (MAX_MULTI_NODE_NAME_LENGTH + 1), "ml", spec)
    assert render("x" * (MAX_MULTI_NODE_NAME_LENGTH + 1), "ml", load_spec(spec_with({})))
