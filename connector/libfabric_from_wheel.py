"""Put the libfabric a NIXL wheel bundles into a library directory, as `libfabric.so.1`.

NIXL's LIBFABRIC plugin links `libfabric.so.1` but its wheels ship none, and no Linux
distribution reachable from the build has one new enough for it. NIXL's 0.6.1 wheel
(`nixl==0.6.1`) bundles libfabric 2.3.0, built with its EFA provider, next to the libraries it
needs (libefa, libibverbs, libnl): `install` downloads that wheel with this interpreter's pip,
copies those libraries into DEST under their bundled (hashed) names, which the bundled
libfabric finds through its `$ORIGIN` run path, links `libfabric.so.1` to it, then checks it.
`check` checks a libfabric.so.1: it must define every `FABRIC_1.x` symbol version that the
LIBFABRIC plugins of the NIXL installed beside this interpreter need, or the plugin would not
load and NIXL would refuse the backend only when vLLM starts.

    python3 libfabric_from_wheel.py install WHEEL_SPEC DEST
    python3 libfabric_from_wheel.py check LIBFABRIC_SO

Stdlib only: it runs in the image build and in tests/engine/setup_env.sh.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL_TAGS = ("--python-version", "3.11", "--platform", "manylinux_2_28_x86_64")
"""The wheel taken: its libraries do not depend on the interpreter that fetches them."""
BUNDLED = re.compile(r"^nixl\.libs/((libfabric|libefa|libibverbs|libnl-3|libnl-route-3)-[^/]+)$")
"""The wheel's libfabric and the libraries it links, by their bundled names."""
ABI = re.compile(rb"FABRIC_1\.\d+")
"""A libfabric symbol version name, as it appears in an ELF file's dynamic string table."""
NIXL_BACKENDS = ("nixl_cu12", "nixl_cu13")
"""The packages of NIXL's backend wheels, whose `<package>.libs/nixl/` holds the plugins."""


def extract(wheel: Path, dest: Path) -> Path:
    """Copy the bundled libfabric and its libraries into `dest`; return `libfabric.so.1`."""
    dest.mkdir(parents=True, exist_ok=True)
    fabric = None
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            match = BUNDLED.match(name)
            if match is None:
                continue
            target = dest / match.group(1)
            target.write_bytes(archive.read(name))
            target.chmod(0o755)
            if match.group(2) == "libfabric":
                fabric = target
    if fabric is None:
        raise SystemExit(f"{wheel.name} bundles no libfabric")
    link = dest / "libfabric.so.1"
    link.unlink(missing_ok=True)
    link.symlink_to(fabric.name)
    return link


def plugins() -> list[Path]:
    """The LIBFABRIC plugins of the NIXL backend wheels this interpreter has installed."""
    found = []
    for package in NIXL_BACKENDS:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.origin is not None:
            libs = Path(spec.origin).parent.parent / f"{package}.libs" / "nixl"
            found += sorted(libs.glob("libplugin_LIBFABRIC*.so"))
    return found


def missing_versions(fabric: Path, plugin: Path) -> list[str]:
    """The libfabric symbol versions `plugin` names that `fabric` does not define."""
    defined = set(ABI.findall(fabric.read_bytes()))
    return sorted(v.decode() for v in set(ABI.findall(plugin.read_bytes())) - defined)


def check(fabric: Path, found: list[Path] | None = None) -> None:
    """Fail, naming what is missing, unless `fabric` defines every libfabric version each
    plugin in `found` (by default the LIBFABRIC plugins installed here) needs."""
    found = plugins() if found is None else found
    if not found:
        raise SystemExit(f"no NIXL LIBFABRIC plugin beside {sys.executable} to check against")
    for plugin in found:
        missing = missing_versions(fabric, plugin)
        if missing:
            raise SystemExit(f"{fabric} lacks {', '.join(missing)}, which {plugin.name} links")
    print(f"{fabric} provides every libfabric version {', '.join(p.name for p in found)} needs")


def install(spec: str, dest: Path) -> None:
    """Download the wheel `spec`, put its libfabric into `dest` and check it."""
    with tempfile.TemporaryDirectory() as tmp:
        download = ["download", "--quiet", "--no-deps", "--only-binary=:all:", *WHEEL_TAGS]
        subprocess.run([sys.executable, "-m", "pip", *download, spec, "-d", tmp], check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        fabric = extract(wheel, dest)
    print(f"libfabric from {spec}: {fabric.resolve()}")
    check(fabric)


def main(argv: list[str]) -> int:
    match argv:
        case ["install", spec, dest]:
            install(spec, Path(dest))
        case ["check", fabric]:
            check(Path(fabric))
        case _:
            print(__doc__, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
