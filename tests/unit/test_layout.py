"""The packages follow the images: each imports only itself, the wire contract and its own
image's dependencies, and each imports alone in an environment holding nothing else.

The import graph is read from the sources (lazy imports inside functions included); the
environments are built from the dev venv's installed distributions, one folder of links per
package holding exactly its extra's distributions and their requirements.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = "disagg_contract"
PACKAGES = {
    "disagg_contract": ROOT / "connector" / "disagg_contract",
    "disagg_connector": ROOT / "connector" / "disagg_connector",
    "disagg_router": ROOT / "connector" / "disagg_router",
    "disagg_operator": ROOT / "operator" / "disagg_operator",
    "disagg": ROOT / "tools" / "disagg",
}
EXTRA = {"disagg_router": "router", "disagg_operator": "operator", "disagg": "bench"}
"""The pyproject extra that is each package's image (the tools package's: `disagg bench`)."""
SERVING_IMPORTS = {"vllm", "torch", "typing_extensions", "nixl", "boto3", "botocore"}
"""What the connector may import inside the serving image: vLLM and what vLLM itself brings,
and boto3 (the Run:ai streamer's S3 dependency, for the launcher's weights check)."""
VLLM_MODULES = {"connector", "scheduler", "stats"}
"""The connector modules that subclass vLLM's classes and so import only inside vLLM."""


def _modules(package: str) -> Iterator[tuple[str, Path]]:
    root = PACKAGES[package]
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join((package, *parts)), path


def _imports(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports, at module level or inside functions."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _top_level_imports(path: Path) -> set[str]:
    """The top-level packages ``path`` imports when it is itself imported."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _first_party(name: str) -> str | None:
    top = name.split(".")[0]
    return top if top in PACKAGES else None


def _distribution_closure(extra: str) -> set[str]:
    """The distributions `disagg[extra]` installs, following every requirement's requirements."""
    wanted: list[Requirement] = []
    for line in metadata.requires("disagg") or []:
        requirement = Requirement(line)
        if requirement.marker is not None and requirement.marker.evaluate({"extra": extra}):
            wanted.append(requirement)
    found: set[str] = set()
    while wanted:
        requirement = wanted.pop()
        name = requirement.name.lower().replace("_", "-")
        if name in found:
            continue
        try:
            requires = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            continue
        found.add(name)
        for line in requires:
            nested = Requirement(line)
            extras = requirement.extras or {""}
            marker = nested.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in extras):
                wanted.append(nested)
    return found


def _environment(tmp: Path, package: str) -> Path:
    """A folder of links to ``package``, the contract and its extra's distributions only."""
    site = tmp / package
    site.mkdir()
    for name in {package, CONTRACT}:
        (site / name).symlink_to(PACKAGES[name])
    for dist_name in _distribution_closure(EXTRA[package]) if package in EXTRA else ():
        dist = metadata.distribution(dist_name)
        for file in dist.files or []:
            top = file.parts[0]
            if top.endswith((".dist-info", ".egg-info")) or top in ("..", "__pycache__"):
                continue
            source = Path(str(dist.locate_file(top)))
            target = site / top
            if source.exists() and not target.exists():
                target.symlink_to(source)
    return site


def test_packages_import_only_themselves_and_the_contract() -> None:
    crossings = []
    for package in PACKAGES:
        allowed = {package, CONTRACT}
        for module, path in _modules(package):
            for name in _imports(path):
                owner = _first_party(name)
                if owner is not None and owner not in allowed:
                    crossings.append(f"{module} imports {name}")
    assert crossings == []


def test_the_contract_is_standard_library_only() -> None:
    for _, path in _modules(CONTRACT):
        assert {n.split(".")[0] for n in _imports(path)} - {"__future__"} <= set(
            sys.stdlib_module_names
        )


def test_the_connector_imports_only_the_serving_image() -> None:
    for module, path in _modules("disagg_connector"):
        third_party = {
            n.split(".")[0]
            for n in _imports(path)
            if n.split(".")[0] not in sys.stdlib_module_names and _first_party(n) is None
        }
        assert third_party <= SERVING_IMPORTS, (module, third_party)
        vllm_at_import = "vllm" in _top_level_imports(path)
        assert vllm_at_import == (module.rsplit(".", 1)[-1] in VLLM_MODULES), module


def test_one_package_imports_another_only_through_its_commands_module() -> None:
    """The `disagg` entry point finds subcommands by module name, never by import."""
    source = (PACKAGES["disagg"] / "cli.py").read_text()
    names = re.findall(r'"(disagg\w*\.commands)"', source)
    assert sorted(names) == sorted(f"{p}.commands" for p in PACKAGES if p != CONTRACT)
    for name in names:
        package, _ = name.split(".")
        assert (PACKAGES[package] / "commands.py").is_file(), name


@pytest.mark.parametrize("package", [p for p in PACKAGES if p != CONTRACT])
def test_each_package_imports_alone(package: str, tmp_path: Path) -> None:
    """Every module imports in an environment with only the package's own image in it."""
    site = _environment(tmp_path, package)
    skip = set(VLLM_MODULES) if package == "disagg_connector" else set()
    skip |= {"__main__"}
    modules = [m for m, _ in _modules(package) if m.rsplit(".", 1)[-1] not in skip]
    script = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(site)
    result = subprocess.run(
        [sys.executable, "-S", "-c", script, *modules],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_an_environment_lacks_other_images_dependencies(tmp_path: Path) -> None:
    """The environments above can fail: the router's has no kopf, the operator's no fastapi."""
    for package, foreign in (("disagg_router", "kopf"), ("disagg_operator", "fastapi")):
        site = _environment(tmp_path, package)
        result = subprocess.run(
            [sys.executable, "-S", "-c", f"import {foreign}"],
            env={"PYTHONPATH": str(site), "PATH": os.environ.get("PATH", "")},
            capture_output=True,
            check=False,
        )
        assert result.returncode != 0, (package, foreign)


def _contract_literals() -> dict[object, str]:
    """The contract's constants by value: every string and number it assigns (dict values too).

    Role values are left out: "prefill" and "decode" are also plain words in messages; so are
    vLLM's option strings (``--port``): the operator renders them and other CLIs share names.
    """
    tree = ast.parse((PACKAGES[CONTRACT] / "__init__.py").read_text())
    found: dict[object, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            assert isinstance(target, ast.Name)
            for item in ast.walk(node.value):
                value = item.value if isinstance(item, ast.Constant) else None
                if isinstance(value, str) and value.startswith("-"):
                    continue
                if isinstance(value, str) or (type(value) is int and value >= 1000):
                    found[value] = target.id
    return found


def test_no_constant_of_the_contract_is_defined_twice() -> None:
    literals = _contract_literals()
    assert {"kv_transfer_params", "disagg_expires_at", "DISAGG_API_KEY", 5600} <= set(literals)
    copies = []
    for package, root in PACKAGES.items():
        if package == CONTRACT:
            continue
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Constant)
                    and type(node.value) in (str, int)
                    and node.value in literals
                    and not _is_docstring(node, path)
                ):
                    copies.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
        for path in root.rglob("*.j2"):
            for value in literals:
                if f'"{value}"' in path.read_text():
                    copies.append(f"{path.relative_to(ROOT)}: {value!r}")
    assert copies == [], f"import these from disagg_contract instead: {copies}"


def _is_docstring(node: ast.Constant, path: Path) -> bool:
    """Whether ``node`` is a module, class or function docstring (prose may name a key)."""
    for parent in ast.walk(ast.parse(path.read_text())):
        body = getattr(parent, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            first = body[0].value
            if isinstance(first, ast.Constant) and first.lineno == node.lineno:
                return True
    return False
