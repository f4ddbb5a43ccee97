"""Rendering: what each spec field does to the child objects, the connector config per role,
the rollout hash, names and labels, and Kubernetes schema validity of every manifest."""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

import kubernetes_validate
import pytest

from disagg_operator.errors import SpecError
from disagg_operator.loading import load_resource, load_spec
from disagg_operator.models import (
    DRAIN_DELAY_SECONDS,
    MAX_NAME_LENGTH,
    ROUTER_MAX_CONCURRENT_REQUESTS,
)
from disagg_operator.names import CONFIG_HASH_ANNOTATION
from disagg_operator.render import hash_seed, render
from dmodel_samples import (
    EXAMPLES,
    KV_TRANSFER_KEYS,
    ROUTER_TENANTS,
    load_example,
    minimal_spec,
    spec_with,
)

Manifest = dict[str, Any]
NAME, NAMESPACE = "demo", "ml"
KUBERNETES_VERSION = kubernetes_validate.latest_version()


def objects(patch: dict[str, Any] | None = None, name: str = NAME) -> dict[str, Manifest]:
    """Rendered children of the minimal spec (plus `patch`), keyed `Kind/name`."""
    spec = load_spec(spec_with(patch or {}))
    return {f"{m['kind']}/{m['metadata']['name']}": m for m in render(name, NAMESPACE, spec)}


def statefulset(patch: dict[str, Any] | None, role: str) -> Manifest:
    return objects(patch)[f"StatefulSet/{NAME}-{role}"]


def pod(patch: dict[str, Any] | None, role: str) -> dict[str, Any]:
    spec: dict[str, Any] = statefulset(patch, role)["spec"]["template"]["spec"]
    return spec


def container(patch: dict[str, Any] | None, role: str) -> dict[str, Any]:
    main: dict[str, Any] = pod(patch, role)["containers"][0]
    return main


def router_container(patch: dict[str, Any] | None = None) -> dict[str, Any]:
    deployment = objects(patch)[f"Deployment/{NAME}-router"]
    main: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return main


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def env(main: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {var["name"]: var for var in main["env"]}


def kv_config(patch: dict[str, Any] | None, role: str) -> dict[str, Any]:
    config_map = objects(patch)[f"ConfigMap/{NAME}-connector"]
    config: dict[str, Any] = json.loads(config_map["data"][f"{role}.json"])
    return config


# ---- connector config ---------------------------------------------------------------------


@pytest.mark.parametrize("bidirectional", [True, False])
def test_kv_transfer_config_per_role(bidirectional: bool) -> None:
    patch = {"kvTransfer": {"bidirectional": bidirectional}}
    extra = {
        "bidirectional_kv_xfer": bidirectional,
        "decoder_kv_blocks_ttl": 480,
        "kv_recompute_threshold": 64,
        "backends": ["LIBFABRIC"],
    }
    common = {
        "kv_connector": "DisaggConnector",
        "kv_connector_module_path": "disagg_connector.connector",
        "kv_buffer_device": "cuda",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": extra,
    }
    prefill_extra = {**extra, "disagg_read_decision": "measured"} if bidirectional else extra
    prefill = {**common, "kv_connector_extra_config": prefill_extra, "kv_role": "kv_producer"}
    assert kv_config(patch, "prefill") == prefill
    decode_extra = {**extra, "disagg_lease_term_s": 45.0} if bidirectional else extra
    decode = {**common, "kv_connector_extra_config": decode_extra, "kv_role": "kv_consumer"}
    assert kv_config(patch, "decode") == decode


@pytest.mark.parametrize("decision", ["measured", "threshold"])
def test_prefill_reads_back_by_the_read_decision(decision: str) -> None:
    patch = {"kvTransfer": {"readDecision": decision, "recomputeThresholdTokens": 16}}
    extra = kv_config(patch, "prefill")["kv_connector_extra_config"]
    assert (extra["disagg_read_decision"], extra["kv_recompute_threshold"]) == (decision, 16)
    assert "disagg_read_decision" not in kv_config(patch, "decode")["kv_connector_extra_config"]


@pytest.mark.parametrize(
    ("idle_timeout", "lease_term"), [(10, 7.5), (60, 45.0), (120, 45.0), (3600, 45.0)]
)
def test_decode_lease_term_follows_the_idle_timeout(idle_timeout: int, lease_term: float) -> None:
    """Three renewal periods of idleTimeoutSeconds / 4 (clamped to 1..15 s): the numbers are
    written out so that a change of the contract's formula shows here."""
    patch = {"kvTransfer": {"idleTimeoutSeconds": idle_timeout}}
    assert kv_config(patch, "decode")["kv_connector_extra_config"]["disagg_lease_term_s"] == (
        lease_term
    )
    assert "disagg_lease_term_s" not in kv_config(patch, "prefill")["kv_connector_extra_config"]
    assert flag(router_container(patch)["command"], "--idle-timeout-s") == str(idle_timeout)


BIDIRECTIONAL_OFF = {"kvTransfer": {"bidirectional": False}}


def test_router_gets_the_default_idle_timeout() -> None:
    assert flag(router_container()["command"], "--idle-timeout-s") == "120"


def test_decode_declares_its_lease_port_only_when_bidirectional() -> None:
    """Prefill's lease service (decode's P->D claims) binds the default port undeclared, so that
    its pod template, and an operator upgrade, leave prefill pods alone; its NetworkPolicy
    opens the port (test_render_security)."""
    decode = container(None, "decode")
    assert {"name": "lease", "containerPort": 5700} in decode["ports"]
    assert env(decode)["DISAGG_LEASE_PORT"]["value"] == "5700"
    prefill = container(None, "prefill")
    assert [p["name"] for p in prefill["ports"]] == ["http", "side-channel"]
    assert "DISAGG_LEASE_PORT" not in env(prefill)
    off = container(BIDIRECTIONAL_OFF, "decode")
    assert [p["name"] for p in off["ports"]] == ["http", "side-channel"]
    assert "DISAGG_LEASE_PORT" not in env(off)


def test_kv_transfer_settings_reach_both_roles() -> None:
    patch = {
        "efa": {"enabled": False},
        "kvTransfer": {
            "decoderKvBlocksTtlSeconds": 900,
            "recomputeThresholdTokens": 256,
            "loadFailurePolicy": "fail",
        },
    }
    for role in ("prefill", "decode"):
        config = kv_config(patch, role)
        assert config["kv_load_failure_policy"] == "fail"
        extra = dict(config["kv_connector_extra_config"])
        extra.pop("disagg_lease_term_s", None)
        extra.pop("disagg_read_decision", None)
        assert extra == {
            "bidirectional_kv_xfer": True,
            "decoder_kv_blocks_ttl": 900,
            "kv_recompute_threshold": 256,
            "backends": ["UCX"],
        }


def test_kv_transfer_config_has_only_keys_current_vllm_accepts() -> None:
    for role in ("prefill", "decode"):
        assert set(kv_config(None, role)) <= KV_TRANSFER_KEYS


def test_pods_run_the_launcher_with_their_role_config() -> None:
    for role in ("prefill", "decode"):
        command = container(None, role)["command"]
        assert command[:7] == [
            "disagg",
            "serve",
            "--role",
            role,
            "--config",
            f"/etc/disagg/{role}.json",
            "--",
        ]
        mounts = {m["mountPath"]: m["name"] for m in container(None, role)["volumeMounts"]}
        volumes = {v["name"]: v for v in pod(None, role)["volumes"]}
        assert volumes[mounts["/etc/disagg"]]["configMap"] == {"name": f"{NAME}-connector"}


# ---- rollout hash ----------------------------------------------------------------------


def _pod_hash(manifests: dict[str, Manifest], role: str) -> str:
    sts = manifests[f"StatefulSet/{NAME}-{role}"]
    value: str = sts["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
    return value


@pytest.mark.parametrize(
    "patch",
    [
        {"kvTransfer": {"bidirectional": False}},
        {"kvTransfer": {"decoderKvBlocksTtlSeconds": 600}},
        {"kvTransfer": {"recomputeThresholdTokens": 128}},
        {"kvTransfer": {"backend": "UCX"}},
        {"kvTransfer": {"loadFailurePolicy": "fail"}},
    ],
)
def test_connector_config_change_rolls_prefill_and_decode(patch: dict[str, Any]) -> None:
    before, after = objects(), objects(patch)
    for role in ("prefill", "decode"):
        assert _pod_hash(before, role) != _pod_hash(after, role)
    assert _pod_hash(after, "prefill") == _pod_hash(after, "decode")


@pytest.mark.parametrize(
    "patch",
    [
        {"router": {"replicas": 3, "redis": {"url": "redis://valkey:6379/0"}}},
        {"router": {"conversationTtlSeconds": 300, "serviceType": "LoadBalancer", "port": 9000}},
        {"router": {"image": {"repository": "ghcr.io/acme/router", "tag": "2"}}},
        {"router": {"headerTimeoutSeconds": 30, "tenants": {"maxRequestsPerTenant": 256}}},
    ],
)
def test_router_only_change_leaves_prefill_and_decode_untouched(patch: dict[str, Any]) -> None:
    before, after = objects(), objects(patch)
    for key in (f"StatefulSet/{NAME}-prefill", f"StatefulSet/{NAME}-decode"):
        assert before[key] == after[key]
    assert before[f"Deployment/{NAME}-router"] != after[f"Deployment/{NAME}-router"]


def test_config_hash_is_published_on_the_config_map() -> None:
    manifests = objects()
    config_map = manifests[f"ConfigMap/{NAME}-connector"]
    assert config_map["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] == _pod_hash(
        manifests, "prefill"
    )


# ---- model and image --------------------------------------------------------------------


def test_model_fields_become_vllm_flags() -> None:
    patch = {
        "model": {
            "name": "zai-org/GLM-5-FP8",
            "servedName": "glm",
            "revision": "abc123",
            "dtype": "float16",
            "maxModelLen": 8192,
        }
    }
    for role in ("prefill", "decode"):
        command = container(patch, role)["command"]
        assert flag(command, "--model") == "zai-org/GLM-5-FP8"
        assert flag(command, "--served-model-name") == "glm"
        assert flag(command, "--revision") == "abc123"
        assert flag(command, "--dtype") == "float16"
        assert flag(command, "--max-model-len") == "8192"
        assert flag(command, "--port") == "8000"


def test_optional_model_flags_are_left_to_vllm() -> None:
    command = container(None, "decode")["command"]
    for name in ("--revision", "--max-model-len", "--max-num-seqs"):
        assert name not in command
    assert flag(command, "--served-model-name") == "Qwen/Qwen3-0.6B"


@pytest.mark.parametrize(
    ("cache", "volume"),
    [
        (None, {"emptyDir": {}}),
        (
            {"pvc": {"claimName": "weights", "readOnly": True}},
            {"persistentVolumeClaim": {"claimName": "weights", "readOnly": True}},
        ),
        (
            {"hostPath": {"path": "/mnt/models"}},
            {"hostPath": {"path": "/mnt/models", "type": "DirectoryOrCreate"}},
        ),
    ],
)
def test_model_cache_volume(cache: dict[str, Any] | None, volume: dict[str, Any]) -> None:
    patch = {"model": {"cache": cache}} if cache else {}
    volumes = {v["name"]: v for v in pod(patch, "prefill")["volumes"]}
    assert volumes["model-cache"] == {"name": "model-cache", **volume}


def test_cache_mount_path_is_hf_home() -> None:
    patch = {"model": {"cache": {"pvc": {"claimName": "c"}, "mountPath": "/cache"}}}
    main = container(patch, "decode")
    assert env(main)["HF_HOME"] == {"name": "HF_HOME", "value": "/cache"}
    assert {"name": "model-cache", "mountPath": "/cache"} in main["volumeMounts"]


def test_token_secret_becomes_hf_token() -> None:
    patch = {"model": {"tokenSecret": {"name": "hf", "key": "tok"}}}
    assert env(container(patch, "prefill"))["HF_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": "hf", "key": "tok"}
    }
    assert "HF_TOKEN" not in env(container(None, "prefill"))


def test_auth_key_reaches_the_router_only_from_the_secret() -> None:
    patch = {
        "auth": {"apiKeySecret": {"name": "api", "key": "k"}},
        "router": {"replicas": 2, "redis": {"urlSecret": {"name": "valkey"}}},
    }
    ref = {"secretKeyRef": {"name": "api", "key": "k"}}
    engine_key = {"secretKeyRef": {"name": f"{NAME}-engine-key", "key": "disagg-key"}}
    for role in ("prefill", "decode"):
        main = container(patch, role)
        assert env(main)["VLLM_API_KEY"] == {"name": "VLLM_API_KEY", "valueFrom": engine_key}
        assert main["readinessProbe"]["httpGet"]["path"] == "/health"
        assert env(container(None, role))["VLLM_API_KEY"]["valueFrom"] == engine_key
    router = router_container(patch)
    assert env(router)["DISAGG_API_KEY"] == {"name": "DISAGG_API_KEY", "valueFrom": ref}
    assert "DISAGG_REDIS_URL" in env(router)
    assert "env" not in router_container()
    commands = [c["command"] for c in (router, container(patch, "prefill"))]
    assert not any(arg.startswith("--api") for command in commands for arg in command)
    default_key = env(router_container({"auth": {"apiKeySecret": {"name": "api"}}}))
    assert default_key["DISAGG_API_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "token"


def test_image_fields() -> None:
    patch = {"image": {"tag": "2.0", "pullPolicy": "Always", "pullSecrets": ["regcred"]}}
    for main, spec in (
        (container(patch, "prefill"), pod(patch, "prefill")),
        (
            router_container(patch),
            objects(patch)[f"Deployment/{NAME}-router"]["spec"]["template"]["spec"],
        ),
    ):
        assert main["image"] == "ghcr.io/acme/disagg-serving:2.0"
        assert main["imagePullPolicy"] == "Always"
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]


def test_a_refusal_at_start_up_shows_in_the_pod_status() -> None:
    """`disagg serve` refuses a bad extraArgs spelling on stderr; the kubelet keeps the log tail
    as the termination message, so `kubectl describe pod` shows why the pod crash-loops."""
    for main in (container({}, "prefill"), container({}, "decode"), router_container({})):
        assert main["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_router_image_overrides_serving_image_for_the_router_only() -> None:
    patch = {"router": {"image": {"repository": "ghcr.io/acme/router", "tag": "3"}}}
    assert router_container(patch)["image"] == "ghcr.io/acme/router:3"
    assert container(patch, "decode")["image"] == "ghcr.io/acme/disagg-serving:1.0"


# ---- roles -----------------------------------------------------------------------------


def test_role_sizes_are_independent() -> None:
    patch = {
        "prefill": {"replicas": 2, "tensorParallelSize": 4, "maxNumSeqs": 16},
        "decode": {"replicas": 3, "tensorParallelSize": 8, "gpusPerPod": 8},
    }
    prefill, decode = statefulset(patch, "prefill"), statefulset(patch, "decode")
    assert (prefill["spec"]["replicas"], decode["spec"]["replicas"]) == (2, 3)
    assert flag(container(patch, "prefill")["command"], "--tensor-parallel-size") == "4"
    assert flag(container(patch, "prefill")["command"], "--max-num-seqs") == "16"
    assert flag(container(patch, "decode")["command"], "--tensor-parallel-size") == "8"
    assert container(patch, "prefill")["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert container(patch, "decode")["resources"]["limits"]["nvidia.com/gpu"] == 8


def test_gpus_per_pod_above_tp() -> None:
    patch = {"prefill": {"tensorParallelSize": 4, "gpusPerPod": 8}}
    assert container(patch, "prefill")["resources"]["limits"]["nvidia.com/gpu"] == 8


def test_prefix_caching_per_role() -> None:
    patch = {"prefill": {"prefixCaching": False}}
    assert "--no-enable-prefix-caching" in container(patch, "prefill")["command"]
    assert "--enable-prefix-caching" in container(patch, "decode")["command"]


def test_extra_args_come_last_after_the_marker() -> None:
    patch = {"decode": {"extraArgs": ["--enforce-eager", "--gpu-memory-utilization=0.9"]}}
    command = container(patch, "decode")["command"]
    assert command.count("--") == 2
    assert command[-3:] == ["--", "--enforce-eager", "--gpu-memory-utilization=0.9"]
    assert container(patch, "prefill")["command"].count("--") == 1
    assert "--enforce-eager" not in container(patch, "prefill")["command"]


def test_user_env_is_added_and_replaces_injected_variables() -> None:
    patch = {
        "prefill": {
            "env": [
                {"name": "HF_HOME", "value": "/elsewhere"},
                {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            ]
        }
    }
    variables = env(container(patch, "prefill"))
    assert variables["HF_HOME"] == {"name": "HF_HOME", "value": "/elsewhere"}
    assert variables["API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "s", "key": "k"}}
    assert [var["name"] for var in container(patch, "prefill")["env"]].count("HF_HOME") == 1


def test_resources_merge_over_defaults() -> None:
    patch = {"decode": {"resources": {"requests": {"memory": "1Ti"}, "limits": {"memory": "1Ti"}}}}
    resources = container(patch, "decode")["resources"]
    assert resources["requests"] == {"cpu": "8", "memory": "1Ti"}
    assert resources["limits"]["memory"] == "1Ti"
    assert resources["limits"]["nvidia.com/gpu"] == 1


def test_scheduling_fields() -> None:
    patch = {
        "prefill": {
            "nodeSelector": {"node.kubernetes.io/instance-type": "p5en.48xlarge"},
            "tolerations": [{"key": "dedicated", "value": "llm", "effect": "NoSchedule"}],
            "podAnnotations": {"team": "ml"},
            "podLabels": {"cost-center": "42"},
        }
    }
    spec = pod(patch, "prefill")
    assert spec["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5en.48xlarge"}
    assert spec["tolerations"][-1] == {
        "key": "dedicated",
        "operator": "Equal",
        "value": "llm",
        "effect": "NoSchedule",
    }
    template = statefulset(patch, "prefill")["spec"]["template"]["metadata"]
    assert template["annotations"]["team"] == "ml"
    assert template["labels"]["cost-center"] == "42"
    assert pod(patch, "decode")["nodeSelector"] == {}


def test_gpu_and_efa_tolerations() -> None:
    keys = [t["key"] for t in pod(None, "decode")["tolerations"]]
    assert keys == ["nvidia.com/gpu", "vpc.amazonaws.com/efa"]
    no_efa = [t["key"] for t in pod({"efa": {"enabled": False}}, "decode")["tolerations"]]
    assert no_efa == ["nvidia.com/gpu"]


def test_prefill_and_decode_share_a_zone() -> None:
    for role in ("prefill", "decode"):
        (term,) = pod(None, role)["affinity"]["podAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["topologyKey"] == "topology.kubernetes.io/zone"
        assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == NAME
        (expression,) = term["labelSelector"]["matchExpressions"]
        assert expression["values"] == ["prefill", "decode"]


def test_user_affinity_is_kept_and_own_pod_affinity_wins() -> None:
    node_affinity: dict[str, Any] = {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}
    }
    affinity = pod({"decode": {"affinity": {"nodeAffinity": node_affinity}}}, "decode")["affinity"]
    assert affinity["nodeAffinity"] == node_affinity
    assert "podAffinity" in affinity
    own: dict[str, Any] = {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    assert pod({"decode": {"affinity": own}}, "decode")["affinity"] == own


# ---- KV transfer and EFA in the pods ------------------------------------------------------


def test_side_channel_env_and_ports() -> None:
    patch = {"kvTransfer": {"sideChannelPort": 5800}}
    main = container(patch, "decode")
    variables = env(main)
    assert variables["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "status.podIP"}
    }
    assert variables["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == "5800"
    assert {"name": "side-channel", "containerPort": 5800} in main["ports"]
    service = objects(patch)[f"Service/{NAME}-decode"]
    assert service["spec"]["clusterIP"] == "None"
    assert {"name": "side-channel", "port": 5800, "targetPort": "side-channel"} in service["spec"][
        "ports"
    ]


def test_hash_seed_is_shared_by_prefill_and_decode_of_one_model_only() -> None:
    seeds = {
        env(container(None, role))["PYTHONHASHSEED"]["value"] for role in ("prefill", "decode")
    }
    assert seeds == {str(hash_seed(NAME, NAMESPACE))}
    assert hash_seed(NAME, NAMESPACE) != hash_seed("other", NAMESPACE)
    assert 0 <= hash_seed(NAME, NAMESPACE) <= 4294967295


def test_efa_enabled_pod_needs() -> None:
    patch = {"efa": {"devicesPerPod": 8, "hugepages2Mi": "2Gi", "provider": "efa-direct"}}
    main = container(patch, "prefill")
    assert main["resources"]["limits"]["vpc.amazonaws.com/efa"] == 8
    assert main["resources"]["limits"]["hugepages-2Mi"] == "2Gi"
    assert main["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert env(main)["FI_PROVIDER"]["value"] == "efa-direct"


def test_efa_disabled_pod_has_none_of_it() -> None:
    main = container({"efa": {"enabled": False}}, "prefill")
    assert "vpc.amazonaws.com/efa" not in main["resources"]["limits"]
    assert "hugepages-2Mi" not in main["resources"]["limits"]
    assert main["securityContext"] == {}
    assert "FI_PROVIDER" not in env(main)


def test_prompt_token_details_are_on_for_both_roles() -> None:
    """The router's reused/recomputed counters read usage.prompt_tokens_details."""
    for role in ("prefill", "decode"):
        assert "--enable-prompt-tokens-details" in container(None, role)["command"]


def test_shared_memory_is_memory_backed() -> None:
    volumes = {v["name"]: v for v in pod(None, "decode")["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container(None, "decode")["volumeMounts"]


def test_health_probes() -> None:
    main = container(None, "prefill")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert main[probe]["httpGet"] == {"path": "/health", "port": "http"}


def test_a_leaving_pod_waits_for_the_routers_then_vllm_drains_within_the_grace_period() -> None:
    for role in ("prefill", "decode"):
        default, custom = pod(None, role), pod({role: {"terminationGracePeriodSeconds": 300}}, role)
        assert default["terminationGracePeriodSeconds"] == 120
        assert custom["terminationGracePeriodSeconds"] == 300
        main = default["containers"][0]
        assert main["lifecycle"] == {"preStop": {"sleep": {"seconds": DRAIN_DELAY_SECONDS}}}
        assert flag(main["command"], "--shutdown-timeout") == str(120 - 15)
        assert flag(custom["containers"][0]["command"], "--shutdown-timeout") == str(300 - 15)
    other = pod({"decode": {"terminationGracePeriodSeconds": 60}}, "prefill")
    assert other["terminationGracePeriodSeconds"] == 120, "each role has its own"


# ---- router ------------------------------------------------------------------------------


def test_router_command_names_services_and_ttls() -> None:
    patch = {"kvTransfer": {"decoderKvBlocksTtlSeconds": 600}, "router": {"port": 9000}}
    command = router_container(patch)["command"]
    assert command[:2] == ["disagg", "router"]
    assert flag(command, "--port") == "9000"
    assert flag(command, "--discovery") == "kubernetes"
    assert flag(command, "--namespace") == NAMESPACE
    assert flag(command, "--prefill-service") == f"{NAME}-prefill"
    assert flag(command, "--decode-service") == f"{NAME}-decode"
    assert flag(command, "--conversation-ttl") == "570"
    assert flag(command, "--decode-kv-ttl") == "600"
    assert (
        flag(
            router_container({"router": {"conversationTtlSeconds": 100}})["command"],
            "--conversation-ttl",
        )
        == "100"
    )


def _repeated(command: list[str], name: str) -> list[str]:
    return [value for key, value in pairwise(command) if key == name]


def test_router_renders_every_tenant_bound_and_the_header_timeout() -> None:
    command = router_container(ROUTER_TENANTS)["command"]
    assert flag(command, "--header-timeout") == "30"
    assert flag(command, "--max-requests-per-tenant") == "256"
    assert flag(command, "--max-conversations-per-tenant") == "2000"
    assert _repeated(command, "--tenant-requests") == ["default=1024", "team-a=512"]
    assert _repeated(command, "--tenant-conversations") == ["team-a=9000", "team-b=50"]


def test_router_defaults_render_the_routers_own_defaults_and_no_request_share() -> None:
    command = router_container()["command"]
    assert flag(command, "--max-concurrent-requests") == str(ROUTER_MAX_CONCURRENT_REQUESTS)
    assert flag(command, "--header-timeout") == "10"
    assert flag(command, "--max-conversations-per-tenant") == "10000"
    for absent in ("--max-requests-per-tenant", "--tenant-requests", "--tenant-conversations"):
        assert absent not in command, "without spec.router.tenants no tenant has its own bound"


def test_a_leaving_router_pod_serves_until_kube_proxy_lets_go_then_finishes_its_requests() -> None:
    for patch, grace in ((None, 120), ({"router": {"terminationGracePeriodSeconds": 600}}, 600)):
        deployment = objects(patch)[f"Deployment/{NAME}-router"]
        assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == grace
        main = deployment["spec"]["template"]["spec"]["containers"][0]
        assert main["lifecycle"] == {"preStop": {"sleep": {"seconds": DRAIN_DELAY_SECONDS}}}
        assert flag(main["command"], "--shutdown-timeout") == str(grace - 15)


def test_router_service_and_replicas() -> None:
    patch = {
        "router": {
            "replicas": 2,
            "serviceType": "LoadBalancer",
            "port": 9000,
            "redis": {"url": "redis://valkey:6379/0"},
        }
    }
    manifests = objects(patch)
    assert manifests[f"Deployment/{NAME}-router"]["spec"]["replicas"] == 2
    service = manifests[f"Service/{NAME}-router"]["spec"]
    assert service["type"] == "LoadBalancer"
    assert service["ports"] == [{"name": "http", "port": 9000, "targetPort": "http"}]


EXPOSED_ROUTER = {
    "router": {
        "serviceType": "LoadBalancer",
        "service": {
            "annotations": {"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"},
            "loadBalancerSourceRanges": ["10.0.0.0/8", "fd00::/8"],
        },
    }
}


def test_router_service_carries_annotations_and_source_ranges() -> None:
    service = objects(EXPOSED_ROUTER)[f"Service/{NAME}-router"]
    assert service["metadata"]["annotations"] == {
        "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"
    }
    assert service["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/8", "fd00::/8"]
    _validate_all([service])


def test_router_service_without_either_sets_neither() -> None:
    service = objects()[f"Service/{NAME}-router"]
    assert "annotations" not in service["metadata"]
    assert "loadBalancerSourceRanges" not in service["spec"]


def test_router_service_exposure_leaves_the_other_children_untouched() -> None:
    before, after = objects(), objects(EXPOSED_ROUTER)
    changed = sorted(key for key in before if before[key] != after[key])
    assert changed == [f"Service/{NAME}-router"]


@pytest.mark.parametrize(
    ("service", "says"),
    [
        ({"annotations": {"disagg.dev/applied-hash": "0"}}, "the operator owns them"),
        (
            {
                "annotations": {
                    "service.beta.kubernetes.io/load-balancer-source-ranges": "1.2.3.4/32"
                }
            },
            "set spec.router.service.loadBalancerSourceRanges instead",
        ),
        ({"loadBalancerSourceRanges": ["10.0.0.0/33"]}, "must be an IPv4 or IPv6 CIDR"),
    ],
)
def test_router_service_collisions_are_refused_before_rendering(
    service: dict[str, Any], says: str
) -> None:
    patch = {"router": {"serviceType": "LoadBalancer", "service": service}}
    with pytest.raises(SpecError, match=r"spec\.router\.service\.") as caught:
        objects(patch)
    assert says in str(caught.value)


def test_router_without_redis_keeps_conversations_in_memory() -> None:
    main = router_container()
    assert "--store" not in main["command"]
    assert "--redis-url" not in main["command"]
    assert "env" not in main


def test_router_redis_url_is_passed_literally() -> None:
    main = router_container({"router": {"redis": {"url": "redis://:pa$(x)@valkey:6379/0"}}})
    assert flag(main["command"], "--store") == "redis"
    assert flag(main["command"], "--redis-url") == "redis://:pa$$(x)@valkey:6379/0"
    assert "env" not in main


def test_router_redis_url_from_secret_is_expanded_from_env() -> None:
    patch = {"router": {"replicas": 2, "redis": {"urlSecret": {"name": "valkey", "key": "uri"}}}}
    main = router_container(patch)
    assert flag(main["command"], "--store") == "redis"
    assert flag(main["command"], "--redis-url") == "$(DISAGG_REDIS_URL)"
    assert main["env"] == [
        {
            "name": "DISAGG_REDIS_URL",
            "valueFrom": {"secretKeyRef": {"name": "valkey", "key": "uri"}},
        }
    ]
    default_key = router_container({"router": {"redis": {"urlSecret": {"name": "valkey"}}}})
    assert default_key["env"][0]["valueFrom"]["secretKeyRef"]["key"] == "url"


def test_router_resources_and_rbac() -> None:
    patch = {"router": {"resources": {"limits": {"memory": "1Gi"}}}}
    assert router_container(patch)["resources"] == {
        "requests": {"cpu": "500m", "memory": "512Mi"},
        "limits": {"memory": "1Gi"},
    }
    manifests = objects()
    (rule,) = manifests[f"Role/{NAME}-router"]["rules"]
    assert rule == {
        "apiGroups": ["discovery.k8s.io"],
        "resources": ["endpointslices"],
        "verbs": ["get", "list", "watch"],
    }
    deployment = manifests[f"Deployment/{NAME}-router"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == f"{NAME}-router"


# ---- disruption budgets --------------------------------------------------------------------

WORKLOADS = {"prefill": "StatefulSet", "decode": "StatefulSet", "router": "Deployment"}


def _pod_labels(manifests: dict[str, Manifest]) -> dict[str, dict[str, str]]:
    """Each workload's pod template labels, keyed `Kind/name`."""
    return {
        key: m["spec"]["template"]["metadata"]["labels"]
        for key, m in manifests.items()
        if "template" in m.get("spec", {})
    }


def test_each_component_has_a_budget_selecting_exactly_its_own_pods() -> None:
    patch = {"prefill": {"podLabels": {"team": "a"}}, "decode": {"podLabels": {"team": "a"}}}
    manifests = objects(patch)
    templates = {**_pod_labels(manifests), **_pod_labels(objects(patch, name="other"))}
    for component, kind in WORKLOADS.items():
        budget = manifests[f"PodDisruptionBudget/{NAME}-{component}"]
        workload = manifests[f"{kind}/{NAME}-{component}"]
        selector = workload["spec"]["selector"]
        assert budget["spec"] == {
            "maxUnavailable": 1,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
            "selector": selector,
        }
        assert budget["metadata"]["labels"] == workload["metadata"]["labels"]
        selected = [
            key
            for key, labels in templates.items()
            if selector["matchLabels"].items() <= labels.items()
        ]
        assert selected == [f"{kind}/{NAME}-{component}"], component


def test_budgets_do_not_depend_on_replicas_and_stay_at_zero() -> None:
    zero = {
        "prefill": {"replicas": 0},
        "decode": {"replicas": 4},
        "router": {"replicas": 0},
    }
    before, after = objects(), objects(zero)
    for component in WORKLOADS:
        key = f"PodDisruptionBudget/{NAME}-{component}"
        assert after[key] == before[key]


# ---- names, labels, validity ---------------------------------------------------------------


def test_children_and_order() -> None:
    assert list(objects()) == [
        f"ConfigMap/{NAME}-connector",
        f"Service/{NAME}-prefill",
        f"PodDisruptionBudget/{NAME}-prefill",
        f"NetworkPolicy/{NAME}-prefill",
        f"StatefulSet/{NAME}-prefill",
        f"Service/{NAME}-decode",
        f"PodDisruptionBudget/{NAME}-decode",
        f"NetworkPolicy/{NAME}-decode",
        f"StatefulSet/{NAME}-decode",
        f"ServiceAccount/{NAME}-router",
        f"Role/{NAME}-router",
        f"RoleBinding/{NAME}-router",
        f"Service/{NAME}-router",
        f"PodDisruptionBudget/{NAME}-router",
        f"NetworkPolicy/{NAME}-router",
        f"Deployment/{NAME}-router",
    ]


def test_labels_and_selectors_agree() -> None:
    for manifest in objects().values():
        meta = manifest["metadata"]
        assert meta["namespace"] == NAMESPACE
        assert "ownerReferences" not in meta
        assert meta["labels"]["app.kubernetes.io/instance"] == NAME
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "disagg-operator"
        spec = manifest.get("spec", {})
        if "template" in spec:
            selector = spec["selector"]["matchLabels"]
            assert selector.items() <= spec["template"]["metadata"]["labels"].items()
        if manifest["kind"] == "Service":
            component = meta["labels"]["app.kubernetes.io/component"]
            assert spec["selector"]["app.kubernetes.io/component"] == component


def test_longest_name_fits_kubernetes_limits() -> None:
    name = "a" * MAX_NAME_LENGTH
    for key, manifest in objects(name=name).items():
        assert len(manifest["metadata"]["name"]) <= 63, key
        if manifest["kind"] == "StatefulSet":
            # `<name>-<10-char hash>` becomes the controller-revision-hash label value.
            assert len(manifest["metadata"]["name"]) + 11 <= 63


@pytest.mark.parametrize("name", ["a" * (MAX_NAME_LENGTH + 1), "Upper", "-x"])
def test_render_refuses_names_the_crd_refuses(name: str) -> None:
    with pytest.raises(SpecError, match=r"^metadata\.name: "):
        render(name, NAMESPACE, load_spec(minimal_spec()))


def test_render_is_deterministic() -> None:
    assert objects() == objects()


def _validate_all(manifests: list[Manifest]) -> None:
    """Every manifest against Kubernetes' schema; a LeaderWorkerSet (no schema here: the API
    server checks it against its CRD in tests/cluster) by its leader and worker pod templates."""
    for manifest in manifests:
        if manifest["kind"] != "LeaderWorkerSet":
            kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
            continue
        group = manifest["spec"]["leaderWorkerTemplate"]
        for template in (group["leaderTemplate"], group["workerTemplate"]):
            pod_template = {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": manifest["metadata"]["name"]},
                "template": template,
            }
            kubernetes_validate.validate(pod_template, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_example_manifests_validate_against_kubernetes_schema(path: Any) -> None:
    model = load_resource(load_example(path))
    manifests = render(model.metadata.name, model.metadata.namespace, model.spec)
    assert len(manifests) == 16
    _validate_all(manifests)


def test_feature_rich_spec_validates_against_kubernetes_schema() -> None:
    patch = {
        "model": {
            "cache": {"hostPath": {"path": "/data"}},
            "tokenSecret": {"name": "hf"},
            "revision": "main",
        },
        "image": {"pullSecrets": ["regcred"]},
        "prefill": {
            "tolerations": [{"operator": "Exists"}],
            "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "k", "operator": "Exists"}]}
                        ]
                    }
                }
            },
            "resources": {"requests": {"cpu": 16}},
        },
        "efa": {"enabled": False},
        "router": {"serviceType": "NodePort"},
    }
    _validate_all(render(NAME, NAMESPACE, load_spec(spec_with(patch))))
    _validate_all(render(NAME, NAMESPACE, load_spec(minimal_spec())))


def test_validator_catches_a_broken_manifest() -> None:
    broken = render(NAME, NAMESPACE, load_spec(minimal_spec()))[2]
    broken["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
