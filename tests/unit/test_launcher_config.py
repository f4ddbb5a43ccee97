"""``disagg serve`` config checks and environment, without vLLM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg_connector.launch_config import LaunchConfigError, check_config, serving_env
from disagg_connector.launcher import vllm_command
from disagg_connector.vllm_facts import kv_transfer_config_keys
from disagg_contract import Role
from disagg_operator.connector_config import config_map_data
from disagg_operator.models import DisaggregatedModelSpec
from disagg_operator.names import Component
from dmodel_samples import EXAMPLES, KV_TRANSFER_KEYS


def config(role: Role = Role.PREFILL, **extra: Any) -> dict[str, Any]:
    return {
        "kv_connector": "DisaggConnector",
        "kv_connector_module_path": "disagg_connector.connector",
        "kv_role": "kv_producer" if role is Role.PREFILL else "kv_consumer",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "bidirectional_kv_xfer": True,
            "decoder_kv_blocks_ttl": 480,
            "kv_recompute_threshold": 64,
            "backends": ["UCX"],
            **extra,
        },
    }


def check(cfg: object, role: Role = Role.PREFILL, version: str = "0.33.0") -> dict[str, Any]:
    return check_config(
        cfg, role, accepted_keys=KV_TRANSFER_KEYS, vllm_version=version, source="/etc/disagg/x.json"
    )


@pytest.mark.parametrize("role", list(Role))
def test_rendered_configs_pass(role: Role) -> None:
    assert check(config(role), role) == config(role)


def test_unknown_top_level_key_is_named() -> None:
    with pytest.raises(LaunchConfigError, match=r"key 'kv_rank' is not accepted by vLLM 0\.33\.0"):
        check({**config(), "kv_rank": 0})


def test_unknown_extra_key_is_named() -> None:
    with pytest.raises(LaunchConfigError, match="'bidirectonal_kv_xfer' is not read"):
        check(config(bidirectonal_kv_xfer=True))


def test_old_vllm_is_refused_with_its_version() -> None:
    with pytest.raises(LaunchConfigError, match=r"vLLM 0\.31\.2 is too old .* >= 0\.32"):
        check(config(), version="0.31.2")


def test_wrong_kv_role_for_the_role() -> None:
    with pytest.raises(LaunchConfigError, match="'kv_role' is 'kv_producer' but a decode server"):
        check(config(Role.PREFILL), Role.DECODE)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"bidirectional_kv_xfer": "yes"}, "bidirectional_kv_xfer must be a JSON bool"),
        ({"decoder_kv_blocks_ttl": True}, "decoder_kv_blocks_ttl must be a JSON int"),
        ({"decoder_kv_blocks_ttl": 0}, "decoder_kv_blocks_ttl must be > 0"),
        ({"kv_recompute_threshold": -1}, "kv_recompute_threshold must be >= 0"),
        ({"backends": ["TCP"]}, "backends entry 'TCP'"),
        ({"engine_ttl": True}, "engine_ttl must be a JSON int or float"),
        ({"enable_cross_layers_blocks": True}, "'enable_cross_layers_blocks' is not read"),
    ],
)
def test_bad_extra_values(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(LaunchConfigError, match=message):
        check(config(**extra))


def test_every_nixl_pull_key_is_accepted() -> None:
    tuned = config(
        kv_lease_duration=60, num_threads=8, engine_ttl=1800.5, enforce_handshake_compat=False
    )
    assert check(tuned) == tuned


@pytest.mark.parametrize("bad", [[], "text", {"kv_role": "kv_producer"}])
def test_structural_errors(bad: object) -> None:
    with pytest.raises(LaunchConfigError):
        check(bad)


def test_env_defaults_never_override_the_user() -> None:
    efa = config(backends=["LIBFABRIC"])
    env = serving_env({"POD_IP": "10.0.0.7"}, efa)
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.7"
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    assert env["FI_PROVIDER"] == "efa"
    mine = {
        "POD_IP": "10.0.0.7",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "h",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": "7000",
        "FI_PROVIDER": "tcp",
    }
    assert serving_env(mine, efa) == mine
    assert "FI_PROVIDER" not in serving_env({}, config())


def test_command_appends_the_config_and_refuses_a_second_one() -> None:
    cfg = config()
    command = vllm_command(["--model", "m"], cfg)
    assert command[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    assert json.loads(command[-1]) == cfg
    with pytest.raises(LaunchConfigError, match="not --kv-transfer-config after"):
        vllm_command(["--kv-transfer-config={}"], cfg)


@pytest.mark.parametrize(
    "arg",
    [
        "--kv-transfer-config",
        "--kv_transfer_config={}",
        "--kv-transfer-config.kv_role",
        "--kv_transfer_config.kv_role=kv_both",
        "--kv-transfer",
        "--kv-t",
    ],
)
def test_command_refuses_every_spelling_vllm_reads_as_the_config(arg: str) -> None:
    with pytest.raises(LaunchConfigError, match="vLLM reads it as --kv-transfer-config"):
        vllm_command(["--model", "m", arg, "{}"], config())


@pytest.mark.parametrize("arg", ["--kv-cache-dtype", "--kv-transfer-configs", "--", "-kv"])
def test_command_passes_other_flags(arg: str) -> None:
    assert arg in vllm_command([arg, "x"], config())


def test_accepted_keys_are_read_from_vllm_source(tmp_path: Path) -> None:
    module = tmp_path / "config" / "kv_transfer.py"
    module.parent.mkdir()
    module.write_text(
        "class Other:\n    x: int = 1\n\n"
        "class KVTransferConfig:\n    kv_role: str | None = None\n    kv_port: int = 1\n"
        '    """doc"""\n    def method(self) -> None:\n        y: int = 2\n'
    )
    assert kv_transfer_config_keys(tmp_path) == {"kv_role", "kv_port"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.stem)
def test_operator_rendered_configs_pass_the_launcher(example: Path) -> None:
    """The contract: what ``disagg render`` puts in the connector ConfigMap serves as is."""
    spec = DisaggregatedModelSpec.model_validate(yaml.safe_load(example.read_text())["spec"])
    for role, component in ((Role.PREFILL, Component.PREFILL), (Role.DECODE, Component.DECODE)):
        rendered = json.loads(config_map_data(spec)[f"{component}.json"])
        assert check(rendered, role) == rendered
