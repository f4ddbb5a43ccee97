"""Check a rendered ``--kv-transfer-config`` against the role and the installed vLLM.

Pure functions: the launcher gathers what vLLM accepts (:mod:`vllm_facts`) and passes it in,
so the checks run in unit tests without vLLM. Every error names the offending key or version
and says how to fix it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from disagg_connector.vllm_version import parse_version
from disagg_contract import (
    EXTRA_BACKENDS,
    EXTRA_BIDIRECTIONAL,
    EXTRA_DECODER_TTL,
    EXTRA_LEASE_TERM,
    EXTRA_READ_DECISION,
    EXTRA_RECOMPUTE_THRESHOLD,
    FI_PROVIDER_ENV,
    KV_ROLE,
    POD_IP_ENV,
    SIDE_CHANNEL_HOST_ENV,
    SIDE_CHANNEL_PORT,
    SIDE_CHANNEL_PORT_ENV,
    ReadDecision,
    Role,
)

MIN_VLLM_VERSION = (0, 32)
"""Oldest vLLM with bidirectional NIXL transfer and the ``nixl/`` connector package."""

EXTRA_KEY_TYPES: dict[str, type | tuple[type, ...]] = {
    EXTRA_BIDIRECTIONAL: bool,
    EXTRA_DECODER_TTL: int,
    EXTRA_RECOMPUTE_THRESHOLD: int,
    EXTRA_BACKENDS: list,
    "kv_lease_duration": int,
    "num_threads": int,
    "engine_ttl": (int, float),
    "enforce_handshake_compat": bool,
}
"""``kv_connector_extra_config`` keys vLLM's NIXL pull connector reads, with their JSON types.

The same set in vLLM 0.32 and 0.33 (tests/engine/test_vllm_fit.py compares it with vLLM's sources).
"""
DISAGG_EXTRA_KEY_TYPES: dict[str, type | tuple[type, ...]] = {
    EXTRA_LEASE_TERM: (int, float),
    EXTRA_READ_DECISION: str,
}
"""``kv_connector_extra_config`` keys only our connector reads (decode's lease term, prefill's
read decision)."""

NIXL_BACKENDS = ("UCX", "LIBFABRIC")


class LaunchConfigError(ValueError):
    """The connector config cannot be served as is."""


def _version_text(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


def check_config(
    config: object,
    role: Role,
    *,
    accepted_keys: Collection[str],
    vllm_version: str,
    source: str,
) -> dict[str, Any]:
    """Validate ``config`` (parsed JSON) for ``role``; return it unchanged when it is servable."""
    if not isinstance(config, dict):
        raise LaunchConfigError(f"{source}: the connector config must be a JSON object")
    unknown = sorted(set(config) - set(accepted_keys))
    if unknown:
        raise LaunchConfigError(
            f"{source}: key {unknown[0]!r} is not accepted by vLLM {vllm_version}'s "
            f"--kv-transfer-config (accepted: {', '.join(sorted(accepted_keys))}); remove it"
        )
    if not config.get("kv_connector"):
        raise LaunchConfigError(f"{source}: 'kv_connector' is required (e.g. 'DisaggConnector')")
    expected_kv_role = KV_ROLE[role]
    if config.get("kv_role") != expected_kv_role:
        raise LaunchConfigError(
            f"{source}: 'kv_role' is {config.get('kv_role')!r} but a {role.value} server "
            f"needs {expected_kv_role!r}"
        )
    extra = config.get("kv_connector_extra_config", {})
    if not isinstance(extra, Mapping):
        raise LaunchConfigError(f"{source}: 'kv_connector_extra_config' must be a JSON object")
    _check_extra(extra, source)
    if parse_version(vllm_version)[:2] < MIN_VLLM_VERSION:
        raise LaunchConfigError(
            f"{source}: vLLM {vllm_version} is too old for bidirectional KV transfer and "
            f"the disagg connector; install vLLM >= {_version_text(MIN_VLLM_VERSION)}"
        )
    return config


def _check_extra(extra: Mapping[str, Any], source: str) -> None:
    known = {**EXTRA_KEY_TYPES, **DISAGG_EXTRA_KEY_TYPES}
    for key, value in extra.items():
        expected = known.get(key)
        if expected is None:
            raise LaunchConfigError(
                f"{source}: kv_connector_extra_config key {key!r} is not read by vLLM's NIXL "
                f"connector or ours (known: {', '.join(sorted(known))}); fix or remove it"
            )
        wrong_bool = isinstance(value, bool) and expected is not bool
        if wrong_bool or not isinstance(value, expected):
            kinds = expected if isinstance(expected, tuple) else (expected,)
            kind = " or ".join(option.__name__ for option in kinds)
            raise LaunchConfigError(
                f"{source}: kv_connector_extra_config.{key} must be a JSON {kind}, got {value!r}"
            )
    for key in (EXTRA_DECODER_TTL, "kv_lease_duration", EXTRA_LEASE_TERM):
        if key in extra and extra[key] <= 0:
            raise LaunchConfigError(
                f"{source}: kv_connector_extra_config.{key} must be > 0 seconds"
            )
    if extra.get(EXTRA_RECOMPUTE_THRESHOLD, 0) < 0:
        raise LaunchConfigError(
            f"{source}: kv_connector_extra_config.{EXTRA_RECOMPUTE_THRESHOLD} must be >= 0 tokens"
        )
    decision = extra.get(EXTRA_READ_DECISION, ReadDecision.THRESHOLD)
    if decision not in set(ReadDecision):
        raise LaunchConfigError(
            f"{source}: kv_connector_extra_config.{EXTRA_READ_DECISION} {decision!r} is not "
            f"one of {', '.join(ReadDecision)}"
        )
    for backend in extra.get(EXTRA_BACKENDS, []):
        if backend not in NIXL_BACKENDS:
            raise LaunchConfigError(
                f"{source}: kv_connector_extra_config.{EXTRA_BACKENDS} entry {backend!r} is "
                f"not one of {', '.join(NIXL_BACKENDS)}"
            )


def check_group_names(leader_address: str, revision: str) -> None:
    """Refuse a group's leader address or revision the kubelet left unexpanded (``$(NAME)``)."""
    for flag, value in (("--leader-address", leader_address), ("--group-revision", revision)):
        if not value or "$(" in value:
            raise LaunchConfigError(
                f"{flag} {value!r} names no group: the pod's environment lacks a variable it "
                "names (is the LeaderWorkerSet controller's pod webhook running?)"
            )


def group_engine_id(leader_address: str, revision: str, leader_ips: Sequence[str]) -> str:
    """The NIXL engine id of one incarnation of a multi-node server's group, the same on each
    of its ranks: its leader's DNS name, its template revision and its leader pod's IPs.

    vLLM's peers handshake again only with an engine id they have not seen. The name and
    revision alone survive a group the LeaderWorkerSet controller recreates after a pod
    failure (same leader pod name, same templates), so peers would keep the dead ranks' NIXL
    agents; the recreated leader pod gets a new IP (unless the network plugin hands it a freed
    one again). The kubelet leaves ``$(NAME)`` as is when a
    variable the command names is missing, and the ranks would then not share a real id.
    """
    check_group_names(leader_address, revision)
    if not leader_ips:
        raise LaunchConfigError(f"no IP address for the group leader {leader_address!r}")
    return f"{leader_address}/{revision}/{','.join(sorted(set(leader_ips)))}"


def serving_env(environ: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, str]:
    """The environment for vLLM: side channel and EFA defaults, never overriding the user's."""
    env = dict(environ)
    if SIDE_CHANNEL_HOST_ENV not in env and env.get(POD_IP_ENV):
        env[SIDE_CHANNEL_HOST_ENV] = env[POD_IP_ENV]
    env.setdefault(SIDE_CHANNEL_PORT_ENV, str(SIDE_CHANNEL_PORT))
    backends = config.get("kv_connector_extra_config", {}).get(EXTRA_BACKENDS, [])
    if "LIBFABRIC" in backends:
        env.setdefault(FI_PROVIDER_ENV, "efa")
    return env
