"""What a CPU server needs from the render: the connector's KV buffer on the CPU
(`kvTransfer.bufferDevice`), and the router placed like the engines (`spec.router.nodeSelector`,
`spec.router.tolerations`), e.g. on the local cluster's tainted real node."""

from __future__ import annotations

import json
from typing import Any

import pytest

from disagg_operator.errors import SpecError
from disagg_operator.loading import load_spec
from disagg_operator.render import render
from dmodel_samples import spec_with

NAME, NAMESPACE = "demo", "ml"
TOLERATION = {"key": "disagg.dev/real-node", "operator": "Exists", "effect": "NoSchedule"}


def children(patch: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = load_spec(spec_with(patch))
    return {f"{m['kind']}/{m['metadata']['name']}": m for m in render(NAME, NAMESPACE, spec)}


def router_pod(patch: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = children(patch)[f"Deployment/{NAME}-router"]["spec"]["template"]["spec"]
    return pod


@pytest.mark.parametrize(("patch", "device"), [({}, "cuda"), ({"bufferDevice": "cpu"}, "cpu")])
def test_both_roles_stage_kv_on_the_buffer_device(patch: dict[str, Any], device: str) -> None:
    data = children({"kvTransfer": patch})[f"ConfigMap/{NAME}-connector"]["data"]
    assert [
        json.loads(data[f"{role}.json"])["kv_buffer_device"] for role in ("prefill", "decode")
    ] == [
        device,
        device,
    ]


def test_an_unknown_buffer_device_is_refused() -> None:
    with pytest.raises(SpecError, match=r"spec\.kvTransfer\.bufferDevice"):
        load_spec(spec_with({"kvTransfer": {"bufferDevice": "xpu"}}))


def test_the_router_pod_is_placed_by_its_node_selector_and_tolerations() -> None:
    pod = router_pod({"router": {"nodeSelector": {"type": "real"}, "tolerations": [TOLERATION]}})
    assert pod["nodeSelector"] == {"type": "real"}
    assert pod["tolerations"] == [TOLERATION]


def test_the_router_pod_has_no_placement_unless_asked() -> None:
    pod = router_pod({})
    assert "nodeSelector" not in pod and "tolerations" not in pod


def test_router_tolerations_take_kubernetes_field_names() -> None:
    toleration = {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}
    assert router_pod({"router": {"tolerations": [toleration]}})["tolerations"] == [toleration]
