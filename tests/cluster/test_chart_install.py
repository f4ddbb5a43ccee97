"""The disagg-operator chart on a real API server: install, upgrade, uninstall with the real
helm, and the operator's ServiceAccount holding exactly the operator's rules, nothing more.

kwok runs no containers, so the operator itself does not start: these tests are about what
the chart creates and what the ServiceAccount may do (`kubectl auth can-i`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import kube

# The chart helpers are shared with the unit tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from helm_chart import CHART, operator_rules

RBAC_KINDS = ("clusterrole", "clusterrolebinding")
CRD_NAMES = (
    "disaggregatedmodels.disagg.dev",
    "kopfpeerings.kopf.dev",
    "clusterkopfpeerings.kopf.dev",
)


@dataclass(frozen=True)
class Release:
    """One installed release of the chart."""

    name: str
    namespace: str

    @property
    def fullname(self) -> str:
        """The chart's object name prefix for this release."""
        return f"{self.name}-disagg-operator"[:63].rstrip("-")

    @property
    def metrics_service(self) -> str:
        """The Service in front of the operator's /metrics."""
        return f"{self.fullname[:55].rstrip('-')}-metrics"

    @property
    def service_account(self) -> str:
        """The operator's ServiceAccount as an RBAC user name."""
        return f"system:serviceaccount:{self.namespace}:{self.fullname}"


def _sets(values: tuple[str, ...]) -> list[str]:
    return [arg for value in values for arg in ("--set", value)]


def install(helm: kube.Tool, release: Release, *values: str) -> str:
    """`helm install --wait` the chart; return helm's output (with NOTES.txt)."""
    return helm(
        "install", release.name, str(CHART), "-n", release.namespace, "--wait",
        "--timeout", "120s", *_sets(values),
    )  # fmt: skip


def upgrade(helm: kube.Tool, release: Release, *values: str) -> str:
    """`helm upgrade --wait` the release with new values (not reusing the old ones)."""
    return helm(
        "upgrade", release.name, str(CHART), "-n", release.namespace, "--wait", "--reset-values",
        "--timeout", "120s", *_sets(values),
    )  # fmt: skip


@dataclass(frozen=True)
class Permission:
    """One verb on one resource (`plural[.group][/subresource]`) in one namespace scope."""

    verb: str
    resource: str


def _resource_name(group: str, plural: str) -> tuple[str, str]:
    name, _, subresource = plural.partition("/")
    return (f"{name}.{group}" if group else name), subresource


def rule_permissions(rules: list[dict[str, Any]]) -> set[Permission]:
    """Every (verb, resource) pair the rules grant."""
    return {
        Permission(verb, "/".join(filter(None, _resource_name(group, plural))))
        for rule in rules
        for group in rule["apiGroups"]
        for plural in rule["resources"]
        for verb in rule["verbs"]
    }


def can_i(kubectl: kube.Kubectl, user: str, permission: Permission, *scope: str) -> bool:
    """`kubectl auth can-i` as `user` with the groups a ServiceAccount token carries."""
    resource, _, subresource = permission.resource.partition("/")
    namespace = user.split(":")[2]
    args = [
        "auth", "can-i", permission.verb, resource, f"--as={user}",
        "--as-group=system:serviceaccounts", f"--as-group=system:serviceaccounts:{namespace}",
        "--as-group=system:authenticated", *scope,
    ]  # fmt: skip
    if subresource:
        args.append(f"--subresource={subresource}")
    answer = kubectl.run(*args, check=False).stdout.strip()
    assert answer in ("yes", "no"), f"unexpected can-i answer {answer!r}"
    return answer == "yes"


def granted(kubectl: kube.Kubectl, user: str, namespace: str) -> set[Permission]:
    """Every resource permission `user` holds in `namespace` (`kubectl auth can-i --list`)."""
    sa_namespace = user.split(":")[2]
    table = kubectl(
        "auth", "can-i", "--list", "-n", namespace, f"--as={user}",
        "--as-group=system:serviceaccounts", f"--as-group=system:serviceaccounts:{sa_namespace}",
        "--as-group=system:authenticated", "--no-headers",
    )  # fmt: skip
    found = set()
    for line in table.splitlines():
        resource, *_, verbs = re.split(r"\s{2,}", line.strip())
        if resource.startswith("["):
            continue  # a non-resource URL
        found |= {Permission(verb, resource) for verb in verbs.strip("[]").split()}
    return found


# Beyond the rules: what an operator must never be able to do.
FORBIDDEN = [
    Permission("list", "secrets"),
    Permission("watch", "secrets"),
    Permission("update", "secrets"),
    Permission("patch", "secrets"),
    Permission("delete", "secrets"),
    Permission("delete", "deployments.apps"),
    Permission("delete", "disaggregatedmodels.disagg.dev"),
    Permission("create", "pods"),
    Permission("create", "pods/exec"),
    Permission("update", "deployments.apps"),
    Permission("escalate", "roles.rbac.authorization.k8s.io"),
    Permission("bind", "roles.rbac.authorization.k8s.io"),
]
FORBIDDEN_CLUSTER = [
    Permission("list", "secrets"),
    Permission("get", "nodes"),
    Permission("list", "namespaces"),
    Permission("create", "clusterroles.rbac.authorization.k8s.io"),
    Permission("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    Permission("patch", "customresourcedefinitions.apiextensions.k8s.io"),
    Permission("impersonate", "serviceaccounts"),
]


@pytest.fixture
def release(request: pytest.FixtureRequest, namespace: str, helm: kube.Tool) -> Iterator[Release]:
    """A release name for the chart in the test's namespace, uninstalled after the test."""
    rel = Release(name=f"r{namespace[-6:]}", namespace=namespace)
    yield rel
    helm.run("uninstall", rel.name, "-n", namespace, "--wait", check=False)


@pytest.fixture
def watched(kubectl: kube.Kubectl) -> Iterator[list[str]]:
    """Two fresh namespaces for the operator to watch and one it must not touch (last)."""
    names = [kube.namespace_name(f"chart-{role}") for role in ("w1", "w2", "other")]
    for name in names:
        kubectl("create", "namespace", name)
    yield names
    for name in names:
        kubectl("delete", "namespace", name, "--wait=false")


def metrics_endpoints(kubectl: kube.Kubectl, release: Release) -> list[tuple[str, int]]:
    """(pod, port) of every ready endpoint of the metrics Service, from its EndpointSlices."""
    slices = kubectl.json(
        "-n", release.namespace, "get", "endpointslices",
        "-l", f"kubernetes.io/service-name={release.metrics_service}",
    )["items"]  # fmt: skip
    return [
        (endpoint["targetRef"]["name"], port["port"])
        for piece in slices
        for port in piece.get("ports") or []
        for endpoint in piece.get("endpoints") or []
        if endpoint["conditions"].get("ready")
    ]


def _baseline(kubectl: kube.Kubectl, namespace: str) -> set[Permission]:
    """What any ServiceAccount may do in `namespace` without bindings of its own."""
    return granted(kubectl, f"system:serviceaccount:{namespace}:default", namespace)


def test_all_namespaces_install_upgrade_uninstall(
    helm: kube.Tool, kubectl: kube.Kubectl, release: Release, watched: list[str]
) -> None:
    notes = install(helm, release)
    assert "all namespaces (ClusterRole)" in notes
    assert f"Service {release.metrics_service}, port 9090, path /metrics" in notes
    rules = operator_rules()
    expected = rule_permissions(rules["namespaced"] + rules["peering"]["clusterwide"])
    user = release.service_account

    # Exactly the operator's rules, in any namespace (compared with a bare ServiceAccount).
    other = watched[2]
    for ns in (other, release.namespace):
        extra = granted(kubectl, user, ns) - _baseline(kubectl, ns)
        assert extra == expected, f"in {ns}: {extra ^ expected}"
    # kubectl auth can-i resolves a resource through discovery: it answers only for kinds the
    # cluster serves (not KEDA's or the Prometheus Operator's here); the rules above hold all.
    served = set(kubectl("api-resources", "--namespaced=true", "-o", "name").split())
    for permission in sorted(expected, key=str):
        if permission.resource.partition("/")[0] in served:
            assert can_i(kubectl, user, permission, "-n", other), permission
    for permission in FORBIDDEN:
        assert not can_i(kubectl, user, permission, "-n", other), permission
    for permission in FORBIDDEN_CLUSTER:
        assert not can_i(kubectl, user, permission, "--all-namespaces"), permission

    deployment = kubectl.json("-n", release.namespace, "get", "deployment", release.fullname)
    assert "--all-namespaces" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert deployment["status"].get("readyReplicas") == 1
    kubectl("get", "clusterkopfpeering", release.fullname)
    for crd in CRD_NAMES:
        kubectl("get", "crd", crd)

    # The metrics Service reaches the operator pod's metrics port (the endpoint controller
    # resolved the named targetPort on the pod selected by the Service).
    (pod,) = kubectl.json(
        "-n", release.namespace, "get", "pods", "-l", f"app.kubernetes.io/instance={release.name}"
    )["items"]  # fmt: skip
    assert "--metrics-port=9090" in pod["spec"]["containers"][0]["args"]
    endpoints = kube.wait_for(
        lambda: metrics_endpoints(kubectl, release), what="the metrics Service's endpoint"
    )
    assert endpoints == [(pod["metadata"]["name"], 9090)]

    upgrade(
        helm, release, "replicaCount=2", "logging.level=debug", "peering.name=shared",
        "rbac.readSecrets=false", "metrics.enabled=false",
    )  # fmt: skip
    gone = kubectl.run("-n", release.namespace, "get", "service", release.metrics_service,
                       check=False)  # fmt: skip
    assert gone.returncode != 0, "metrics Service left after metrics.enabled=false"
    for ns in (other, "kube-system"):
        assert not can_i(kubectl, user, Permission("get", "secrets"), "-n", ns)
    assert can_i(kubectl, user, Permission("patch", "statefulsets.apps"), "-n", other)
    deployment = kubectl.json("-n", release.namespace, "get", "deployment", release.fullname)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert deployment["spec"]["replicas"] == 2
    assert {"--log-level=debug", "--peering=shared"} <= set(args)
    assert not [arg for arg in args if arg.startswith("--metrics-port")], args
    kubectl("get", "clusterkopfpeering", "shared")
    assert kubectl.run("get", "clusterkopfpeering", release.fullname, check=False).returncode

    helm("uninstall", release.name, "-n", release.namespace, "--wait")
    for kind in (*RBAC_KINDS, "clusterkopfpeering/shared"):
        target = kind if "/" in kind else f"{kind}/{release.fullname}"
        assert kubectl.run("get", target, check=False).returncode != 0, f"{target} left behind"
    for kind in ("deployment", "serviceaccount"):
        gone = kubectl.run("-n", release.namespace, "get", kind, release.fullname, check=False)
        assert gone.returncode != 0, f"{kind} left behind"
    for crd in CRD_NAMES:
        kubectl("get", "crd", crd)  # kept: helm.sh/resource-policy and Helm's crds/ rules


def test_namespace_list_confines_the_operator(
    helm: kube.Tool, kubectl: kube.Kubectl, release: Release, watched: list[str]
) -> None:
    w1, w2, other = watched
    install(helm, release, f"watch.namespaces={{{w1},{w2}}}")
    rules = operator_rules()
    expected = rule_permissions(rules["namespaced"] + rules["peering"]["namespaced"])
    user = release.service_account

    for ns in (w1, w2):
        extra = granted(kubectl, user, ns) - _baseline(kubectl, ns)
        assert extra == expected, f"in {ns}: {extra ^ expected}"
        kubectl("-n", ns, "get", "kopfpeering", release.fullname)
    for ns in (other, release.namespace, "kube-system"):
        assert granted(kubectl, user, ns) == _baseline(kubectl, ns), f"acts in {ns}"
        for permission in expected:
            assert not can_i(kubectl, user, permission, "-n", ns), (ns, permission)
    for permission in (*FORBIDDEN_CLUSTER, *expected):
        assert not can_i(kubectl, user, permission, "--all-namespaces"), permission
    for kind in RBAC_KINDS:
        assert kubectl.run("get", kind, release.fullname, check=False).returncode != 0

    # Upgrade: stop watching w2; its Role, RoleBinding and peering go with it.
    apply_statefulset = Permission("patch", "statefulsets.apps")
    upgrade(helm, release, f"watch.namespaces={{{w1}}}", "logging.format=plain")
    assert can_i(kubectl, user, apply_statefulset, "-n", w1)
    assert not can_i(kubectl, user, apply_statefulset, "-n", w2)
    for kind in ("role", "rolebinding", "kopfpeering"):
        gone = kubectl.run("-n", w2, "get", kind, release.fullname, check=False)
        assert gone.returncode != 0, f"{kind} left behind in {w2}"
    deployment = kubectl.json("-n", release.namespace, "get", "deployment", release.fullname)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--namespace={w1}" in args and f"--namespace={w2}" not in args

    # Upgrade to every namespace: the Roles give way to one ClusterRole.
    upgrade(helm, release)
    assert can_i(kubectl, user, apply_statefulset, "-n", other)
    assert kubectl.run("-n", w1, "get", "role", release.fullname, check=False).returncode != 0
    kubectl("get", "clusterrole", release.fullname)

    helm("uninstall", release.name, "-n", release.namespace, "--wait")
    for kind in RBAC_KINDS:
        assert kubectl.run("get", kind, release.fullname, check=False).returncode != 0


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("replicaCount=-1", "/replicaCount"),
        ("logging.level=verbose", "/logging/level"),
        ("watch.namespaces={Not_A_Namespace}", "/watch/namespaces/0"),
        ("metrics.port=70000", "/metrics/port"),
    ],
)
def test_bad_values_install_nothing(
    helm: kube.Tool, kubectl: kube.Kubectl, release: Release, value: str, named: str
) -> None:
    proc = helm.run(
        "install", release.name, str(CHART), "-n", release.namespace, "--set", value, check=False
    )
    assert proc.returncode != 0 and named in proc.stderr, proc.stderr
    assert helm.run("status", release.name, "-n", release.namespace, check=False).returncode
    assert not kubectl("-n", release.namespace, "get", "deployment", "-o", "name").strip()
