"""The models and the CRD (schema + CEL) accept exactly the same specs.

Hypothesis draws specs around every rule's boundary; a spec the models accept must pass the
emulated API-server admission and vice versa, so `disagg render` and `kubectl apply` never
disagree about what is valid.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crd_admission import admission_errors
from disagg_operator.errors import SpecError
from disagg_operator.loading import load_spec
from dmodel_samples import resource, spec_with


def _role() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {},
        optional={
            "tensorParallelSize": st.sampled_from([0, 1, 4, 8]),
            "gpusPerPod": st.sampled_from([1, 4, 8, 9]),
            "replicas": st.sampled_from([-1, 0, 2]),
            "extraArgs": st.lists(
                st.sampled_from(
                    [
                        "--enforce-eager",
                        "-tp",
                        "-t",
                        "--port=9",
                        "--portal",
                        "--dtype",
                        "--max_model=1",
                        "--kv-transfer-config.kv_role",
                        "--disable-prefix",
                        "--api_k",
                        "--api-key=k",
                        "--api-server-count",
                        "--max-num-batched-tokens",
                        "--",
                        "-",
                        "=x",
                    ]
                ),
                max_size=2,
            ),
            "env": st.lists(
                st.fixed_dictionaries(
                    {"name": st.sampled_from(["A", "PYTHONHASHSEED", "HF_HOME", "1BAD"])},
                    optional={
                        "value": st.just("v"),
                        "valueFrom": st.just({"fieldRef": {"fieldPath": "status.podIP"}}),
                    },
                ),
                max_size=2,
            ),
            "podLabels": _pod_labels(),
            "podAnnotations": _pod_annotations(),
            "volumes": st.lists(_volume(), max_size=2),
            "volumeMounts": st.lists(_volume_mount(), max_size=2),
            "topologySpreadConstraints": st.lists(_spread(), max_size=1),
        },
    )


def _pod_labels() -> st.SearchStrategy[dict[str, str]]:
    return st.dictionaries(
        st.sampled_from(["team", "app.kubernetes.io/name"]), st.just("x"), max_size=2
    )


def _pod_annotations() -> st.SearchStrategy[dict[str, str]]:
    return st.dictionaries(
        st.sampled_from(["team", "disagg.dev/config-hash", "example.com/disagg.dev"]),
        st.just("x"),
        max_size=2,
    )


VOLUME_SOURCES: list[dict[str, Any]] = [
    {"emptyDir": {}},
    {"secret": {"secretName": "s"}},
    {},
    {"emptyDir": {}, "csi": {"driver": "secrets-store.csi.k8s.io"}},
]
"""A volume's sources around the one-source rule."""
MOUNT_PATHS = ["/data", "/models", "/models/", "/etc/disagg", "/etc/disagg/x", "/etc/disaggx",
               "/dev/shm", "/dev/shm/", "/dev/shmx", "/cache"]  # fmt: skip
"""Mount paths around the operator's (the model cache's is /models unless a case moves it)."""


def _volume() -> st.SearchStrategy[dict[str, Any]]:
    name = st.sampled_from(["a", "b", "dshm", "model-cache"])
    return st.builds(lambda n, source: {"name": n, **source}, name, st.sampled_from(VOLUME_SOURCES))


def _volume_mount() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"name": st.sampled_from(["a", "b"]), "mountPath": st.sampled_from(MOUNT_PATHS)},
        optional={"subPath": st.sampled_from(["x", "x/y", "../x", "x/..", "/x", "..x"])},
    )


def _spread() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"topologyKey": st.just("topology.kubernetes.io/zone")},
        optional={
            "whenUnsatisfiable": st.sampled_from(["DoNotSchedule", "ScheduleAnyway"]),
            "minDomains": st.sampled_from([0, 1, 3]),
        },
    )


def _router_service() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {},
        optional={
            "annotations": st.dictionaries(
                st.sampled_from(
                    [
                        "service.beta.kubernetes.io/aws-load-balancer-scheme",
                        "service.beta.kubernetes.io/load-balancer-source-ranges",
                        "disagg.dev/applied-hash",
                        "example.com/disagg.dev/x",
                    ]
                ),
                st.just("x"),
                max_size=2,
            ),
            "loadBalancerSourceRanges": st.lists(
                st.sampled_from(["10.0.0.0/8", "fd00::/8", "10.0.0.0"]), max_size=2
            ),
        },
    )


def _http_route() -> st.SearchStrategy[dict[str, Any]]:
    """Routes around Gateway API's rules: refs repeating one Gateway with and without
    listeners, namespaces and hostnames that are and are not DNS names."""
    parent = st.fixed_dictionaries(
        {"name": st.sampled_from(["public", "internal"])},
        optional={
            "namespace": st.sampled_from(["gateways", "Gateways"]),
            "sectionName": st.sampled_from(["http", "https", "h_1"]),
        },
    )
    hostname = st.sampled_from(["llm.example.com", "*.example.com", "a.*.com", "Example.com", ""])
    return st.fixed_dictionaries(
        {"parentRefs": st.lists(parent, max_size=3)},
        optional={"hostnames": st.lists(hostname, max_size=2)},
    )


TENANT_NAMES = ["team-a", "default", ".x", "..data", ".", "a/b", "a:b", "x" * 253, "y" * 254, "é"]
"""Tenant names around the Secret-key rule: kept, and refused by what a key may not be."""


def _router_tenants() -> st.SearchStrategy[dict[str, Any]]:
    requests = st.sampled_from([0, 1, 1024, 1025])
    conversations = st.sampled_from([0, 1, 10_000_000, 10_000_001])
    override = st.fixed_dictionaries(
        {}, optional={"requests": requests, "conversations": conversations}
    )
    return st.fixed_dictionaries(
        {},
        optional={
            "maxRequestsPerTenant": requests,
            "maxConversationsPerTenant": conversations,
            "overrides": st.dictionaries(st.sampled_from(TENANT_NAMES), override, max_size=2),
        },
    )


SOURCES = [
    "hf://Qwen/Qwen3-32B",
    "hf://gpt2",
    "hf://a/b/c",
    "s3://models/qwen3/32b",
    "s3://models",
    "s3://Models/x",
    "s3://m/x",
    "pvc://weights/qwen3",
    "pvc://weights",
    "pvc://Weights/x",
    "gs://models/x",
    "/models/x",
    "",
]
"""Model sources around the URI rule: each scheme's accepted forms and near misses."""


SPEC_PATCHES = st.fixed_dictionaries(
    {},
    optional={
        "model": st.fixed_dictionaries(
            {},
            optional={
                "maxModelLen": st.sampled_from([8, 16, 64, 65, 1024]),
                "source": st.sampled_from(SOURCES),
                "s3": st.sampled_from([{}, {"endpoint": "http://10.0.0.1:7070", "region": "x"}]),
                "startupBudgetSeconds": st.sampled_from([59, 60, 86400, 86401]),
                "weightsSize": st.sampled_from(["750Gi", "1.5T", "-1", 0]),
                "cache": st.fixed_dictionaries(
                    {},
                    optional={
                        "pvc": st.just({"claimName": "c"}),
                        "hostPath": st.sampled_from([{"path": "/d"}, {"path": "d"}]),
                        "mountPath": st.sampled_from(["/models", "/cache"]),
                    },
                ),
            },
        ),
        "prefill": _role(),
        "decode": _role(),
        "kvTransfer": st.fixed_dictionaries(
            {},
            optional={
                "bidirectional": st.booleans(),
                "decoderKvBlocksTtlSeconds": st.sampled_from([59, 60, 100, 480]),
                "recomputeThresholdTokens": st.sampled_from([0, 1, 64, 65, 1024]),
                "backend": st.sampled_from(["LIBFABRIC", "UCX", "TCP"]),
                "sideChannelPort": st.sampled_from([5600, 5700, 8000, 0]),
                "idleTimeoutSeconds": st.sampled_from([0, 9, 10, 120, 86400, 86401]),
            },
        ),
        "router": st.fixed_dictionaries(
            {},
            optional={
                "conversationTtlSeconds": st.sampled_from([0, 1, 54, 55, 94, 95, 474, 475]),
                "serviceType": st.sampled_from(["ClusterIP", "LoadBalancer"]),
                "service": _router_service(),
                "httpRoute": _http_route(),
                "headerTimeoutSeconds": st.sampled_from([0, 1, 10, 300, 301]),
                "tenants": _router_tenants(),
                "podLabels": _pod_labels(),
                "podAnnotations": _pod_annotations(),
                "topologySpreadConstraints": st.lists(_spread(), max_size=1),
            },
        ),
        "auth": st.just({"clientKeysSecret": {"name": "clients"}}),
        "efa": st.fixed_dictionaries({}, optional={"enabled": st.booleans()}),
    },
)


def _model_accepts(spec: dict[str, Any]) -> bool:
    try:
        load_spec(spec)
    except SpecError:
        return False
    return True


# cel-python's parser raises the recursion limit on first use, which hypothesis reports.
@pytest.mark.filterwarnings("ignore:The recursion limit will not be reset")
@settings(max_examples=300, deadline=None)
@given(SPEC_PATCHES)
def test_models_and_crd_accept_the_same_specs(patch: dict[str, Any]) -> None:
    spec = spec_with(patch)
    errors = admission_errors(resource(spec))
    assert _model_accepts(spec) == (errors == []), errors
