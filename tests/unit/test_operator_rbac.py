"""The operator's RBAC rules: no wildcards, every kind `render` produces applied and watched
(nothing more: no update; delete only for the role workloads it replaces and the kinds it
renders on request), Secrets only read and created by name, the chart's copy current, and every
permission the operator grants a router held by the operator."""

from __future__ import annotations

from disagg_operator.loading import load_spec
from disagg_operator.render import ROUTER_RULES, render
from disagg_operator.resources import CHILD_RESOURCES, ON_REQUEST, ROLE_WORKLOADS, resource_of
from dmodel_samples import spec_with
from gen_rbac import RULES_PATH, namespaced_rules, peering_rules, rules_yaml


def _all_rules() -> list[dict[str, list[str]]]:
    return [*namespaced_rules(), *peering_rules(False), *peering_rules(True)]


def _grants(group: str, resource: str, verb: str) -> bool:
    return any(
        group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
        for r in namespaced_rules()
    )


def test_chart_copy_is_current() -> None:
    assert RULES_PATH.read_text() == rules_yaml(), "run `make operator-rbac`"


DELETABLE = (*ROLE_WORKLOADS, *ON_REQUEST)


def test_no_wildcards_and_delete_only_for_replaced_or_unrequested_children() -> None:
    for rule in _all_rules():
        for values in rule.values():
            assert "*" not in values, rule
        assert "deletecollection" not in rule["verbs"], rule
        if "delete" in rule["verbs"]:
            assert rule["verbs"] == ["delete"], rule
            kinds = {(r.group, r.plural) for r in DELETABLE}
            assert {(g, p) for g in rule["apiGroups"] for p in rule["resources"]} <= kinds


def test_only_role_workloads_autoscalers_pod_monitors_and_routes_can_be_deleted() -> None:
    deletable = {
        (group, plural)
        for r in namespaced_rules()
        if "delete" in r["verbs"]
        for group in r["apiGroups"]
        for plural in r["resources"]
    }
    assert deletable == {
        ("apps", "statefulsets"),
        ("leaderworkerset.x-k8s.io", "leaderworkersets"),
        ("autoscaling", "horizontalpodautoscalers"),
        ("keda.sh", "scaledobjects"),
        ("monitoring.coreos.com", "podmonitors"),
        ("gateway.networking.k8s.io", "httproutes"),
    }


def test_every_rendered_kind_is_a_child_kind() -> None:
    spec = load_spec(spec_with({"router": {"redis": {"urlSecret": {"name": "valkey"}}}}))
    multi_node = load_spec(spec_with({"decode": {"tensorParallelSize": 16, "nodesPerReplica": 2}}))
    scaled = load_spec(
        spec_with(
            {
                "prefill": {"autoscaling": {"maxReplicas": 4, "signal": "queueDepth", "target": 4}},
                "decode": {
                    "autoscaling": {
                        "engine": "keda",
                        "prometheusAddress": "http://prometheus:9090",
                        "maxReplicas": 4,
                        "signal": "kvCacheUsage",
                        "target": 0.8,
                    }
                },
                "monitoring": {"podMonitors": True},
                "router": {"httpRoute": {"parentRefs": [{"name": "gateway"}]}},
            }
        )
    )
    specs = (spec, multi_node, scaled)
    rendered = {resource_of(m) for s in specs for m in render("m", "ml", s)}
    assert rendered == set(CHILD_RESOURCES)


def test_every_child_kind_can_be_applied_and_watched_and_nothing_more() -> None:
    for resource in CHILD_RESOURCES:
        verbs = {
            verb
            for r in namespaced_rules()
            if resource.group in r["apiGroups"] and resource.plural in r["resources"]
            for verb in r["verbs"]
        }
        extra = {"delete"} if resource in DELETABLE else set()
        assert verbs == {"get", "list", "watch", "create", "patch", *extra}, resource.plural


def test_secrets_are_only_read_and_created_by_name() -> None:
    """Read: the Secrets a spec names and the generated keys; create: the generated keys. Never
    list, watch, update, patch or delete (a generated key is never rewritten)."""
    secret_verbs = {
        v for r in namespaced_rules() if "secrets" in r["resources"] for v in r["verbs"]
    }
    assert secret_verbs == {"get", "create"}


def test_operator_holds_what_it_grants_routers() -> None:
    for rule in ROUTER_RULES:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert _grants(group, resource, verb), (group, resource, verb)
