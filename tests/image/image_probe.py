"""What tests/image/test_serving_cuda.py asks the CUDA serving image, run by the image's Python.

    python3 image_probe.py CHECK

prints one JSON value: ``libraries`` (the sonames each NIXL plugin links that the loader does
not find), ``agents`` (the backends a NIXL agent loads for each plugin), ``connector`` (what
vLLM makes of the connector and of the package's general plugin), ``commands`` (every example's
rendered server command through ``disagg serve``'s checks and vLLM's parser), ``streamer``
(vLLM's loader for ``s3://`` sources and the Run:ai streamer with its S3 part) or ``versions``.
Stdlib at the top: each check imports what it needs from the image.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

PLUGINS = ("UCX", "LIBFABRIC")
"""NIXL's backends the operator configures: UCX, and LIBFABRIC for EFA."""
NIXL_BACKENDS = ("nixl_cu12", "nixl_cu13")
"""The packages of NIXL's backend wheels (the image holds the one matching torch's CUDA)."""
ENGINE_TESTS = Path(__file__).resolve().parents[1] / "engine"
"""tests/engine, whose vllm_cli_fit.py renders the examples and parses their commands."""


def nixl_backend() -> str:
    """The NIXL backend package installed here."""
    found = [name for name in NIXL_BACKENDS if importlib.util.find_spec(name) is not None]
    if len(found) != 1:
        raise SystemExit(f"expected one of {NIXL_BACKENDS} installed, found {found}")
    return found[0]


def site_packages() -> Path:
    """The site-packages directory holding NIXL's backend package."""
    spec = importlib.util.find_spec(nixl_backend())
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent.parent


def plugin_path(backend: str) -> Path:
    """NIXL's plugin library of ``backend``."""
    return site_packages() / f"{nixl_backend()}.libs" / "nixl" / f"libplugin_{backend}.so"


def loaded_before_plugins() -> list[Path]:
    """Directories of libraries already loaded when NIXL opens a plugin, which the plugins link
    by soname alone: NIXL's own (its Python bindings load them) and the CUDA runtime of the
    nvidia wheels (torch loads it when vLLM imports torch)."""
    packages = site_packages()
    return [packages / f".{nixl_backend()}.mesonpy.libs", *sorted(packages.glob("nvidia/cu*/lib"))]


def libraries() -> dict[str, list[str]]:
    """For each plugin, the libraries ``ldd`` finds nowhere: the image's loader path
    (LD_LIBRARY_PATH) and the directories of :func:`loaded_before_plugins`."""
    path = [*map(str, loaded_before_plugins()), os.environ.get("LD_LIBRARY_PATH", "")]
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join(p for p in path if p)}
    missing = {}
    for backend in PLUGINS:
        plugin = plugin_path(backend)
        if not plugin.is_file():
            raise SystemExit(f"{plugin} is missing")
        out = subprocess.run(["ldd", str(plugin)], env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"ldd {plugin}: {out.stderr}")
        missing[backend] = sorted(set(re.findall(r"^\s*(\S+) => not found", out.stdout, re.M)))
    return missing


def agents() -> dict[str, list[str]]:
    """For each plugin, the backends of a NIXL agent made with it alone, as the connector makes
    its agent (after torch, as in vLLM)."""
    import torch  # noqa: F401  (loads the CUDA runtime the plugins link, as in the server)
    from nixl._api import nixl_agent, nixl_agent_config

    return {
        backend: list(
            nixl_agent(f"probe-{backend}", nixl_agent_config(backends=[backend])).backends
        )
        for backend in PLUGINS
    }


def connector() -> dict[str, Any]:
    """The connector class vLLM's factory loads through the module path the operator renders,
    and whether vLLM's general-plugin loading ran the package's stream-params plugin."""
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
    from vllm.plugins import load_general_plugins

    import disagg_connector.connector  # noqa: F401
    from disagg_connector import stream_params
    from disagg_contract import CONNECTOR_CLASS, CONNECTOR_MODULE, KV_ROLE, Role

    config = KVTransferConfig(
        kv_connector=CONNECTOR_CLASS,
        kv_connector_module_path=CONNECTOR_MODULE,
        kv_role=KV_ROLE[Role.PREFILL],
    )
    cls = KVConnectorFactory.get_connector_class(config)
    load_general_plugins()
    patched = {
        f"{owner}.{method}": getattr(
            getattr(importlib.import_module(module), owner).__dict__[method],
            stream_params._PATCHED_MARK,
            False,
        )
        for module, owner, method in stream_params.PATCHED_GENERATORS
    }
    return {
        "class": f"{cls.__module__}.{cls.__name__}",
        "is_v1_connector": issubclass(cls, KVConnectorBase_V1),
        "stream_params_needed": stream_params.needs_stream_params(
            importlib.metadata.version("vllm")
        ),
        "stream_params_patched": patched,
    }


def commands() -> dict[str, Any]:
    """Every example's rendered servers, and the problems ``disagg serve``'s checks and the
    image's vLLM parser find in the command lines it would exec (on vLLM's CPU platform: no GPU
    here)."""
    sys.path.insert(0, str(ENGINE_TESTS))
    import vllm_cli_fit

    os.environ.update(vllm_cli_fit.PLATFORM_ENV)
    servers = [server.where for server in vllm_cli_fit.rendered_servers()]
    problems = vllm_cli_fit.rendered_command_problems(vllm_cli_fit.serve_parser())
    return {"servers": servers, "problems": problems}


def streamer() -> dict[str, Any]:
    """The loader vLLM picks for the load format an ``s3://`` source renders, and the Run:ai
    streamer it reads with: its reader imported, its S3 part's package present, both versions."""
    from runai_model_streamer import SafetensorsStreamer  # noqa: F401
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    from disagg_contract import RUNAI_LOAD_FORMAT

    loader = get_model_loader(LoadConfig(load_format=RUNAI_LOAD_FORMAT))
    return {
        "loader": type(loader).__name__,
        "s3_package": importlib.util.find_spec("runai_model_streamer_s3") is not None,
        "versions": {
            name: importlib.metadata.version(name)
            for name in ("runai-model-streamer", "runai-model-streamer-s3")
        },
    }


def versions() -> dict[str, str]:
    """Python, vLLM, torch (with its CUDA), NIXL's backend wheel and the Run:ai streamer."""
    import torch

    backend = nixl_backend().replace("_", "-")
    return {
        "python": platform.python_version(),
        "vllm": importlib.metadata.version("vllm"),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "nixl": f"{backend} {importlib.metadata.version(backend)}",
        "streamer": importlib.metadata.version("runai-model-streamer"),
    }


CHECKS: dict[str, Callable[[], Any]] = {
    "libraries": libraries,
    "agents": agents,
    "connector": connector,
    "commands": commands,
    "streamer": streamer,
    "versions": versions,
}

if __name__ == "__main__":
    (check,) = sys.argv[1:]
    result = CHECKS[check]()
    print(json.dumps(result))
