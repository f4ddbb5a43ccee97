"""API-key protection: clients need the key on every path but /health and /metrics, and the
router sends its engine credential to every engine call (stand-ins that refuse /v1 without it,
as vLLM): the engine key when it has one, else (as before engine keys) its single API key."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import httpx
import pytest

from disagg_contract import ENGINE_KEY_FILE_ENV, ROUTER_API_KEY_ENV
from disagg_router.auth import Client, KeyGuard
from disagg_router.config import ConfigError, RouterConfig, engine_credential
from disagg_router.options import add_router_arguments, config_from_args
from disagg_router.tenants import TenantKeys
from engine_standin import MODEL
from router_harness import RouterRig, metric

KEY = "sk-disagg-0123456789"
KEYED = {"api_key": KEY, "engine_api_key": KEY}
GOOD = {"Authorization": f"Bearer {KEY}"}


def chat(client: httpx.Client, headers: dict[str, str], **fields: object) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi there"}], **fields}
    return client.post("/v1/chat/completions", json=body, headers=headers)


@pytest.mark.parametrize("rig", [KEYED], indirect=True)
@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong", f"Bearer {KEY[:-1]}", f"Bearer {KEY}x", f"Basic {KEY}", KEY, "Bearer"],
)
def test_generation_without_the_key_is_401(
    rig: RouterRig, client: httpx.Client, authorization: str | None
) -> None:
    headers = {"X-Request-Id": "req-401"}
    if authorization is not None:
        headers["Authorization"] = authorization
    for path in ("/v1/chat/completions", "/v1/completions"):
        response = client.post(path, json={"model": MODEL, "prompt": "x"}, headers=headers)
        assert response.status_code == 401, response.text
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
        assert "Authorization: Bearer" in error["message"]
        assert response.headers["X-Request-Id"] == "req-401"
        assert response.headers["WWW-Authenticate"] == "Bearer"
    assert [b for e in rig.prefill + rig.decode for b in e.state.received] == []
    for endpoint in ("/v1/chat/completions", "/v1/completions"):
        assert (
            metric(
                client, "disagg_router_requests_total", endpoint=endpoint, outcome="unauthorized"
            )
            == 1
        )
    client.get("/v2/anything")
    assert (
        metric(client, "disagg_router_requests_total", endpoint="other", outcome="unauthorized")
        == 1
    )


@pytest.mark.parametrize("rig", [KEYED], indirect=True)
def test_models_and_unknown_paths_need_the_key_health_and_metrics_do_not(
    client: httpx.Client,
) -> None:
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v2/anything").status_code == 401
    assert client.get("/v1/models", headers=GOOD).json()["data"][0]["id"] == MODEL
    assert client.get("/v2/anything", headers=GOOD).status_code == 404
    assert client.get("/health").status_code == 200
    assert client.get("/metrics").status_code == 200


@pytest.mark.parametrize("rig", [KEYED], indirect=True)
@pytest.mark.parametrize("stream", [False, True])
def test_the_key_serves_and_reaches_every_engine_call(
    rig: RouterRig, client: httpx.Client, stream: bool
) -> None:
    lower_scheme = {"Authorization": f"bearer {KEY}"}
    for headers in (GOOD, lower_scheme):
        response = chat(client, headers, stream=stream)
        assert response.status_code == 200, response.text
    calls = [call for e in rig.prefill + rig.decode for call in e.state.authorizations]
    paths = {path for path, _ in calls}
    assert {"/v1/chat/completions", "/v1/models"} <= paths
    assert {auth for _, auth in calls} == {f"Bearer {KEY}"}
    assert sum(len(e.state.received) for e in rig.prefill) == 2
    assert sum(len(e.state.received) for e in rig.decode) == 2


@pytest.mark.parametrize("rig", [KEYED], indirect=True)
def test_conversations_still_hit_behind_the_key(client: httpx.Client) -> None:
    for _ in range(2):
        assert chat(client, GOOD, conversation_id="c-auth").status_code == 200
    assert metric(client, "disagg_router_conversation_lookups_total", result="hit") == 1


@pytest.mark.parametrize("rig", [{"engine_api_key": KEY}], indirect=True)
def test_engines_refusing_the_routers_key_is_a_502_not_the_clients_401(
    client: httpx.Client,
) -> None:
    response = chat(client, {})
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "engine_unauthorized"
    assert "--engine-key-file" in error["message"] and "spec.auth" in error["message"]


def test_without_a_key_the_router_stays_open(client: httpx.Client) -> None:
    assert chat(client, {}).status_code == 200
    assert client.get("/v1/models").status_code == 200


def _parse(*argv: str) -> RouterConfig:
    parser = argparse.ArgumentParser()
    add_router_arguments(parser)
    return config_from_args(
        parser.parse_args(["--prefill", "http://p:1", "--decode", "http://d:1", *argv])
    )


def test_key_comes_from_the_environment_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ROUTER_API_KEY_ENV, raising=False)
    monkeypatch.delenv(ENGINE_KEY_FILE_ENV, raising=False)
    assert _parse().api_key is None and engine_credential(_parse()) is None
    monkeypatch.setenv(ROUTER_API_KEY_ENV, KEY)
    assert _parse().api_key == KEY
    assert _parse("--api-key", "sk-flag").api_key == "sk-flag"
    assert KEY not in repr(_parse())
    assert engine_credential(_parse()) == KEY, "without an engine key the API key goes to engines"


def test_engine_key_comes_from_its_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ROUTER_API_KEY_ENV, KEY)
    path = tmp_path / "disagg-key"
    path.write_text("sk-engine-1\n")
    monkeypatch.setenv(ENGINE_KEY_FILE_ENV, str(path))
    assert engine_credential(_parse()) == "sk-engine-1"
    other = tmp_path / "other"
    other.write_text("sk-engine-2")
    config = _parse("--engine-key-file", str(other))
    assert engine_credential(config) == "sk-engine-2" and config.api_key == KEY
    missing = _parse("--engine-key-file", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="--engine-key-file"):
        engine_credential(missing)
    other.write_text("two words")
    with pytest.raises(ConfigError, match=ENGINE_KEY_FILE_ENV):
        engine_credential(config)


@pytest.mark.parametrize("key", ["", f"{KEY}\n", "two words", "clé"])
def test_keys_that_cannot_travel_in_a_header_are_refused(key: str) -> None:
    config = dataclasses.replace(_parse(), api_key=key)
    with pytest.raises(ConfigError, match=ROUTER_API_KEY_ENV):
        config.validate()


def test_guard_reads_only_the_authorization_header() -> None:
    guard = KeyGuard(TenantKeys(None, KEY, refresh_s=5.0))

    def scope(path: str, *headers: tuple[bytes, bytes]) -> dict[str, object]:
        return {"type": "http", "path": path, "headers": list(headers)}

    assert guard.admit(scope("/v1/models", (b"authorization", f"Bearer {KEY}".encode())))
    assert guard.admit(scope("/v1/models", (b"x-api-key", KEY.encode()))) is None
    assert guard.admit(scope("/v1/models")) is None
    assert guard.admit(scope("/health")) == guard.admit(scope("/metrics")) == Client("", "")
