"""Smoke tests: the local control plane behaves like a real cluster with EKS p5en GPU nodes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import kube

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
P5EN = {"node.kubernetes.io/instance-type": "p5en.48xlarge"}

SMOKE_GROUP = "smoke.disagg.dev"
SMOKE_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"widgets.{SMOKE_GROUP}"},
    "spec": {
        "group": SMOKE_GROUP,
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "default": {},
                                "properties": {
                                    "replicas": {"type": "integer", "default": 1, "minimum": 0},
                                    "mode": {
                                        "type": "string",
                                        "enum": ["fast", "exact"],
                                        "default": "exact",
                                    },
                                    "cache": {
                                        "type": "object",
                                        "default": {},
                                        "properties": {
                                            "ttlSeconds": {"type": "integer", "default": 480}
                                        },
                                    },
                                },
                            },
                            "status": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                        },
                    }
                },
            }
        ],
    },
}


def gpu_pod_spec(efa: int) -> dict[str, Any]:
    """A pod spec asking for a whole p5en node's GPUs and `efa` EFA interfaces."""
    resources = {
        "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": str(efa),
        "hugepages-2Mi": "2Gi",
        "cpu": "8",
        "memory": "64Gi",
    }
    return {
        "nodeSelector": P5EN,
        "tolerations": [GPU_TOLERATION],
        "containers": [
            {
                "name": "engine",
                "image": "vllm/vllm-openai:latest",
                "resources": {"requests": resources, "limits": resources},
            }
        ],
    }


def test_versions_match_the_pins(kubectl: kube.Kubectl, cluster_env: kube.ClusterEnv) -> None:
    versions = json.loads(kubectl("version", "-o", "json"))
    assert versions["serverVersion"]["gitVersion"] == cluster_env.kube_version
    assert versions["clientVersion"]["gitVersion"] == cluster_env.kube_version


def test_fake_nodes_look_like_eks(kubectl: kube.Kubectl) -> None:
    nodes = kubectl.json("get", "nodes", "-l", "type=kwok")["items"]
    gpu = [n for n in nodes if n["metadata"]["labels"].get("nvidia.com/gpu.present") == "true"]
    assert len(gpu) == 4 and len(nodes) == 6
    for node in gpu:
        labels = node["metadata"]["labels"]
        assert labels["node.kubernetes.io/instance-type"] == "p5en.48xlarge"
        assert labels["topology.kubernetes.io/zone"] == "us-east-2a"
        assert labels["eks.amazonaws.com/capacityType"] == "ON_DEMAND"
        allocatable = node["status"]["allocatable"]
        assert allocatable["nvidia.com/gpu"] == "8"
        assert allocatable["vpc.amazonaws.com/efa"] == "16"
        assert allocatable["hugepages-2Mi"] == "10Gi"
        taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
        assert node["spec"]["taints"] == [taint]
    assert all(kube.condition_true(n, "Ready") for n in nodes)


@pytest.fixture
def widget_crd(kubectl: kube.Kubectl) -> Iterator[None]:
    """The smoke test CRD, installed and Established; removed afterwards."""
    kubectl.apply(SMOKE_CRD)
    name = SMOKE_CRD["metadata"]["name"]
    kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    yield
    kubectl("delete", "crd", name, "--wait=false")


def test_crd_schema_defaults_applied_by_server(
    widget_crd: None, k8s_api: client.ApiClient, namespace: str
) -> None:
    api = client.CustomObjectsApi(k8s_api)
    body = {"apiVersion": f"{SMOKE_GROUP}/v1", "kind": "Widget", "metadata": {"name": "w"}}
    api.create_namespaced_custom_object(SMOKE_GROUP, "v1", namespace, "widgets", body)
    stored = api.get_namespaced_custom_object(SMOKE_GROUP, "v1", namespace, "widgets", "w")
    assert isinstance(stored, dict)
    assert stored["spec"] == {"replicas": 1, "mode": "exact", "cache": {"ttlSeconds": 480}}

    bad = {**body, "metadata": {"name": "bad"}, "spec": {"mode": "sloppy"}}
    with pytest.raises(client.ApiException) as refused:
        api.create_namespaced_custom_object(SMOKE_GROUP, "v1", namespace, "widgets", bad)
    assert refused.value.status == 422
    assert "spec.mode" in str(refused.value.body)


def test_gpu_statefulset_scheduled_on_p5en_and_ready(kubectl: kube.Kubectl, namespace: str) -> None:
    labels = {"app": "engine"}
    kubectl.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "engine", "namespace": namespace},
            "spec": {
                "replicas": 2,
                "podManagementPolicy": "Parallel",
                "serviceName": "engine",
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": gpu_pod_spec(efa=16)},
            },
        }
    )
    kubectl("-n", namespace, "rollout", "status", "statefulset/engine", "--timeout=90s")
    pods = kubectl.json("-n", namespace, "get", "pods", "-l", "app=engine")["items"]
    assert len(pods) == 2
    nodes = {p["spec"]["nodeName"] for p in pods}
    assert len(nodes) == 2, "each pod takes a whole node's GPUs, so two nodes"
    for pod in pods:
        node = kubectl.json("get", "node", pod["spec"]["nodeName"])
        assert node["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "p5en.48xlarge"
        assert pod["status"]["phase"] == "Running"
        assert kube.condition_true(pod, "Ready")


def test_pod_asking_too_much_efa_stays_pending(kubectl: kube.Kubectl, namespace: str) -> None:
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "greedy", "namespace": namespace},
            "spec": gpu_pod_spec(efa=32),
        }
    )

    def failed_scheduling() -> str | None:
        events = kubectl.json(
            "-n", namespace, "get", "events", "--field-selector",
            "involvedObject.name=greedy,reason=FailedScheduling",
        )["items"]  # fmt: skip
        return events[0]["message"] if events else None

    message = kube.wait_for(failed_scheduling, what="a FailedScheduling event for pod greedy")
    assert "Insufficient vpc.amazonaws.com/efa" in message
    pod = kubectl.json("-n", namespace, "get", "pod", "greedy")
    assert pod["status"]["phase"] == "Pending"
    assert "nodeName" not in pod["spec"]


def test_deleting_owner_garbage_collects_dependent(kubectl: kube.Kubectl, namespace: str) -> None:
    kubectl("-n", namespace, "create", "configmap", "owner")
    owner = kubectl.json("-n", namespace, "get", "configmap", "owner")
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner"}
    ref["uid"] = owner["metadata"]["uid"]
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "dependent", "namespace": namespace, "ownerReferences": [ref]},
            "data": {"k": "v"},
        }
    )
    kubectl("-n", namespace, "delete", "configmap", "owner", "--cascade=background")

    def dependent_gone() -> bool:
        probe = kubectl.run("-n", namespace, "get", "configmap", "dependent", check=False)
        return probe.returncode != 0 and "NotFound" in probe.stderr

    kube.wait_for(dependent_gone, what="the garbage collector to delete 'dependent'", timeout_s=90)


def test_server_side_apply_tracks_field_managers(kubectl: kube.Kubectl, namespace: str) -> None:
    def config_map(value: str) -> dict[str, Any]:
        meta = {"name": "ssa", "namespace": namespace}
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": value}}

    kubectl.apply(config_map("one"), "--server-side", "--field-manager=disagg-smoke")
    stored = kubectl.json("-n", namespace, "get", "configmap", "ssa", "--show-managed-fields")
    managers = {(m["manager"], m["operation"]) for m in stored["metadata"]["managedFields"]}
    assert ("disagg-smoke", "Apply") in managers

    conflict = kubectl.run(
        "apply", "-f", "-", "--server-side", "--field-manager=someone-else",
        input=json.dumps(config_map("two")), check=False,
    )  # fmt: skip
    assert conflict.returncode != 0
    assert "conflict" in conflict.stderr.lower() and "disagg-smoke" in conflict.stderr

    kubectl.apply(
        config_map("two"), "--server-side", "--field-manager=someone-else", "--force-conflicts"
    )
    stored = kubectl.json("-n", namespace, "get", "configmap", "ssa", "--show-managed-fields")
    assert stored["data"] == {"k": "two"}
    fields = stored["metadata"]["managedFields"]
    assert [m["manager"] for m in fields if "f:data" in m["fieldsV1"]] == ["someone-else"]


def test_helm_defaults_to_the_cluster_version(
    helm: kube.Tool, kubectl: kube.Kubectl, tmp_path: Path
) -> None:
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: probe\n"
        "data:\n  kube: {{ .Capabilities.KubeVersion.Version | quote }}\n"
    )
    rendered = helm("template", "probe", str(chart))
    server = json.loads(kubectl("version", "-o", "json"))["serverVersion"]
    assert f'kube: "v{server["major"]}.{server["minor"]}.0"' in rendered
