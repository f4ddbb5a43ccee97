"""Operator restarts and replicas: a kill in the middle of a reconcile converges with no
duplicate and no orphan, and two replicas sharing a peering never both act."""

from __future__ import annotations

import json
from typing import Any

import kube
from operator_fixtures import StartOperator, crds, small_model, start_operator  # noqa: F401
from operator_harness import children, rendered_children, wait_ready

NAME = "m"
KOPF_KEEPS = {"disagg.dev/kopf-managed", "disagg.dev/last-handled-configuration"}


def _live_pods(kubectl: kube.Kubectl, namespace: str, component: str) -> list[dict[str, Any]]:
    return [
        p
        for p in children(kubectl, namespace, NAME, kinds="pods")
        if p["metadata"]["labels"]["app.kubernetes.io/component"] == component
        and not p["metadata"].get("deletionTimestamp")
    ]


def test_kill_mid_reconcile_then_restart_converges_without_duplicates_or_orphans(
    kubectl: kube.Kubectl,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
) -> None:
    first = start_operator()
    kubectl.apply(small_model(NAME, namespace))
    kube.wait_for(
        lambda: "applied ConfigMap" in first.log(), what="the first apply", interval_s=0.01
    )
    first.kill()
    at_kill = sorted(
        f"{c['kind']}/{c['metadata']['name']}" for c in children(kubectl, namespace, NAME)
    )
    assert len(at_kill) >= 1, "the kill came after the first child was applied"

    # Whatever the kill interrupted, make the half-done state certain and move the goal:
    # children gone, a spec change (scale + a connector change that rolls pods) while down.
    ns = ("-n", namespace)
    kubectl(*ns, "delete", "statefulset", f"{NAME}-decode", "--ignore-not-found")
    kubectl(*ns, "delete", "deployment", f"{NAME}-router", "--ignore-not-found")
    patch = {"spec": {"prefill": {"replicas": 3}, "kvTransfer": {"decoderKvBlocksTtlSeconds": 600}}}
    kubectl(*ns, "patch", "dmodel", NAME, "--type=merge", "-p", json.dumps(patch))

    start_operator()
    model = wait_ready(kubectl, namespace, NAME, timeout_s=240)
    uid = model["metadata"]["uid"]

    live = children(kubectl, namespace, NAME)
    names = sorted(f"{c['kind']}/{c['metadata']['name']}" for c in live)
    assert names == rendered_children(small_model(NAME, namespace)), (
        f"children at kill time: {at_kill}"
    )
    for child in live:
        refs = child["metadata"]["ownerReferences"]
        assert [(r["uid"], r.get("controller")) for r in refs] == [(uid, True)], child["metadata"]
    config = json.loads(live[[c["kind"] for c in live].index("ConfigMap")]["data"]["decode.json"])
    assert config["kv_connector_extra_config"]["decoder_kv_blocks_ttl"] == 600

    def pods_settled() -> bool:
        counts = {
            c: len(_live_pods(kubectl, namespace, c)) for c in ("prefill", "decode", "router")
        }
        return counts == {"prefill": 3, "decode": 1, "router": 1}

    kube.wait_for(pods_settled, what="exactly 3 prefill, 1 decode and 1 router pod", timeout_s=90)
    replica_sets = children(kubectl, namespace, NAME, kinds="replicasets")
    assert [rs["spec"]["replicas"] for rs in replica_sets] == [1], "one router ReplicaSet"
    for obj in [*children(kubectl, namespace, NAME, kinds="pods"), *replica_sets]:
        assert obj["metadata"].get("ownerReferences"), (
            f"orphan {obj['kind']} {obj['metadata']['name']}"
        )
    left = set(model["metadata"].get("annotations", {})) - KOPF_KEEPS
    assert not [k for k in left if k.startswith("disagg.dev/")], (
        f"kopf progress left behind: {left}"
    )


def test_two_replicas_sharing_a_peering_never_both_act(
    kubectl: kube.Kubectl,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
) -> None:
    standby = start_operator("--priority", "10")
    active = start_operator("--priority", "20")
    standby.wait_log("Pausing operations in favour of")

    kubectl.apply(small_model(NAME, namespace))
    wait_ready(kubectl, namespace, NAME)
    assert "applied " in active.log()
    assert "applied " not in standby.log() and "Handler 'reconcile'" not in standby.log()

    active.assert_clean_stop()  # leaves the peering on its way out
    standby.wait_log("Resuming operations after the pause")
    kubectl("-n", namespace, "patch", "dmodel", NAME, "--type=merge",
            "-p", json.dumps({"spec": {"decode": {"replicas": 2}}}))  # fmt: skip
    model = wait_ready(kubectl, namespace, NAME)
    assert model["status"]["decode"] == {"desiredReplicas": 2, "readyReplicas": 2}
    assert f"applied StatefulSet {NAME}-decode" in standby.log()
