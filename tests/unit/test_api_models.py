"""The DisaggregatedModel models: defaults, derived values, and refused specs naming the field."""

from __future__ import annotations

import re

import pytest

from disagg_contract import MANAGED_VLLM_FLAGS
from disagg_operator.errors import SpecError
from disagg_operator.loading import load_resource, load_spec
from disagg_operator.models import (
    GROUP,
    KIND,
    MANAGED_FLAGS_MESSAGE,
    MAX_NAME_LENGTH,
    VERSION,
    DisaggregatedModelSpec,
)
from dmodel_samples import INVALID_SPECS, InvalidSpec, minimal_spec, resource, spec_with


def test_minimal_spec_gets_explicit_defaults() -> None:
    spec = load_spec(minimal_spec())
    assert spec.kv_transfer.bidirectional is True
    assert spec.kv_transfer.decoder_kv_blocks_ttl_seconds == 480
    assert spec.kv_transfer.recompute_threshold_tokens == 64
    assert spec.kv_transfer.side_channel_port == 5600
    assert spec.kv_transfer.load_failure_policy == "recompute"
    assert spec.kv_transfer.idle_timeout_seconds == 120
    assert spec.efa.enabled is True
    assert spec.efa.devices_per_pod == 16
    assert (spec.prefill.fixed_replicas, spec.decode.fixed_replicas) == (1, 1)
    assert (spec.prefill.replicas, spec.decode.replicas, spec.router.replicas) == (None, None, 1)
    assert (spec.prefill.autoscaling, spec.decode.autoscaling) == (None, None)
    assert spec.monitoring.pod_monitors is False
    assert spec.router.service_type == "ClusterIP"


def test_backend_defaults_follow_efa() -> None:
    assert load_spec(minimal_spec()).kv_backend == "LIBFABRIC"
    assert load_spec(spec_with({"efa": {"enabled": False}})).kv_backend == "UCX"
    assert load_spec(spec_with({"kvTransfer": {"backend": "UCX"}})).kv_backend == "UCX"


def test_router_ttl_defaults_below_decode_ttl() -> None:
    assert load_spec(minimal_spec()).conversation_ttl_seconds == 450
    spec = load_spec(spec_with({"kvTransfer": {"decoderKvBlocksTtlSeconds": 60}}))
    assert spec.conversation_ttl_seconds == 30
    explicit = spec_with({"router": {"conversationTtlSeconds": 474}})
    assert load_spec(explicit).conversation_ttl_seconds == 474


def test_gpus_per_pod_derive_from_tp_unless_set() -> None:
    spec = load_spec(spec_with({"prefill": {"tensorParallelSize": 4}}))
    assert spec.prefill.gpus == 4
    spec = load_spec(spec_with({"prefill": {"tensorParallelSize": 4, "gpusPerPod": 8}}))
    assert spec.prefill.gpus == 8


def test_served_name_and_router_image_default() -> None:
    spec = load_spec(minimal_spec())
    assert spec.model.served_model_name == "Qwen/Qwen3-0.6B"
    assert spec.router_image == spec.image
    spec = load_spec(
        spec_with(
            {"model": {"servedName": "qwen"}, "router": {"image": {"repository": "r", "tag": "t"}}}
        )
    )
    assert spec.model.served_model_name == "qwen"
    assert spec.router_image.reference == "r:t"


def test_spec_round_trips_through_camel_case_dump() -> None:
    spec = load_spec(spec_with({"prefill": {"tensorParallelSize": 2, "extraArgs": ["-O3"]}}))
    dumped = spec.model_dump(exclude_none=True)
    assert dumped["prefill"]["tensorParallelSize"] == 2
    assert DisaggregatedModelSpec.model_validate(dumped) == spec


def test_snake_case_names_are_refused() -> None:
    with pytest.raises(SpecError, match=r"spec\.prefill\.tensor_parallel_size"):
        load_spec(spec_with({"prefill": {"tensor_parallel_size": 2}}))


@pytest.mark.parametrize("case", INVALID_SPECS, ids=lambda case: case.id)
def test_invalid_spec_is_refused_naming_the_field(case: InvalidSpec) -> None:
    with pytest.raises(SpecError) as caught:
        load_spec(spec_with(case.patch))
    paths = [problem.split(": ", 1)[0] for problem in caught.value.problems]
    assert case.path in paths, caught.value.problems
    assert case.says in str(caught.value), caught.value.problems


def test_catalogue_is_large_and_covers_every_cross_field_rule() -> None:
    assert len(INVALID_SPECS) >= 20
    blamed = {case.path for case in INVALID_SPECS if case.cross_field}
    assert {
        "spec.router.conversationTtlSeconds",
        "spec.kvTransfer.backend",
        "spec.kvTransfer.recomputeThresholdTokens",
        "spec.kvTransfer.sideChannelPort",
        "spec.model.cache.pvc",
        "spec.decode.gpusPerPod",
        "spec.prefill.gpusPerPod",
        "spec.decode.nodesPerReplica",
        "spec.prefill.extraArgs",
        "spec.decode.env",
        "spec.prefill.podLabels",
        "spec.prefill.env[0].valueFrom",
        "spec.prefill.replicas",
        "spec.decode.autoscaling.minReplicas",
        "spec.decode.autoscaling.target",
        "spec.prefill.autoscaling.signal",
        "spec.decode.autoscaling.signal",
        "spec.decode.autoscaling.prometheusAddress",
        "spec.decode.autoscaling.metricName",
        "spec.router.service.annotations",
        "spec.router.service.loadBalancerSourceRanges",
        "spec.router.tenants.overrides",
        "spec.decode.podAnnotations",
        "spec.router.podLabels",
        "spec.monitoring.labels",
        "spec.router.podAnnotations",
        "spec.prefill.volumes",
        "spec.decode.volumes",
        "spec.prefill.volumes[0].name",
        "spec.decode.volumeMounts",
        "spec.prefill.volumeMounts",
        "spec.prefill.volumeMounts[0].subPath",
        "spec.prefill.topologySpreadConstraints[0].minDomains",
    } <= blamed


def test_cross_field_message_says_why() -> None:
    bad = spec_with({"router": {"conversationTtlSeconds": 476}})
    with pytest.raises(SpecError) as caught:
        load_spec(bad)
    assert caught.value.problems == [
        "spec.router.conversationTtlSeconds: must be less than "
        "spec.kvTransfer.decoderKvBlocksTtlSeconds - 5: prefill declines reads that expire "
        "within 5 s"
    ]


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("x" * (MAX_NAME_LENGTH + 1), "at most 44 characters"),
        ("Qwen", "should match pattern"),
        ("7b-model", "should match pattern"),
    ],
)
def test_resource_name_must_fit_child_names(name: str, fragment: str) -> None:
    with pytest.raises(SpecError) as caught:
        load_resource(resource(minimal_spec(), name=name))
    (problem,) = caught.value.problems
    assert problem.startswith("metadata.name: ")
    assert fragment in problem


def test_longest_name_is_accepted() -> None:
    model = load_resource(resource(minimal_spec(), name="x" * MAX_NAME_LENGTH))
    assert len(model.metadata.name) == MAX_NAME_LENGTH


def test_resource_checks_api_version_and_kind() -> None:
    model = load_resource(resource(minimal_spec()))
    assert (model.api_version, model.kind) == (f"{GROUP}/{VERSION}", KIND)
    obj = resource(minimal_spec())
    obj["apiVersion"] = "disagg.dev/v1"
    obj["kind"] = "Model"
    with pytest.raises(SpecError) as caught:
        load_resource(obj)
    paths = {problem.split(": ", 1)[0] for problem in caught.value.problems}
    assert paths == {"apiVersion", "kind"}


@pytest.mark.parametrize(
    ("args", "explained"),
    [
        (
            ["--max-model-len=10"],
            "--max-model-len is set by the operator; set spec.model.maxModelLen",
        ),
        (["-tp", "2"], "-tp is set by the operator; set tensorParallelSize (beside extraArgs)"),
        (["--disable-prefix-caching"], "is set by the operator; set prefixCaching"),
        (["--port", "9000"], "--port is set by the operator; drop it: vLLM listens on 8000"),
        (["--api-key=k"], "--api-key is set by the operator; drop it: the operator gives"),
    ],
)
def test_managed_flag_refusal_names_the_flag_and_the_spec_field(
    args: list[str], explained: str
) -> None:
    with pytest.raises(SpecError) as caught:
        load_spec(spec_with({"decode": {"extraArgs": ["--enforce-eager", *args]}}))
    (problem,) = caught.value.problems
    assert problem.startswith(f"spec.decode.extraArgs: {MANAGED_FLAGS_MESSAGE}: "), problem
    assert explained in problem, problem


def test_managed_flags_message_names_exactly_the_managed_flags() -> None:
    named = set(re.findall(r"(?<![\w-])--?[a-z][-a-z]*", MANAGED_FLAGS_MESSAGE)) - {"--flag"}
    assert named == set(MANAGED_VLLM_FLAGS)


def test_auth_takes_an_api_key_client_keys_or_both() -> None:
    both = load_spec(
        spec_with({"auth": {"apiKeySecret": {"name": "api"}, "clientKeysSecret": {"name": "c"}}})
    )
    assert both.auth is not None and both.auth.client_keys_secret is not None
    assert both.auth.api_key_secret is not None and both.auth.api_key_secret.key == "token"
    tenants = load_spec(spec_with({"auth": {"clientKeysSecret": {"name": "c"}}}))
    assert tenants.auth is not None and tenants.auth.api_key_secret is None


@pytest.mark.parametrize(
    "peer",
    [
        {"ipBlock": {"cidr": "10.0.0.0/8"}},
        {"ipBlock": {"cidr": "fd00::/8", "except": ["fd00:1::/32"]}},
        {"ipBlock": {"cidr": "10.1.2.3/8"}},
        {"podSelector": {}},
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "prometheus"}}},
        {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Exists"}]}},
    ],
    ids=["v4", "v6-except", "host-bits", "any-pod", "pods-anywhere", "expression"],
)
def test_network_peers_take_the_networkpolicy_forms(peer: dict[str, object]) -> None:
    spec = load_spec(
        spec_with({"router": {"allowedFrom": [peer]}, "decode": {"allowedFrom": [peer]}})
    )
    assert spec.router.allowed_from[0].model_dump(exclude_defaults=True) == peer
    assert spec.decode.allowed_from == spec.router.allowed_from
    assert load_spec(minimal_spec()).router.allowed_from == []


def test_a_cidr_the_pattern_admits_but_no_address_is_refused() -> None:
    with pytest.raises(SpecError) as caught:
        load_spec(spec_with({"router": {"allowedFrom": [{"ipBlock": {"cidr": "300.1.1.1/8"}}]}}))
    (problem,) = caught.value.problems
    assert problem.startswith("spec.router.allowedFrom[0].ipBlock.cidr: "), problem
    assert "CIDR" in problem


def test_offer_key_variables_are_the_operators() -> None:
    for name in ("DISAGG_OFFER_KEY_FILE", "DISAGG_OFFER_KEY"):
        with pytest.raises(SpecError) as caught:
            load_spec(spec_with({"decode": {"env": [{"name": name, "value": "x"}]}}))
        (problem,) = caught.value.problems
        assert problem.startswith("spec.decode.env: must not set operator-owned"), problem
