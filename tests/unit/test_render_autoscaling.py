"""Rendering per-role autoscaling and the PodMonitors: an autoscaled role's workload carries no
replica count, its autoscaler (a HorizontalPodAutoscaler, or a KEDA ScaledObject) targets that
workload's scale subresource with the role's signal, and the PodMonitors scrape every
component's serving port only when the spec asks."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from disagg_operator.engine_metrics import SIGNALS, decimal_text
from disagg_operator.loading import load_spec
from disagg_operator.render import render
from dmodel_samples import (
    DECODE_AUTOSCALING,
    KEDA_AUTOSCALING,
    PREFILL_AUTOSCALING,
    PROMETHEUS,
    spec_with,
)

Manifest = dict[str, Any]
NAME, NAMESPACE = "demo", "ml"
KUBERNETES_VERSION = kubernetes_validate.latest_version()
SCALED = {
    "prefill": {"autoscaling": PREFILL_AUTOSCALING},
    "decode": {"autoscaling": DECODE_AUTOSCALING},
}
TWO_NODES = {"tensorParallelSize": 16, "nodesPerReplica": 2}


def objects(patch: dict[str, Any]) -> dict[str, Manifest]:
    spec = load_spec(spec_with(patch))
    return {f"{m['kind']}/{m['metadata']['name']}": m for m in render(NAME, NAMESPACE, spec)}


def test_a_fixed_role_keeps_its_replicas_and_gets_no_autoscaler() -> None:
    children = objects({"decode": {"replicas": 3}})
    assert children[f"StatefulSet/{NAME}-prefill"]["spec"]["replicas"] == 1
    assert children[f"StatefulSet/{NAME}-decode"]["spec"]["replicas"] == 3
    kinds = {key.split("/")[0] for key in children}
    assert not kinds & {"HorizontalPodAutoscaler", "ScaledObject", "PodMonitor"}


def test_an_autoscaled_role_leaves_its_replicas_to_its_autoscaler() -> None:
    children = objects(SCALED)
    for role in ("prefill", "decode"):
        workload = children[f"StatefulSet/{NAME}-{role}"]
        assert "replicas" not in workload["spec"]
        hpa = children[f"HorizontalPodAutoscaler/{NAME}-{role}"]
        assert hpa["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "name": f"{NAME}-{role}",
        }
        assert hpa["metadata"]["labels"] == workload["metadata"]["labels"]
        kubernetes_validate.validate(hpa, KUBERNETES_VERSION, strict=True)
    prefill = children[f"HorizontalPodAutoscaler/{NAME}-prefill"]["spec"]
    assert (prefill["minReplicas"], prefill["maxReplicas"]) == (1, 4)
    assert prefill["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "vllm_num_requests_waiting"},
                "target": {"type": "AverageValue", "averageValue": "4"},
            },
        }
    ]
    assert prefill["behavior"] == {
        "scaleUp": {"stabilizationWindowSeconds": 0},
        "scaleDown": {"stabilizationWindowSeconds": 300},
    }
    decode = children[f"HorizontalPodAutoscaler/{NAME}-decode"]["spec"]["metrics"][0]["pods"]
    assert decode == {
        "metric": {"name": "vllm_kv_cache_usage_perc"},
        "target": {"type": "AverageValue", "averageValue": "0.8"},
    }


def test_behavior_and_metric_name_come_from_the_spec() -> None:
    autoscaling = {
        **PREFILL_AUTOSCALING,
        "minReplicas": 2,
        "signal": "ttft",
        "target": 1.5,
        "metricName": "prefill_ttft_seconds",
        "behavior": {
            "scaleUpStabilizationWindowSeconds": 30,
            "scaleDownStabilizationWindowSeconds": 900,
        },
    }
    spec = objects({"prefill": {"autoscaling": autoscaling}})[
        f"HorizontalPodAutoscaler/{NAME}-prefill"
    ]["spec"]
    assert spec["minReplicas"] == 2
    assert spec["metrics"][0]["pods"]["metric"] == {"name": "prefill_ttft_seconds"}
    assert spec["metrics"][0]["pods"]["target"]["averageValue"] == "1.5"
    assert spec["behavior"]["scaleUp"] == {"stabilizationWindowSeconds": 30}
    assert spec["behavior"]["scaleDown"] == {"stabilizationWindowSeconds": 900}


def test_a_multi_node_role_scales_its_leaderworkerset() -> None:
    children = objects({"decode": {**TWO_NODES, "autoscaling": DECODE_AUTOSCALING}})
    workload = children[f"LeaderWorkerSet/{NAME}-decode"]
    assert "replicas" not in workload["spec"]
    target = children[f"HorizontalPodAutoscaler/{NAME}-decode"]["spec"]["scaleTargetRef"]
    assert target == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": f"{NAME}-decode",
    }


def test_keda_renders_a_scaled_object_querying_prometheus() -> None:
    children = objects({"decode": {"autoscaling": KEDA_AUTOSCALING}})
    assert f"HorizontalPodAutoscaler/{NAME}-decode" not in children
    scaled = children[f"ScaledObject/{NAME}-decode"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": f"{NAME}-decode",
    }
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 4)
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"] == {
        "stabilizationWindowSeconds": 300
    }
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == "AverageValue"
    assert trigger["metadata"] == {
        "serverAddress": PROMETHEUS,
        "query": f'sum(vllm:kv_cache_usage_perc{{namespace="{NAMESPACE}",'
        f'pod=~"{NAME}-decode-[0-9]+"}})',
        "threshold": "0.8",
    }


def test_keda_ttft_is_a_mean_over_the_role_not_divided_by_its_servers() -> None:
    autoscaling = {
        **PREFILL_AUTOSCALING,
        "engine": "keda",
        "prometheusAddress": PROMETHEUS,
        "signal": "ttft",
        "target": 2,
    }
    scaled = objects({"prefill": {"autoscaling": autoscaling}})[f"ScaledObject/{NAME}-prefill"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["metricType"] == "Value"
    selector = f'namespace="{NAMESPACE}",pod=~"{NAME}-prefill-[0-9]+"'
    series = "vllm:time_to_first_token_seconds"
    assert trigger["metadata"]["query"] == (
        f"(sum(rate({series}_sum{{{selector}}}[2m])) / "
        f"(sum(rate({series}_count{{{selector}}}[2m])) > 0)) or vector(0)"
    )
    assert trigger["metadata"]["threshold"] == "2"


def test_every_signal_reads_a_listed_vllm_series() -> None:
    assert {signal.series.name for signal in SIGNALS.values()} == {
        "vllm:num_requests_waiting",
        "vllm:time_to_first_token_seconds",
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
    }


@pytest.mark.parametrize(
    ("value", "text"), [(4.0, "4"), (0.8, "0.8"), (1.5, "1.5"), (1e6, "1000000"), (0.05, "0.05")]
)
def test_targets_are_plain_decimals(value: float, text: str) -> None:
    assert decimal_text(value) == text


def test_pod_monitors_only_on_request() -> None:
    assert not [key for key in objects({}) if key.startswith("PodMonitor/")]
    stock = {"release": "kube-prometheus-stack"}
    children = objects({"monitoring": {"podMonitors": True, "interval": "15s", "labels": stock}})
    for component in ("prefill", "decode", "router"):
        monitor = children[f"PodMonitor/{NAME}-{component}"]
        assert monitor["metadata"]["labels"].items() >= stock.items()
        assert monitor["metadata"]["labels"]["app.kubernetes.io/component"] == component
        spec = monitor["spec"]
        assert spec["selector"]["matchLabels"] == {
            "app.kubernetes.io/name": "disagg",
            "app.kubernetes.io/instance": NAME,
            "app.kubernetes.io/component": component,
        }
        assert spec["podMetricsEndpoints"] == [
            {"port": "http", "path": "/metrics", "interval": "15s"}
        ]
        assert spec["podTargetLabels"] == [
            "app.kubernetes.io/instance",
            "app.kubernetes.io/component",
        ]
    router_ports = children[f"Deployment/{NAME}-router"]["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert {"name": "http", "containerPort": 8000} in router_ports["ports"]
    engine = children[f"StatefulSet/{NAME}-decode"]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "http", "containerPort": 8000} in engine["ports"]


def test_a_multi_node_role_is_scraped_on_its_leaders_only() -> None:
    children = objects({"prefill": TWO_NODES, "monitoring": {"podMonitors": True}})
    selector = children[f"PodMonitor/{NAME}-prefill"]["spec"]["selector"]["matchLabels"]
    assert selector["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    decode = children[f"PodMonitor/{NAME}-decode"]["spec"]["selector"]["matchLabels"]
    assert "leaderworkerset.sigs.k8s.io/worker-index" not in decode
