"""The EKS guide's files and the examples, checked so that the guide cannot rot.

Every file in docs/eks/ is checked by what it is: the eksctl ClusterConfig against the JSON
schema eksctl publishes; the strategic merge patch onto the EFA device plugin DaemonSet that
eksctl installs (its own manifest, from the same eksctl release); the operator chart's values
through `helm template`; and every Kubernetes manifest, with the examples/, by
`kubectl apply --dry-run=server --validate=strict` on the local API server, with the CRDs
they need installed: the project's, Karpenter's and the Prometheus Operator's (pinned modules,
`pinned_files.py`). So the API server, with each CRD's schema and CEL rules, accepts every
object the guide tells a user to apply.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

import kube
from pinned_files import EKSCTL, KARPENTER, PROMETHEUS_OPERATOR, crd_name, pinned_files

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "eks.md"
DOCS = REPO / "docs" / "eks"
CLUSTER_CONFIG = DOCS / "cluster.yaml"
EFA_PATCH = DOCS / "efa-device-plugin-patch.yaml"
OPERATOR_VALUES = DOCS / "operator-values.yaml"
CHART = REPO / "charts" / "disagg-operator"
OPERATOR_NAMESPACE = "disagg-system"
SPECIAL = {CLUSTER_CONFIG, EFA_PATCH, OPERATOR_VALUES}
MANIFESTS = sorted(set(DOCS.glob("*.yaml")) - SPECIAL) + sorted((REPO / "examples").glob("*.yaml"))
THIRD_PARTY_CRDS = (KARPENTER, PROMETHEUS_OPERATOR)


def _docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.fixture(scope="module")
def crds(kubectl: kube.Kubectl) -> Iterator[None]:
    """The project's CRDs and the third-party ones the manifests use, Established; the
    third-party CRDs this fixture added are removed afterwards."""
    third_party = [path for m in THIRD_PARTY_CRDS for path in pinned_files(m).values()]
    names = [crd_name(path) for path in third_party]
    present = set(kubectl("get", "crd", "-o", "name").split())
    added = [
        name
        for name in names
        if f"customresourcedefinition.apiextensions.k8s.io/{name}" not in present
    ]
    for path in [*sorted((REPO / "crds").glob("*.yaml")), *third_party]:
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in names))
    yield
    if added:
        kubectl("delete", "crd", *added, "--wait=false")


def _namespace_phase(kubectl: kube.Kubectl, name: str) -> str:
    """The namespace's phase, or "" when there is none."""
    proc = kubectl.run("get", "namespace", name, "-o", "jsonpath={.status.phase}", check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


@pytest.fixture(scope="module")
def namespaces(kubectl: kube.Kubectl) -> Iterator[None]:
    """The namespaces the manifests name, created when missing and deleted afterwards."""
    wanted = {OPERATOR_NAMESPACE, "monitoring"}
    for path in MANIFESTS:
        wanted |= {d["metadata"]["namespace"] for d in _docs(path) if "namespace" in d["metadata"]}
    for name in wanted:
        kube.wait_for(
            lambda name=name: _namespace_phase(kubectl, name) != "Terminating",
            what=f"namespace {name} to finish terminating",
            timeout_s=120,
        )
    present = {n.removeprefix("namespace/") for n in kubectl("get", "ns", "-o", "name").split()}
    created = sorted(wanted - present)
    for name in created:
        kubectl("create", "namespace", name)
    yield
    if created:
        kubectl("delete", "namespace", *created, "--wait=false")


def _dry_run(kubectl: kube.Kubectl, manifest: str) -> str:
    return kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-o", "name", "-f", "-", input=manifest
    )


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(REPO)))
def test_manifest_applies(kubectl: kube.Kubectl, crds: None, namespaces: None, path: Path) -> None:
    """The API server accepts every object of the file as it stands (dry run, strict fields)."""
    applied = _dry_run(kubectl, path.read_text()).split()
    expected = [f"{d['kind'].lower()}" for d in _docs(path)]
    assert [name.split("/")[0].split(".")[0] for name in applied] == expected, applied


def test_a_wrong_field_is_refused(kubectl: kube.Kubectl, crds: None, namespaces: None) -> None:
    """The dry run is strict: a misspelled field of a NodePool fails, so the checks above can."""
    pool = _docs(DOCS / "karpenter-nodepool.yaml")[0]
    pool["spec"]["template"]["spec"]["expireAfterr"] = "Never"
    proc = kubectl.run(
        "apply", "--dry-run=server", "--validate=strict", "-f", "-",
        input=yaml.safe_dump(pool), check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "expireAfterr" in proc.stderr


def _eksctl_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(pinned_files(EKSCTL)[EKSCTL.files[0]].read_text())
    return schema


def test_eksctl_cluster_config_matches_the_published_schema() -> None:
    """docs/eks/cluster.yaml is valid against eksctl's ClusterConfig schema (draft 7), which
    refuses unknown fields, so a renamed or misspelled field fails here."""
    validator = jsonschema.Draft7Validator(_eksctl_schema())
    config = yaml.safe_load(CLUSTER_CONFIG.read_text())
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(config)
    ]
    assert errors == []
    wrong = copy.deepcopy(config)
    wrong["managedNodeGroups"][1]["efaEnabeld"] = True
    assert any("efaEnabeld" in e.message for e in validator.iter_errors(wrong))


def test_eksctl_cluster_config_keeps_what_the_guide_relies_on() -> None:
    """The facts the guide states of the cluster: network policy enforced by the VPC CNI, one
    zone and EFA for the p5en group, the GPU taint the engines tolerate, and hugepages for one
    engine pod's spec.efa.hugepages2Mi (5120Mi, the operator's default)."""
    config = yaml.safe_load(CLUSTER_CONFIG.read_text())
    addons = {addon["name"]: addon for addon in config["addons"]}
    assert json.loads(addons["vpc-cni"]["configurationValues"]) == {"enableNetworkPolicy": "true"}
    (p5en,) = [g for g in config["managedNodeGroups"] if g["instanceType"] == "p5en.48xlarge"]
    assert p5en["efaEnabled"] is True and len(p5en["availabilityZones"]) == 1
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in p5en["taints"]
    (command,) = p5en["preBootstrapCommands"]
    pages = {int(n) for n in re.findall(r"vm\.nr_hugepages\s*=\s*(\d+)", command)}
    assert pages == {5120 // 2}


def _efa_daemonset() -> dict[str, Any]:
    """eksctl's EFA device plugin DaemonSet with its image placeholder filled as eksctl does
    (account, region, domain)."""
    text = pinned_files(EKSCTL)[EKSCTL.files[1]].read_text()
    text = text.replace("%s.dkr.ecr.%s.%s", "602401143452.dkr.ecr.us-east-1.amazonaws.com")
    (daemonset,) = [d for d in _docs_of(text) if d["kind"] == "DaemonSet"]
    return daemonset


def _docs_of(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_efa_device_plugin_patch_lets_it_run_on_gpu_nodes(
    kubectl: kube.Kubectl, tmp_path: Path
) -> None:
    """The guide's patch onto eksctl's EFA DaemonSet (as `kubectl patch` applies it) keeps its
    own tolerations and adds the GPU taint's, and the API server takes the result; without
    the patch the plugin would not run on the tainted p5en nodes."""
    original = _efa_daemonset()
    source = tmp_path / "efa-device-plugin.yaml"
    source.write_text(yaml.safe_dump(original))
    before = original["spec"]["template"]["spec"]["tolerations"]
    assert not any(t.get("key") == "nvidia.com/gpu" for t in before)
    patched = kubectl.json("patch", "--local", "-f", str(source), "--patch-file", str(EFA_PATCH))
    after = patched["spec"]["template"]["spec"]["tolerations"]
    assert all(t in after for t in before)
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in after
    assert _dry_run(kubectl, json.dumps(patched)).strip() == (
        "daemonset.apps/aws-efa-k8s-device-plugin"
    )


def test_operator_values_render_and_apply(
    kubectl: kube.Kubectl, helm: kube.Tool, crds: None, namespaces: None
) -> None:
    """The chart takes the guide's values (its values.schema.json included) and the API server
    takes what it renders: the operator, its ServiceMonitor, the dashboard in the monitoring
    namespace and the PrometheusRule."""
    rendered = helm(
        "template", "disagg-operator", str(CHART), "-n", OPERATOR_NAMESPACE,
        "-f", str(OPERATOR_VALUES),
    )  # fmt: skip
    kinds = {d["kind"] for d in _docs_of(rendered)}
    assert {"Deployment", "ServiceMonitor", "PrometheusRule", "ConfigMap"} <= kinds
    values = yaml.safe_load(OPERATOR_VALUES.read_text())
    (deployment,) = [d for d in _docs_of(rendered) if d["kind"] == "Deployment"]
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"{values['image']['repository']}:{values['image']['tag']}"
    applied = _dry_run(kubectl, rendered).split()
    assert len(applied) == len(_docs_of(rendered))


def _guide_karpenter_version() -> str:
    found = set(
        re.findall(r"oci://public\.ecr\.aws/karpenter/karpenter --version (\S+)", GUIDE.read_text())
    )
    assert len(found) == 1, f"docs/eks.md should install one Karpenter version, found {found}"
    return found.pop()


def test_guide_names_the_checked_releases() -> None:
    """The Karpenter release the guide installs is the one whose CRDs the manifests are
    checked against, and the releases it says it was checked against are the pinned ones."""
    assert _guide_karpenter_version() == KARPENTER.version.removeprefix("v")
    text = GUIDE.read_text()
    for module in (EKSCTL, KARPENTER, PROMETHEUS_OPERATOR):
        assert module.version in text, f"docs/eks.md does not name {module.path} {module.version}"
