"""``disagg serve`` config and extra-argument checks and environment, without vLLM.

The extra-argument checks run here on a stand-in argparse parser; tests/engine runs them on
vLLM's own server parser (its ``_`` for ``-``, dotted keys and ``--config`` files).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg_connector.launch_config import LaunchConfigError, check_config, serving_env
from disagg_connector.launcher import check_extra_args, split_vllm_args, vllm_command
from disagg_connector.vllm_facts import kv_transfer_config_keys
from disagg_connector.vllm_options import managed_option, server_parser, server_parser_modules
from disagg_contract import MANAGED_VLLM_FLAGS, Role
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
        ({"disagg_lease_term_s": "30"}, "disagg_lease_term_s must be a JSON int or float"),
        ({"disagg_lease_term_s": 0}, "disagg_lease_term_s must be > 0"),
        ({"disagg_read_decision": 1}, "disagg_read_decision must be a JSON str"),
        ({"disagg_read_decision": "auto"}, "'auto' is not one of measured, threshold"),
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


def test_our_lease_term_and_read_decision_are_accepted() -> None:
    ours = config(disagg_lease_term_s=45.0, disagg_read_decision="measured")
    assert check(ours) == ours


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


def test_command_appends_the_config() -> None:
    cfg = config()
    command = vllm_command(["--model", "m"], cfg)
    assert command[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    assert command[-2] == "--kv-transfer-config"
    assert json.loads(command[-1]) == cfg


@pytest.mark.parametrize(
    ("args", "split"),
    [
        (["--model", "m"], (["--model", "m"], [])),
        (["--model", "m", "--", "--enforce-eager"], (["--model", "m"], ["--enforce-eager"])),
        (["--port", "1", "--", "-O3", "--", "x"], (["--port", "1"], ["-O3", "--", "x"])),
    ],
)
def test_extra_args_follow_the_first_marker(
    args: list[str], split: tuple[list[str], list[str]]
) -> None:
    assert split_vllm_args(args) == split


def stand_in_parser() -> argparse.ArgumentParser:
    """A few of vLLM's options, declared as vLLM declares them (abbreviations allowed)."""
    parser = argparse.ArgumentParser(prog="server")
    parser.add_argument("--model", default="default-model")
    parser.add_argument("--model-impl")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--portal-count", type=int)
    parser.add_argument("--enforce-eager", action="store_true")
    return parser


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--port", "8000"], "reads `--port 8000` as --port, which the operator sets; drop it"),
        (["--max-model=10"], "`--max-model=10` as --max-model-len, which the operator sets; set "
         "spec.model.maxModelLen instead"),
        (["-t", "2"], "`-t 2` as --tensor-parallel-size/-tp, which the operator sets; set "
         "tensorParallelSize"),
        (["--no-enable-prefix"], "`--no-enable-prefix` as --enable-prefix-caching/"
         "--no-enable-prefix-caching, which the operator sets; set prefixCaching"),
        (["--enforce-eager", "--model-impl", "x", "--model=m", "-O3"], "`--model=m` as --model,"),
        (["--bogus", "--port", "9"], "`--port 9` as --port"),
    ],
)  # fmt: skip
def test_extra_args_vllm_reads_as_a_managed_flag_are_refused(extra: list[str], says: str) -> None:
    with pytest.raises(LaunchConfigError) as caught:
        check_extra_args(stand_in_parser(), Role.DECODE, extra)
    assert str(caught.value).startswith("spec.decode.extraArgs: vLLM reads `"), caught.value
    assert says in str(caught.value), caught.value


@pytest.mark.parametrize(
    "extra",
    [
        ["--enforce-eager", "--model-impl", "vllm", "--portal-count=2"],
        ["--portal", "2"],
        ["--mod", "x"],
        ["--unknown", "--port"],
        ["--", "--port", "9"],
    ],
)
def test_other_extra_args_pass_to_vllm(extra: list[str]) -> None:
    """Other options, and arguments vLLM refuses by itself (ambiguous, unknown, no value)."""
    check_extra_args(stand_in_parser(), Role.PREFILL, extra)


def test_managed_flags_the_parser_lacks_are_skipped() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--disable-prefix-caching", action="store_true")
    parser.add_argument("--enforce-eager", action="store_true")
    assert managed_option(parser, ["--enforce-eager"], MANAGED_VLLM_FLAGS) is None
    assert managed_option(parser, ["--disable-prefix"], MANAGED_VLLM_FLAGS) == (
        "--disable-prefix",
        ["--disable-prefix-caching"],
    )


def test_server_parser_is_found_through_the_main_the_server_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "fakevllm"
    (package / "entry").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "entry" / "__init__.py").write_text("")
    (package / "server.py").write_text(
        "import heavy_thing\n\nif __name__ == '__main__':\n"
        "    from fakevllm.entry.run import main\n\n    main()\n"
    )
    (package / "entry" / "run.py").write_text(
        "def main():\n    from ..args import make_arg_parser\n"
        "    from fakevllm.util import FlexibleArgumentParser as FlexibleArgumentParser\n"
    )
    (package / "args.py").write_text(
        "def make_arg_parser(parser):\n    parser.add_argument('--port')\n    return parser\n"
    )
    (package / "util.py").write_text(
        "from argparse import ArgumentParser as FlexibleArgumentParser\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert server_parser_modules("fakevllm.server") == {
        "FlexibleArgumentParser": "fakevllm.util",
        "make_arg_parser": "fakevllm.args",
    }
    assert server_parser("fakevllm.server").parse_args(["--port", "1"]).port == "1"
    (package / "entry" / "run.py").write_text(
        "def main():\n    from ..args import make_arg_parser\n"
    )
    with pytest.raises(LookupError, match="main no longer imports FlexibleArgumentParser"):
        server_parser_modules("fakevllm.server")


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
