"""Facts about the installed vLLM read from its files, without importing it (torch is slow)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

_KV_TRANSFER_MODULE = ("config", "kv_transfer.py")


def vllm_package_dir() -> Path | None:
    """Directory of the installed ``vllm`` package, or None when it is not installed."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def kv_transfer_config_keys(package_dir: Path) -> frozenset[str]:
    """Field names of vLLM's ``KVTransferConfig``: the keys ``--kv-transfer-config`` accepts."""
    source = package_dir.joinpath(*_KV_TRANSFER_MODULE).read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == "KVTransferConfig":
            return frozenset(
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            )
    raise LookupError(f"KVTransferConfig not found in {package_dir.joinpath(*_KV_TRANSFER_MODULE)}")
