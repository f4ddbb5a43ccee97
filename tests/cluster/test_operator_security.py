"""The model's keys, tenants and NetworkPolicies on the real control plane, reconciled by the
real operator process: the offer-signing and engine-credential Secrets exist, owned by the
model, are created afresh when deleted, are never rewritten (not even after a rotation by hand)
and go with the model; the offer key is mounted in prefill and decode pods and never in the
router's, whose ServiceAccount cannot read it; the client keys reach the router only; the three
NetworkPolicies render, are owned, and are repaired after a hand edit or a deletion; a missing
client-keys Secret is Degraded naming the field.

kwok fakes the kubelet and there is no CNI: nothing here enforces a NetworkPolicy or reads a
mounted key; that is what the pod specs, the API server's authorizer and the engine tests
(tests/engine) cover.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import kube
from disagg_contract import (
    CLIENT_KEYS_DIR,
    ENGINE_KEY_DIR,
    LEASE_PORT,
    OFFER_KEY_DIR,
    SECRET_KEY_NAME,
)
from disagg_operator.children import adopt
from disagg_operator.drift import differences
from disagg_operator.loading import load_resource
from disagg_operator.render import render
from operator_fixtures import (  # noqa: F401
    StartOperator,
    crds,
    small_model,
    start_operator,
)
from operator_harness import condition, dmodel, wait_ready

NAME = "m"
POLICIES = [f"{NAME}-{component}" for component in ("prefill", "decode", "router")]
KEYS = [f"{NAME}-offer-key", f"{NAME}-engine-key"]
AUTH = {"apiKeySecret": {"name": "api"}, "clientKeysSecret": {"name": "clients"}}
ROUTER = {
    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
    "redis": {"url": "redis://valkey:6379/0"},
    "allowedFrom": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}],
}


def _get(kubectl: kube.Kubectl, namespace: str, kind: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = kubectl.json("-n", namespace, "get", kind, name)
    return obj


def _exists(kubectl: kube.Kubectl, namespace: str, kind: str, name: str) -> bool:
    return kubectl.run("-n", namespace, "get", kind, name, check=False).returncode == 0


def _key(secret: dict[str, Any]) -> str:
    return base64.b64decode(secret["data"][SECRET_KEY_NAME]).decode()


def _pods(kubectl: kube.Kubectl, namespace: str, component: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component={component}"
    items: list[dict[str, Any]] = kubectl.json("-n", namespace, "get", "pods", "-l", selector)[
        "items"
    ]
    return items


def _secrets_read(pod: dict[str, Any]) -> set[str]:
    """Every Secret a pod reads, by volume (projected ones included) or environment."""
    names = set()
    for volume in pod["spec"].get("volumes", []):
        if "secret" in volume:
            names.add(volume["secret"]["secretName"])
        for source in volume.get("projected", {}).get("sources", []):
            if "secret" in source:
                names.add(source["secret"]["name"])
    for container in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
        for var in container.get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                names.add(ref["name"])
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                names.add(source["secretRef"]["name"])
    return names


def _mounts(pod: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Mount path -> (Secret name, read-only) for the pod's Secret volumes."""
    secrets = {
        v["name"]: v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v
    }
    (container,) = pod["spec"]["containers"]
    return {
        m["mountPath"]: (secrets[m["name"]], m.get("readOnly", False))
        for m in container.get("volumeMounts", [])
        if m["name"] in secrets
    }


def _can(kubectl: kube.Kubectl, namespace: str, user: str, *what: str) -> bool:
    result = kubectl.run("auth", "can-i", *what, f"--as={user}", "-n", namespace, check=False)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), (what, result.stdout, result.stderr)
    return answer == "yes"


def _poke(kubectl: kube.Kubectl, namespace: str) -> None:
    """A label on every workload by hand: child events, so the operator runs a pass."""
    kubectl("-n", namespace, "label", "statefulsets,deployments", "-l",
            f"app.kubernetes.io/instance={NAME}", "example.com/poked=yes")  # fmt: skip


def _rendered_policies(applied: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
    """The model's NetworkPolicies as the operator applies them (owned by the live model)."""
    resource = load_resource(applied)
    meta = resource.metadata
    return {
        m["metadata"]["name"]: adopt(m, live)
        for m in render(meta.name, meta.namespace, resource.spec)
        if m["kind"] == "NetworkPolicy"
    }


def _policies_as_rendered(
    kubectl: kube.Kubectl, namespace: str, wanted: dict[str, dict[str, Any]]
) -> bool:
    for name, desired in wanted.items():
        live = kubectl.run("-n", namespace, "get", "networkpolicy", name, "-o", "json", check=False)
        if live.returncode != 0 or differences(desired, json.loads(live.stdout)):
            return False
    return True


def test_keys_tenants_and_network_policies(
    kubectl: kube.Kubectl,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
) -> None:
    ns = ("-n", namespace)
    kubectl(*ns, "create", "secret", "generic", "api", "--from-literal=token=sk-default-0123")
    tenants = ("--from-literal=team-a=sk-team-a-0123", "--from-literal=team-b=sk-team-b-0123")
    kubectl(*ns, "create", "secret", "generic", "clients", *tenants)
    start_operator()
    applied = small_model(NAME, namespace, auth=AUTH, router=ROUTER)
    kubectl.apply(applied)
    wait_ready(kubectl, namespace, NAME)
    model = dmodel(kubectl, namespace, NAME)
    uid = model["metadata"]["uid"]
    policies = _rendered_policies(applied, model)
    assert sorted(policies) == sorted(POLICIES)

    # The generated Secrets: owned by the model, one random 64-hex-character key each.
    secrets = {name: _get(kubectl, namespace, "secret", name) for name in KEYS}
    for secret in secrets.values():
        (owner,) = secret["metadata"]["ownerReferences"]
        assert (owner["uid"], owner["controller"]) == (uid, True)
        assert re.fullmatch("[0-9a-f]{64}", _key(secret))
    assert _key(secrets[KEYS[0]]) != _key(secrets[KEYS[1]])

    # The offer key in prefill and decode pods (read-only, where the engines read it), never
    # in a router pod; the engine credential in the router; client keys in the router only.
    for role in ("prefill", "decode"):
        (pod,) = _pods(kubectl, namespace, role)
        assert _mounts(pod)[OFFER_KEY_DIR] == (f"{NAME}-offer-key", True)
        assert _secrets_read(pod) == {f"{NAME}-offer-key", f"{NAME}-engine-key"}
    (router,) = _pods(kubectl, namespace, "router")
    assert f"{NAME}-offer-key" not in _secrets_read(router)
    assert _secrets_read(router) == {f"{NAME}-engine-key", "clients", "api"}
    assert _mounts(router) == {
        ENGINE_KEY_DIR: (f"{NAME}-engine-key", True),
        CLIENT_KEYS_DIR: ("clients", True),
    }
    command = router["spec"]["containers"][0]["command"]
    assert command[command.index("--redis-prefix") + 1] == f"disagg:{namespace}:{NAME}:conv:"

    # The router's ServiceAccount reads its EndpointSlices and no Secret at all.
    router_sa = f"system:serviceaccount:{namespace}:{router['spec']['serviceAccountName']}"
    assert _can(kubectl, namespace, router_sa, "list", "endpointslices.discovery.k8s.io")
    for secret in KEYS:
        assert not _can(kubectl, namespace, router_sa, "get", f"secret/{secret}")
    for verb in ("get", "list", "watch"):
        assert not _can(kubectl, namespace, router_sa, verb, "secrets")

    # The NetworkPolicies: as rendered, owned by the model; decode's opens its lease port to
    # the model's router and prefill pods only, prefill's (decode's P->D claims) to decode's.
    assert _policies_as_rendered(kubectl, namespace, policies)
    for name in POLICIES:
        (owner,) = _get(kubectl, namespace, "networkpolicy", name)["metadata"]["ownerReferences"]
        assert (owner["uid"], owner["controller"]) == (uid, True)
    for policy, lessees in [(POLICIES[1], ["router", "prefill"]), (POLICIES[0], ["decode"])]:
        ingress = _get(kubectl, namespace, "networkpolicy", policy)["spec"]["ingress"]
        lease_rules = [r for r in ingress if {"port": LEASE_PORT, "protocol": "TCP"} in r["ports"]]
        assert [
            [
                peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
                for peer in r["from"]
            ]
            for r in lease_rules
        ] == [lessees], policy

    # A hand edit opens prefill to every pod, another deletes the router's policy, and a
    # person rotates the offer key (new key first, old second): the policies are repaired,
    # the rotated key is left as it is.
    versions = {n: s["metadata"]["resourceVersion"] for n, s in secrets.items()}
    rotated = f"{'a' * 64}\n{_key(secrets[KEYS[0]])}"
    kubectl(*ns, "patch", "secret", KEYS[0], "--type=merge",
            "-p", json.dumps({"stringData": {SECRET_KEY_NAME: rotated}}))  # fmt: skip
    versions[KEYS[0]] = _get(kubectl, namespace, "secret", KEYS[0])["metadata"]["resourceVersion"]
    kubectl(*ns, "patch", "networkpolicy", POLICIES[0], "--type=merge",
            "-p", json.dumps({"spec": {"ingress": [{}]}}))  # fmt: skip
    kubectl(*ns, "delete", "networkpolicy", POLICIES[2])
    kube.wait_for(lambda: _policies_as_rendered(kubectl, namespace, policies),
                  what="the NetworkPolicies repaired", timeout_s=60)  # fmt: skip
    # The passes that repaired them read both keys: neither was written.
    for name in KEYS:
        assert (
            _get(kubectl, namespace, "secret", name)["metadata"]["resourceVersion"]
            == (versions[name])
        ), f"{name} was written by the operator"
    assert _key(_get(kubectl, namespace, "secret", KEYS[0])) == rotated

    # A deleted key is created afresh on the next pass (here: the next child event).
    kubectl(*ns, "delete", "secret", KEYS[0])
    _poke(kubectl, namespace)
    fresh = kube.wait_for(
        lambda: (
            _exists(kubectl, namespace, "secret", KEYS[0])
            and _get(kubectl, namespace, "secret", KEYS[0])
        ),
        what="a fresh offer key",
        timeout_s=60,
    )
    assert re.fullmatch("[0-9a-f]{64}", _key(fresh)) and _key(fresh) not in rotated

    # The garbage collector takes the keys and the policies with the model.
    kubectl(*ns, "delete", "dmodel", NAME, "--wait=false")
    kube.wait_for(
        lambda: (
            not any(_exists(kubectl, namespace, "secret", name) for name in KEYS)
            and not any(_exists(kubectl, namespace, "networkpolicy", name) for name in POLICIES)
        ),
        what="the keys and policies deleted with the model",
        timeout_s=90,
    )


def test_missing_client_keys_secret_degrades_naming_the_field(
    kubectl: kube.Kubectl,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
) -> None:
    start_operator()
    kubectl.apply(small_model(NAME, namespace, auth={"clientKeysSecret": {"name": "clients"}}))

    def degraded() -> dict[str, Any] | None:
        obj = dmodel(kubectl, namespace, NAME)
        return obj if condition(obj, "Degraded").get("status") == "True" else None

    cond = condition(kube.wait_for(degraded, what="Degraded", timeout_s=60), "Degraded")
    assert cond["reason"] == "SecretNotFound"
    assert "spec.auth.clientKeysSecret" in cond["message"] and "clients" in cond["message"]
    # The generated keys do not wait for the client keys; the workloads do.
    assert all(_exists(kubectl, namespace, "secret", name) for name in KEYS)
    assert kubectl.json("-n", namespace, "get", "statefulsets")["items"] == []

    kubectl("-n", namespace, "create", "secret", "generic", "clients",
            "--from-literal=team-a=sk-team-a-0123")  # fmt: skip
    model = wait_ready(kubectl, namespace, NAME, timeout_s=120)
    assert condition(model, "Degraded")["status"] == "False"
