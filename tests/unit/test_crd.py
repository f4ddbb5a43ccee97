"""The generated CRD: current, structural, and refusing what the models refuse."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import celpy
import pytest
import yaml

from crd_admission import (
    CEL_RESERVED,
    admission_errors,
    apply_defaults,
    cel_failures,
    root_schema,
)
from disagg_operator.base import ApiModel
from disagg_operator.errors import SpecError
from disagg_operator.loading import load_resource, load_spec
from disagg_operator.models import MAX_MULTI_NODE_NAME_LENGTH, MULTI_NODE_NAME_MESSAGE
from dmodel_samples import (
    ADMITTED_MANAGED_SPELLINGS,
    EXAMPLES,
    HTTP_ROUTE,
    INVALID_SPECS,
    LEGIT_EXTRA_ARGS,
    ROUTER_TENANTS,
    InvalidSpec,
    load_example,
    minimal_spec,
    resource,
    spec_with,
)
from gen_crd import CRD_PATH, crd_yaml, main

Schema = dict[str, Any]


def _nodes(schema: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from _nodes(prop, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


def _rule_models() -> list[type[ApiModel]]:
    found: list[type[ApiModel]] = []
    pending: list[type[ApiModel]] = [ApiModel]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        found.extend(sub for sub in cls.__subclasses__() if sub.rules)
    return found


def test_committed_crd_is_current() -> None:
    assert CRD_PATH.read_text() == crd_yaml(), "crds/ is stale: run `make crds`"
    assert main(["--check"]) == 0


def test_check_fails_on_a_stale_file(tmp_path: Any) -> None:
    stale = tmp_path / "crd.yaml"
    stale.write_text(crd_yaml().replace("dmodel", "dm"))
    assert main(["--check", "--path", str(stale)]) == 1


def test_names_scope_and_subresources() -> None:
    crd = yaml.safe_load(crd_yaml())
    assert crd["metadata"]["name"] == "disaggregatedmodels.disagg.dev"
    spec = crd["spec"]
    assert (spec["group"], spec["scope"]) == ("disagg.dev", "Namespaced")
    assert spec["names"]["plural"] == "disaggregatedmodels"
    assert spec["names"]["shortNames"] == ["dmodel"]
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def test_printer_columns_point_at_declared_fields() -> None:
    version = yaml.safe_load(crd_yaml())["spec"]["versions"][0]
    columns = {col["name"]: col["jsonPath"] for col in version["additionalPrinterColumns"]}
    assert list(columns) == ["Ready", "Prefill", "Decode", "Bidir", "TTL", "Reuse", "Age"]
    paths = {path for path, _ in _nodes(root_schema())}
    for name, json_path in columns.items():
        if name in ("Ready", "Age"):
            continue
        assert json_path in paths, json_path
    assert ".status.conditions[].type" in paths


def test_schema_is_structural() -> None:
    for path, node in _nodes(root_schema()):
        assert not {"$ref", "$defs", "allOf", "oneOf", "not", "nullable", "title"} & set(node)
        if node.get("x-kubernetes-int-or-string"):
            assert node.get("anyOf") == [{"type": "integer"}, {"type": "string"}], path
            continue
        assert "anyOf" not in node, path
        types = {"object", "array", "string", "integer", "number", "boolean"}
        assert node.get("type") in types, path
        if node.get("x-kubernetes-preserve-unknown-fields"):
            assert node["type"] == "object" and "properties" not in node, path


def test_every_spec_and_status_field_is_described() -> None:
    schema = root_schema()
    for section in ("spec", "status"):
        for path, node in _nodes(schema["properties"][section], section):
            if not path.endswith(("[]", "{}")):
                assert node.get("description"), f"{path} has no description"


def test_strings_and_lists_are_bounded_for_cel_cost() -> None:
    for path, node in _nodes(root_schema()["properties"]["spec"], "spec"):
        if node.get("type") == "string" and "enum" not in node:
            assert "maxLength" in node, path
        if node.get("type") == "array":
            assert "maxItems" in node, path
        if node.get("type") == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, path


def test_rules_read_reserved_word_properties_by_their_escaped_names() -> None:
    """The API server hands CEL a property named like a CEL reserved word (`namespace`) as
    `__namespace__`; a rule reading it plainly fails its cost estimate, and the CRD with it."""
    plain = re.compile(rf"\.({'|'.join(sorted(CEL_RESERVED))})\b")
    for path, node in _nodes(root_schema()):
        for rule in node.get("x-kubernetes-validations", []):
            assert not plain.search(rule["rule"]), f"{path}: {rule['rule']}"


def test_every_model_rule_is_a_cel_rule_with_the_same_message() -> None:
    validations = [
        rule
        for _, node in _nodes(root_schema())
        for rule in node.get("x-kubernetes-validations", [])
    ]
    models = _rule_models()
    assert len(models) >= 5
    for model in models:
        for rule in model.rules:
            wanted = {"rule": rule.cel, "message": rule.message, "fieldPath": f".{rule.field}"}
            assert wanted in validations, f"{model.__name__}.{rule.field} lacks its CEL rule"


def test_every_cel_rule_compiles() -> None:
    env = celpy.Environment()
    for _, node in _nodes(root_schema()):
        for rule in node.get("x-kubernetes-validations", []):
            env.compile(rule["rule"])


def test_defaults_pass_their_own_rules() -> None:
    """The API server checks each `default` as written (nested defaults not applied)."""
    checked = 0
    for path, node in _nodes(root_schema()):
        if "default" in node and node.get("x-kubernetes-validations"):
            assert list(cel_failures(node["default"], node, [path])) == [], path
            checked += 1
    assert checked >= 3


def test_crd_defaults_match_model_defaults() -> None:
    schema = root_schema()["properties"]["spec"]
    defaulted = apply_defaults(copy.deepcopy(minimal_spec()), schema)
    assert defaulted["kvTransfer"]["decoderKvBlocksTtlSeconds"] == 480
    assert defaulted["prefill"]["tensorParallelSize"] == 1
    assert load_spec(defaulted) == load_spec(minimal_spec())


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_examples_are_admitted(path: Any) -> None:
    assert admission_errors(load_example(path)) == []


def test_minimal_resource_is_admitted() -> None:
    assert admission_errors(resource(minimal_spec())) == []


@pytest.mark.parametrize("case", INVALID_SPECS, ids=lambda case: case.id)
def test_crd_refuses_invalid_spec_naming_the_field(case: InvalidSpec) -> None:
    errors = admission_errors(resource(spec_with(case.patch)))
    assert case.path in [error.split(": ", 1)[0] for error in errors], errors
    assert any(case.says in error for error in errors), errors


@pytest.mark.parametrize(
    "case", [case for case in INVALID_SPECS if case.cross_field], ids=lambda case: case.id
)
def test_cel_rule_refuses_what_the_model_validator_refuses(case: InvalidSpec) -> None:
    schema = root_schema()["properties"]["spec"]
    spec = apply_defaults(spec_with(case.patch), schema)
    failures = list(cel_failures(spec, schema, ["spec"]))
    assert [failure.split(": ", 1)[0] for failure in failures] == [case.path]


@pytest.mark.parametrize(
    "patch",
    [
        {"router": {"conversationTtlSeconds": 474}},
        {"efa": {"enabled": False}, "kvTransfer": {"backend": "UCX"}},
        {"model": {"maxModelLen": 1024}, "kvTransfer": {"recomputeThresholdTokens": 1023}},
        {"model": {"maxModelLen": 64}, "kvTransfer": {"bidirectional": False}},
        {"decode": {"tensorParallelSize": 4, "gpusPerPod": 4}},
        {"decode": {"tensorParallelSize": 4, "pipelineParallelSize": 1, "gpusPerPod": 8}},
        {"prefill": {"tensorParallelSize": 8, "nodesPerReplica": 2}},
        {"prefill": {"tensorParallelSize": 16}, "decode": {"tensorParallelSize": 4}},
        {"prefill": {"tensorParallelSize": 2}, "decode": {"tensorParallelSize": 8}},
        {"decode": {"tensorParallelSize": 16, "nodesPerReplica": 2, "groupTopologyKey": "pg"}},
        {"decode": {"tensorParallelSize": 16, "nodesPerReplica": 2, "gpusPerPod": 8}},
        {"decode": {"tensorParallelSize": 16, "nodesPerReplica": 2}, "efa": {"enabled": False}},
        {"prefill": {"extraArgs": ["--enforce-eager", "--portal=x"], "podLabels": {"team": "a"}}},
        {"decode": {"extraArgs": ["--api-server-count", "2"]}},
        {"prefill": {"extraArgs": LEGIT_EXTRA_ARGS}, "decode": {"extraArgs": LEGIT_EXTRA_ARGS}},
        {"decode": {"extraArgs": ADMITTED_MANAGED_SPELLINGS}},
        {"auth": {"apiKeySecret": {"name": "api-key"}}},
        {"model": {"cache": {"hostPath": {"path": "/data"}}}},
        {
            "router": {
                "serviceType": "LoadBalancer",
                "service": {
                    "annotations": {"example.com/disagg.dev/x": "y", "disagg.dev": "z"},
                    "loadBalancerSourceRanges": ["10.0.0.0/8", "fd00::/8"],
                },
            }
        },
        {"router": {"service": {"loadBalancerSourceRanges": []}}},
        ROUTER_TENANTS,
        {
            "auth": {"apiKeySecret": {"name": "api-key"}},
            "router": {
                "headerTimeoutSeconds": 300,
                "tenants": {
                    "maxRequestsPerTenant": 1024,
                    "overrides": {".x": {"requests": 1}, "x" * 253: {"conversations": 1}},
                },
            },
        },
        {"router": {"tenants": {"maxRequestsPerTenant": 1, "overrides": {}}}},
        {"router": {"httpRoute": HTTP_ROUTE}},
        {
            "router": {
                "httpRoute": {
                    "parentRefs": [
                        {"name": "public", "sectionName": "http"},
                        {"name": "public", "sectionName": "https"},
                        {"name": "public", "namespace": "gateways"},
                        {"name": "internal", "sectionName": "http"},
                    ],
                    "hostnames": ["*.example.com", "example.com", "x" * 253],
                }
            }
        },
    ],
)
def test_cel_and_models_accept_the_edge_of_each_rule(patch: dict[str, Any]) -> None:
    load_spec(spec_with(patch))
    assert admission_errors(resource(spec_with(patch))) == []


def test_crd_refuses_long_and_malformed_names() -> None:
    for name in ("x" * 45, "Upper"):
        errors = admission_errors(resource(minimal_spec(), name=name))
        assert [error.split(": ", 1)[0] for error in errors] == ["metadata.name"]


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_multi_node_model_name_leaves_room_for_its_groups_labels(role: str) -> None:
    spec = spec_with({role: {"tensorParallelSize": 16, "nodesPerReplica": 2}})
    longest = "x" * MAX_MULTI_NODE_NAME_LENGTH
    assert admission_errors(resource(spec, name=longest)) == []
    load_resource(resource(spec, name=longest))
    assert admission_errors(resource(minimal_spec(), name=longest + "xxx")) == []
    errors = admission_errors(resource(spec, name=longest + "x"))
    assert errors == [f"metadata.name: {MULTI_NODE_NAME_MESSAGE}"]
    with pytest.raises(SpecError, match=f"metadata.name: must be at most {len(longest)} "):
        load_resource(resource(spec, name=longest + "x"))
