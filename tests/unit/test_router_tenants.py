"""Tenants: every client key of the client-keys folder (laid out as the kubelet mounts a
Secret) is its own conversation scope, and a key removed or changed in the folder takes effect
without a restart; the engines only ever see the router's engine key."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from disagg_contract import CACHE_SALT_KEY
from disagg_router.app import create_app
from disagg_router.config import ConfigError, RouterConfig
from disagg_router.salts import CacheSalts
from disagg_router.tenants import API_KEY_TENANT, TenantKeys, read_client_keys
from engine_standin import MODEL
from router_harness import RouterRig, SecretVolume, metric, router_rig

ENGINE_KEY = "sk-engine-only-7f3a"
KEYS = {"alice": "sk-alice-0001", "bob": "sk-bob-0002"}
REFRESH_S = 0.1
URLS = ("http://127.0.0.1:1",)


@pytest.fixture
def volume(tmp_path: Path) -> SecretVolume:
    return SecretVolume(
        tmp_path / "client-keys", {"alice": KEYS["alice"] + "\n", "bob": KEYS["bob"]}
    )


@pytest.fixture
def tenants(volume: SecretVolume, tmp_path: Path) -> Iterator[RouterRig]:
    """One prefill and one decode that accept only ENGINE_KEY, behind a router with the folder."""
    engine_key = SecretVolume(tmp_path / "engine-key", {"disagg-key": ENGINE_KEY + "\n"})
    with router_rig(
        prefills=1,
        decodes=1,
        engine_api_key=ENGINE_KEY,
        client_keys_dir=str(volume.path),
        client_keys_refresh_s=REFRESH_S,
        engine_key_file=str(engine_key.path / "disagg-key"),
    ) as running:
        yield running


@pytest.fixture
def client(tenants: RouterRig) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=tenants.routers[0].url, timeout=10) as http:
        yield http


def turn(client: httpx.Client, key: str, conversation: str = "same-id") -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "conversation_id": conversation,
    }
    return client.post(
        "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    )


def hits(client: httpx.Client) -> float:
    return metric(client, "disagg_router_conversation_lookups_total", result="hit")


def wait_for_status(client: httpx.Client, key: str, status: int) -> httpx.Response:
    """Turns with ``key`` until one answers ``status`` (the folder is re-read every 0.1 s)."""
    deadline = time.monotonic() + 5
    while True:
        response = turn(client, key, conversation="probe")
        if response.status_code == status or time.monotonic() > deadline:
            assert response.status_code == status, response.text
            return response
        time.sleep(REFRESH_S / 2)


def test_one_conversation_id_under_two_keys_is_two_conversations(
    tenants: RouterRig, client: httpx.Client
) -> None:
    decode = tenants.decode[0].state
    assert turn(client, KEYS["alice"]).status_code == 200
    assert turn(client, KEYS["bob"]).status_code == 200
    assert hits(client) == 0, "bob's first turn must not reuse alice's KV"
    alice_kv, bob_kv = (f"{decode.name}-{i}" for i in range(2))
    assert turn(client, KEYS["alice"]).status_code == 200
    assert turn(client, KEYS["bob"]).status_code == 200
    assert hits(client) == 2, "neither tenant's turn evicted the other's entry"
    reads = [read["remote_request_id"] for read in tenants.prefill[0].state.reads]
    assert reads == [alice_kv, bob_kv], "each tenant read back only its own decode KV"


def test_engines_get_the_engine_key_never_a_client_key(
    tenants: RouterRig, client: httpx.Client
) -> None:
    for key in KEYS.values():
        assert turn(client, key).status_code == 200
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {KEYS['bob']}"}).is_success
    sent = {auth for e in tenants.prefill + tenants.decode for _, auth in e.state.authorizations}
    assert sent == {f"Bearer {ENGINE_KEY}"}
    assert turn(client, ENGINE_KEY).status_code == 401, "the engine key is no client key"


def salts_sent(tenants: RouterRig, since: int = 0) -> list[tuple[str, str]]:
    """(prefill, decode) ``cache_salt`` of each turn since the ``since``-th, in order."""
    prefill = [body[CACHE_SALT_KEY] for body in tenants.prefill[0].state.received[since:]]
    decode = [body[CACHE_SALT_KEY] for body in tenants.decode[0].state.received[since:]]
    assert len(prefill) == len(decode)
    return list(zip(prefill, decode, strict=True))


def test_each_tenant_has_its_own_cache_salt_on_both_engine_bodies(
    tenants: RouterRig, client: httpx.Client
) -> None:
    for key in (KEYS["alice"], KEYS["bob"], KEYS["alice"]):
        assert turn(client, key, conversation="salted").status_code == 200
    (alice_p, alice_d), (bob_p, bob_d), (again_p, again_d) = salts_sent(tenants)
    assert alice_p == alice_d == again_p == again_d, "one tenant, one salt, on every body"
    assert bob_p == bob_d != alice_p, "the same prompt of two tenants is salted apart"
    salts = CacheSalts(ENGINE_KEY)
    assert (alice_p, bob_p) == (salts.salt("alice", None), salts.salt("bob", None))


def test_a_clients_own_cache_salt_is_scoped_under_its_tenant(
    tenants: RouterRig, client: httpx.Client
) -> None:
    bob_salt = CacheSalts(ENGINE_KEY).salt("bob", None)
    before = len(tenants.prefill[0].state.received)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
    answers = [
        client.post(
            "/v1/chat/completions",
            json={**body, CACHE_SALT_KEY: salt},
            headers={"Authorization": f"Bearer {KEYS['alice']}"},
        )
        for salt in (bob_salt, "mine", "mine")
    ]
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    (posed, posed_d), (mine, mine_d), (again, _) = salts_sent(tenants, before)
    assert posed == posed_d and mine == mine_d == again
    assert len({posed, mine, bob_salt, CacheSalts(ENGINE_KEY).salt("alice", None)}) == 4
    assert all(bob_salt not in answer.text and mine not in answer.text for answer in answers)
    refused = client.post(
        "/v1/chat/completions",
        json={**body, CACHE_SALT_KEY: ""},
        headers={"Authorization": f"Bearer {KEYS['alice']}"},
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == CACHE_SALT_KEY


def test_cache_salts_never_collide_across_tenants_and_client_salts() -> None:
    keyed, other_key, keyless = CacheSalts("k1"), CacheSalts("k2"), CacheSalts(None)
    bob = keyed.salt("bob", None)
    pairs = [("bob", None), ("bo", "b"), ("bob", ""), ("alice", bob), ("alice", None)]
    pairs += [('alice", "x', None), ("alice", "x"), ("", None), ("", "bob")]
    derived = [keyed.salt(tenant, salt) for tenant, salt in pairs]
    assert len(set(derived)) == len(pairs), "distinct (tenant, client salt) pairs salt apart"
    assert keyed.salt("bob", None) == bob, "stable"
    assert other_key.salt("bob", None) != bob != keyless.salt("bob", None)
    assert len(bob) == 64 and bob.isalnum()


def test_a_key_removed_from_the_secret_is_refused_without_a_restart(
    volume: SecretVolume, tenants: RouterRig, client: httpx.Client
) -> None:
    assert turn(client, KEYS["bob"]).status_code == 200
    volume.publish({"alice": KEYS["alice"]})
    refused = wait_for_status(client, KEYS["bob"], 401)
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert turn(client, KEYS["alice"]).status_code == 200
    volume.publish({"alice": KEYS["alice"], "bob": KEYS["bob"]})
    wait_for_status(client, KEYS["bob"], 200)
    assert turn(client, KEYS["bob"]).status_code == 200
    assert hits(client) >= 1, "bob's conversations outlived the revocation (same tenant)"


def test_a_rotated_key_keeps_its_tenants_conversations(
    volume: SecretVolume, tenants: RouterRig, client: httpx.Client
) -> None:
    assert turn(client, KEYS["alice"]).status_code == 200
    volume.publish({"alice": "sk-alice-rotated", "bob": KEYS["bob"]})
    wait_for_status(client, KEYS["alice"], 401)
    before = hits(client)
    assert turn(client, "sk-alice-rotated").status_code == 200
    assert hits(client) == before + 1, "the new key reads the tenant's entry of the old one"


def test_the_api_key_is_the_default_tenant_beside_the_folder(volume: SecretVolume) -> None:
    volume.publish({**KEYS, API_KEY_TENANT: "sk-default-second"})
    with (
        router_rig(
            prefills=1, decodes=1, api_key="sk-default-first", client_keys_dir=str(volume.path)
        ) as rig,
        httpx.Client(base_url=rig.routers[0].url, timeout=10) as client,
    ):
        assert turn(client, "sk-default-first").status_code == 200
        assert turn(client, "sk-default-second").status_code == 200
        assert hits(client) == 1, "two keys of one tenant share its conversations"
        assert turn(client, KEYS["alice"]).status_code == 200
        assert hits(client) == 1
        sent = {auth for e in rig.prefill + rig.decode for _, auth in e.state.authorizations}
        assert sent == {"Bearer sk-default-first"}, "no engine key: the API key goes to engines"


def test_an_empty_folder_refuses_everyone(tmp_path: Path) -> None:
    folder = SecretVolume(tmp_path / "none", {}).path
    with (
        router_rig(prefills=1, decodes=1, client_keys_dir=str(folder)) as rig,
        httpx.Client(base_url=rig.routers[0].url, timeout=10) as client,
    ):
        assert turn(client, "anything").status_code == 401
        assert client.get("/health").status_code == 200


@pytest.mark.parametrize(
    ("files", "mentions"),
    [
        ({"alice": "two words"}, "alice"),
        ({"alice": ""}, "alice"),
        ({"alice": "sk-x\n\n"}, "alice"),
        ({"alice": "sk-same", "bob": "sk-same"}, "alice, bob"),
        ({API_KEY_TENANT + "-not": "sk-api"}, "default"),
    ],
)
def test_bad_key_files_are_refused_at_start_up_by_name(
    tmp_path: Path, files: dict[str, str], mentions: str
) -> None:
    folder = SecretVolume(tmp_path / "keys", files).path
    config = RouterConfig(URLS, URLS, client_keys_dir=str(folder), api_key="sk-api").validate()
    with pytest.raises(ConfigError, match=rf"--client-keys-dir.*{mentions}"):
        create_app(config)


def test_a_missing_folder_is_refused_at_start_up(tmp_path: Path) -> None:
    config = RouterConfig(URLS, URLS, client_keys_dir=str(tmp_path / "x")).validate()
    with pytest.raises(ConfigError, match="--client-keys-dir"):
        create_app(config)


def test_the_cli_names_a_bad_key_file_and_exits(tmp_path: Path) -> None:
    folder = SecretVolume(tmp_path / "keys", {"alice": "two words"}).path
    command = [sys.executable, "-m", "disagg.cli", "router", "--prefill", *URLS, "--decode", *URLS]
    done = subprocess.run(
        [*command, "--client-keys-dir", str(folder)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "disagg router: --client-keys-dir" in done.stderr and "alice" in done.stderr
    assert "Traceback" not in done.stderr


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_folder_is_read_again_only_after_the_refresh_interval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    volume = SecretVolume(tmp_path / "keys", KEYS)
    clock = Clock()
    keys = TenantKeys(volume.path, None, refresh_s=5.0, clock=clock)
    assert keys.tenant_of(KEYS["bob"].encode()) == "bob"
    volume.publish({"alice": KEYS["alice"], "bob": "two words"})
    clock.now = 4.9
    assert keys.tenant_of(KEYS["bob"].encode()) == "bob", "read again only every 5 s"
    clock.now = 5.0
    with caplog.at_level(logging.WARNING, logger="disagg_router.tenants"):
        assert keys.tenant_of(KEYS["bob"].encode()) is None
        clock.now = 10.0
        assert keys.tenant_of(KEYS["alice"].encode()) == "alice"
    warnings = [r.getMessage() for r in caplog.records if "bob" in r.getMessage()]
    assert len(warnings) == 1, "a problem is logged once, not on every read"
    assert keys.tenants() == {"alice"}


def test_a_folder_that_cannot_be_read_revokes_nothing(tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path / "keys", KEYS)
    clock = Clock()
    keys = TenantKeys(volume.path, None, refresh_s=1.0, clock=clock)
    volume.path.rename(tmp_path / "gone")
    clock.now = 2.0
    assert keys.tenant_of(KEYS["alice"].encode()) == "alice"


def test_only_regular_files_count_and_one_trailing_newline_is_dropped(tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path / "keys", {"alice": "sk-a\r\n", "bob": "sk-b\n"})
    (volume.path / "sub").mkdir()
    (volume.path / "dangling").symlink_to("..data/nothing")
    keys, problems = read_client_keys(volume.path)
    assert keys == {"alice": "sk-a", "bob": "sk-b"} and problems == []
