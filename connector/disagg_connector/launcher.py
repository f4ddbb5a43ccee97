"""``disagg serve``: check the rendered connector config, set the environment, exec vLLM."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from disagg_connector.launch_config import LaunchConfigError, check_config, serving_env
from disagg_connector.vllm_facts import kv_transfer_config_keys, vllm_package_dir
from disagg_connector.vllm_options import flags_named
from disagg_connector.vllm_version import installed_vllm_version
from disagg_contract import Role

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
KV_CONFIG_FLAG = "--kv-transfer-config"


def names_kv_config(arg: str) -> bool:
    """Whether vLLM's parser may read ``arg`` as ``--kv-transfer-config``.

    Every spelling counts (``_`` for ``-``, ``=value``, unique prefixes such as ``--kv-transfer``,
    and dotted keys: ``--kv-transfer-config.kv_role x`` replaces the whole config, the appended
    one included).
    """
    return bool(flags_named(arg, (KV_CONFIG_FLAG,)))


def vllm_command(vllm_args: Sequence[str], config: dict[str, object]) -> list[str]:
    """The vLLM OpenAI server command line with the connector config appended."""
    for arg in vllm_args:
        if names_kv_config(arg):
            raise LaunchConfigError(
                f"pass the connector config with --config, not {arg.split('=', 1)[0]} after "
                f"'--' (vLLM reads it as {KV_CONFIG_FLAG})"
            )
    return [
        sys.executable,
        "-m",
        API_SERVER_MODULE,
        *vllm_args,
        KV_CONFIG_FLAG,
        json.dumps(config, separators=(",", ":")),
    ]


def prepare(
    role: Role, config_path: Path, vllm_args: Sequence[str]
) -> tuple[list[str], dict[str, str]]:
    """Validate everything and return the command and environment to exec."""
    version = installed_vllm_version()
    package_dir = vllm_package_dir()
    if version is None or package_dir is None:
        raise LaunchConfigError("vLLM is not installed in this Python environment")
    try:
        raw = json.loads(config_path.read_text())
    except OSError as exc:
        raise LaunchConfigError(f"{config_path}: cannot read the connector config: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise LaunchConfigError(f"{config_path}: not valid JSON: {exc}") from exc
    config = check_config(
        raw,
        role,
        accepted_keys=kv_transfer_config_keys(package_dir),
        vllm_version=version,
        source=str(config_path),
    )
    return vllm_command(vllm_args, config), serving_env(os.environ, config)


def serve(role: Role, config_path: Path, vllm_args: Sequence[str]) -> int:
    """Exec the vLLM server; return 2 with a message when the config cannot be served."""
    try:
        command, env = prepare(role, config_path, vllm_args)
    except LaunchConfigError as exc:
        print(f"disagg serve: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, env)
