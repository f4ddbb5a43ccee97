"""The CUDA serving image (`make image-cuda`, tests/cluster/node/images.sh build-cuda) inspected
on this machine, without a GPU: each check runs in a working container of the image (buildah,
chroot isolation) with the image's own Python, libraries and vLLM (tests/image/image_probe.py).

- Every library NIXL's UCX and LIBFABRIC plugins link resolves in the image but the NVIDIA
  driver's libcuda.so.1, which the NVIDIA container runtime mounts on GPU nodes; with a stand-in
  libcuda.so.1 (tests/engine/libcuda_stub.c) NIXL loads both plugins into an agent.
- Debian's `fi_info -l` (libfabric-bin, run against the image's libfabric) lists `efa`.
- The connector imports; vLLM's factory loads it through the module path the operator renders,
  and vLLM's general-plugin loading runs the package's stream-params plugin.
- Every example's rendered server command passes `disagg serve`'s checks and the image's vLLM
  parser (vLLM's CPU platform, as in tests/engine/vllm_cli_fit.py).
- vLLM's loader for an `s3://` source (the Run:ai streamer's load format the operator renders)
  loads, and the streamer's reader and its S3 part are installed.
- The image's size and versions are printed and written to docs/images/serving-cuda.json, which
  the README's table must agree with (tests/unit/test_readme_images.py).

Fails, not skips, when the image is not built: `make image-cuda` builds it first.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from image_probe import PLUGINS

from disagg.rig.engine import LIBFABRIC_PROVIDER
from disagg_contract import CONNECTOR_CLASS, CONNECTOR_MODULE, FI_PROVIDER_ENV

pytestmark = pytest.mark.image

REPO = Path(__file__).resolve().parents[2]
IMAGES_SH = REPO / "tests" / "cluster" / "node" / "images.sh"
FIGURES = REPO / "docs" / "images" / "serving-cuda.json"
"""The image's size and versions, as the last inspection found them."""
DRIVER_LIBRARIES = ["libcuda.so.1"]
"""What the plugins may link that the image does not hold: the NVIDIA driver's library."""
SOURCE = "/src"
"""Where the working tree is mounted (read-only) in the container."""
STUB = "/opt/libcuda-stub"
"""Where the libcuda.so.1 stand-in is mounted."""
FI_INFO = "/opt/fi-info"
"""Where Debian's fi_info is mounted."""
PROBE_TIMEOUT_S = 600


def _key_values(*command: str) -> dict[str, str]:
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.fixture(scope="module")
def buildah() -> list[str]:
    """The buildah command line over the images' storage (the one images.sh builds into)."""
    state = _key_values("bash", str(REPO / "tests" / "cluster" / "env.sh"))["IMAGE_STATE"]
    return ["buildah", "--root", f"{state}/storage", "--runroot", f"{state}/run"]


@pytest.fixture(scope="module")
def image(buildah: list[str]) -> str:
    """The CUDA serving image the last `images.sh build-cuda` built, which must be present."""
    built = subprocess.run(["bash", str(IMAGES_SH), "env", "cuda"], capture_output=True, text=True)
    assert built.returncode == 0, f"no CUDA image built (make image-cuda): {built.stderr}"
    tag = dict(line.split("=", 1) for line in built.stdout.split())["SERVING_CUDA_IMAGE"]
    present = subprocess.run([*buildah, "inspect", "--type", "image", tag], capture_output=True)
    assert present.returncode == 0, f"{tag} is not in buildah's storage (make image-cuda)"
    return tag


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Host directories mounted into the container: a libcuda.so.1 stand-in and Debian's
    fi_info (libfabric-bin, unpacked, not installed)."""
    root = tmp_path_factory.mktemp("image-tools")
    stub = root / "stub"
    stub.mkdir()
    source = REPO / "tests" / "engine" / "libcuda_stub.c"
    library = ["-shared", "-fPIC", "-O2", "-Wl,-soname,libcuda.so.1"]
    subprocess.run(["cc", *library, "-o", str(stub / "libcuda.so.1"), str(source)], check=True)
    subprocess.run(["apt-get", "download", "libfabric-bin"], cwd=root, check=True)
    (deb,) = root.glob("libfabric-bin_*.deb")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root / "deb")], check=True)
    return {"stub": stub, "fi_info": root / "deb" / "usr" / "bin"}


@pytest.fixture(scope="module")
def container(buildah: list[str], image: str, tools: dict[str, Path]) -> Iterator[list[str]]:
    """A working container of the image; yields the command prefix that runs in it, as the
    image's user, with the working tree, the libcuda stand-in and fi_info mounted."""
    name = subprocess.run(
        [*buildah, "from", "--pull=never", image], check=True, capture_output=True, text=True
    ).stdout.strip()
    mounts = [f"{REPO}:{SOURCE}", f"{tools['stub']}:{STUB}", f"{tools['fi_info']}:{FI_INFO}"]
    volumes = [arg for mount in mounts for arg in ("--volume", f"{mount}:ro")]
    yield [*buildah, "run", "--isolation", "chroot", *volumes, name, "--"]
    subprocess.run([*buildah, "rm", name], check=True, capture_output=True)


def _run(container: list[str], script: str) -> str:
    """Run a shell script in the container; its standard output."""
    out = subprocess.run(
        [*container, "sh", "-c", script], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out.stdout


def _probe(container: list[str], check: str, env: str = "") -> Any:
    """The JSON result of image_probe.py's ``check`` (the last line it prints: vLLM and NIXL
    log to standard output)."""
    out = _run(container, f"{env} exec python3 {SOURCE}/tests/image/image_probe.py {check}")
    return json.loads(out.splitlines()[-1])


def test_plugins_link_nothing_missing_but_the_driver(container: list[str]) -> None:
    missing = _probe(container, "libraries")
    assert set(missing) == set(PLUGINS)
    assert [
        name for names in missing.values() for name in names if name not in DRIVER_LIBRARIES
    ] == []


def test_nixl_loads_both_plugins_with_a_libcuda_stand_in(container: list[str]) -> None:
    env = f"LD_LIBRARY_PATH={STUB}:$LD_LIBRARY_PATH {FI_PROVIDER_ENV}={LIBFABRIC_PROVIDER}"
    assert _probe(container, "agents", env) == {backend: [backend] for backend in PLUGINS}


def _fi_info(container: list[str], *args: str) -> str:
    return _run(container, " ".join([f"{FI_INFO}/fi_info", *args]))


def _providers(container: list[str]) -> list[str]:
    """The providers `fi_info -l` lists."""
    return re.findall(r"^(\S+):$", _fi_info(container, "-l"), flags=re.MULTILINE)


def test_fi_info_lists_the_efa_provider(container: list[str]) -> None:
    assert "efa" in _providers(container)


def test_vllm_loads_the_connector_and_its_plugin(container: list[str]) -> None:
    found = _probe(container, "connector")
    assert found["class"] == f"{CONNECTOR_MODULE}.{CONNECTOR_CLASS}"
    assert found["is_v1_connector"] is True
    patched = found["stream_params_patched"]
    assert patched and all(flag is found["stream_params_needed"] for flag in patched.values())


def test_every_example_command_parses_with_the_images_vllm(container: list[str]) -> None:
    found = _probe(container, "commands")
    examples = {where.split()[0] for where in found["servers"]}
    assert examples == {path.name for path in (REPO / "examples").glob("*.yaml")}
    assert found["problems"] == []


def test_vllm_streams_s3_sources_with_the_runai_streamer(container: list[str]) -> None:
    found = _probe(container, "streamer")
    assert found["loader"] == "RunaiModelStreamerLoader"
    assert found["s3_package"] is True
    assert found["versions"]["runai-model-streamer-s3"] == found["versions"]["runai-model-streamer"]


def test_size_and_versions_are_recorded(
    buildah: list[str], image: str, container: list[str]
) -> None:
    size = subprocess.run(
        [*buildah, "images", "--format", "{{.Size}}", image],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    versions = _probe(container, "versions")
    efa = "efa" in _providers(container)
    libfabric = re.search(r"^libfabric: (\S+)$", _fi_info(container, "--version"), re.MULTILINE)
    assert libfabric, "fi_info printed no libfabric version"
    figures = {
        "size": size,
        "Python": versions["python"],
        "vLLM": versions["vllm"],
        "torch": f"{versions['torch']} (CUDA {versions['cuda']})",
        "NIXL": versions["nixl"],
        "libfabric": libfabric.group(1) + (", efa provider" if efa else ""),
        "Run:ai model streamer": versions["streamer"],
    }
    print(json.dumps(figures, indent=2))
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(figures, indent=2) + "\n")
    assert re.fullmatch(r"[\d.]+ [GM]B", size), size
