"""A short table of rendered objects: kind, name and the facts worth a glance."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from disagg_contract import (
    EXTRA_BACKENDS,
    EXTRA_BIDIRECTIONAL,
    EXTRA_DECODER_TTL,
    EXTRA_LEASE_TERM,
)
from disagg_operator.names import COMPONENT_LABEL, CONFIG_HASH_ANNOTATION

Manifest = dict[str, Any]


def _container(manifest: Manifest) -> dict[str, Any]:
    container: dict[str, Any] = manifest["spec"]["template"]["spec"]["containers"][0]
    return container


def _flag(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1] if flag in command else "-"


def _engine(replicas: int, template: Manifest) -> list[str]:
    """The facts of one engine pod template: role, parallelism, devices, caching, config."""
    container = template["spec"]["containers"][0]
    command, limits = container["command"], container["resources"]["limits"]
    caching = "off" if "--no-enable-prefix-caching" in command else "on"
    return [
        f"replicas={replicas}",
        f"role={_flag(command, '--role')}",
        f"tp={_flag(command, '--tensor-parallel-size')}",
        f"gpus={limits.get('nvidia.com/gpu', 0)}",
        f"efa={limits.get('vpc.amazonaws.com/efa', 0)}",
        f"prefixCaching={caching}",
        f"configHash={template['metadata']['annotations'][CONFIG_HASH_ANNOTATION]}",
    ]


def _statefulset(manifest: Manifest) -> str:
    return " ".join(_engine(manifest["spec"]["replicas"], manifest["spec"]["template"]))


def _leader_worker_set(manifest: Manifest) -> str:
    """A multi-node engine: its groups, the pods per group, and the leader pod's facts."""
    spec = manifest["spec"]
    group = spec["leaderWorkerTemplate"]
    facts = _engine(spec["replicas"], group["leaderTemplate"])
    facts.insert(1, f"nodesPerReplica={group['size']}")
    return " ".join(facts)


def _deployment(manifest: Manifest) -> str:
    command = _container(manifest)["command"]
    return (
        f"replicas={manifest['spec']['replicas']} "
        f"conversationTtl={_flag(command, '--conversation-ttl')}s "
        f"idleTimeout={_flag(command, '--idle-timeout-s')}s "
        f"prefill={_flag(command, '--prefill-service')} "
        f"decode={_flag(command, '--decode-service')}"
    )


def _service(manifest: Manifest) -> str:
    spec = manifest["spec"]
    kind = "headless" if spec.get("clusterIP") == "None" else spec.get("type", "ClusterIP")
    ports = ",".join(f"{port['name']}:{port['port']}" for port in spec["ports"])
    return f"{kind} ports={ports}"


def _config_map(manifest: Manifest) -> str:
    facts = []
    for key, text in manifest["data"].items():
        config = json.loads(text)
        extra = config["kv_connector_extra_config"]
        lease = f" leaseTerm={extra[EXTRA_LEASE_TERM]:g}s" if EXTRA_LEASE_TERM in extra else ""
        facts.append(
            f"{key}: {config['kv_role']} bidir={str(extra[EXTRA_BIDIRECTIONAL]).lower()} "
            f"ttl={extra[EXTRA_DECODER_TTL]}s{lease} backends={','.join(extra[EXTRA_BACKENDS])}"
        )
    return "; ".join(facts)


def _disruption_budget(manifest: Manifest) -> str:
    spec = manifest["spec"]
    return (
        f"maxUnavailable={spec['maxUnavailable']} "
        f"unhealthyPodEvictionPolicy={spec['unhealthyPodEvictionPolicy']}"
    )


def _peer(peer: dict[str, Any]) -> str:
    """A model's own component by name; any other peer by its kind."""
    component = peer.get("podSelector", {}).get("matchLabels", {}).get(COMPONENT_LABEL)
    if component is not None and "namespaceSelector" not in peer:
        return str(component)
    return "ipBlock" if "ipBlock" in peer else "selected"


def _port(port: dict[str, Any]) -> str:
    return f"{port['port']}-{port['endPort']}" if "endPort" in port else str(port["port"])


def _network_policy(manifest: Manifest) -> str:
    """Each ingress rule as `peers->ports`; a rule without `ports` admits every port."""
    rules = []
    for rule in manifest["spec"]["ingress"]:
        who = "+".join(_peer(peer) for peer in rule.get("from", [])) or "anyone"
        ports = ",".join(_port(port) for port in rule.get("ports", [])) or "all"
        rules.append(f"{who}->{ports}")
    return "ingress " + " ".join(rules)


_FACTS: dict[str, Callable[[Manifest], str]] = {
    "StatefulSet": _statefulset,
    "LeaderWorkerSet": _leader_worker_set,
    "Deployment": _deployment,
    "PodDisruptionBudget": _disruption_budget,
    "NetworkPolicy": _network_policy,
    "Service": _service,
    "ConfigMap": _config_map,
}


def summary_table(manifests: list[Manifest]) -> str:
    """One aligned line per manifest: KIND, NAMESPACE/NAME, FACTS."""
    rows = [("KIND", "NAME", "FACTS")]
    for manifest in manifests:
        meta = manifest["metadata"]
        describe = _FACTS.get(manifest["kind"])
        facts = describe(manifest) if describe is not None else ""
        rows.append((manifest["kind"], f"{meta['namespace']}/{meta['name']}", facts))
    kind_width = max(len(row[0]) for row in rows)
    name_width = max(len(row[1]) for row in rows)
    return "".join(
        f"{kind:<{kind_width}}  {name:<{name_width}}  {facts}".rstrip() + "\n"
        for kind, name, facts in rows
    )
