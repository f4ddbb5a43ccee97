"""The router command the operator renders is one ``disagg router`` accepts as it stands."""

from __future__ import annotations

from pathlib import Path

import pytest

from disagg.cli import build_parser
from disagg_contract import CLIENT_KEYS_DIR, ENGINE_KEY_DIR, SECRET_KEY_NAME
from disagg_operator.loading import load_file
from disagg_operator.models import AuthSpec
from disagg_operator.render import render
from disagg_router.config import DiscoveryKind
from disagg_router.options import config_from_args

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_rendered_router_command_is_a_valid_router_config(example: Path) -> None:
    for model in load_file(example):
        namespace = model.metadata.namespace or "default"
        manifests = render(model.metadata.name, namespace, model.spec)
        (deployment,) = [m for m in manifests if m["kind"] == "Deployment"]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        program, *args = container["command"]
        assert program == "disagg"
        config = config_from_args(build_parser().parse_args(args))
        assert config.discovery == DiscoveryKind.KUBERNETES
        assert config.namespace == namespace
        assert config.conversation_ttl_s == model.spec.conversation_ttl_seconds
        assert config.shutdown_timeout_s == model.spec.router.shutdown_timeout_seconds
        probe = container["readinessProbe"]["httpGet"]
        assert (probe["path"], probe["port"]) == ("/health", config.port_name)


def test_rendered_router_reads_the_api_key_the_secret_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = load_file(EXAMPLES[0])[0]
    spec = model.spec.model_copy(
        update={"auth": AuthSpec.model_validate({"apiKeySecret": {"name": "api"}})}
    )
    manifests = render(model.metadata.name, model.metadata.namespace, spec)
    (deployment,) = [m for m in manifests if m["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (from_secret,) = [v for v in container["env"] if "secretKeyRef" in v["valueFrom"]]
    monkeypatch.setenv(from_secret["name"], "sk-from-secret")
    config = config_from_args(build_parser().parse_args(container["command"][1:]))
    assert config.api_key == "sk-from-secret"


def test_the_mounted_key_paths_validate_where_they_are_not_mounted() -> None:
    engine_key = f"{ENGINE_KEY_DIR}/{SECRET_KEY_NAME}"
    args = ["router", "--prefill", "http://p:1", "--decode", "http://d:1"]
    args += ["--client-keys-dir", CLIENT_KEYS_DIR, "--engine-key-file", engine_key]
    config = config_from_args(build_parser().parse_args(args))
    assert (config.client_keys_dir, config.engine_key_file) == (CLIENT_KEYS_DIR, engine_key)
    assert config.authenticates, "a client-keys folder, even empty, means clients need a key"


def test_examples_exist() -> None:
    assert EXAMPLES, "examples/*.yaml are the samples this contract is checked on"
