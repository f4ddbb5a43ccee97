"""The operator with an autoscaled role: it never writes the role's replica count (and hands a
count it owned over before it stops applying it), deletes an autoscaler the spec no longer asks
for, reports a kind the cluster lacks by what installs it, compares an autoscaler's stored
target as a quantity, and counts an autoscaled role ready from its workload's own counts."""

from __future__ import annotations

import asyncio
import copy
from typing import Any, cast

from api_standin import StoreStandIn
from disagg_operator.children import Action, adopt, decide, key, owns_replicas
from disagg_operator.conditions import Observed, build_status
from disagg_operator.kubeapi import FIELD_MANAGER, HANDOVER_MANAGER, ApiException, KubeApi
from disagg_operator.loading import load_spec
from disagg_operator.names import Component
from disagg_operator.reconcile import Live, Reconciler
from disagg_operator.render import render
from disagg_operator.resources import ApiResource
from dmodel_samples import DECODE_AUTOSCALING, KEDA_AUTOSCALING, minimal_spec, spec_with

NOW = "2026-01-01T00:00:00Z"
DEFAULT_REPLICAS = 1
"""What the API server defaults a workload's spec.replicas to when no manager owns it."""
WORKLOAD_KINDS = ("StatefulSet", "LeaderWorkerSet", "Deployment")


def _owner(patch: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedModel",
        "metadata": {"name": "m", "namespace": "ml", "uid": "u-1", "resourceVersion": "1",
                     "generation": 1},
        "spec": spec_with(patch),
    }  # fmt: skip


class ApplyStandIn(StoreStandIn):
    """A stand-in for the API server's server-side apply, modelling only what decides the
    replica count: who owns `spec.replicas`. A manager that stops applying a field it alone
    owned resets it to the default; a manager applying another value than a field's other
    owners hold gets a 409 unless it forces (then it alone owns it); an Update of the scale
    subresource (the autoscaler's write) makes its manager the only owner."""

    def __init__(self, missing: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.owners: dict[tuple[str, str], set[str]] = {}
        self.writes: list[tuple[str, str, str, dict[str, Any]]] = []
        self.missing = missing

    def apply(
        self,
        resource: ApiResource,
        manifest: dict[str, Any],
        field_manager: str = FIELD_MANAGER,
        force: bool = True,
    ) -> dict[str, Any]:
        child = key(manifest)
        self.writes.append(("apply", field_manager, f"{child[0]}/{child[1]}", manifest))
        if resource.kind in self.missing:
            raise ApiException(status=404, reason="Not Found")
        live = self.objects.get(child)
        owners = self.owners.setdefault(child, set())
        kept = (live or {}).get("spec", {}).get("replicas")
        merged = copy.deepcopy(manifest if field_manager == FIELD_MANAGER or live is None else live)
        replicas = manifest.get("spec", {}).get("replicas")
        if replicas is not None:
            if owners - {field_manager} and kept != replicas and not force:
                raise ApiException(status=409, reason="Conflict")
            if kept != replicas:
                owners.clear()
            owners.add(field_manager)
            merged["spec"]["replicas"] = replicas
        elif manifest["kind"] in WORKLOAD_KINDS:
            owners.discard(field_manager)
            merged["spec"]["replicas"] = kept if kept is not None and owners else DEFAULT_REPLICAS
        return self._store(merged)

    def scale(self, kind: str, name: str, replicas: int, manager: str) -> None:
        """An Update of the scale subresource, as the HorizontalPodAutoscaler writes it."""
        self.objects[(kind, name)]["spec"]["replicas"] = replicas
        self.owners[(kind, name)] = {manager}

    def get(self, resource: ApiResource, namespace: str, name: str) -> dict[str, Any] | None:
        if resource.kind == "Secret":
            return {"data": {"disagg-key": "a2V5"}}
        live = self.objects.get((resource.kind, name))
        if live is None:
            return None
        managed = [
            {
                "manager": owner,
                "operation": "Apply",
                "fieldsV1": {"f:spec": {"f:replicas": {}}},
            }
            for owner in sorted(self.owners.get((resource.kind, name), ()))
        ]
        return {**copy.deepcopy(live), "metadata": {**live["metadata"], "managedFields": managed}}

    def delete(self, resource: ApiResource, namespace: str, name: str, uid: str) -> None:
        self.writes.append(("delete", "", f"{resource.kind}/{name}", {}))
        assert self.objects.pop((resource.kind, name))["metadata"]["uid"] == uid

    def patch_status(
        self, resource: ApiResource, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        return {"kind": "DisaggregatedModel", "metadata": {"name": name, "resourceVersion": "0"}}


def _pass(api: ApplyStandIn, reconciler: Reconciler, patch: dict[str, Any]) -> Any:
    api.writes.clear()
    live = Live(children=copy.deepcopy(api.objects))
    return asyncio.run(reconciler.reconcile(_owner(patch), live))


def _replica_writes(api: ApplyStandIn, manager: str = FIELD_MANAGER) -> list[str]:
    return [
        target
        for verb, by, target, body in api.writes
        if verb == "apply" and by == manager and "replicas" in body.get("spec", {})
    ]


SCALED_DECODE = {"decode": {"autoscaling": DECODE_AUTOSCALING}}


def test_an_autoscaled_role_is_created_without_replicas_and_its_count_is_left_alone() -> None:
    api = ApplyStandIn()
    reconciler = Reconciler(cast(KubeApi, api))
    _pass(api, reconciler, SCALED_DECODE)
    assert ("HorizontalPodAutoscaler", "m-decode") in api.objects
    assert _replica_writes(api) == ["StatefulSet/m-prefill", "Deployment/m-router"]
    assert not _replica_writes(api, HANDOVER_MANAGER), "nothing to hand over on creation"

    api.scale("StatefulSet", "m-decode", 3, "kube-controller-manager")
    outcome = _pass(api, reconciler, SCALED_DECODE)
    assert api.writes == [] and not outcome.problems, "the autoscaler's count is no drift"
    assert api.objects[("StatefulSet", "m-decode")]["spec"]["replicas"] == 3


def test_the_role_is_read_from_its_workload_not_from_its_autoscaler_of_the_same_name() -> None:
    api = ApplyStandIn()
    reconciler = Reconciler(cast(KubeApi, api))
    _pass(api, reconciler, SCALED_DECODE)
    for child, live in api.objects.items():
        if child[0] in WORKLOAD_KINDS:
            replicas = live["spec"]["replicas"]
            live["status"] = {"observedGeneration": 0, "readyReplicas": replicas,
                              "updatedReplicas": replicas, "replicas": replicas}  # fmt: skip
    outcome = _pass(api, reconciler, SCALED_DECODE)
    decode = next(c for c in outcome.status.conditions if c.type == "DecodeReady")
    assert (decode.status, decode.reason) == ("True", "AutoscaledReplicasReady")


def test_turning_autoscaling_on_hands_the_live_count_over_first() -> None:
    api = ApplyStandIn()
    reconciler = Reconciler(cast(KubeApi, api))
    _pass(api, reconciler, {"decode": {"replicas": 3}})
    assert owns_replicas(api.get(_STS, "ml", "m-decode") or {}, FIELD_MANAGER)

    _pass(api, reconciler, SCALED_DECODE)
    sts_writes = [
        (verb, by) for verb, by, target, _ in api.writes if target == "StatefulSet/m-decode"
    ]
    assert sts_writes == [("apply", HANDOVER_MANAGER), ("apply", FIELD_MANAGER)]
    assert _replica_writes(api, HANDOVER_MANAGER) == ["StatefulSet/m-decode"]
    assert "StatefulSet/m-decode" not in _replica_writes(api)
    assert api.objects[("StatefulSet", "m-decode")]["spec"]["replicas"] == 3, "not reset to 1"
    assert not owns_replicas(api.get(_STS, "ml", "m-decode") or {}, FIELD_MANAGER)

    # The autoscaler takes the count over with its first change; nothing is handed over again.
    api.scale("StatefulSet", "m-decode", 2, "kube-controller-manager")
    _pass(api, reconciler, {"decode": {"autoscaling": {**DECODE_AUTOSCALING, "maxReplicas": 6}}})
    assert not _replica_writes(api, HANDOVER_MANAGER)
    assert api.objects[("StatefulSet", "m-decode")]["spec"]["replicas"] == 2


def test_the_stand_in_resets_a_count_its_only_manager_stops_applying() -> None:
    """Why the handover: without it the role would drop to one server."""
    api = ApplyStandIn()
    manifest = {"apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": "s", "namespace": "ml"}, "spec": {"replicas": 3}}  # fmt: skip
    api.apply(_STS, manifest)
    api.apply(_STS, {**manifest, "spec": {}})
    assert api.objects[("StatefulSet", "s")]["spec"]["replicas"] == DEFAULT_REPLICAS


def test_turning_autoscaling_off_deletes_the_autoscaler_and_fixes_the_count() -> None:
    api = ApplyStandIn()
    reconciler = Reconciler(cast(KubeApi, api))
    _pass(api, reconciler, SCALED_DECODE)
    outcome = _pass(api, reconciler, {"decode": {"replicas": 2}})
    assert ("delete", "", "HorizontalPodAutoscaler/m-decode", {}) in api.writes
    assert ("HorizontalPodAutoscaler", "m-decode") not in api.objects
    assert "StatefulSet/m-decode" in _replica_writes(api)
    assert api.objects[("StatefulSet", "m-decode")]["spec"]["replicas"] == 2
    assert any(e.reason == "Deleted" and "HorizontalPodAutoscaler" in e.message
               for e in outcome.events)  # fmt: skip


def test_switching_engines_replaces_the_autoscaler() -> None:
    api = ApplyStandIn()
    reconciler = Reconciler(cast(KubeApi, api))
    _pass(api, reconciler, {"decode": {"autoscaling": KEDA_AUTOSCALING}})
    assert ("ScaledObject", "m-decode") in api.objects
    _pass(api, reconciler, SCALED_DECODE)
    assert ("ScaledObject", "m-decode") not in api.objects
    assert ("HorizontalPodAutoscaler", "m-decode") in api.objects


def test_a_kind_the_cluster_lacks_says_what_installs_it() -> None:
    api = ApplyStandIn(missing=frozenset({"ScaledObject", "PodMonitor"}))
    reconciler = Reconciler(cast(KubeApi, api))
    outcome = _pass(
        api,
        reconciler,
        {"decode": {"autoscaling": KEDA_AUTOSCALING}, "monitoring": {"podMonitors": True}},
    )
    reasons = {problem.reason for problem in outcome.problems}
    assert reasons == {"KindNotInstalled"}
    messages = " ".join(problem.message for problem in outcome.problems)
    assert "cannot apply ScaledObject m-decode: the cluster has no ScaledObject" in messages
    assert "(CRD scaledobjects.keda.sh): install KEDA, or set the role's autoscaling.engine" in (
        messages
    )
    assert "install the Prometheus Operator, or set spec.monitoring.podMonitors to false" in (
        messages
    )
    assert ("StatefulSet", "m-decode") in api.objects, "the rest of the model is applied"
    assert outcome.status is not None
    degraded = next(c for c in outcome.status.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "KindNotInstalled")


_STS = ApiResource("apps", "v1", "statefulsets", "StatefulSet")


def test_a_stored_target_in_canonical_form_is_no_drift() -> None:
    owner = _owner(SCALED_DECODE)
    manifests = render("m", "ml", load_spec(owner["spec"]))
    hpa = adopt(next(m for m in manifests if m["kind"] == "HorizontalPodAutoscaler"), owner)
    stored = copy.deepcopy(hpa)
    stored["spec"]["metrics"][0]["pods"]["target"]["averageValue"] = "800m"
    stored["spec"]["behavior"]["scaleUp"]["selectPolicy"] = "Max"
    assert decide(hpa, stored, "u-1").action is Action.NONE
    stored["spec"]["metrics"][0]["pods"]["target"]["averageValue"] = "900m"
    assert decide(hpa, stored, "u-1").action is Action.REPAIR


def _workload(spec_replicas: int | None, ready: int, updated: int) -> dict[str, Any]:
    spec = {} if spec_replicas is None else {"replicas": spec_replicas}
    return {
        "kind": "StatefulSet",
        "metadata": {"generation": 1},
        "spec": spec,
        "status": {
            "observedGeneration": 1,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "replicas": updated,
        },
    }


def _decode_view(patch: dict[str, Any], decode: dict[str, Any] | None) -> tuple[str, str, int]:
    fixed = _workload(1, 1, 1)
    observed = Observed(
        spec=load_spec(spec_with(patch)),
        name="m",
        namespace="ml",
        generation=1,
        workloads={Component.PREFILL: fixed, Component.DECODE: decode, Component.ROUTER: fixed},
        in_sync=True,
    )
    status = build_status(observed, NOW)
    condition = next(c for c in status.conditions if c.type == "DecodeReady")
    return condition.status, condition.message, status.decode.desired_replicas


def test_an_autoscaled_role_is_ready_from_its_workloads_own_counts() -> None:
    autoscaling = {"decode": {"autoscaling": {**DECODE_AUTOSCALING, "minReplicas": 2}}}
    # The autoscaler asked for 4; two are up: serving, while it adds the others.
    assert _decode_view(autoscaling, _workload(4, 2, 4)) == (
        "True",
        "2/4 ready (autoscaled, 2 needed)",
        4,
    )
    assert _decode_view(autoscaling, _workload(4, 1, 4))[0] == "False"
    assert _decode_view(autoscaling, _workload(4, 4, 3))[0] == "False", "rolling out"
    assert _decode_view(autoscaling, None)[2] == 2, "before the workload: its minReplicas"
    # A fixed role still needs every replica.
    assert _decode_view({"decode": {"replicas": 4}}, _workload(4, 2, 4))[0] == "False"
    assert _decode_view({}, _workload(1, 1, 1))[0] == "True"


def test_minimal_spec_has_no_autoscaler() -> None:
    kinds = {m["kind"] for m in render("m", "ml", load_spec(minimal_spec()))}
    assert "HorizontalPodAutoscaler" not in kinds
