"""The router's Gateway API HTTPRoute (`spec.router.httpRoute`): rendered only when asked,
attached to the Gateways named, sending to the router Service on the Service's own port; the
operator repairs it, deletes it once the spec drops it, and reports a cluster without the
Gateway API CRDs as KindNotInstalled naming the fix."""

from __future__ import annotations

import asyncio
import copy
from typing import Any, cast

import pytest

from api_standin import StoreStandIn
from disagg_operator.children import Action, adopt, decide
from disagg_operator.errors import SpecError
from disagg_operator.kubeapi import ApiException, KubeApi
from disagg_operator.loading import load_spec
from disagg_operator.reconcile import Live, Reconciler
from disagg_operator.render import render
from disagg_operator.resources import HTTP_ROUTES, ON_REQUEST, ApiResource, resource_of
from dmodel_samples import HTTP_ROUTE, spec_with

Manifest = dict[str, Any]
NAME, NAMESPACE = "demo", "ml"
ROUTER = f"{NAME}-router"
ROUTED = {"router": {"httpRoute": HTTP_ROUTE}}


def _objects(patch: dict[str, Any]) -> dict[str, Manifest]:
    spec = load_spec(spec_with(patch))
    return {f"{m['kind']}/{m['metadata']['name']}": m for m in render(NAME, NAMESPACE, spec)}


def _route(patch: dict[str, Any]) -> Manifest:
    return _objects(patch)[f"HTTPRoute/{ROUTER}"]


def test_no_route_unless_the_spec_asks() -> None:
    assert not [key for key in _objects({}) if key.startswith("HTTPRoute/")]


def test_the_route_attaches_to_the_named_gateways_and_hostnames() -> None:
    route = _route(ROUTED)
    assert resource_of(route) is HTTP_ROUTES
    assert route["metadata"]["name"] == ROUTER
    assert route["metadata"]["namespace"] == NAMESPACE
    assert (
        route["metadata"]["labels"] == _objects(ROUTED)[f"Service/{ROUTER}"]["metadata"]["labels"]
    )
    assert route["spec"]["parentRefs"] == [
        {"name": "public", "namespace": "gateways", "sectionName": "https"},
        {"name": "internal"},
    ]
    assert route["spec"]["hostnames"] == ["llm.example.com", "*.llm.example.com"]


def test_without_hostnames_the_route_takes_every_host_the_gateway_accepts() -> None:
    route = _route({"router": {"httpRoute": {"parentRefs": [{"name": "public"}]}}})
    assert "hostnames" not in route["spec"]
    assert route["spec"]["parentRefs"] == [{"name": "public"}]


@pytest.mark.parametrize("port", [None, 9000])
def test_the_backend_is_the_router_service_on_its_port(port: int | None) -> None:
    router: dict[str, Any] = {"httpRoute": HTTP_ROUTE}
    if port is not None:
        router["port"] = port
    objects = _objects({"router": router})
    service = objects[f"Service/{ROUTER}"]
    route = objects[f"HTTPRoute/{ROUTER}"]
    backend = {"name": service["metadata"]["name"], "port": service["spec"]["ports"][0]["port"]}
    assert route["spec"]["rules"] == [{"backendRefs": [backend]}]
    if port is not None:
        assert backend["port"] == port


def test_the_route_leaves_the_other_children_untouched() -> None:
    before, after = _objects({}), _objects(ROUTED)
    assert [k for k in after if k not in before] == [f"HTTPRoute/{ROUTER}"]
    assert all(after[k] == before[k] for k in before)


@pytest.mark.parametrize(
    ("route", "field", "says"),
    [
        ({"parentRefs": []}, "spec.router.httpRoute.parentRefs", "at least 1 item"),
        ({}, "spec.router.httpRoute.parentRefs", "Field required"),
        (
            {"parentRefs": [{"name": "public"}], "hostnames": ["LLM.example.com"]},
            "spec.router.httpRoute.hostnames[0]",
            "should match pattern",
        ),
        (
            {"parentRefs": [{"name": "public"}, {"name": "public", "sectionName": "https"}]},
            "spec.router.httpRoute.parentRefs",
            "a Gateway named twice needs a different sectionName",
        ),
    ],
)
def test_a_route_gateway_api_would_refuse_is_refused_before_rendering(
    route: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(SpecError) as caught:
        _objects({"router": {"httpRoute": route}})
    assert field in str(caught.value) and says in str(caught.value)


def test_server_defaults_are_no_drift_and_a_changed_backend_is_repaired() -> None:
    owner = {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedModel",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "u-1"},
        "spec": spec_with(ROUTED),
    }
    route = adopt(_route(ROUTED), owner)
    stored = copy.deepcopy(route)
    for parent in stored["spec"]["parentRefs"]:
        parent.update({"group": "gateway.networking.k8s.io", "kind": "Gateway"})
    rule = stored["spec"]["rules"][0]
    rule["matches"] = [{"path": {"type": "PathPrefix", "value": "/"}}]
    rule["backendRefs"][0].update({"group": "", "kind": "Service", "weight": 1})
    assert decide(route, stored, "u-1").action is Action.NONE
    rule["backendRefs"][0]["port"] = 9999
    decision = decide(route, stored, "u-1")
    assert decision.action is Action.REPAIR
    assert "backendRefs" in decision.detail


class RouteApi(StoreStandIn):
    """Stores what the operator applies and deletes; the kinds in `missing` answer 404, as the
    API server does for a kind no installed CRD defines."""

    def __init__(self, missing: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.missing = missing
        self.deleted: list[tuple[str, str]] = []

    def apply(self, resource: ApiResource, manifest: Manifest) -> Manifest:
        if resource.kind in self.missing:
            raise ApiException(status=404, reason="Not Found")
        return self._store(copy.deepcopy(manifest))

    def delete(self, resource: ApiResource, namespace: str, name: str, uid: str) -> None:
        assert self.objects.pop((resource.kind, name))["metadata"]["uid"] == uid
        self.deleted.append((resource.kind, name))

    def get(self, resource: ApiResource, namespace: str, name: str) -> Manifest | None:
        if resource.kind == "Secret":
            return {"data": {"disagg-key": "a2V5"}}
        return copy.deepcopy(self.objects.get((resource.kind, name)))

    def patch_status(
        self, resource: ApiResource, namespace: str, name: str, status: dict[str, Any]
    ) -> Manifest:
        return {"kind": "DisaggregatedModel", "metadata": {"name": name, "resourceVersion": "0"}}


def _pass(api: RouteApi, reconciler: Reconciler, patch: dict[str, Any]) -> Any:
    owner = {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedModel",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "u-1", "resourceVersion": "1",
                     "generation": 1},
        "spec": spec_with(patch),
    }  # fmt: skip
    live = Live(children=copy.deepcopy(api.objects))
    return asyncio.run(reconciler.reconcile(owner, live))


def test_the_route_is_applied_and_deleted_once_the_spec_drops_it() -> None:
    assert HTTP_ROUTES in ON_REQUEST
    api = RouteApi()
    reconciler = Reconciler(cast(KubeApi, api))
    assert not _pass(api, reconciler, ROUTED).problems
    assert api.objects[("HTTPRoute", ROUTER)]["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    outcome = _pass(api, reconciler, {})
    assert api.deleted == [("HTTPRoute", ROUTER)]
    assert ("Service", ROUTER) in api.objects
    assert any(e.reason == "Deleted" and f"HTTPRoute {ROUTER}" in e.message for e in outcome.events)


def test_without_the_gateway_api_crds_the_model_is_degraded_naming_the_fix() -> None:
    api = RouteApi(missing=frozenset({"HTTPRoute"}))
    outcome = _pass(api, Reconciler(cast(KubeApi, api)), ROUTED)
    assert [p.reason for p in outcome.problems] == ["KindNotInstalled"]
    assert outcome.problems[0].message == (
        f"cannot apply HTTPRoute {ROUTER}: the cluster has no HTTPRoute (CRD "
        "httproutes.gateway.networking.k8s.io): install the Gateway API CRDs, or remove "
        "spec.router.httpRoute"
    )
    assert ("Deployment", ROUTER) in api.objects, "the rest of the model is applied"
    degraded = next(c for c in outcome.status.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "KindNotInstalled")


def test_a_model_without_a_route_needs_no_gateway_api() -> None:
    api = RouteApi(missing=frozenset({"HTTPRoute"}))
    outcome = _pass(api, Reconciler(cast(KubeApi, api)), {})
    assert not outcome.problems
    assert not [kind for kind, _ in api.objects if kind == "HTTPRoute"]
