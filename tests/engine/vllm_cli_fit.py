"""The vLLM server's own argument parser against the command lines ``disagg serve`` execs.

Every example is rendered by the operator. Each StatefulSet's container command
(``disagg serve --role R --config F -- <vLLM args>``) is read with ``disagg``'s own parser, its
config is taken from the rendered ConfigMap mounted at ``F``, and the launcher's ``prepare``
builds the server command from both (appending ``--kv-transfer-config``). Those vLLM arguments
are parsed by the parser the launcher builds (:func:`disagg_connector.vllm_options.server_parser`,
the one the server module's ``main`` runs) and validated as that ``main`` does. Each flag must be
one of the parser's own option strings (an abbreviation that argparse takes today becomes an
error or another flag once vLLM adds a flag) and not deprecated, and the config vLLM ends with
must be the rendered one. The launcher's ``extraArgs`` check is run against the parser for every
option the operator manages: each spelling vLLM reads as one is refused, every other vLLM option
accepted, and every option string of a managed setting is in the contract's flag table.

Platform: building the parser builds default configs, and ``DeviceConfig`` wants a platform
with a device type; the serving image's CUDA build finds no GPU here ("Failed to infer device
type"). :data:`PLATFORM_ENV` selects vLLM's CPU platform with vLLM's own switch for running an
accelerator wheel on a CPU host. The parser then differs from the GPU one only where the platform
enters it: ``--mm-processor-device`` also offers ``cuda`` on GPU (this parser is stricter, never
laxer), and ``pre_register_and_update`` is the base no-op on both the CUDA and CPU platforms.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.util
import io
import json
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PLATFORM_ENV = {"VLLM_TARGET_DEVICE": "cpu"}
"""Set before vLLM is imported: its CPU platform, so the CUDA build's parser can be built here."""
VALIDATE = "validate_parsed_serve_args"
"""The check the server's ``main`` runs on the parsed arguments, beside ``make_arg_parser``."""
OTHER_KV_ROLE = ("kv_role", "kv_both")
"""A key and value a user could try to pass to ``--kv-transfer-config`` in ``extraArgs``."""


class Rejected(Exception):
    """vLLM's parser or its post-parse check refused a command line (vLLM's message)."""


@dataclass(frozen=True)
class ServeParser:
    """The vLLM server's argument parser and the check its ``main`` runs after parsing."""

    parser: argparse.ArgumentParser
    validate: Callable[[argparse.Namespace], None]
    version: str

    def parse(self, args: Sequence[str]) -> argparse.Namespace:
        """Parse and validate ``args`` as the server's ``main`` does; :class:`Rejected` if not."""
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                namespace = self.parser.parse_args(list(args))
                self.validate(namespace)
        except SystemExit:
            raise Rejected(stderr.getvalue().strip().splitlines()[-1]) from None
        except (ValueError, TypeError, KeyError) as exc:
            raise Rejected(str(exc)) from None
        return namespace

    def option(self, flag: str) -> argparse.Action | None:
        """The action ``flag`` names exactly (no abbreviation), if any."""
        return self.parser._option_string_actions.get(flag)

    def deprecated(self, action: argparse.Action) -> bool:
        """Whether vLLM marks ``action`` deprecated (it warns when it is used)."""
        return action in getattr(self.parser, "_deprecated", ())


@functools.cache
def serve_parser() -> ServeParser:
    """The parser the launcher builds, in the vLLM this interpreter imports."""
    from vllm.platforms import current_platform

    from disagg_connector.launcher import API_SERVER_MODULE
    from disagg_connector.vllm_options import server_parser, server_parser_modules
    from disagg_connector.vllm_version import installed_vllm_version

    if not current_platform.device_type:
        raise RuntimeError(f"vLLM found no platform to build its parser on: set {PLATFORM_ENV}")
    parts = importlib.import_module(server_parser_modules(API_SERVER_MODULE)["make_arg_parser"])
    return ServeParser(
        server_parser(API_SERVER_MODULE), getattr(parts, VALIDATE), installed_vllm_version() or ""
    )


def flag_name(arg: str) -> str | None:
    """The option ``arg`` names as vLLM's parser reads it (``--a_b.c=v`` -> ``--a-b``).

    None for values (negative numbers included).
    """
    if not arg.startswith("-") or re.fullmatch(r"-\d.*", arg):
        return None
    name = arg.split("=", 1)[0]
    if not name.startswith("--"):
        return name
    return "--" + name[2:].split(".", 1)[0].replace("_", "-")


def flag_problems(serve: ServeParser, args: Sequence[str]) -> list[str]:
    """Flags in ``args`` that are not exactly vLLM's own options, or that vLLM deprecates."""
    problems = []
    for name in filter(None, map(flag_name, args)):
        action = serve.option(name)
        if action is None:
            problems.append(
                f"{name} is not an option of vLLM {serve.version} (argparse would read it as an "
                "abbreviation of another flag, or refuse it)"
            )
        elif serve.deprecated(action):
            problems.append(f"{name} is deprecated in vLLM {serve.version}")
    return problems


def command_problems(
    serve: ServeParser, args: Sequence[str], config: Mapping[str, Any] | None = None
) -> list[str]:
    """``args`` as the server reads them: vLLM's own flags, accepted, ending with ``config``."""
    problems = flag_problems(serve, args)
    try:
        namespace = serve.parse(args)
    except Rejected as exc:
        return [*problems, f"vLLM {serve.version} rejects the command line: {exc}"]
    for key, value in (config or {}).items():
        read = getattr(namespace.kv_transfer_config, key, None)
        if read != value:
            problems.append(f"vLLM {serve.version} reads kv_transfer_config.{key} as {read!r}")
    return problems


@dataclass(frozen=True)
class RenderedServer:
    """One prefill or decode container of an example, as the operator renders it."""

    where: str
    role: str
    vllm_args: list[str]
    config: str
    """The rendered ConfigMap entry mounted where ``--config`` points."""


def mounted_file(pod: Mapping[str, Any], container: Mapping[str, Any], path: Path) -> str:
    """The ConfigMap name and key that ``path`` in ``container`` comes from, as ``name/key``."""
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    config_map = volumes[mounts[str(path.parent)]]["configMap"]["name"]
    return f"{config_map}/{path.name}"


def rendered_servers() -> Iterator[RenderedServer]:
    """Every serving container of every example in examples/ (a multi-node role's leader)."""
    from disagg.cli import build_parser
    from disagg_operator.loading import load_file
    from disagg_operator.render import render

    disagg = build_parser()
    for example in sorted((REPO / "examples").glob("*.yaml")):
        for model in load_file(example):
            manifests = render(model.metadata.name, "default", model.spec)
            files = {
                f"{manifest['metadata']['name']}/{key}": text
                for manifest in manifests
                if manifest["kind"] == "ConfigMap"
                for key, text in manifest["data"].items()
            }
            for manifest in manifests:
                if manifest["kind"] == "StatefulSet":
                    pod = manifest["spec"]["template"]["spec"]
                elif manifest["kind"] == "LeaderWorkerSet":
                    # The leader serves (disagg serve); workers join it (checked in
                    # tests/engine/test_render_multinode_fit.py).
                    pod = manifest["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
                else:
                    continue
                for container in pod["containers"]:
                    command = [*container.get("command", []), *container.get("args", [])]
                    serve = disagg.parse_args(command[1:])
                    yield RenderedServer(
                        where=f"{example.name} {manifest['metadata']['name']}",
                        role=serve.role,
                        vllm_args=command[command.index("--") + 1 :],
                        config=files[mounted_file(pod, container, serve.config)],
                    )


def rendered_command_problems(serve: ServeParser) -> list[str]:
    """Every example's servers: ``disagg serve``'s checks, then vLLM's parser on what it execs."""
    from disagg_connector.launch_config import LaunchConfigError
    from disagg_connector.launcher import prepare
    from disagg_contract import Role

    problems = []
    with tempfile.TemporaryDirectory() as scratch:
        for server in rendered_servers():
            path = Path(scratch) / f"{server.role}.json"
            path.write_text(server.config)
            try:
                command, _ = prepare(Role(server.role), path, server.vllm_args)
            except LaunchConfigError as exc:
                problems.append(f"{server.where}: {exc}")
                continue
            problems += [
                f"{server.where}: {problem}"
                for problem in command_problems(serve, command[3:], json.loads(server.config))
            ]
    return problems


def launcher_refuses(serve: ServeParser, extra_args: Sequence[str]) -> bool:
    """Whether ``disagg serve`` refuses ``extra_args`` (a role's ``extraArgs``) on this parser."""
    from disagg_connector.launch_config import LaunchConfigError
    from disagg_connector.launcher import check_extra_args
    from disagg_contract import Role

    try:
        check_extra_args(serve.parser, Role.DECODE, extra_args)
    except LaunchConfigError:
        return True
    return False


MANAGED_SAMPLE_VALUES = {
    "model": "x",
    "served_model_name": "x",
    "revision": "x",
    "dtype": "half",
    "max_model_len": "10",
    "tensor_parallel_size": "2",
    "pipeline_parallel_size": "2",
    "nnodes": "2",
    "node_rank": "1",
    "master_addr": "10.0.0.1",
    "max_num_seqs": "3",
    "port": "9",
    "kv_transfer_config": json.dumps(dict([OTHER_KV_ROLE])),
    "api_key": "x",
    "shutdown_timeout": "7",
}
"""A value, unlike the server's default, for each destination of a flag the operator manages."""


def managed_spellings(
    serve: ServeParser, action: argparse.Action, scratch: Path
) -> list[list[str]]:
    """Arguments vLLM's parser reads into ``action``'s destination (a flag the operator manages).

    Candidates: each option string, with underscores, with ``=``, each prefix (argparse
    abbreviations), as a dotted key (the connector config) and from a ``--config`` YAML file in
    ``scratch``; kept where vLLM sets the destination.
    """
    value = [] if action.nargs == 0 else [MANAGED_SAMPLE_VALUES[action.dest]]
    options = [
        flag for flag, named in serve.parser._option_string_actions.items() if named is action
    ]
    candidates: list[list[str]] = []
    for option in options:
        underscored = option[:2] + option[2:].replace("-", "_")
        candidates += [[option, *value], [underscored, *value]]
        candidates += [[f"{spelling}={value[0]}"] for spelling in (option, underscored) if value]
        candidates += [[option[:end], *value] for end in range(2, len(option))]
    if action.dest == "kv_transfer_config":
        key, kv_role = OTHER_KV_ROLE
        full = action.option_strings[0]
        candidates += [[f"{name}.{key}", kv_role] for name in (full, full[:-3])]
    config_file = scratch / f"{action.dest}.yaml"
    config_file.write_text(f"{options[0][2:]}: {json.dumps(value[0] if value else True)}\n")
    candidates.append(["--config", str(config_file)])
    default = getattr(serve.parse(["--model", "m"]), action.dest)
    spellings = []
    for args in map(list, dict.fromkeys(map(tuple, candidates))):
        with contextlib.suppress(Rejected):
            if getattr(serve.parse(["--model", "m", *args]), action.dest) != default:
                spellings.append(args)
    return spellings


def managed_flag_problems(
    serve: ServeParser,
    refuses: Callable[[ServeParser, Sequence[str]], bool] = launcher_refuses,
) -> list[str]:
    """Where the launcher's ``extraArgs`` check and vLLM's parser disagree on managed flags.

    Every spelling vLLM reads as a managed flag must be refused, every other option of vLLM's
    accepted (with underscores too), and every option string of a managed flag's destination
    listed in the contract's table (a new inverse such as 0.33's ``--disable-*``).
    """
    from disagg_contract import MANAGED_VLLM_FLAGS

    options = serve.parser._option_string_actions
    managed = {action.dest: action for flag in MANAGED_VLLM_FLAGS if (action := options.get(flag))}
    problems = [
        f"vLLM {serve.version}'s {option} sets {action.dest}, which the operator manages; the "
        "contract's MANAGED_VLLM_FLAGS lacks it"
        for option, action in options.items()
        if action.dest in managed and option not in MANAGED_VLLM_FLAGS
    ]
    with tempfile.TemporaryDirectory() as scratch:
        for action in managed.values():
            problems += [
                f"vLLM {serve.version} reads `{' '.join(args)}` as {action.option_strings[0]}; "
                "the launcher lets it through in extraArgs"
                for args in managed_spellings(serve, action, Path(scratch))
                if not refuses(serve, args)
            ]
    for option, action in options.items():
        if action.dest in managed:
            continue
        problems += [
            f"the launcher refuses {spelling} in extraArgs, an option of vLLM {serve.version} "
            "that sets no managed flag"
            for spelling in dict.fromkeys([option, option[:2] + option[2:].replace("-", "_")])
            if refuses(serve, [spelling])
        ]
    return problems


def cli_problems() -> list[str]:
    """Every command-line check against the vLLM this interpreter imports."""
    serve = serve_parser()
    return rendered_command_problems(serve) + managed_flag_problems(serve)
