"""The chart renders valid, least-privilege Kubernetes objects for every supported setup."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from disagg.cli import build_parser
from helm_chart import CHART, by_kind, helm, operator_rules, template

# The chart's kubeVersion floor and the local control plane's release.
KUBE_VERSIONS = ("1.29", "1.36")
SETUPS = {
    "defaults": (),
    "watch-list": ("watch.namespaces={team-a,team-b}",),
    "standalone": ("peering.enabled=false",),
    "reuse-by-service": ("reuse.interval=30", "reuse.url=http://{service}.{namespace}.svc:{port}"),
    "peering-objects-external": ("peering.create=false", "replicaCount=3"),
    "existing-service-account": ("serviceAccount.create=false", "serviceAccount.name=ops"),
    "pinned-placed": (
        "image.digest=sha256:" + "a" * 64,
        "nodeSelector.kubernetes\\.io/os=linux",
        "tolerations[0].key=dedicated,tolerations[0].operator=Exists",
        "priorityClassName=system-cluster-critical",
        "logging.level=debug,logging.format=plain",
        "extraEnv[0].name=HTTPS_PROXY,extraEnv[0].value=http://proxy:3128",
        "podAnnotations.team=ml,podLabels.tier=control,commonLabels.cost-center=ai",
    ),
    "metrics-off": ("metrics.enabled=false",),
    "service-monitor": (
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.labels.release=prom",
        "metrics.port=9400",
    ),
    "model-dashboard-and-alerts": (
        "monitoring.grafanaDashboard.enabled=true",
        "monitoring.prometheusRule.enabled=true",
    ),
}
# Custom resources, which the Kubernetes schema does not know: kopf's peering objects (their
# CRDs are validated here as CustomResourceDefinitions) and the Prometheus Operator's
# ServiceMonitor and PrometheusRule. Only these kinds, by name, skip schema validation.
CUSTOM_KINDS = {"KopfPeering", "ClusterKopfPeering", "ServiceMonitor", "PrometheusRule"}
ALL_NAMESPACE_KINDS = {"ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"}


def _values_file_args(setup: tuple[str, ...]) -> list[str]:
    return [arg for value in setup for arg in ("--set", value)]


@pytest.mark.parametrize("setup", SETUPS.values(), ids=SETUPS.keys())
def test_lint_strict_is_clean(setup: tuple[str, ...]) -> None:
    proc = helm("lint", "--strict", str(CHART), *_values_file_args(setup))
    assert "0 chart(s) failed" in proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("setup", SETUPS.values(), ids=SETUPS.keys())
def test_objects_validate_against_the_kubernetes_schema(
    setup: tuple[str, ...], version: str
) -> None:
    docs = template(*setup, include_crds=True)
    checked = [doc for doc in docs if doc["kind"] not in CUSTOM_KINDS]
    assert {doc["kind"] for doc in checked} >= {"Deployment", "CustomResourceDefinition"}
    for doc in checked:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("setup", SETUPS.values(), ids=SETUPS.keys())
def test_every_object_carries_the_shared_labels(setup: tuple[str, ...]) -> None:
    for doc in template(*setup, release="ml"):
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "disagg-operator", doc["kind"]
        assert labels["app.kubernetes.io/instance"] == "ml"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "disagg-operator-0.1.0"


def test_deployment_runs_the_operator_hardened_and_probed() -> None:
    (deployment,) = by_kind(template(), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][0] == "operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
    assert "--metrics-port=9090" in container["args"]
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    assert container["resources"]["limits"]["memory"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ((), ["--all-namespaces", "--peering=disagg-disagg-operator"]),
        (("watch.namespaces={a,b}",), ["--namespace=a", "--namespace=b"]),
        (("peering.enabled=false",), ["--standalone"]),
        (("peering.name=shared",), ["--peering=shared"]),
        (("logging.level=debug", "logging.format=plain"), ["--log-level=debug"]),
        ((), ["--reuse-interval=60"]),
        (
            ("reuse.interval=0", "reuse.url=http://{service}.{namespace}.svc:{port}"),
            ["--reuse-interval=0", "--reuse-url=http://{service}.{namespace}.svc:{port}"],
        ),
    ],
)
def test_operator_args_follow_the_values(values: tuple[str, ...], expected: list[str]) -> None:
    (deployment,) = by_kind(template(*values), "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert set(expected) <= set(args)


@pytest.mark.parametrize("setup", SETUPS.values(), ids=SETUPS.keys())
def test_the_operator_cli_accepts_the_rendered_args(setup: tuple[str, ...]) -> None:
    (deployment,) = by_kind(template(*setup), "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    parsed = build_parser().parse_args(args)
    assert parsed.command == "operator"
    assert parsed.all_namespaces != bool(parsed.namespace)


def test_metrics_service_is_rendered_when_metrics_are_on_and_absent_when_off() -> None:
    docs = template()
    (deployment,) = by_kind(docs, "Deployment")
    (service,) = by_kind(docs, "Service")
    assert service["metadata"]["name"] == "disagg-disagg-operator-metrics"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert not by_kind(docs, "ServiceMonitor")

    off = template("metrics.enabled=false")
    assert not by_kind(off, "Service") and not by_kind(off, "ServiceMonitor")
    (container,) = by_kind(off, "Deployment")[0]["spec"]["template"]["spec"]["containers"]
    assert not [arg for arg in container["args"] if arg.startswith("--metrics-port")]
    assert [port["name"] for port in container["ports"]] == ["health"]


def test_service_monitor_scrapes_the_metrics_service() -> None:
    docs = template(*SETUPS["service-monitor"], namespace="ops")
    (service,) = by_kind(docs, "Service")
    (monitor,) = by_kind(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    spec = monitor["spec"]
    assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert spec["namespaceSelector"] == {"matchNames": ["ops"]}
    assert spec["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]
    assert service["spec"]["ports"][0]["name"] == "metrics"
    assert service["spec"]["ports"][0]["port"] == 9400


def test_image_reference_prefers_digest_then_tag_then_app_version() -> None:
    def image(*values: str) -> str:
        (deployment,) = by_kind(template(*values), "Deployment")
        ref: str = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        return ref

    digest = "sha256:" + "b" * 64
    assert image() == "ghcr.io/disagg-dev/disagg-operator:0.1.0"
    assert image("image.tag=1.2.3") == "ghcr.io/disagg-dev/disagg-operator:1.2.3"
    assert image("image.tag=1.2.3", f"image.digest={digest}").endswith(f"@{digest}")


def _rules(doc: dict[str, Any]) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = doc["rules"]
    return rules


def test_all_namespaces_gets_one_cluster_role_with_the_operator_rules() -> None:
    docs = template()
    rules = operator_rules()
    (role,) = by_kind(docs, "ClusterRole")
    assert _rules(role) == rules["namespaced"] + rules["peering"]["clusterwide"]
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    (account,) = by_kind(docs, "ServiceAccount")
    subject = {"kind": "ServiceAccount", "namespace": "disagg-system"}
    assert binding["subjects"] == [{**subject, "name": account["metadata"]["name"]}]
    assert not by_kind(docs, "Role") and not by_kind(docs, "RoleBinding")


def test_a_namespace_list_gets_a_role_per_namespace_and_nothing_cluster_wide() -> None:
    docs = template("watch.namespaces={team-a,team-b}")
    rules = operator_rules()
    assert not [doc for doc in docs if doc["kind"] in ALL_NAMESPACE_KINDS]
    roles = by_kind(docs, "Role")
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["team-a", "team-b"]
    for role in roles:
        assert _rules(role) == rules["namespaced"] + rules["peering"]["namespaced"]
    bindings = by_kind(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert {b["subjects"][0]["namespace"] for b in bindings} == {"disagg-system"}
    peerings = by_kind(docs, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]


def test_rules_hold_no_wildcards_and_delete_only_workloads() -> None:
    rules = operator_rules()
    every = rules["namespaced"] + rules["peering"]["namespaced"] + rules["peering"]["clusterwide"]
    assert every
    for rule in every:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
        assert not {"deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"])
        if "delete" in rule["verbs"]:
            assert rule["verbs"] == ["delete"], "only a replaced or unrequested child is deleted"
            deletable = {"statefulsets", "leaderworkersets", "horizontalpodautoscalers",
                         "scaledobjects", "podmonitors", "httproutes"}  # fmt: skip
            assert set(rule["resources"]) <= deletable, rule
        if "secrets" in rule["resources"]:
            assert set(rule["verbs"]) <= {"get", "create"}, "never listed, watched or rewritten"
            assert rule["resources"] == ["secrets"], "rbac.readSecrets drops this whole rule"


@pytest.mark.parametrize("watch", [(), ("watch.namespaces={a}",)], ids=["all", "list"])
def test_read_secrets_off_drops_only_the_secrets_rule(watch: tuple[str, ...]) -> None:
    def rules(*values: str) -> list[dict[str, Any]]:
        docs = template(*watch, *values)
        (role,) = by_kind(docs, "ClusterRole") + by_kind(docs, "Role")
        return _rules(role)

    with_secrets, without = rules(), rules("rbac.readSecrets=false")
    assert [rule for rule in with_secrets if rule not in without] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]}
    ]
    assert all(rule in with_secrets for rule in without)


def test_rbac_off_renders_no_rbac_objects() -> None:
    kinds = {doc["kind"] for doc in template("rbac.create=false")}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def test_peering_objects_follow_the_watch_mode() -> None:
    (cluster_peering,) = by_kind(template(), "ClusterKopfPeering")
    assert cluster_peering["metadata"]["name"] == "disagg-disagg-operator"
    assert not by_kind(template("peering.create=false"), "ClusterKopfPeering")
    assert not by_kind(template("peering.enabled=false"), "ClusterKopfPeering")


@pytest.mark.parametrize(
    ("release", "values", "expected"),
    [
        ("disagg", (), "disagg-disagg-operator"),
        ("my-disagg-operator", (), "my-disagg-operator"),
        ("r", ("fullnameOverride=ops",), "ops"),
        ("r", ("nameOverride=op",), "r-op"),
        ("a" * 53, (), "a" * 53 + "-disagg-op"),
        ("a" * 53, ("nameOverride=abcdefgh-ijk",), "a" * 53 + "-abcdefgh"),
        ("r", ("fullnameOverride=" + "y" * 62 + "-",), "y" * 62),
    ],
)
def test_fullname_is_a_dns_label(release: str, values: tuple[str, ...], expected: str) -> None:
    (deployment,) = by_kind(template(*values, release=release), "Deployment")
    name = deployment["metadata"]["name"]
    assert name == expected
    assert len(name) <= 63 and not name.endswith("-")
