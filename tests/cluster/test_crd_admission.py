"""The DisaggregatedModel CRD on a real API server: it installs, defaults like the models, and
refuses every invalid spec of the unit catalogue with the offending field named.

The rendered children of both examples are also created (server-side dry run), so the API
server, not only the OpenAPI schema, accepts what `disagg render` prints.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kube

# The sample CRs and the invalid-spec catalogue are shared with the unit tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from disagg_operator.loading import load_resource, load_spec
from disagg_operator.models import (
    MAX_MULTI_NODE_NAME_LENGTH,
    MULTI_NODE_NAME_MESSAGE,
    DisaggregatedModelStatus,
)
from disagg_operator.render import render
from dmodel_samples import (
    EXAMPLES,
    INVALID_SPECS,
    LEGIT_EXTRA_ARGS,
    InvalidSpec,
    load_example,
    minimal_spec,
    resource,
    spec_with,
)
from gen_crd import CRD_NAME, CRD_PATH


@pytest.fixture(scope="module")
def crd(kubectl: kube.Kubectl) -> str:
    """The generated CRD applied and Established."""
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_PATH))
    kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    return CRD_NAME


@pytest.fixture(scope="module")
def crd_namespace(kubectl: kube.Kubectl, crd: str) -> Iterator[str]:
    """One namespace for the whole module (the cases only dry-run or create small objects)."""
    name = kube.namespace_name("crd-admission")
    kubectl("create", "namespace", name)
    yield name
    kubectl("delete", "namespace", name, "--wait=false")


def _create(
    kubectl: kube.Kubectl, namespace: str, obj: dict[str, Any], *, dry_run: bool = True
) -> tuple[int, str]:
    obj = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
    args = ["create", "-n", namespace, "--validate=strict", "-f", "-"]
    if dry_run:
        args.append("--dry-run=server")
    proc = kubectl.run(*args, input=json.dumps(obj), check=False)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("case", INVALID_SPECS, ids=lambda case: case.id)
def test_api_server_refuses_invalid_spec_naming_the_field(
    kubectl: kube.Kubectl, crd_namespace: str, case: InvalidSpec
) -> None:
    code, out = _create(kubectl, crd_namespace, resource(spec_with(case.patch)))
    assert code != 0, out
    assert case.path in out, out
    assert case.says in out, out


def test_api_server_accepts_vllm_flags_beside_the_managed_ones(
    kubectl: kube.Kubectl, crd_namespace: str
) -> None:
    roles = {"extraArgs": LEGIT_EXTRA_ARGS}
    code, out = _create(
        kubectl, crd_namespace, resource(spec_with({"prefill": roles, "decode": roles}))
    )
    assert code == 0, out


@pytest.mark.parametrize("name", ["x" * 45, "Upper"])
def test_api_server_refuses_names_children_cannot_carry(
    kubectl: kube.Kubectl, crd_namespace: str, name: str
) -> None:
    code, out = _create(kubectl, crd_namespace, resource(minimal_spec(), name=name))
    assert code != 0 and "metadata.name" in out, out


def test_api_server_refuses_a_multi_node_name_its_groups_labels_cannot_carry(
    kubectl: kube.Kubectl, crd_namespace: str
) -> None:
    spec = spec_with({"prefill": {"tensorParallelSize": 16, "nodesPerReplica": 2}})
    longest = "x" * MAX_MULTI_NODE_NAME_LENGTH
    code, out = _create(kubectl, crd_namespace, resource(spec, name=longest + "x"))
    assert code != 0 and f"metadata.name: Invalid value: {MULTI_NODE_NAME_MESSAGE}" in out, out
    code, out = _create(kubectl, crd_namespace, resource(spec, name=longest))
    assert code == 0, out
    code, out = _create(kubectl, crd_namespace, resource(minimal_spec(), name=longest + "x"))
    assert code == 0, out


def test_cross_field_messages_are_the_models(kubectl: kube.Kubectl, crd_namespace: str) -> None:
    bad = resource(spec_with({"router": {"conversationTtlSeconds": 476}}))
    code, out = _create(kubectl, crd_namespace, bad)
    assert code != 0
    assert (
        "spec.router.conversationTtlSeconds: Invalid value: must be less than "
        "spec.kvTransfer.decoderKvBlocksTtlSeconds - 5" in out
    ), out


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_examples_are_stored_with_the_models_defaults(
    kubectl: kube.Kubectl, crd_namespace: str, path: Path
) -> None:
    example = load_example(path)
    code, out = _create(kubectl, crd_namespace, example, dry_run=False)
    assert code == 0, out
    stored = kubectl.json("get", "-n", crd_namespace, "dmodel", example["metadata"]["name"])
    assert load_resource(stored).spec == load_spec(example["spec"])


def test_server_defaults_equal_model_defaults(kubectl: kube.Kubectl, crd_namespace: str) -> None:
    obj = resource(minimal_spec(), name="defaults")
    code, out = _create(kubectl, crd_namespace, obj, dry_run=False)
    assert code == 0, out
    stored = kubectl.json("get", "-n", crd_namespace, "dmodel", "defaults")
    assert stored["spec"]["kvTransfer"]["decoderKvBlocksTtlSeconds"] == 480
    assert stored["spec"]["prefill"]["tensorParallelSize"] == 1
    assert load_resource(stored).spec == load_spec(minimal_spec())


def test_status_subresource_and_printer_columns(kubectl: kube.Kubectl, crd_namespace: str) -> None:
    code, out = _create(
        kubectl, crd_namespace, resource(minimal_spec(), name="shown"), dry_run=False
    )
    assert code == 0, out
    status = DisaggregatedModelStatus.model_validate(
        {
            "observedGeneration": 1,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "AllReplicasReady",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
            "prefill": {"desiredReplicas": 1, "readyReplicas": 1},
            "decode": {"desiredReplicas": 1, "readyReplicas": 0},
            "connectorConfigHash": "0123456789abcdef",
            "reuse": {
                "hitRatio": "40.0%",
                "turns": 5,
                "hits": 2,
                "reusedTokens": 4096,
                "recomputedTokens": 1024,
                "leasesHeld": 3,
                "routers": 1,
                "observedAt": "2026-01-01T00:00:00Z",
                "stale": True,
                "message": "no reading since 2026-01-01T00:00:00Z: connection refused",
            },
        }
    )
    patch = json.dumps({"status": status.model_dump(exclude_none=True)})
    kubectl(
        "patch",
        "-n",
        crd_namespace,
        "dmodel",
        "shown",
        "--subresource=status",
        "--type=merge",
        "-p",
        patch,
    )
    stored = kubectl.json("get", "-n", crd_namespace, "dmodel", "shown")
    assert DisaggregatedModelStatus.model_validate(stored["status"]) == status
    table = kubectl("get", "-n", crd_namespace, "dmodel", "shown").splitlines()
    assert table[0].split() == [
        "NAME", "READY", "PREFILL", "DECODE", "BIDIR", "TTL", "REUSE", "AGE"
    ]  # fmt: skip
    assert table[1].split()[:7] == ["shown", "True", "1", "0", "true", "480", "40.0%"]
    short = kubectl("get", "-n", crd_namespace, "dmodel", "-o", "name").split()
    assert "disaggregatedmodel.disagg.dev/shown" in short


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_rendered_children_are_accepted_by_the_api_server(
    kubectl: kube.Kubectl, crd_namespace: str, path: Path
) -> None:
    model = load_resource(load_example(path))
    manifests = render(model.metadata.name, crd_namespace, model.spec)
    out = kubectl.apply(manifests, "--dry-run=server", "--validate=strict")
    assert out.count("(server dry run)") == len(manifests), out
