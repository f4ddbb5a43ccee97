"""The router's Gateway API HTTPRoute (`spec.router.httpRoute`) on the real control plane, with
the real operator and the Gateway API's own CRDs (the standard install of the pinned release,
fetched by `pinned_files.py`): the route is applied owned by the model, sending to the
router Service on its port, repaired after hand edits and deleted once the spec drops it; on a
cluster without the Gateway API CRDs the model is Degraded naming the CRD and the fix, and the
rest of the model is applied; the API server tells two Gateways of one name apart by namespace.

The Gateway API CRDs are this module's alone: a fixture installs them for one test (labelled as
the test's) and removes them after it, so that the local cluster serves no HTTPRoute to other
tests and the test without them finds none. A cluster that had them before (a user's) keeps
them, and the test that needs them absent is skipped there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

import kube
from disagg_operator.resources import HTTP_ROUTES
from operator_fixtures import StartOperator, crds, small_model, start_operator  # noqa: F401
from operator_harness import apply_crds, condition, dmodel
from pinned_files import GATEWAY_API, GATEWAY_API_STANDARD, pinned_files

NAME = "m"
ROUTER = f"{NAME}-router"
CRD = f"{HTTP_ROUTES.plural}.{HTTP_ROUTES.group}"
INSTALLED_BY = "disagg.dev/test-installed=gateway-api"
"""The label this module puts on the Gateway API CRDs it installs (and removes after)."""
ROUTE = {
    "parentRefs": [{"name": "public", "namespace": "gateways", "sectionName": "https"}],
    "hostnames": ["llm.example.com"],
}


def _serves_routes(kubectl: kube.Kubectl) -> bool:
    return kubectl.run("get", "crd", CRD, check=False).returncode == 0


def _remove_ours(kubectl: kube.Kubectl) -> None:
    """Delete the Gateway API CRDs this module installed, and wait until they are gone."""
    kubectl("delete", "crd", "-l", INSTALLED_BY, "--wait=true", "--timeout=120s")


@pytest.fixture
def gateway_api(kubectl: kube.Kubectl) -> Iterator[None]:
    """The Gateway API's standard-install CRDs, Established and served, for one test."""
    ours = not _serves_routes(kubectl)
    crds_dir = GATEWAY_API.cache_dir / GATEWAY_API_STANDARD
    pinned_files(GATEWAY_API)
    if ours:
        apply_crds(kubectl, crds_dir)
        kubectl("label", "-f", str(crds_dir), INSTALLED_BY, "--overwrite")
    yield
    if ours:
        _remove_ours(kubectl)


@pytest.fixture
def no_gateway_api(kubectl: kube.Kubectl) -> None:
    """A cluster without the Gateway API CRDs (those a crashed run of this module left go)."""
    _remove_ours(kubectl)
    if _serves_routes(kubectl):
        pytest.skip(f"the cluster has the Gateway API CRDs ({CRD}) of its own")


def _model(namespace: str) -> dict[str, Any]:
    router = {
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "httpRoute": ROUTE,
    }
    return small_model(NAME, namespace, router=router)


def _route(kubectl: kube.Kubectl, namespace: str) -> dict[str, Any] | None:
    found = kubectl.run("-n", namespace, "get", "httproute", ROUTER, "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


def _sends_to_the_router_service(kubectl: kube.Kubectl, namespace: str) -> bool:
    """The live route holds what the spec asks, its backend the live router Service's port."""
    route = _route(kubectl, namespace)
    if route is None:
        return False
    service = kubectl.json("-n", namespace, "get", "service", ROUTER)
    backends = [b for rule in route["spec"]["rules"] for b in rule["backendRefs"]]
    parents = [(p["name"], p.get("namespace"), p.get("sectionName"), p["kind"])
               for p in route["spec"]["parentRefs"]]  # fmt: skip
    return (
        [(b["kind"], b["name"], b["port"]) for b in backends]
        == [("Service", ROUTER, service["spec"]["ports"][0]["port"])]
        and parents == [("public", "gateways", "https", "Gateway")]
        and route["spec"].get("hostnames") == ROUTE["hostnames"]
    )


def _events(kubectl: kube.Kubectl, namespace: str, reason: str) -> str:
    selector = f"involvedObject.kind=DisaggregatedModel,reason={reason}"
    items = kubectl.json("-n", namespace, "get", "events", "--field-selector", selector)["items"]
    return " ".join(str(event["message"]) for event in items)


def test_the_route_is_applied_repaired_and_deleted_with_the_spec(
    kubectl: kube.Kubectl,
    gateway_api: None,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
) -> None:
    start_operator()  # after the CRDs: the operator finds the kinds it watches at start-up
    kubectl.apply(_model(namespace))
    kube.wait_for(
        lambda: _sends_to_the_router_service(kubectl, namespace),
        what="the router's HTTPRoute",
        timeout_s=60,
    )
    route = _route(kubectl, namespace)
    assert route is not None
    uid = dmodel(kubectl, namespace, NAME)["metadata"]["uid"]
    assert [(o["uid"], o["controller"]) for o in route["metadata"]["ownerReferences"]] == [
        (uid, True)
    ]

    # Hand edits: the backend moved to another port, the hostnames dropped. The patch's own
    # response is the object that write stored; a read after it may already see the repair.
    rules = [{"backendRefs": [{"name": ROUTER, "port": 9999}]}]
    edit = json.dumps({"spec": {"rules": rules, "hostnames": None}})
    edited = kubectl.json("-n", namespace, "patch", "httproute", ROUTER, "--type=merge", "-p", edit)
    assert "hostnames" not in edited["spec"]
    assert [b["port"] for rule in edited["spec"]["rules"] for b in rule["backendRefs"]] == [9999]
    kube.wait_for(
        lambda: _sends_to_the_router_service(kubectl, namespace),
        what="the HTTPRoute's hand edits undone",
        timeout_s=60,
    )
    assert f"HTTPRoute {ROUTER}" in _events(kubectl, namespace, "DriftRepaired")

    kubectl("-n", namespace, "patch", "dmodel", NAME, "--type=merge",
            "-p", json.dumps({"spec": {"router": {"httpRoute": None}}}))  # fmt: skip
    kube.wait_for(
        lambda: _route(kubectl, namespace) is None,
        what="the HTTPRoute deleted once the spec drops it",
        timeout_s=60,
    )
    assert f"deleted HTTPRoute {ROUTER}" in _events(kubectl, namespace, "Deleted")
    assert kubectl.json("-n", namespace, "get", "service", ROUTER)["metadata"]["name"] == ROUTER


def test_without_the_gateway_api_the_model_is_degraded_naming_the_fix(
    kubectl: kube.Kubectl,
    no_gateway_api: None,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
) -> None:
    operator = start_operator()
    kubectl.apply(_model(namespace))

    def degraded() -> dict[str, Any] | None:
        found = condition(dmodel(kubectl, namespace, NAME), "Degraded")
        return found if found.get("reason") == "KindNotInstalled" else None

    found = kube.wait_for(degraded, what="Degraded KindNotInstalled", timeout_s=60)
    assert found["status"] == "True"
    assert (
        f"cannot apply HTTPRoute {ROUTER}: the cluster has no HTTPRoute (CRD {CRD})"
        in (found["message"])
    )
    assert "install the Gateway API CRDs, or remove spec.router.httpRoute" in found["message"]
    deployment = kubectl.json("-n", namespace, "get", "deployment", ROUTER)
    assert deployment["metadata"]["name"] == ROUTER, "the rest of the model is applied"

    # The fix the message names: without spec.router.httpRoute the model is no longer Degraded
    # for it.
    kubectl("-n", namespace, "patch", "dmodel", NAME, "--type=merge",
            "-p", json.dumps({"spec": {"router": {"httpRoute": None}}}))  # fmt: skip
    kube.wait_for(
        lambda: degraded() is None,
        what="Degraded KindNotInstalled cleared once the spec drops the route",
        timeout_s=60,
    )
    assert not operator.proc_exited()


@pytest.mark.parametrize(
    ("parents", "refused"),
    [
        ([{"name": "public", "namespace": "a"}, {"name": "public", "namespace": "b"}], False),
        ([{"name": "public", "namespace": "a"}, {"name": "public"}], False),
        ([{"name": "public", "namespace": "a"}, {"name": "public", "namespace": "a"}], True),
    ],
    ids=["two-namespaces", "set-and-unset", "same-namespace"],
)
def test_the_api_server_tells_gateways_apart_by_namespace(
    kubectl: kube.Kubectl,
    crds: None,  # noqa: F811
    namespace: str,
    parents: list[dict[str, str]],
    refused: bool,
) -> None:
    """The parentRefs rule reads each reference's namespace (`__namespace__` to CEL): one
    Gateway name in two namespaces is two Gateways."""
    model = small_model(NAME, namespace, router={"httpRoute": {"parentRefs": parents}})
    proc = kubectl.run("create", "-n", namespace, "--dry-run=server", "-f", "-",
                       input=json.dumps(model), check=False)  # fmt: skip
    assert (proc.returncode != 0) == refused, proc.stderr
    if refused:
        assert "a Gateway named twice needs a different sectionName" in proc.stderr
