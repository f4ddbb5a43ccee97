"""The `--kv-transfer-config` JSON each serving role runs with, and its hash."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from disagg_contract import (
    CONNECTOR_CLASS,
    CONNECTOR_MODULE,
    EXTRA_BACKENDS,
    EXTRA_BIDIRECTIONAL,
    EXTRA_DECODER_TTL,
    EXTRA_LEASE_TERM,
    EXTRA_READ_DECISION,
    EXTRA_RECOMPUTE_THRESHOLD,
    KV_ROLE,
    Role,
    lease_term_s,
)
from disagg_operator.models import CONFIG_DIR, DisaggregatedModelSpec


def kv_transfer_config(spec: DisaggregatedModelSpec, role: Role) -> dict[str, Any]:
    """The `--kv-transfer-config` object for one role (only keys vLLM >= 0.32 accepts).

    When bidirectional, decode also gets the lease term its retentions live past their last
    renewal (from `kvTransfer.idleTimeoutSeconds`) and prefill how it decides to read them
    back (`kvTransfer.readDecision`); bidirectional off, nothing is retained or read back.
    """
    kv = spec.kv_transfer
    extra: dict[str, Any] = {
        EXTRA_BIDIRECTIONAL: kv.bidirectional,
        EXTRA_DECODER_TTL: kv.decoder_kv_blocks_ttl_seconds,
        EXTRA_RECOMPUTE_THRESHOLD: kv.recompute_threshold_tokens,
        EXTRA_BACKENDS: [spec.kv_backend],
    }
    if kv.bidirectional and role is Role.DECODE:
        extra[EXTRA_LEASE_TERM] = lease_term_s(kv.idle_timeout_seconds)
    if kv.bidirectional and role is Role.PREFILL:
        extra[EXTRA_READ_DECISION] = str(kv.read_decision)
    return {
        "kv_connector": CONNECTOR_CLASS,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": KV_ROLE[role],
        "kv_buffer_device": kv.buffer_device,
        "kv_load_failure_policy": kv.load_failure_policy,
        "kv_connector_extra_config": extra,
    }


def config_file(role: Role) -> str:
    """Path of a role's config file inside the serving container."""
    return f"{CONFIG_DIR}/{role}.json"


def config_map_data(spec: DisaggregatedModelSpec) -> dict[str, str]:
    """The connector ConfigMap's data: `prefill.json` and `decode.json`."""
    return {
        f"{role}.json": json.dumps(kv_transfer_config(spec, role), sort_keys=True) for role in Role
    }


def config_hash(data: dict[str, str]) -> str:
    """A short, stable hash of the connector ConfigMap data."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
