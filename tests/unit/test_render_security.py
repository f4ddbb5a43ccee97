"""Rendering of the model's keys, tenants, NetworkPolicies and Redis prefix: the offer-signing
Secret only in prefill and decode, the engine credential the engines' only key and a file in
the router, client keys only in the router, every pod reachable only as the policies say, and
the rendered router command one `disagg router` accepts."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from disagg.cli import build_parser
from disagg_contract import (
    CLIENT_KEYS_DIR,
    ENGINE_KEY_DIR,
    OFFER_KEY_DIR,
    OFFER_KEY_FILE_ENV,
    SECRET_KEY_NAME,
)
from disagg_operator.loading import load_spec
from disagg_operator.render import render
from disagg_router.options import config_from_args
from dmodel_samples import spec_with

NAME, NAMESPACE = "demo", "ml"
KUBERNETES_VERSION = kubernetes_validate.latest_version()
ROLES = ("prefill", "decode")
AUTH = {"auth": {"apiKeySecret": {"name": "api"}, "clientKeysSecret": {"name": "clients"}}}
UCX = {"efa": {"enabled": False}}


def _objects(patch: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    spec = load_spec(spec_with(patch or {}))
    return {f"{m['kind']}/{m['metadata']['name']}": m for m in render(NAME, NAMESPACE, spec)}


def _pod(patch: dict[str, Any] | None, component: str) -> dict[str, Any]:
    kind = "Deployment" if component == "router" else "StatefulSet"
    spec: dict[str, Any] = _objects(patch)[f"{kind}/{NAME}-{component}"]["spec"]["template"]
    return dict(spec["spec"])


def _secrets_used(pod: dict[str, Any]) -> set[str]:
    """Every Secret a pod reads, by volume or environment."""
    names = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    for container in pod["containers"]:
        for var in container.get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                names.add(ref["name"])
    return names


def _mounts(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    volumes = {v["name"]: v for v in pod["volumes"]}
    (container,) = pod["containers"]
    return {m["mountPath"]: {**m, **volumes[m["name"]]} for m in container["volumeMounts"]}


def _env(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (container,) = pod["containers"]
    return {var["name"]: var for var in container.get("env", [])}


def _policy(patch: dict[str, Any] | None, component: str) -> dict[str, Any]:
    return dict(_objects(patch)[f"NetworkPolicy/{NAME}-{component}"]["spec"])


def _pods_of(component: str) -> dict[str, Any]:
    labels = {
        "app.kubernetes.io/name": "disagg",
        "app.kubernetes.io/instance": NAME,
        "app.kubernetes.io/component": component,
    }
    return {"podSelector": {"matchLabels": labels}}


# ---- keys -----------------------------------------------------------------------------------


@pytest.mark.parametrize("patch", [None, AUTH], ids=["no-auth", "auth"])
def test_offer_key_is_mounted_read_only_in_prefill_and_decode_only(
    patch: dict[str, Any] | None,
) -> None:
    for role in ROLES:
        pod = _pod(patch, role)
        mount = _mounts(pod)[OFFER_KEY_DIR]
        assert mount["readOnly"] is True
        assert mount["secret"] == {"secretName": f"{NAME}-offer-key"}
        assert _env(pod)[OFFER_KEY_FILE_ENV] == {
            "name": OFFER_KEY_FILE_ENV,
            "value": f"{OFFER_KEY_DIR}/{SECRET_KEY_NAME}",
        }
    router = _pod(patch, "router")
    assert f"{NAME}-offer-key" not in _secrets_used(router)
    assert not any(path.startswith(OFFER_KEY_DIR) for path in _mounts(router))
    assert OFFER_KEY_FILE_ENV not in _env(router)


@pytest.mark.parametrize("patch", [None, AUTH], ids=["no-auth", "auth"])
def test_engines_accept_only_the_engine_credential_which_the_router_holds(
    patch: dict[str, Any] | None,
) -> None:
    engine_key = {"secretKeyRef": {"name": f"{NAME}-engine-key", "key": SECRET_KEY_NAME}}
    for role in ROLES:
        pod = _pod(patch, role)
        assert _env(pod)["VLLM_API_KEY"]["valueFrom"] == engine_key
        assert _secrets_used(pod) == {f"{NAME}-offer-key", f"{NAME}-engine-key"}
    router = _pod(patch, "router")
    mount = _mounts(router)[ENGINE_KEY_DIR]
    assert (mount["readOnly"], mount["secret"]) == (True, {"secretName": f"{NAME}-engine-key"})
    (container,) = router["containers"]
    command = container["command"]
    assert command[command.index("--engine-key-file") + 1] == f"{ENGINE_KEY_DIR}/{SECRET_KEY_NAME}"


def test_client_keys_reach_the_router_only() -> None:
    router = _pod(AUTH, "router")
    mount = _mounts(router)[CLIENT_KEYS_DIR]
    assert (mount["readOnly"], mount["secret"]) == (True, {"secretName": "clients"})
    (container,) = router["containers"]
    command = container["command"]
    assert command[command.index("--client-keys-dir") + 1] == CLIENT_KEYS_DIR
    assert _env(router)["DISAGG_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "api"
    for role in ROLES:
        assert not {"api", "clients"} & _secrets_used(_pod(AUTH, role))
    only_tenants = {"auth": {"clientKeysSecret": {"name": "clients"}}}
    assert "DISAGG_API_KEY" not in _env(_pod(only_tenants, "router"))
    assert "--client-keys-dir" not in _pod(None, "router")["containers"][0]["command"]
    assert CLIENT_KEYS_DIR not in _mounts(_pod(None, "router"))


@pytest.mark.parametrize("patch", [None, AUTH], ids=["no-auth", "auth"])
def test_the_rendered_router_command_is_one_disagg_router_accepts(
    patch: dict[str, Any] | None,
) -> None:
    redis = {"router": {"redis": {"url": "redis://valkey:6379/0"}}}
    (container,) = _pod({**(patch or {}), **redis}, "router")["containers"]
    program, *args = container["command"]
    config = config_from_args(build_parser().parse_args(args))
    assert program == "disagg"
    assert config.engine_key_file == f"{ENGINE_KEY_DIR}/{SECRET_KEY_NAME}"
    assert (config.client_keys_dir or None) == (CLIENT_KEYS_DIR if patch else None)
    assert config.authenticates == bool(patch)
    assert config.redis_prefix == f"disagg:{NAMESPACE}:{NAME}:conv:"


def test_redis_prefix_is_per_model_and_only_with_redis() -> None:
    redis = {"router": {"redis": {"urlSecret": {"name": "valkey"}}}}
    spec = load_spec(spec_with(redis))
    prefixes = set()
    for name, namespace in (("a", "x"), ("b", "x"), ("a", "y")):
        (deployment,) = [m for m in render(name, namespace, spec) if m["kind"] == "Deployment"]
        command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
        prefixes.add(command[command.index("--redis-prefix") + 1])
    assert prefixes == {"disagg:x:a:conv:", "disagg:x:b:conv:", "disagg:y:a:conv:"}
    assert "--redis-prefix" not in _pod(None, "router")["containers"][0]["command"]


# ---- NetworkPolicies --------------------------------------------------------------------------


def test_every_component_has_an_ingress_policy_selecting_its_own_pods() -> None:
    objects = _objects()
    for component in (*ROLES, "router"):
        policy = objects[f"NetworkPolicy/{NAME}-{component}"]
        kind = "Deployment" if component == "router" else "StatefulSet"
        workload = objects[f"{kind}/{NAME}-{component}"]
        assert policy["spec"]["podSelector"] == workload["spec"]["selector"]
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert policy["metadata"]["labels"] == workload["metadata"]["labels"]
        kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)
    names = list(objects)
    for component, kind in (("prefill", "StatefulSet"), ("router", "Deployment")):
        first = names.index(f"NetworkPolicy/{NAME}-{component}")
        assert first < names.index(f"{kind}/{NAME}-{component}"), "no pod runs unprotected"


def test_over_efa_the_engines_open_only_the_side_channel_to_each_other() -> None:
    """EFA's SRD traffic bypasses the IP stack; NIXL's side channel is TCP."""
    port = {"kvTransfer": {"sideChannelPort": 6100}}
    for role, peer in (("prefill", "decode"), ("decode", "prefill")):
        assert _policy(port, role)["ingress"][:2] == [
            {"from": [_pods_of("router")], "ports": [{"protocol": "TCP", "port": 8000}]},
            {"from": [_pods_of(peer)], "ports": [{"protocol": "TCP", "port": 6100}]},
        ]
    assert len(_policy(port, "prefill")["ingress"]) == 3  # and decode's claims on the lease port


def test_the_lease_ports_are_open_to_the_model_router_and_the_other_role_only() -> None:
    """Over EFA the KV rule opens only the side channel, so the lease rule is what lets the
    router renew and release and prefill claim on decode, and decode claim on prefill;
    bidirectional off, decode opens no lease port and prefill's still serves decode."""
    lease_port = [{"protocol": "TCP", "port": 5700}]
    for patch in ({"kvTransfer": {"sideChannelPort": 6100}}, UCX):
        *_, lease = _policy(patch, "decode")["ingress"]
        assert lease == {"from": [_pods_of("router"), _pods_of("prefill")], "ports": lease_port}
        *_, lease = _policy(patch, "prefill")["ingress"]
        assert lease == {"from": [_pods_of("decode")], "ports": lease_port}
    bidirectional_off = {"kvTransfer": {"bidirectional": False}}
    off = _policy(bidirectional_off, "decode")["ingress"]
    assert all({"protocol": "TCP", "port": 5700} not in rule["ports"] for rule in off)
    assert len(off) == 2
    *_, lease = _policy(bidirectional_off, "prefill")["ingress"]
    assert lease == {"from": [_pods_of("decode")], "ports": lease_port}
    for role in ("decode", "prefill"):
        kubernetes_validate.validate(
            _objects()[f"NetworkPolicy/{NAME}-{role}"], KUBERNETES_VERSION, strict=True
        )


def test_over_ucx_the_engines_open_every_port_but_vllm_to_each_other() -> None:
    """UCX's TCP transport listens on ports the kernel picks, so the peer role gets every port
    but vLLM's (which includes the side channel); the vLLM port stays the router's."""
    for role, peer in (("prefill", "decode"), ("decode", "prefill")):
        router, kv = _policy(UCX, role)["ingress"][:2]
        assert router == {
            "from": [_pods_of("router")],
            "ports": [{"protocol": "TCP", "port": 8000}],
        }
        assert kv == {
            "from": [_pods_of(peer)],
            "ports": [
                {"protocol": "TCP", "port": 1, "endPort": 7999},
                {"protocol": "TCP", "port": 8001, "endPort": 65535},
            ],
        }
    open_ports = [
        port
        for rule in _policy(UCX, "prefill")["ingress"]
        for p in rule["ports"]
        for port in range(p["port"], p.get("endPort", p["port"]) + 1)
        if rule["from"] != [_pods_of("router")]
    ]
    assert 8000 not in open_ports and 5600 in open_ports


def test_role_allowed_from_opens_only_the_vllm_port_of_that_role() -> None:
    scraper = {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}, "podSelector": {}}
    patch = {"decode": {"allowedFrom": [scraper]}}
    *_, lease, extra = _policy(patch, "decode")["ingress"]
    assert extra == {"from": [scraper], "ports": [{"protocol": "TCP", "port": 8000}]}
    assert scraper not in lease["from"]
    assert len(_policy(patch, "prefill")["ingress"]) == 3


def test_router_ingress_is_open_by_default_and_narrowed_by_allowed_from() -> None:
    assert _policy({"router": {"port": 9000}}, "router")["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": 9000}]}
    ]
    peers = [
        {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.9.0.0/16"]}},
        {
            "podSelector": {
                "matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]
            }
        },
        {"namespaceSelector": {}},
    ]
    policy = _objects({"router": {"allowedFrom": peers}})[f"NetworkPolicy/{NAME}-router"]
    assert policy["spec"]["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": 8000}], "from": peers}
    ]
    kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)
