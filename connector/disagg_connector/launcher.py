"""``disagg serve``: check the rendered connector config, set the environment, exec vLLM.

The operator renders ``disagg serve --role R --config F -- <its vLLM args> [-- <extraArgs>]``:
the arguments after the first ``--`` are the operator's own and pass as given; a second ``--``
starts the role's ``extraArgs``, which vLLM's own parser reads before the server starts, refusing
any that sets an option the operator manages (:data:`disagg_contract.MANAGED_VLLM_FLAGS`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from disagg_connector.launch_config import (
    LaunchConfigError,
    check_config,
    serving_env,
    with_engine_id,
)
from disagg_connector.vllm_facts import kv_transfer_config_keys, vllm_package_dir
from disagg_connector.vllm_options import managed_option, server_parser
from disagg_connector.vllm_version import installed_vllm_version
from disagg_contract import (
    EXTRA_ARGS_MARKER,
    KV_TRANSFER_CONFIG_FLAG,
    MANAGED_VLLM_FLAGS,
    Role,
)

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def split_vllm_args(vllm_args: Sequence[str]) -> tuple[list[str], list[str]]:
    """The operator's vLLM arguments and the role's extra arguments (after the marker)."""
    if EXTRA_ARGS_MARKER not in vllm_args:
        return list(vllm_args), []
    marker = list(vllm_args).index(EXTRA_ARGS_MARKER)
    return list(vllm_args[:marker]), list(vllm_args[marker + 1 :])


def check_extra_args(
    parser: argparse.ArgumentParser, role: Role, extra_args: Sequence[str]
) -> None:
    """Refuse extra arguments that ``parser`` (vLLM's) reads into an option the operator sets."""
    found = managed_option(parser, extra_args, MANAGED_VLLM_FLAGS)
    if found is not None:
        spelled, flags = found
        raise LaunchConfigError(
            f"spec.{role.value}.extraArgs: vLLM reads `{spelled}` as {'/'.join(flags)}, which "
            f"the operator sets; {MANAGED_VLLM_FLAGS[flags[0]]}"
        )


def vllm_command(vllm_args: Sequence[str], config: dict[str, object]) -> list[str]:
    """The vLLM OpenAI server command line with the connector config appended."""
    return [
        sys.executable,
        "-m",
        API_SERVER_MODULE,
        *vllm_args,
        KV_TRANSFER_CONFIG_FLAG,
        json.dumps(config, separators=(",", ":")),
    ]


def prepare(
    role: Role, config_path: Path, vllm_args: Sequence[str], engine_id: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """Validate everything and return the command and environment to exec (the config with
    ``engine_id``, when given)."""
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
    if engine_id is not None:
        config = with_engine_id(config, engine_id)
    own_args, extra_args = split_vllm_args(vllm_args)
    if extra_args:
        try:
            parser = server_parser(API_SERVER_MODULE)
        except (LookupError, ImportError, AttributeError) as exc:
            raise LaunchConfigError(
                f"cannot build vLLM {version}'s argument parser to check spec.{role.value}."
                f"extraArgs: {exc}"
            ) from exc
        check_extra_args(parser, role, extra_args)
    return vllm_command([*own_args, *extra_args], config), serving_env(os.environ, config)


def serve(
    role: Role, config_path: Path, vllm_args: Sequence[str], engine_id: str | None = None
) -> int:
    """Exec the vLLM server; return 2 with a message when the config cannot be served."""
    try:
        command, env = prepare(role, config_path, vllm_args, engine_id)
    except LaunchConfigError as exc:
        print(f"disagg serve: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, env)
