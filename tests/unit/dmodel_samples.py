"""DisaggregatedModel samples shared by the API, CRD and rendering tests.

`INVALID_SPECS` is the catalogue of refused specs: each case patches a minimal valid spec and
names the field path every layer (models, CRD schema + CEL) must blame.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

DELETE = object()
"""Patch value that removes a key."""

KV_TRANSFER_KEYS = frozenset(
    {
        "kv_connector",
        "engine_id",
        "kv_buffer_device",
        "kv_role",
        "kv_port",
        "kv_connector_extra_config",
        "kv_connector_module_path",
        "enable_permute_local_kv",
        "kv_load_failure_policy",
    }
)
"""The ``--kv-transfer-config`` keys current vLLM's ``KVTransferConfig`` accepts."""


def minimal_spec() -> dict[str, Any]:
    """The smallest valid spec: a model and an image."""
    return {
        "model": {"name": "Qwen/Qwen3-0.6B"},
        "image": {"repository": "ghcr.io/acme/disagg-serving", "tag": "1.0"},
    }


def patched(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of `base` with `patch` merged in (dicts recursively, `DELETE` removes)."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is DELETE:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = patched(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def spec_with(patch: dict[str, Any]) -> dict[str, Any]:
    """The minimal spec with `patch` merged in."""
    return patched(minimal_spec(), patch)


def resource(spec: dict[str, Any], name: str = "demo", namespace: str = "ml") -> dict[str, Any]:
    """A whole DisaggregatedModel object around `spec`."""
    return {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedModel",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def load_example(path: Path) -> dict[str, Any]:
    """One example CR as a dict."""
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


MANAGED_FLAG_ENTRIES = [
    ("tp-short-with-value", "prefill", ["-tp=2"]),
    ("disable-prefix-caching", "prefill", ["--disable-prefix-caching"]),
    ("disable-prompt-tokens-details", "decode", ["--disable-prompt-tokens-details"]),
    ("served-model-name", "decode", ["--served-model-name", "x"]),
    ("port-with-value", "prefill", ["--port=9000"]),
    ("model", "decode", ["--model", "x"]),
]
"""Extra args that are a flag the operator manages, exactly or as ``--flag=value``."""

ADMITTED_MANAGED_SPELLINGS = [
    "--max_model_len=10",
    "--max-model=10",
    "-t",
    "--kv-transfer-config.kv_role=kv_both",
    "--kv-transfer",
    "--no-enable-prefix",
    "--api_ke=secret",
]
"""Other spellings vLLM's parser reads as a managed flag: the API server admits them (its check
is exact) and ``disagg serve`` refuses them at start-up with vLLM's own parser."""


LEGIT_EXTRA_ARGS = [
    "--enforce-eager",
    "--max-num-batched-tokens=8192",
    "--max_num_batched_tokens=8192",
    "--enable-chunked-prefill",
    "--disable-chunked-prefill",
    "--kv-cache-dtype=fp8",
    "--gpu_memory_utilization=0.9",
    "--disable-log-requests",
    "--api-server-count=2",
    "--model-impl=vllm",
    "--model-loader-extra-config.x=1",
    "--no-enable-prompt-embeds",
    "--max-num-partial-prefills=2",
    "-O3",
    "--master-port=29500",
]
"""Extra args that are not a managed flag: vLLM options beside them, some sharing a prefix."""


PREFILL_AUTOSCALING: dict[str, Any] = {"maxReplicas": 4, "signal": "queueDepth", "target": 4}
"""A valid prefill autoscaling section: up to 4 servers, 4 requests waiting on each."""
DECODE_AUTOSCALING: dict[str, Any] = {"maxReplicas": 4, "signal": "kvCacheUsage", "target": 0.8}
"""A valid decode autoscaling section: up to 4 servers, each at most 80% of its KV cache used."""
PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
KEDA_AUTOSCALING: dict[str, Any] = {
    **DECODE_AUTOSCALING,
    "engine": "keda",
    "prometheusAddress": PROMETHEUS,
}
"""The decode section with KEDA querying Prometheus instead."""


ROUTER_TENANTS: dict[str, Any] = {
    "auth": {"clientKeysSecret": {"name": "clients"}},
    "router": {
        "headerTimeoutSeconds": 30,
        "tenants": {
            "maxRequestsPerTenant": 256,
            "maxConversationsPerTenant": 2000,
            "overrides": {
                "team-b": {"conversations": 50},
                "default": {"requests": 1024},
                "team-a": {"requests": 512, "conversations": 9000},
            },
        },
    },
}
"""Fairness between tenants: a share of the request slots, a conversation share, and three
tenants with bounds of their own (given out of name order)."""


def _without(section: dict[str, Any], key: str) -> dict[str, Any]:
    """A copy of `section` lacking `key`."""
    return {k: v for k, v in section.items() if k != key}


HTTP_ROUTE: dict[str, Any] = {
    "parentRefs": [
        {"name": "public", "namespace": "gateways", "sectionName": "https"},
        {"name": "internal"},
    ],
    "hostnames": ["llm.example.com", "*.llm.example.com"],
}
"""A valid spec.router.httpRoute: two Gateways (one listener of the first), two hostnames."""


def _route(**route: Any) -> dict[str, Any]:
    """A spec patch with `spec.router.httpRoute` set to `route`."""
    return {"router": {"httpRoute": route}}


_KEYED: dict[str, Any] = {"auth": {"clientKeysSecret": {"name": "clients"}}}
"""Client keys, which tenant overrides need."""


_VOLUME_A: dict[str, Any] = {"volumes": [{"name": "a", "emptyDir": {}}]}
"""A role's own scratch volume, for the mount cases."""


@dataclass(frozen=True)
class InvalidSpec:
    """A spec patch that must be refused, blaming `path` (and saying `says`, when set)."""

    id: str
    patch: dict[str, Any]
    path: str
    cross_field: bool = False
    says: str = ""


INVALID_SPECS = [
    InvalidSpec(
        "negative-decode-ttl",
        {"kvTransfer": {"decoderKvBlocksTtlSeconds": -1}},
        "spec.kvTransfer.decoderKvBlocksTtlSeconds",
    ),
    InvalidSpec(
        "router-ttl-not-below-decode-ttl-minus-margin",
        {
            "kvTransfer": {"decoderKvBlocksTtlSeconds": 480},
            "router": {"conversationTtlSeconds": 475},
        },
        "spec.router.conversationTtlSeconds",
        cross_field=True,
    ),
    InvalidSpec(
        "router-ttl-above-decode-ttl",
        {
            "kvTransfer": {"decoderKvBlocksTtlSeconds": 120},
            "router": {"conversationTtlSeconds": 300},
        },
        "spec.router.conversationTtlSeconds",
        cross_field=True,
    ),
    InvalidSpec(
        "zero-router-ttl",
        {"router": {"conversationTtlSeconds": 0}},
        "spec.router.conversationTtlSeconds",
    ),
    InvalidSpec(
        "tp-zero", {"prefill": {"tensorParallelSize": 0}}, "spec.prefill.tensorParallelSize"
    ),
    InvalidSpec(
        "grace-period-shorter-than-the-drain",
        {"decode": {"terminationGracePeriodSeconds": 10}},
        "spec.decode.terminationGracePeriodSeconds",
    ),
    InvalidSpec(
        "router-grace-period-shorter-than-the-drain",
        {"router": {"terminationGracePeriodSeconds": 10}},
        "spec.router.terminationGracePeriodSeconds",
    ),
    InvalidSpec("unknown-backend", {"kvTransfer": {"backend": "TCP"}}, "spec.kvTransfer.backend"),
    InvalidSpec(
        "one-pod-smaller-than-its-ranks",
        {"prefill": {"tensorParallelSize": 8, "gpusPerPod": 4}},
        "spec.prefill.gpusPerPod",
        cross_field=True,
        says="tensorParallelSize x pipelineParallelSize",
    ),
    InvalidSpec(
        "prefill-pipeline-stages",
        {"prefill": {"tensorParallelSize": 4, "pipelineParallelSize": 2}},
        "spec.prefill.pipelineParallelSize",
        cross_field=True,
        says="reads a peer's KV from its first pipeline stage only",
    ),
    InvalidSpec(
        "decode-pipeline-stages-across-nodes",
        {"decode": {"tensorParallelSize": 8, "pipelineParallelSize": 2, "nodesPerReplica": 2}},
        "spec.decode.pipelineParallelSize",
        cross_field=True,
        says="spread a server over nodes with tensorParallelSize",
    ),
    InvalidSpec(
        "tp-sizes-not-dividing-one-another",
        {"prefill": {"tensorParallelSize": 8}, "decode": {"tensorParallelSize": 12}},
        "spec.decode.tensorParallelSize",
        cross_field=True,
        says="must divide or be a multiple of spec.prefill.tensorParallelSize",
    ),
    InvalidSpec(
        "nodes-not-dividing-tp-x-pp",
        {"decode": {"tensorParallelSize": 8, "nodesPerReplica": 3}},
        "spec.decode.nodesPerReplica",
        cross_field=True,
        says="must divide tensorParallelSize x pipelineParallelSize",
    ),
    InvalidSpec(
        "gpus-per-pod-not-the-share-of-ranks",
        {"prefill": {"tensorParallelSize": 16, "nodesPerReplica": 2, "gpusPerPod": 4}},
        "spec.prefill.gpusPerPod",
        cross_field=True,
        says="nodesPerReplica > 1",
    ),
    InvalidSpec(
        "multi-node-libfabric-without-efa",
        {
            "decode": {"tensorParallelSize": 16, "nodesPerReplica": 2},
            "efa": {"enabled": False},
            "kvTransfer": {"backend": "LIBFABRIC"},
        },
        "spec.kvTransfer.backend",
        cross_field=True,
        says="set spec.efa.enabled true",
    ),
    InvalidSpec("zero-nodes", {"decode": {"nodesPerReplica": 0}}, "spec.decode.nodesPerReplica"),
    InvalidSpec(
        "pp-zero", {"prefill": {"pipelineParallelSize": 0}}, "spec.prefill.pipelineParallelSize"
    ),
    InvalidSpec("replicas-as-string", {"prefill": {"replicas": "2"}}, "spec.prefill.replicas"),
    InvalidSpec("replicas-as-bool", {"decode": {"replicas": True}}, "spec.decode.replicas"),
    InvalidSpec(
        "autoscaling-with-replicas",
        {"prefill": {"replicas": 2, "autoscaling": PREFILL_AUTOSCALING}},
        "spec.prefill.replicas",
        cross_field=True,
        says="remove replicas",
    ),
    InvalidSpec(
        "autoscaling-min-above-max",
        {"decode": {"autoscaling": {**DECODE_AUTOSCALING, "minReplicas": 5}}},
        "spec.decode.autoscaling.minReplicas",
        cross_field=True,
        says="raise maxReplicas or lower minReplicas",
    ),
    InvalidSpec(
        "autoscaling-min-zero",
        {"prefill": {"autoscaling": {**PREFILL_AUTOSCALING, "minReplicas": 0}}},
        "spec.prefill.autoscaling.minReplicas",
    ),
    InvalidSpec(
        "autoscaling-without-max",
        {"decode": {"autoscaling": _without(DECODE_AUTOSCALING, "maxReplicas")}},
        "spec.decode.autoscaling.maxReplicas",
    ),
    InvalidSpec(
        "autoscaling-without-signal",
        {"prefill": {"autoscaling": _without(PREFILL_AUTOSCALING, "signal")}},
        "spec.prefill.autoscaling.signal",
    ),
    InvalidSpec(
        "autoscaling-without-target",
        {"decode": {"autoscaling": _without(DECODE_AUTOSCALING, "target")}},
        "spec.decode.autoscaling.target",
    ),
    InvalidSpec(
        "autoscaling-target-zero",
        {"prefill": {"autoscaling": {**PREFILL_AUTOSCALING, "target": 0}}},
        "spec.prefill.autoscaling.target",
    ),
    InvalidSpec(
        "autoscaling-target-as-string",
        {"prefill": {"autoscaling": {**PREFILL_AUTOSCALING, "target": "4"}}},
        "spec.prefill.autoscaling.target",
    ),
    InvalidSpec(
        "autoscaling-unknown-signal",
        {"prefill": {"autoscaling": {**PREFILL_AUTOSCALING, "signal": "cpu"}}},
        "spec.prefill.autoscaling.signal",
    ),
    InvalidSpec(
        "prefill-scaled-on-kv-cache-usage",
        {
            "prefill": {
                "autoscaling": {**PREFILL_AUTOSCALING, "signal": "kvCacheUsage", "target": 0.8}
            }
        },
        "spec.prefill.autoscaling.signal",
        cross_field=True,
        says="prefill scales on queueDepth or ttft",
    ),
    InvalidSpec(
        "decode-scaled-on-queue-depth",
        {"decode": {"autoscaling": {**DECODE_AUTOSCALING, "signal": "queueDepth", "target": 4}}},
        "spec.decode.autoscaling.signal",
        cross_field=True,
        says="decode scales on kvCacheUsage or runningRequests",
    ),
    InvalidSpec(
        "kv-cache-usage-target-above-one",
        {"decode": {"autoscaling": {**DECODE_AUTOSCALING, "target": 80}}},
        "spec.decode.autoscaling.target",
        cross_field=True,
        says="0.8 is 80%",
    ),
    InvalidSpec(
        "keda-without-prometheus-address",
        {"decode": {"autoscaling": {**DECODE_AUTOSCALING, "engine": "keda"}}},
        "spec.decode.autoscaling.prometheusAddress",
        cross_field=True,
        says="set prometheusAddress",
    ),
    InvalidSpec(
        "hpa-with-prometheus-address",
        {"prefill": {"autoscaling": {**PREFILL_AUTOSCALING, "prometheusAddress": PROMETHEUS}}},
        "spec.prefill.autoscaling.prometheusAddress",
        cross_field=True,
        says="leave it unset",
    ),
    InvalidSpec(
        "keda-with-metric-name",
        {"decode": {"autoscaling": {**KEDA_AUTOSCALING, "metricName": "kv"}}},
        "spec.decode.autoscaling.metricName",
        cross_field=True,
        says="leave it unset with engine keda",
    ),
    InvalidSpec(
        "autoscaling-unknown-engine",
        {"prefill": {"autoscaling": {**PREFILL_AUTOSCALING, "engine": "vpa"}}},
        "spec.prefill.autoscaling.engine",
    ),
    InvalidSpec(
        "prometheus-address-not-a-url",
        {"decode": {"autoscaling": {**KEDA_AUTOSCALING, "prometheusAddress": "prometheus"}}},
        "spec.decode.autoscaling.prometheusAddress",
    ),
    InvalidSpec(
        "scale-down-window-above-an-hour",
        {
            "decode": {
                "autoscaling": {
                    **DECODE_AUTOSCALING,
                    "behavior": {"scaleDownStabilizationWindowSeconds": 3601},
                }
            }
        },
        "spec.decode.autoscaling.behavior.scaleDownStabilizationWindowSeconds",
    ),
    InvalidSpec(
        "pod-monitors-as-string",
        {"monitoring": {"podMonitors": "true"}},
        "spec.monitoring.podMonitors",
    ),
    InvalidSpec(
        "scrape-interval-without-unit",
        {"monitoring": {"interval": "30"}},
        "spec.monitoring.interval",
    ),
    InvalidSpec(
        "bidirectional-as-string",
        {"kvTransfer": {"bidirectional": "yes"}},
        "spec.kvTransfer.bidirectional",
    ),
    InvalidSpec(
        "max-model-len-as-float", {"model": {"maxModelLen": 1.5}}, "spec.model.maxModelLen"
    ),
    InvalidSpec("missing-model", {"model": DELETE}, "spec.model"),
    InvalidSpec("missing-model-name", {"model": {"name": DELETE}}, "spec.model.name"),
    InvalidSpec("empty-model-name", {"model": {"name": ""}}, "spec.model.name"),
    InvalidSpec("missing-image", {"image": DELETE}, "spec.image"),
    InvalidSpec("unknown-field", {"prefill": {"tensorParallel": 8}}, "spec.prefill.tensorParallel"),
    InvalidSpec(
        "gpus-below-tp",
        {"decode": {"tensorParallelSize": 8, "gpusPerPod": 4}},
        "spec.decode.gpusPerPod",
        cross_field=True,
    ),
    InvalidSpec(
        "libfabric-without-efa",
        {"efa": {"enabled": False}, "kvTransfer": {"backend": "LIBFABRIC"}},
        "spec.kvTransfer.backend",
        cross_field=True,
    ),
    InvalidSpec(
        "side-channel-on-vllm-port",
        {"kvTransfer": {"sideChannelPort": 8000}},
        "spec.kvTransfer.sideChannelPort",
        cross_field=True,
    ),
    InvalidSpec(
        "side-channel-on-lease-port",
        {"kvTransfer": {"sideChannelPort": 5700}},
        "spec.kvTransfer.sideChannelPort",
        cross_field=True,
        says="lease port 5700",
    ),
    InvalidSpec(
        "idle-timeout-zero",
        {"kvTransfer": {"idleTimeoutSeconds": 0}},
        "spec.kvTransfer.idleTimeoutSeconds",
    ),
    InvalidSpec(
        "idle-timeout-below-ten-seconds",
        {"kvTransfer": {"idleTimeoutSeconds": 9}},
        "spec.kvTransfer.idleTimeoutSeconds",
    ),
    InvalidSpec(
        "idle-timeout-above-a-day",
        {"kvTransfer": {"idleTimeoutSeconds": 86401}},
        "spec.kvTransfer.idleTimeoutSeconds",
    ),
    InvalidSpec(
        "idle-timeout-as-string",
        {"kvTransfer": {"idleTimeoutSeconds": "120s"}},
        "spec.kvTransfer.idleTimeoutSeconds",
    ),
    InvalidSpec(
        "side-channel-port-out-of-range",
        {"kvTransfer": {"sideChannelPort": 70000}},
        "spec.kvTransfer.sideChannelPort",
    ),
    InvalidSpec(
        "unknown-load-failure-policy",
        {"kvTransfer": {"loadFailurePolicy": "abort"}},
        "spec.kvTransfer.loadFailurePolicy",
    ),
    InvalidSpec(
        "unknown-read-decision",
        {"kvTransfer": {"readDecision": "auto"}},
        "spec.kvTransfer.readDecision",
    ),
    InvalidSpec(
        "zero-recompute-threshold",
        {"kvTransfer": {"recomputeThresholdTokens": 0}},
        "spec.kvTransfer.recomputeThresholdTokens",
    ),
    InvalidSpec(
        "threshold-not-below-max-model-len",
        {"model": {"maxModelLen": 1024}, "kvTransfer": {"recomputeThresholdTokens": 1024}},
        "spec.kvTransfer.recomputeThresholdTokens",
        cross_field=True,
    ),
    InvalidSpec(
        "extra-args-repeat-kv-transfer-config",
        {"prefill": {"extraArgs": ["--enforce-eager", "--kv-transfer-config={}"]}},
        "spec.prefill.extraArgs",
        cross_field=True,
    ),
    InvalidSpec(
        "extra-args-repeat-tp",
        {"decode": {"extraArgs": ["--tensor-parallel-size", "4"]}},
        "spec.decode.extraArgs",
        cross_field=True,
    ),
    InvalidSpec(
        "extra-args-repeat-prompt-tokens-details",
        {"decode": {"extraArgs": ["--no-enable-prompt-tokens-details"]}},
        "spec.decode.extraArgs",
        cross_field=True,
    ),
    *(
        InvalidSpec(
            f"extra-args-set-{name}",
            {role: {"extraArgs": ["--enforce-eager", *args]}},
            f"spec.{role}.extraArgs",
            cross_field=True,
            says="set the spec field instead",
        )
        for name, role, args in MANAGED_FLAG_ENTRIES
    ),
    *(
        InvalidSpec(
            f"extra-args-set-api-key-as-{arg.split('=')[0]}",
            {"decode": {"extraArgs": ["--enforce-eager", arg]}},
            "spec.decode.extraArgs",
            cross_field=True,
            says="drop it (--port, --api-key,",
        )
        for arg in ("--api-key", "--api-key=secret")
    ),
    InvalidSpec(
        "env-sets-vllm-api-key",
        {"decode": {"env": [{"name": "VLLM_API_KEY", "value": "secret"}]}},
        "spec.decode.env",
        cross_field=True,
        says="the engine credential it generates (Secret <name>-engine-key)",
    ),
    InvalidSpec(
        "auth-without-any-key",
        {"auth": {}},
        "spec.auth.apiKeySecret",
        cross_field=True,
        says="set apiKeySecret, clientKeysSecret or both",
    ),
    InvalidSpec(
        "client-keys-secret-without-name",
        {"auth": {"clientKeysSecret": {}}},
        "spec.auth.clientKeysSecret.name",
    ),
    *(
        InvalidSpec(
            f"env-sets-{variable.lower().replace('_', '-')}",
            {"prefill": {"env": [{"name": variable, "value": "/tmp/key"}]}},
            "spec.prefill.env",
            cross_field=True,
            says=variable,
        )
        for variable in ("DISAGG_OFFER_KEY_FILE", "DISAGG_OFFER_KEY")
    ),
    InvalidSpec(
        "peer-with-ip-block-and-selector",
        {
            "router": {
                "allowedFrom": [
                    {"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {"matchLabels": {"a": "b"}}}
                ]
            }
        },
        "spec.router.allowedFrom[0].ipBlock",
        cross_field=True,
    ),
    InvalidSpec(
        "peer-without-anything",
        {"decode": {"allowedFrom": [{}]}},
        "spec.decode.allowedFrom[0].ipBlock",
        cross_field=True,
    ),
    InvalidSpec(
        "peer-cidr-not-a-cidr",
        {"router": {"allowedFrom": [{"ipBlock": {"cidr": "10.0.0.0"}}]}},
        "spec.router.allowedFrom[0].ipBlock.cidr",
    ),
    InvalidSpec(
        "peer-selector-in-without-values",
        {
            "prefill": {
                "allowedFrom": [
                    {"namespaceSelector": {"matchExpressions": [{"key": "k", "operator": "In"}]}}
                ]
            }
        },
        "spec.prefill.allowedFrom[0].namespaceSelector.matchExpressions[0].values",
        cross_field=True,
    ),
    InvalidSpec(
        "peer-selector-exists-with-values",
        {
            "router": {
                "allowedFrom": [
                    {
                        "podSelector": {
                            "matchExpressions": [
                                {"key": "k", "operator": "Exists", "values": ["v"]}
                            ]
                        }
                    }
                ]
            }
        },
        "spec.router.allowedFrom[0].podSelector.matchExpressions[0].values",
        cross_field=True,
    ),
    InvalidSpec(
        "peer-selector-unknown-operator",
        {
            "router": {
                "allowedFrom": [
                    {"podSelector": {"matchExpressions": [{"key": "k", "operator": "Is"}]}}
                ]
            }
        },
        "spec.router.allowedFrom[0].podSelector.matchExpressions[0].operator",
    ),
    InvalidSpec(
        "router-service-annotation-in-the-operators-domain",
        {"router": {"service": {"annotations": {"disagg.dev/applied-hash": "0"}}}},
        "spec.router.service.annotations",
        cross_field=True,
        says="the operator owns them",
    ),
    InvalidSpec(
        "router-service-source-ranges-as-annotation",
        {
            "router": {
                "serviceType": "LoadBalancer",
                "service": {
                    "annotations": {
                        "service.beta.kubernetes.io/load-balancer-source-ranges": "10.0.0.0/8"
                    }
                },
            }
        },
        "spec.router.service.annotations",
        cross_field=True,
        says="set spec.router.service.loadBalancerSourceRanges instead",
    ),
    InvalidSpec(
        "router-source-ranges-without-load-balancer",
        {"router": {"service": {"loadBalancerSourceRanges": ["10.0.0.0/8"]}}},
        "spec.router.service.loadBalancerSourceRanges",
        cross_field=True,
        says="needs spec.router.serviceType: LoadBalancer",
    ),
    InvalidSpec(
        "router-source-range-not-a-cidr",
        {
            "router": {
                "serviceType": "LoadBalancer",
                "service": {"loadBalancerSourceRanges": ["10.0.0.0"]},
            }
        },
        "spec.router.service.loadBalancerSourceRanges[0]",
    ),
    InvalidSpec(
        "http-route-without-parents",
        _route(parentRefs=[]),
        "spec.router.httpRoute.parentRefs",
    ),
    InvalidSpec(
        "http-route-parent-without-name",
        _route(parentRefs=[{"namespace": "gateways"}]),
        "spec.router.httpRoute.parentRefs[0].name",
    ),
    InvalidSpec(
        "http-route-parent-namespace-not-a-dns-label",
        _route(parentRefs=[{"name": "public", "namespace": "Gateways"}]),
        "spec.router.httpRoute.parentRefs[0].namespace",
    ),
    InvalidSpec(
        "http-route-section-name-not-a-dns-subdomain",
        _route(parentRefs=[{"name": "public", "sectionName": "https_"}]),
        "spec.router.httpRoute.parentRefs[0].sectionName",
    ),
    InvalidSpec(
        "http-route-hostname-with-a-port",
        _route(parentRefs=[{"name": "public"}], hostnames=["llm.example.com:443"]),
        "spec.router.httpRoute.hostnames[0]",
    ),
    InvalidSpec(
        "http-route-hostname-wildcard-inside",
        _route(parentRefs=[{"name": "public"}], hostnames=["llm.*.example.com"]),
        "spec.router.httpRoute.hostnames[0]",
    ),
    InvalidSpec(
        "http-route-same-gateway-twice",
        _route(parentRefs=[{"name": "public"}, {"name": "public"}]),
        "spec.router.httpRoute.parentRefs",
        cross_field=True,
        says="a Gateway named twice needs a different sectionName",
    ),
    InvalidSpec(
        "http-route-same-gateway-once-without-a-listener",
        _route(
            parentRefs=[
                {"name": "public", "namespace": "gateways", "sectionName": "https"},
                {"name": "public", "namespace": "gateways"},
            ]
        ),
        "spec.router.httpRoute.parentRefs",
        cross_field=True,
        says="a Gateway named twice needs a different sectionName",
    ),
    InvalidSpec(
        "http-route-same-listener-twice",
        _route(
            parentRefs=[
                {"name": "public", "sectionName": "https"},
                {"name": "public", "sectionName": "https"},
            ]
        ),
        "spec.router.httpRoute.parentRefs",
        cross_field=True,
        says="a Gateway named twice needs a different sectionName",
    ),
    InvalidSpec(
        "auth-secret-without-name",
        {"auth": {"apiKeySecret": {"key": "api-key"}}},
        "spec.auth.apiKeySecret.name",
    ),
    InvalidSpec(
        "env-sets-hash-seed",
        {"decode": {"env": [{"name": "PYTHONHASHSEED", "value": "0"}]}},
        "spec.decode.env",
        cross_field=True,
    ),
    InvalidSpec(
        "env-value-and-value-from",
        {"prefill": {"env": [{"name": "X", "value": "1", "valueFrom": {"fieldRef": {}}}]}},
        "spec.prefill.env[0].valueFrom",
        cross_field=True,
    ),
    InvalidSpec(
        "pod-label-overrides-selector",
        {"prefill": {"podLabels": {"app.kubernetes.io/component": "x"}}},
        "spec.prefill.podLabels",
        cross_field=True,
    ),
    InvalidSpec(
        "pod-annotation-operator-key",
        {"decode": {"podAnnotations": {"disagg.dev/config-hash": "x"}}},
        "spec.decode.podAnnotations",
        cross_field=True,
        says="must not set disagg.dev/ annotations",
    ),
    InvalidSpec(
        "router-pod-label-overrides-selector",
        {"router": {"podLabels": {"app.kubernetes.io/name": "x"}}},
        "spec.router.podLabels",
        cross_field=True,
    ),
    InvalidSpec(
        "pod-monitor-label-overrides-selector",
        {"monitoring": {"podMonitors": True, "labels": {"app.kubernetes.io/instance": "x"}}},
        "spec.monitoring.labels",
        cross_field=True,
    ),
    InvalidSpec(
        "router-pod-annotation-operator-key",
        {"router": {"podAnnotations": {"disagg.dev/x": "y"}}},
        "spec.router.podAnnotations",
        cross_field=True,
    ),
    InvalidSpec(
        "model-source-unknown-scheme",
        {"model": {"source": "gs://models/qwen3"}},
        "spec.model.source",
        cross_field=True,
        says="must be hf://<org>/<model> (a Hugging Face id), s3://<bucket>/<prefix>",
    ),
    InvalidSpec(
        "model-source-bucket-uppercase",
        {"model": {"source": "s3://Models/qwen3"}},
        "spec.model.source",
        cross_field=True,
        says="must be hf://<org>/<model>",
    ),
    InvalidSpec(
        "model-s3-without-an-s3-source",
        {"model": {"source": "pvc://weights/qwen3", "s3": {"region": "us-east-1"}}},
        "spec.model.s3",
        cross_field=True,
        says="applies only to an s3:// source",
    ),
    InvalidSpec(
        "model-s3-endpoint-not-a-url",
        {"model": {"source": "s3://models/qwen3", "s3": {"endpoint": "minio:9000"}}},
        "spec.model.s3.endpoint",
    ),
    InvalidSpec(
        "model-startup-budget-too-short",
        {"model": {"startupBudgetSeconds": 59}},
        "spec.model.startupBudgetSeconds",
    ),
    InvalidSpec(
        "mount-over-the-model-source",
        {
            "prefill": {
                "volumes": [{"name": "mine", "emptyDir": {}}],
                "volumeMounts": [{"name": "mine", "mountPath": "/model-source"}],
            }
        },
        "spec.prefill.volumeMounts",
        cross_field=True,
        says="must not mount at a path the operator mounts",
    ),
    InvalidSpec(
        "volume-named-like-the-operators",
        {"prefill": {"volumes": [{"name": "dshm", "emptyDir": {}}]}},
        "spec.prefill.volumes",
        cross_field=True,
        says="must not use a volume name the operator gives every pod",
    ),
    InvalidSpec(
        "volume-name-twice",
        {"decode": {"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]}},
        "spec.decode.volumes",
        cross_field=True,
        says="each volume name must be unique",
    ),
    InvalidSpec(
        "volume-without-source",
        {"prefill": {"volumes": [{"name": "a"}]}},
        "spec.prefill.volumes[0].name",
        cross_field=True,
        says="set exactly one of secret",
    ),
    InvalidSpec(
        "volume-with-two-sources",
        {"prefill": {"volumes": [{"name": "a", "emptyDir": {}, "secret": {"secretName": "s"}}]}},
        "spec.prefill.volumes[0].name",
        cross_field=True,
    ),
    InvalidSpec(
        "volume-name-not-a-dns-label",
        {"prefill": {"volumes": [{"name": "Data", "emptyDir": {}}]}},
        "spec.prefill.volumes[0].name",
    ),
    InvalidSpec(
        "mount-of-no-volume",
        {"decode": {"volumeMounts": [{"name": "a", "mountPath": "/data"}]}},
        "spec.decode.volumeMounts",
        cross_field=True,
        says="each mount must name one of the role's volumes",
    ),
    InvalidSpec(
        "mount-over-the-connector-config",
        {"prefill": {**_VOLUME_A, "volumeMounts": [{"name": "a", "mountPath": "/etc/disagg"}]}},
        "spec.prefill.volumeMounts",
        cross_field=True,
        says="must not mount at a path the operator mounts",
    ),
    InvalidSpec(
        "mount-over-the-offer-key",
        {
            "decode": {
                **_VOLUME_A,
                "volumeMounts": [{"name": "a", "mountPath": "/etc/disagg/offer-key"}],
            }
        },
        "spec.decode.volumeMounts",
        cross_field=True,
    ),
    InvalidSpec(
        "mount-over-shared-memory",
        {"prefill": {**_VOLUME_A, "volumeMounts": [{"name": "a", "mountPath": "/dev/shm/"}]}},
        "spec.prefill.volumeMounts",
        cross_field=True,
    ),
    InvalidSpec(
        "mount-over-the-default-model-cache",
        {"prefill": {**_VOLUME_A, "volumeMounts": [{"name": "a", "mountPath": "/models"}]}},
        "spec.prefill.volumeMounts",
        cross_field=True,
        says="must not mount at the model cache's path",
    ),
    InvalidSpec(
        "mount-over-a-moved-model-cache",
        {
            "model": {"cache": {"pvc": {"claimName": "c"}, "mountPath": "/cache"}},
            "decode": {**_VOLUME_A, "volumeMounts": [{"name": "a", "mountPath": "/cache"}]},
        },
        "spec.decode.volumeMounts",
        cross_field=True,
        says="must not mount at the model cache's path",
    ),
    InvalidSpec(
        "mount-path-twice",
        {
            "prefill": {
                **_VOLUME_A,
                "volumeMounts": [
                    {"name": "a", "mountPath": "/data"},
                    {"name": "a", "mountPath": "/data", "subPath": "x"},
                ],
            }
        },
        "spec.prefill.volumeMounts",
        cross_field=True,
        says="each mountPath must be unique",
    ),
    InvalidSpec(
        "mount-sub-path-leaving-the-volume",
        {
            "prefill": {
                **_VOLUME_A,
                "volumeMounts": [{"name": "a", "mountPath": "/data", "subPath": "../etc"}],
            }
        },
        "spec.prefill.volumeMounts[0].subPath",
        cross_field=True,
    ),
    InvalidSpec(
        "mount-path-relative",
        {"prefill": {**_VOLUME_A, "volumeMounts": [{"name": "a", "mountPath": "data"}]}},
        "spec.prefill.volumeMounts[0].mountPath",
    ),
    InvalidSpec(
        "spread-min-domains-on-a-soft-constraint",
        {
            "prefill": {
                "topologySpreadConstraints": [
                    {
                        "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "minDomains": 2,
                    }
                ]
            }
        },
        "spec.prefill.topologySpreadConstraints[0].minDomains",
        cross_field=True,
        says="needs whenUnsatisfiable: DoNotSchedule",
    ),
    InvalidSpec(
        "router-spread-without-topology-key",
        {"router": {"topologySpreadConstraints": [{"maxSkew": 1}]}},
        "spec.router.topologySpreadConstraints[0].topologyKey",
    ),
    InvalidSpec(
        "service-account-not-a-name",
        {"decode": {"serviceAccountName": "Serving_SA"}},
        "spec.decode.serviceAccountName",
    ),
    InvalidSpec(
        "router-priority-class-not-a-name",
        {"router": {"priorityClassName": "High"}},
        "spec.router.priorityClassName",
    ),
    InvalidSpec(
        "negative-fs-group",
        {"prefill": {"podSecurityContext": {"fsGroup": -1}}},
        "spec.prefill.podSecurityContext.fsGroup",
    ),
    InvalidSpec(
        "cache-pvc-and-host-path",
        {"model": {"cache": {"pvc": {"claimName": "c"}, "hostPath": {"path": "/data"}}}},
        "spec.model.cache.pvc",
        cross_field=True,
    ),
    InvalidSpec(
        "cache-without-source",
        {"model": {"cache": {"mountPath": "/models"}}},
        "spec.model.cache.pvc",
        cross_field=True,
    ),
    InvalidSpec(
        "cache-relative-host-path",
        {"model": {"cache": {"hostPath": {"path": "data"}}}},
        "spec.model.cache.hostPath.path",
    ),
    InvalidSpec(
        "bad-quantity",
        {"prefill": {"resources": {"requests": {"memory": "lots"}}}},
        "spec.prefill.resources.requests.memory",
    ),
    InvalidSpec(
        "unknown-service-type", {"router": {"serviceType": "Ingress"}}, "spec.router.serviceType"
    ),
    InvalidSpec(
        "router-replicas-without-redis",
        {"router": {"replicas": 2}},
        "spec.router.redis",
        cross_field=True,
    ),
    InvalidSpec(
        "router-redis-url-and-secret",
        {"router": {"redis": {"url": "redis://valkey:6379/0", "urlSecret": {"name": "valkey"}}}},
        "spec.router.redis.url",
        cross_field=True,
    ),
    InvalidSpec(
        "router-redis-without-url",
        {"router": {"redis": {}}},
        "spec.router.redis.url",
        cross_field=True,
    ),
    InvalidSpec(
        "router-redis-url-not-redis",
        {"router": {"redis": {"url": "http://valkey:6379"}}},
        "spec.router.redis.url",
    ),
    InvalidSpec("negative-router-replicas", {"router": {"replicas": -1}}, "spec.router.replicas"),
    InvalidSpec(
        "router-header-timeout-zero",
        {"router": {"headerTimeoutSeconds": 0}},
        "spec.router.headerTimeoutSeconds",
    ),
    InvalidSpec(
        "tenant-request-share-above-the-routers-slots",
        {"router": {"tenants": {"maxRequestsPerTenant": 1025}}},
        "spec.router.tenants.maxRequestsPerTenant",
    ),
    InvalidSpec(
        "tenant-conversation-share-zero",
        {"router": {"tenants": {"maxConversationsPerTenant": 0}}},
        "spec.router.tenants.maxConversationsPerTenant",
    ),
    InvalidSpec(
        "tenant-override-above-the-routers-slots",
        {**_KEYED, "router": {"tenants": {"overrides": {"team-a": {"requests": 2048}}}}},
        "spec.router.tenants.overrides.team-a.requests",
    ),
    InvalidSpec(
        "tenant-override-without-keys",
        {"router": {"tenants": {"overrides": {"team-a": {"requests": 8}}}}},
        "spec.router.tenants.overrides",
        cross_field=True,
        says="needs spec.auth",
    ),
    InvalidSpec(
        "tenant-override-no-secret-key-names",
        {**_KEYED, "router": {"tenants": {"overrides": {"team/a": {"requests": 8}}}}},
        "spec.router.tenants.overrides",
        cross_field=True,
        says="a Secret key of letters, digits",
    ),
    InvalidSpec(
        "tenant-override-the-kubelets-own-entry",
        {**_KEYED, "router": {"tenants": {"overrides": {"..data": {"requests": 8}}}}},
        "spec.router.tenants.overrides",
        cross_field=True,
        says="not starting with '..'",
    ),
    InvalidSpec(
        "tenant-override-empty",
        {**_KEYED, "router": {"tenants": {"overrides": {"team-a": {}}}}},
        "spec.router.tenants.overrides",
        cross_field=True,
        says="requests, conversations or both",
    ),
    InvalidSpec("zero-efa-devices", {"efa": {"devicesPerPod": 0}}, "spec.efa.devicesPerPod"),
    InvalidSpec("unknown-dtype", {"model": {"dtype": "int4"}}, "spec.model.dtype"),
    InvalidSpec(
        "unknown-pull-policy", {"image": {"pullPolicy": "Sometimes"}}, "spec.image.pullPolicy"
    ),
    InvalidSpec(
        "unknown-toleration-operator",
        {"prefill": {"tolerations": [{"key": "k", "operator": "Maybe"}]}},
        "spec.prefill.tolerations[0].operator",
    ),
]
