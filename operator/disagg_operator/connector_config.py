"""The `--kv-transfer-config` JSON each serving role runs with, and its hash."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from disagg_operator.models import DisaggregatedModelSpec
from disagg_operator.names import Component

CONNECTOR_CLASS = "DisaggConnector"
CONNECTOR_MODULE = "disagg_connector.connector"
CONFIG_DIR = "/etc/disagg"
KV_BUFFER_DEVICE = "cuda"
KV_ROLES = {Component.PREFILL: "kv_producer", Component.DECODE: "kv_consumer"}


def kv_transfer_config(spec: DisaggregatedModelSpec, role: Component) -> dict[str, Any]:
    """The `--kv-transfer-config` object for one role (only keys vLLM >= 0.32 accepts)."""
    kv = spec.kv_transfer
    return {
        "kv_connector": CONNECTOR_CLASS,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": KV_ROLES[role],
        "kv_buffer_device": KV_BUFFER_DEVICE,
        "kv_load_failure_policy": kv.load_failure_policy,
        "kv_connector_extra_config": {
            "bidirectional_kv_xfer": kv.bidirectional,
            "decoder_kv_blocks_ttl": kv.decoder_kv_blocks_ttl_seconds,
            "kv_recompute_threshold": kv.recompute_threshold_tokens,
            "backends": [spec.kv_backend],
        },
    }


def config_file(role: Component) -> str:
    """Path of a role's config file inside the serving container."""
    return f"{CONFIG_DIR}/{role}.json"


def config_map_data(spec: DisaggregatedModelSpec) -> dict[str, str]:
    """The connector ConfigMap's data: `prefill.json` and `decode.json`."""
    return {
        f"{role}.json": json.dumps(kv_transfer_config(spec, role), sort_keys=True)
        for role in KV_ROLES
    }


def config_hash(data: dict[str, str]) -> str:
    """A short, stable hash of the connector ConfigMap data."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
