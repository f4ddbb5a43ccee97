"""After a scripted run, /metrics holds exactly the expected counts; logs keep upstream's line."""

from __future__ import annotations

import logging
import re

import httpx
import pytest

from engine_standin import MODEL
from router_harness import metric, router_rig

CHAT = "/v1/chat/completions"


def test_scripted_run_counts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="disagg.router")
    with (
        router_rig(prefills=1, decodes=1) as rig,
        httpx.Client(base_url=rig.routers[0].url, timeout=10) as client,
    ):
        messages = [{"role": "user", "content": "one two three four"}]
        for _ in range(3):
            body: dict[str, object] = {"model": MODEL, "messages": messages, "conversation_id": "m"}
            assert client.post(CHAT, json=body).status_code == 200
        body = {"model": MODEL, "messages": messages, "stream": True}
        assert client.post(CHAT, json=body).status_code == 200
        assert client.post(CHAT, content=b"{").status_code == 400
        rig.decode[0].state.fail_statuses = [500]
        assert client.post(CHAT, json={"model": MODEL, "messages": messages}).status_code == 502

        def value(name: str, **labels: str) -> float:
            return metric(client, name, **labels)

        outcomes = {
            o: value("disagg_router_requests_total", endpoint=CHAT, outcome=o)
            for o in ("success", "client_error", "upstream_error")
        }
        assert outcomes == {"success": 4, "client_error": 1, "upstream_error": 1}
        lookups = {
            r: value("disagg_router_conversation_lookups_total", result=r)
            for r in ("hit", "miss", "no_key")
        }
        assert lookups == {"hit": 2, "miss": 1, "no_key": 2}
        # prompt: 4 words + 2 (chat framing) = 6 tokens; turns 2 and 3 reuse decode's 6 + 8.
        assert value("disagg_router_prompt_tokens_total", kind="reused") == 12
        assert value("disagg_router_prompt_tokens_total", kind="recomputed") == 6 * 5 - 12
        assert value("disagg_router_prefill_duration_seconds_count") == 5
        assert value("disagg_router_e2e_latency_seconds_count") == 4
        assert value("disagg_router_ttft_seconds_count") == 1
        assert value("disagg_router_decode_affinity_total", result="kept") == 2
        decode = rig.decode[0].url
        labels = {"role": "decode", "replica": decode, "kind": "http_500"}
        assert value("disagg_router_upstream_errors_total", **labels) == 1
        assert value("disagg_router_replica_healthy", role="decode", replica=decode) == 1
        assert value("disagg_router_replica_outstanding", role="decode", replica=decode) == 0
    done = [r.getMessage() for r in caplog.records if "Prefill done in" in r.getMessage()]
    assert len(done) == 5
    assert all(re.search(r"Prefill done in \d+ms", line) for line in done)
