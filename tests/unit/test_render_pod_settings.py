"""Pod settings a platform needs (EKS: IRSA, fsGroup, priority, spreading, its own volumes):
what each does to the prefill and decode pods (a multi-node role's leaders and workers alike)
and the router's, what the models refuse with the field named, and that a spec without them
renders exactly what it rendered before they existed (no pod rolls on an operator upgrade)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from disagg_operator.errors import SpecError
from disagg_operator.loading import load_resource, load_spec
from disagg_operator.models import POD_VOLUMES
from disagg_operator.names import CONFIG_HASH_ANNOTATION, selector_labels
from disagg_operator.render import render
from dmodel_samples import EXAMPLES, load_example, patched, spec_with

Manifest = dict[str, Any]
NAME, NAMESPACE = "demo", "ml"
KUBERNETES_VERSION = kubernetes_validate.latest_version()
SPREAD_KEY = "topologySpreadConstraints"

IRSA_ROLE: dict[str, Any] = {
    "serviceAccountName": "serving",
    "podSecurityContext": {"fsGroup": 1000, "fsGroupChangePolicy": "OnRootMismatch"},
    "priorityClassName": "gpu-serving",
    "topologySpreadConstraints": [
        {"topologyKey": "kubernetes.io/hostname"},
        {
            "topologyKey": "topology.kubernetes.io/zone",
            "maxSkew": 2,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"team": "ml"}},
        },
    ],
    "volumes": [
        {"name": "aws-secrets", "csi": {
            "driver": "secrets-store.csi.k8s.io",
            "readOnly": True,
            "volumeAttributes": {"secretProviderClass": "serving"},
        }},
        {"name": "shared-weights", "persistentVolumeClaim": {"claimName": "fsx"}},
        {"name": "scratch", "emptyDir": {"sizeLimit": "10Gi"}},
    ],
    "volumeMounts": [
        {"name": "aws-secrets", "mountPath": "/mnt/secrets", "readOnly": True},
        {"name": "shared-weights", "mountPath": "/fsx", "subPath": "qwen"},
        {"name": "scratch", "mountPath": "/scratch"},
    ],
    "podAnnotations": {"example.com/team": "ml"},
    "podLabels": {"cost-center": "42"},
}  # fmt: skip
"""A role as an EKS platform would set it: its own ServiceAccount (IRSA) with an fsGroup for
the projected token, a priority, spreading, secrets from AWS through the CSI driver, an FSx
claim and a scratch folder."""
ROUTER: dict[str, Any] = {
    "priorityClassName": "serving-front",
    "topologySpreadConstraints": [{"topologyKey": "topology.kubernetes.io/zone", "minDomains": 3}],
    "podAnnotations": {"example.com/team": "ml"},
    "podLabels": {"cost-center": "42"},
}


def _objects(patch: dict[str, Any]) -> dict[str, Manifest]:
    spec = load_spec(spec_with(patch))
    return {f"{m['kind']}/{m['metadata']['name']}": m for m in render(NAME, NAMESPACE, spec)}


def _template(objects: dict[str, Manifest], kind: str, component: str) -> dict[str, Any]:
    template: dict[str, Any] = objects[f"{kind}/{NAME}-{component}"]["spec"]["template"]
    return template


def _pod_templates(manifests: list[Manifest]) -> list[dict[str, Any]]:
    """Every pod template of the rendered workloads (a LeaderWorkerSet's leader and worker)."""
    templates = []
    for manifest in manifests:
        if manifest["kind"] in ("StatefulSet", "Deployment"):
            templates.append(manifest["spec"]["template"])
        elif manifest["kind"] == "LeaderWorkerSet":
            group = manifest["spec"]["leaderWorkerTemplate"]
            templates += [group["leaderTemplate"], group["workerTemplate"]]
    return templates


def test_role_pods_carry_the_roles_settings() -> None:
    objects = _objects({"prefill": IRSA_ROLE})
    template = _template(objects, "StatefulSet", "prefill")
    pod = template["spec"]
    assert pod["serviceAccountName"] == "serving"
    assert pod["securityContext"] == {"fsGroup": 1000, "fsGroupChangePolicy": "OnRootMismatch"}
    assert pod["priorityClassName"] == "gpu-serving"
    assert pod[SPREAD_KEY] == [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": selector_labels(NAME, "prefill")},
        },
        {
            "maxSkew": 2,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"team": "ml"}},
        },
    ]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert list(volumes)[: len(POD_VOLUMES)] == list(POD_VOLUMES)
    assert volumes["aws-secrets"]["csi"] == {
        "driver": "secrets-store.csi.k8s.io",
        "readOnly": True,
        "volumeAttributes": {"secretProviderClass": "serving"},
    }
    assert volumes["shared-weights"] == {
        "name": "shared-weights",
        "persistentVolumeClaim": {"claimName": "fsx"},
    }
    assert volumes["scratch"] == {"name": "scratch", "emptyDir": {"sizeLimit": "10Gi"}}
    (container,) = pod["containers"]
    mounts = container["volumeMounts"][len(POD_VOLUMES) :]
    assert mounts == [
        {"name": "aws-secrets", "mountPath": "/mnt/secrets", "readOnly": True},
        {"name": "shared-weights", "mountPath": "/fsx", "subPath": "qwen"},
        {"name": "scratch", "mountPath": "/scratch"},
    ]
    assert template["metadata"]["annotations"]["example.com/team"] == "ml"
    assert template["metadata"]["labels"]["cost-center"] == "42"


def test_one_roles_settings_leave_the_other_children_untouched() -> None:
    before, after = _objects({}), _objects({"prefill": IRSA_ROLE})
    changed = sorted(key for key in before if before[key] != after[key])
    assert changed == [f"StatefulSet/{NAME}-prefill"]


def test_a_multi_node_roles_leaders_and_workers_both_carry_them() -> None:
    role = {**IRSA_ROLE, "tensorParallelSize": 16, "nodesPerReplica": 2}
    lws = _objects({"decode": role})[f"LeaderWorkerSet/{NAME}-decode"]
    group = lws["spec"]["leaderWorkerTemplate"]
    for template in (group["leaderTemplate"], group["workerTemplate"]):
        pod = template["spec"]
        assert pod["serviceAccountName"] == "serving"
        assert pod["securityContext"]["fsGroup"] == 1000
        assert pod[SPREAD_KEY][0]["labelSelector"] == {
            "matchLabels": selector_labels(NAME, "decode")
        }
        assert {"name": "scratch", "mountPath": "/scratch"} in pod["containers"][0]["volumeMounts"]


def test_router_pods_carry_the_routers_settings_and_keep_their_service_account() -> None:
    objects = _objects({"router": ROUTER, "prefill": IRSA_ROLE})
    template = _template(objects, "Deployment", "router")
    pod = template["spec"]
    assert pod["serviceAccountName"] == f"{NAME}-router"
    assert pod["priorityClassName"] == "serving-front"
    assert pod[SPREAD_KEY] == [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "minDomains": 3,
            "labelSelector": {"matchLabels": selector_labels(NAME, "router")},
        }
    ]
    assert template["metadata"]["annotations"] == {"example.com/team": "ml"}
    assert template["metadata"]["labels"] == {
        "cost-center": "42",
        **objects[f"Deployment/{NAME}-router"]["metadata"]["labels"],
    }
    assert "securityContext" not in pod


def test_pod_security_context_renders_only_what_is_set() -> None:
    context = {"runAsUser": 1000, "runAsGroup": 0, "runAsNonRoot": False,
               "supplementalGroups": [5, 6]}  # fmt: skip
    pod = _template(_objects({"decode": {"podSecurityContext": context}}), "StatefulSet", "decode")
    assert pod["spec"]["securityContext"] == context


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_a_spec_without_the_settings_adds_no_key_to_any_pod(path: Path) -> None:
    model = load_resource(load_example(path))
    name = model.metadata.name
    templates = _pod_templates(render(name, model.metadata.namespace, model.spec))
    assert len(templates) >= 3
    for template in templates:
        pod = template["spec"]
        assert "priorityClassName" not in pod and SPREAD_KEY not in pod, pod
        assert "securityContext" not in pod, pod
        if pod["containers"][0]["name"] == "router":
            assert pod["serviceAccountName"] == f"{name}-router"
            assert "annotations" not in template["metadata"]
        else:
            assert "serviceAccountName" not in pod
            assert [volume["name"] for volume in pod["volumes"]] == list(POD_VOLUMES)
            assert list(template["metadata"]["annotations"]) == [CONFIG_HASH_ANNOTATION]


def test_the_settings_given_empty_render_as_if_unset() -> None:
    """Explicit empty values (as a GitOps tool may write them) change no pod either."""
    example = load_example(EXAMPLES[0])
    empty = {"volumes": [], "volumeMounts": [], SPREAD_KEY: [], "podAnnotations": {},
             "podLabels": {}}  # fmt: skip
    router = {SPREAD_KEY: [], "podAnnotations": {}, "podLabels": {}}
    given = patched(example, {"spec": {"prefill": empty, "decode": empty, "router": router}})
    renders = []
    for obj in (example, given):
        model = load_resource(obj)
        renders.append(render(model.metadata.name, model.metadata.namespace, model.spec))
    assert renders[0] == renders[1]


def test_pods_with_every_setting_validate_against_kubernetes_schema() -> None:
    patch = {"prefill": IRSA_ROLE, "decode": IRSA_ROLE, "router": ROUTER}
    for manifest in _objects(patch).values():
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    volumes = [{"name": "a", "secret": {"secretName": "s", "optional": True, "defaultMode": 256}},
               {"name": "b", "configMap": {"name": "c", "defaultMode": 292}},
               {"name": "c", "hostPath": {"path": "/var/run/x", "type": "Socket"}},
               {"name": "d", "emptyDir": {"medium": "Memory"}}]  # fmt: skip
    mounts = [{"name": v["name"], "mountPath": f"/mnt/{v['name']}"} for v in volumes]
    for manifest in _objects({"decode": {"volumes": volumes, "volumeMounts": mounts}}).values():
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize(
    ("patch", "problem"),
    [
        (
            {"prefill": {"volumes": [{"name": "model-cache", "emptyDir": {}}]}},
            "spec.prefill.volumes: must not use a volume name the operator gives every pod "
            "(connector-config, offer-key, model-cache, dshm, model-source): pick another name: "
            "refused "
            "model-cache",
        ),
        (
            {"decode": {"volumes": [{"name": "x", "emptyDir": {}}] * 2}},
            "spec.decode.volumes: each volume name must be unique in the role: given twice: x",
        ),
        (
            {"decode": {"volumeMounts": [{"name": "x", "mountPath": "/x"}]}},
            "spec.decode.volumeMounts: each mount must name one of the role's volumes "
            "(spec.<role>.volumes): no volume x",
        ),
        (
            {
                "prefill": {
                    "volumes": [{"name": "x", "emptyDir": {}}],
                    "volumeMounts": [{"name": "x", "mountPath": "/x"}] * 2,
                }
            },
            "spec.prefill.volumeMounts: each mountPath must be unique in the role: given twice: /x",
        ),
    ],
)
def test_models_say_which_item_collides(patch: dict[str, Any], problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        load_spec(spec_with(patch))
    assert caught.value.problems == [problem]


def test_mounts_below_the_operators_folder_are_refused_and_beside_it_kept() -> None:
    beside = {"volumes": [{"name": "x", "emptyDir": {}}],
              "volumeMounts": [{"name": "x", "mountPath": "/etc/disagg-extra"}]}  # fmt: skip
    assert load_spec(spec_with({"prefill": beside})).prefill.volume_mounts[0].name == "x"
    below = patched(beside, {"volumeMounts": [{"name": "x", "mountPath": "/etc/disagg/x"}]})
    with pytest.raises(SpecError, match=r"spec\.prefill\.volumeMounts: must not mount"):
        load_spec(spec_with({"prefill": below}))
