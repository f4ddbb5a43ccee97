"""The serving image's libfabric (connector/libfabric_from_wheel.py): taken from NIXL's 0.6.1
wheel with the libraries it links, reachable as libfabric.so.1, refused when it lacks a symbol
version NIXL's LIBFABRIC plugin needs; and one pin for the image and the engine tests."""

from __future__ import annotations

import importlib.util
import re
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "connector" / "libfabric_from_wheel.py"
DOCKERFILE = ROOT / "connector" / "Dockerfile"
SETUP_ENV = ROOT / "tests" / "engine" / "setup_env.sh"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("libfabric_from_wheel", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LIBFABRIC = _module()
BUNDLED = {
    "nixl.libs/libfabric-1a2b3c4d.so.1.26.0": b"\x7fELF FABRIC_1.0\0FABRIC_1.7\0FABRIC_1.8\0",
    "nixl.libs/libefa-5e6f7a8b.so.1.3.56.0": b"\x7fELF efa",
    "nixl.libs/libibverbs-9c0d1e2f.so.1.14.56.0": b"\x7fELF verbs",
    "nixl.libs/libnl-3-aa11bb22.so.200.26.0": b"\x7fELF nl",
    "nixl.libs/libnl-route-3-cc33dd44.so.200.26.0": b"\x7fELF nl-route",
}
UNRELATED = {"nixl.libs/libucs-0123abcd.so.0.0.0": b"ucx", "nixl/_api.py": b"python"}


def _wheel(tmp_path: Path, members: dict[str, bytes]) -> Path:
    wheel = tmp_path / "nixl-0.6.1-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return wheel


def test_extract_takes_libfabric_and_what_it_links_and_names_it_libfabric_so_1(
    tmp_path: Path,
) -> None:
    dest = tmp_path / "lib"
    link = LIBFABRIC.extract(_wheel(tmp_path, {**BUNDLED, **UNRELATED}), dest)
    assert link == dest / "libfabric.so.1"
    assert link.is_symlink() and link.resolve().name == "libfabric-1a2b3c4d.so.1.26.0"
    assert link.read_bytes() == BUNDLED["nixl.libs/libfabric-1a2b3c4d.so.1.26.0"]
    expected = {name.split("/")[-1] for name in BUNDLED} | {"libfabric.so.1"}
    assert {p.name for p in dest.iterdir()} == expected


def test_extract_refuses_a_wheel_without_libfabric(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="bundles no libfabric"):
        LIBFABRIC.extract(_wheel(tmp_path, UNRELATED), tmp_path / "lib")


def test_check_names_each_symbol_version_the_plugin_needs_and_libfabric_lacks(
    tmp_path: Path,
) -> None:
    fabric = LIBFABRIC.extract(_wheel(tmp_path, BUNDLED), tmp_path / "lib")
    fits, newer = tmp_path / "libplugin_LIBFABRIC.so", tmp_path / "libplugin_LIBFABRIC_new.so"
    fits.write_bytes(b"\x7fELF fi_getinfo\0FABRIC_1.0\0FABRIC_1.7\0")
    newer.write_bytes(b"\x7fELF fi_getinfo\0FABRIC_1.7\0FABRIC_1.10\0FABRIC_1.9\0")
    assert LIBFABRIC.missing_versions(fabric, fits) == []
    assert LIBFABRIC.missing_versions(fabric, newer) == ["FABRIC_1.10", "FABRIC_1.9"]
    LIBFABRIC.check(fabric, [fits])
    with pytest.raises(SystemExit, match=r"lacks FABRIC_1\.10, FABRIC_1\.9, which libplugin"):
        LIBFABRIC.check(fabric, [fits, newer])
    with pytest.raises(SystemExit, match="no NIXL LIBFABRIC plugin"):
        LIBFABRIC.check(fabric, [])


def _assignment(text: str, name: str, prefix: str) -> str:
    (value,) = re.findall(rf"^{prefix}{name}=(\S+)$", text, re.M)
    return value


def test_the_image_and_the_engine_tests_pin_the_same_nixl_and_libfabric() -> None:
    dockerfile, setup = DOCKERFILE.read_text(), SETUP_ENV.read_text()
    for name in ("NIXL_VERSION", "LIBFABRIC_WHEEL"):
        assert _assignment(dockerfile, name, "ARG ") == _assignment(setup, name, ""), name


def test_the_image_puts_that_libfabric_on_the_loader_path_after_nixl() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^ENV LD_LIBRARY_PATH=/opt/libfabric/lib\$", text, re.M)
    steps = [s.strip() for s in text.replace("\\\n", " ").split("&&")]
    nixl = max(i for i, s in enumerate(steps) if '"nixl==${NIXL_VERSION}"' in s)
    (fabric,) = [i for i, s in enumerate(steps) if "libfabric_from_wheel.py install" in s]
    assert nixl < fabric, "the check reads the plugin of the NIXL installed before it"
    assert '"${LIBFABRIC_WHEEL}" /opt/libfabric/lib' in steps[fabric]
    assert any("apt-get install" in s and "libhwloc15" in s for s in steps)
