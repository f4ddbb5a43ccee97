"""The router command the operator renders is one ``disagg router`` accepts as it stands."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from disagg.cli import build_parser
from disagg_contract import CLIENT_KEYS_DIR, ENGINE_KEY_DIR, SECRET_KEY_NAME, PrefillRouting
from disagg_operator.loading import load_file, load_spec
from disagg_operator.models import ROUTER_MAX_CONCURRENT_REQUESTS, AuthSpec
from disagg_operator.render import render
from disagg_router.app import create_app
from disagg_router.auth import tenant_scope
from disagg_router.config import DiscoveryKind
from disagg_router.conversation import conversation_key
from disagg_router.options import config_from_args
from disagg_router.stores import tenant_shares
from dmodel_samples import ROUTER_TENANTS, spec_with

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
        assert config.prefill_routing is model.spec.router.prefill_routing
        probe = container["readinessProbe"]["httpGet"]
        assert (probe["path"], probe["port"]) == ("/health", config.port_name)


@pytest.mark.parametrize("routing", [None, *PrefillRouting])
def test_the_router_routes_prefill_as_the_spec_says(routing: PrefillRouting | None) -> None:
    router = {} if routing is None else {"prefillRouting": str(routing)}
    spec = load_spec(spec_with({"router": router}))
    (deployment,) = [m for m in render("m", "ns", spec) if m["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    config = config_from_args(build_parser().parse_args(container["command"][1:]))
    assert config.prefill_routing is (routing or PrefillRouting.AFFINITY)
    # The default stays off the command: a model that keeps it renders as before the field.
    assert ("--prefill-routing" in container["command"]) is (routing is PrefillRouting.LEAST_LOADED)


def test_rendered_tenant_bounds_are_the_ones_the_router_enforces(tmp_path: Path) -> None:
    spec = load_spec(spec_with(ROUTER_TENANTS))
    (deployment,) = [m for m in render("m", "ns", spec) if m["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    config = config_from_args(build_parser().parse_args(container["command"][1:]))
    assert config.header_timeout_s == 30
    assert config.max_concurrent_requests == ROUTER_MAX_CONCURRENT_REQUESTS
    # The mounted files are not here: the same command with the key paths on local files.
    keys = tmp_path / "client-keys"
    keys.mkdir()
    (keys / "team-a").write_text("sk-team-a")
    (tmp_path / "engine-key").write_text("sk-engine")
    local = replace(config, client_keys_dir=str(keys), engine_key_file=str(tmp_path / "engine-key"))
    slots = create_app(local).slots
    assert [slots.share(t) for t in ("team-a", "default", "team-b")] == [512, 1024, 256]
    shares = tenant_shares(local)
    tenants = ("team-a", "team-b", "x")
    by_tenant = {t: shares.of(conversation_key("c", tenant_scope(t)))[1] for t in tenants}
    assert by_tenant == {"team-a": 9000, "team-b": 50, "x": 2000}


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
