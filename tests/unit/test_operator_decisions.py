"""The operator's pure decisions: drift between rendered and live children, what to do with
each child, and the status it reports."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from disagg_operator.children import Action, adopt, decide
from disagg_operator.conditions import Observed, PodState, Problem, build_status, pod_state
from disagg_operator.drift import differences
from disagg_operator.loading import load_spec
from disagg_operator.models import DisaggregatedModelStatus, SecretKeyRef
from disagg_operator.names import Component
from disagg_operator.reconcile import secret_problem, secret_refs
from disagg_operator.render import render
from dmodel_samples import minimal_spec, spec_with

OWNER = {
    "apiVersion": "disagg.dev/v1alpha1",
    "kind": "DisaggregatedModel",
    "metadata": {"name": "m", "namespace": "ml", "uid": "u-1"},
    "spec": minimal_spec(),
}
NOW = "2026-01-01T00:00:00Z"


def _statefulset() -> dict[str, Any]:
    manifests = render("m", "ml", load_spec(minimal_spec()))
    sts = next(m for m in manifests if m["kind"] == "StatefulSet")
    return adopt(sts, OWNER)


def _as_stored(manifest: dict[str, Any]) -> dict[str, Any]:
    """What the API server stores: defaults added, empties dropped, quantities canonical."""
    live = copy.deepcopy(manifest)
    live["metadata"]["uid"] = "child-uid"
    live["spec"]["revisionHistoryLimit"] = 10
    pod = live["spec"]["template"]["spec"]
    pod.pop("nodeSelector")
    pod.pop("imagePullSecrets")
    container = pod["containers"][0]
    container["terminationMessagePath"] = "/dev/termination-log"
    limits = container["resources"]["limits"]
    limits["hugepages-2Mi"] = "5Gi"
    limits["nvidia.com/gpu"] = str(limits["nvidia.com/gpu"])
    return live


def test_server_defaults_and_canonical_quantities_are_no_drift() -> None:
    desired = _statefulset()
    assert differences(desired, _as_stored(desired)) == []
    assert decide(desired, _as_stored(desired), "u-1").action is Action.NONE


def test_hand_edits_are_drift_naming_the_field() -> None:
    desired = _statefulset()
    live = _as_stored(desired)
    live["spec"]["replicas"] = 3
    live["spec"]["template"]["spec"]["containers"][0]["env"].pop()
    decision = decide(desired, live, "u-1")
    assert decision.action is Action.REPAIR
    assert ".spec.replicas" in decision.detail
    assert ".spec.template.spec.containers[0].env" in decision.detail


def test_missing_changed_and_foreign_children() -> None:
    desired = _statefulset()
    assert decide(desired, None, "u-1").action is Action.CREATE
    changed = adopt({**_statefulset(), "spec": {**desired["spec"], "replicas": 2}}, OWNER)
    assert decide(changed, _as_stored(desired), "u-1").action is Action.UPDATE
    foreign = _as_stored(desired)
    foreign["metadata"]["ownerReferences"] = []
    conflict = decide(desired, foreign, "u-1")
    assert conflict.action is Action.CONFLICT and "delete or rename" in conflict.detail


def _workload(ready: int, desired: int = 1, generation: int = 1) -> dict[str, Any]:
    status = {"readyReplicas": ready, "updatedReplicas": desired, "replicas": desired}
    return {
        "kind": "StatefulSet",
        "metadata": {"generation": generation},
        "status": {**status, "observedGeneration": generation},
    }


def _observed(**overrides: Any) -> Observed:
    values: dict[str, Any] = {
        "spec": load_spec(minimal_spec()),
        "name": "m",
        "namespace": "ml",
        "generation": 1,
        "workloads": {
            c: _workload(1) for c in (Component.PREFILL, Component.DECODE, Component.ROUTER)
        },
        "in_sync": True,
        "config_hash": "abc",
    }
    return Observed(**{**values, **overrides})


def _conditions(status: DisaggregatedModelStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


def test_all_ready() -> None:
    status = build_status(_observed(), NOW)
    conditions = _conditions(status)
    assert conditions["Ready"] == ("True", "AllRolesReady")
    assert conditions["Progressing"] == ("False", "Complete")
    assert conditions["Degraded"] == ("False", "AsExpected")
    assert status.observed_generation == 1 and status.connector_config_hash == "abc"
    assert status.router_endpoint == "http://m-router.ml.svc:8000"


def test_unschedulable_pod_explains_the_role() -> None:
    workloads = {**_observed().workloads, Component.DECODE: _workload(0)}
    pods = [PodState("m-decode-0", "decode", False, "unschedulable: 0/6 nodes are available")]
    status = build_status(_observed(workloads=workloads, pods=pods), NOW)
    decode = next(c for c in status.conditions if c.type == "DecodeReady")
    assert decode.status == "False" and "m-decode-0: unschedulable" in decode.message
    assert _conditions(status)["Progressing"] == ("True", "RollingOut")


def test_problem_is_degraded_and_keeps_the_last_generation() -> None:
    problem = Problem("SecretNotFound", "Secret hf-token ... create it")
    previous = build_status(_observed(), NOW)
    status = build_status(
        _observed(generation=2, problems=[problem], in_sync=False, previous=previous), NOW
    )
    assert _conditions(status)["Degraded"] == ("True", "SecretNotFound")
    assert _conditions(status)["Progressing"] == ("False", "Blocked")
    assert status.observed_generation == 1


def test_transition_time_only_moves_on_a_change() -> None:
    first = build_status(_observed(), NOW)
    again = build_status(_observed(previous=first), "2026-01-02T00:00:00Z")
    assert again == first


def test_pod_states_name_what_blocks_them() -> None:
    crashing = {
        "metadata": {"name": "m-prefill-0"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {"state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m"}}}
            ],
        },
    }
    state = pod_state(crashing, "prefill")
    assert state.failing and not state.ready and state.detail == "CrashLoopBackOff: back-off 5m"
    status = build_status(_observed(pods=[state]), NOW)
    assert _conditions(status)["Degraded"] == ("True", "PodFailing")

    pending = {
        "metadata": {"name": "m-decode-0"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "message": "Insufficient nvidia.com/gpu",
                }
            ],
        },
    }
    state = pod_state(pending, "decode")
    assert not state.failing and state.detail == "unschedulable: Insufficient nvidia.com/gpu"


def test_secret_refs_name_every_secret_pods_read_by_field() -> None:
    spec = load_spec(
        spec_with(
            {
                "model": {"tokenSecret": {"name": "hf"}},
                "auth": {"apiKeySecret": {"name": "api", "key": "k"}},
            }
        )
    )
    assert [(path, ref.name, ref.key) for path, ref in secret_refs(spec)] == [
        ("spec.model.tokenSecret", "hf", "token"),
        ("spec.auth.apiKeySecret", "api", "k"),
    ]
    assert secret_refs(load_spec(minimal_spec())) == []


@pytest.mark.parametrize(
    ("secret", "reason", "says"),
    [
        (None, "SecretNotFound", "create secret generic api --from-literal=k=<value>"),
        ({"data": {"other": "eA=="}}, "SecretKeyNotFound", "no key 'k' (spec.auth.apiKeySecret"),
        ({}, "SecretKeyNotFound", "add it or change the key"),
        ({"data": {"k": ""}}, "SecretKeyEmpty", "key 'k' (spec.auth.apiKeySecret.key) is empty"),
        ({"data": {"k": "c2steA=="}}, None, ""),
    ],
    ids=["missing", "other-key", "no-data", "empty-value", "ok"],
)
def test_secret_problem_names_the_field_and_the_fix(
    secret: dict[str, Any] | None, reason: str | None, says: str
) -> None:
    ref = SecretKeyRef(name="api", key="k")
    problem = secret_problem("spec.auth.apiKeySecret", ref, "ml", secret)
    if reason is None:
        assert problem is None
    else:
        assert problem is not None
        assert problem.reason == reason
        assert says in problem.message
