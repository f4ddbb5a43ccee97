"""The engine rig's NIXL backends: a LIBFABRIC server's config passes ``disagg serve``'s checks,
and the environment the rig gives it survives the launcher (libfabric's tcp provider, not the
EFA default the launcher fills in, and the plugin's libraries first on the loader path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from disagg.rig.engine import LIBFABRIC_CPU_LIB, LIBFABRIC_PROVIDER, EngineServer, ServerSpec
from disagg_connector.launch_config import check_config, serving_env
from disagg_contract import EXTRA_BACKENDS, FI_PROVIDER_ENV, Role
from dmodel_samples import KV_TRANSFER_KEYS

OTHER_LIBS = "/opt/elsewhere/lib"


def served_env(tmp_path: Path, backends: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, str]]:
    """A rig decode's checked ``--kv-transfer-config`` and the environment vLLM gets from it."""
    spec = ServerSpec("decode-on", Role.DECODE, 18200, 15601, 1, backends=backends)
    server = EngineServer(spec, tmp_path / "model", tmp_path)
    config = check_config(
        spec.kv_transfer_config(),
        Role.DECODE,
        accepted_keys=KV_TRANSFER_KEYS,
        vllm_version="0.32.0",
        source="rig",
    )
    return config, serving_env(server.environment(), config)


@pytest.fixture(autouse=True)
def host_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's own loader path, and no libfabric provider chosen."""
    monkeypatch.setenv("LD_LIBRARY_PATH", OTHER_LIBS)
    monkeypatch.delenv(FI_PROVIDER_ENV, raising=False)


def test_a_libfabric_server_runs_the_tcp_provider_with_the_plugins_libraries(
    tmp_path: Path,
) -> None:
    config, env = served_env(tmp_path, ("LIBFABRIC",))
    assert config["kv_connector_extra_config"][EXTRA_BACKENDS] == ["LIBFABRIC"]
    assert env[FI_PROVIDER_ENV] == LIBFABRIC_PROVIDER
    paths = env["LD_LIBRARY_PATH"].split(":")
    assert paths[0] == str(LIBFABRIC_CPU_LIB)
    assert paths[-1] == OTHER_LIBS


def test_a_ucx_server_keeps_the_hosts_loader_path_and_names_no_provider(tmp_path: Path) -> None:
    config, env = served_env(tmp_path, ("UCX",))
    assert config["kv_connector_extra_config"][EXTRA_BACKENDS] == ["UCX"]
    assert FI_PROVIDER_ENV not in env
    assert env["LD_LIBRARY_PATH"] == OTHER_LIBS
