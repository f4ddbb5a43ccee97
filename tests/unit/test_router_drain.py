"""Drain before removal (issue 14), the router's side, through the real router app in front of
engine stand-ins: a decode replica whose endpoint turns terminating finishes its stream in
flight, takes no new turn, is not health-checked, and each conversation whose KV it holds moves
on its next turn to another decode as a clean recompute (no D->P read from the leaving pod),
with its lease released as drained; a draining prefill takes no new prefill."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from disagg_contract import KV_TRANSFER_PARAMS, ReleaseReason
from router_harness import Engine, RouterRig, metric, router_rig
from test_router_leases import CHAT, MODEL, LeaseServiceStandIn, wait_until

IDLE_TIMEOUT_S = 4.0
"""Renewal passes (which release the leases on a draining decode) every second."""


@contextmanager
def drain_rig() -> Iterator[tuple[RouterRig, list[LeaseServiceStandIn], httpx.Client]]:
    """One prefill and two decode stand-ins, each decode with its lease service, a router."""
    with router_rig(prefills=1, decodes=2, idle_timeout_s=IDLE_TIMEOUT_S) as rig:
        services = [LeaseServiceStandIn(engine.state) for engine in rig.decode]
        try:
            with httpx.Client(base_url=rig.routers[0].url, timeout=10) as client:
                yield rig, services, client
        finally:
            for service in services:
                service.stop()


def ask(
    client: httpx.Client, conversation: str, content: str, stream: bool = False
) -> httpx.Response:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "conversation_id": conversation,
        "stream": stream,
    }
    return client.post(CHAT, json=body)


def served_by(rig: RouterRig, content: str) -> Engine:
    """The decode stand-in that received the turn asking ``content``."""
    (engine,) = [
        engine
        for engine in rig.decode
        if any(body["messages"][-1]["content"] == content for body in engine.state.received)
    ]
    return engine


def drain(rig: RouterRig, leaving: Engine) -> None:
    """Discovery's view of a pod being deleted: its endpoint is terminating."""
    pool = rig.routers[0].app_state().decode
    pool.set_urls([engine.url for engine in rig.decode], draining=[leaving.url])


def test_a_draining_decode_finishes_its_stream_and_its_conversations_move_as_recomputes() -> None:
    with drain_rig() as (rig, services, client):
        assert ask(client, "moved", "first question").status_code == 200
        leaving = served_by(rig, "first question")
        staying = next(engine for engine in rig.decode if engine is not leaving)
        service = services[rig.decode.index(leaving)]
        (lease,) = leaving.state.offers

        # A slow stream on the leaving decode is in flight when its endpoint turns terminating.
        leaving.state.token_delay_s = 0.2
        streamed: list[httpx.Response] = []
        pinned = threading.Thread(
            target=lambda: streamed.append(ask(client, "moved", "streamed question", True))
        )
        pinned.start()
        wait_until(lambda: len(leaving.state.received) == 2, 5, "the stream reaching decode")
        drain(rig, leaving)
        pinned.join(10)
        (stream,) = streamed
        assert stream.status_code == 200
        assert stream.text.rstrip().endswith("data: [DONE]"), "the stream in flight finished"
        assert "error" not in stream.text
        leaving.state.token_delay_s = 0.0

        # Its lease is released as drained within a renewal pass; the other decode's is not.
        second = leaving.state.offers[-1]
        wait_until(lambda: (second, ReleaseReason.DRAINED.value) in service.released(), 3, "drain")
        assert metric(client, "disagg_router_lease_releases_total", reason="drained") == 1
        assert lease in [name for name, _ in service.released()], "the first turn's superseded"

        # The conversation's next turn, and every new one, go to the staying decode; the moved
        # turn offers prefill no KV of the leaving pod (a recompute).
        reads = len(rig.prefill[0].state.reads)
        for conversation, content in (("moved", "third question"), ("new", "new question")):
            assert ask(client, conversation, content).status_code == 200
            assert served_by(rig, content) is staying
        assert len(rig.prefill[0].state.reads) == reads, "no D->P read from the leaving pod"
        prefill_params = rig.prefill[0].state.received[-2][KV_TRANSFER_PARAMS]
        assert prefill_params["remote_block_ids"] is None
        assert metric(client, "disagg_router_decode_affinity_total", result="draining") == 1
        labels = {"role": "decode", "replica": leaving.url}
        assert metric(client, "disagg_router_replica_draining", **labels) == 1
        successes = {"endpoint": CHAT, "outcome": "success"}
        assert metric(client, "disagg_router_requests_total", **successes) == 4
        assert services[rig.decode.index(staying)].released() == []


def test_a_turn_whose_entry_is_on_a_draining_decode_is_a_draining_lookup() -> None:
    with drain_rig() as (rig, _, client):
        assert ask(client, "c", "first question").status_code == 200
        leaving = served_by(rig, "first question")
        drain(rig, leaving)
        assert ask(client, "c", "second question").status_code == 200
        lookups = "disagg_router_conversation_lookups_total"
        assert metric(client, lookups, result="draining") == 1
        assert metric(client, lookups, result="hit") == 0
        assert served_by(rig, "second question") is not leaving


def test_a_draining_decode_is_not_health_checked_and_counts_as_unavailable() -> None:
    with drain_rig() as (rig, _, client):
        leaving, staying = rig.decode
        drain(rig, leaving)
        leaving.server.stop()  # a leaving pod stops answering: that is no failure
        time.sleep(1.0)  # five health intervals
        replica = rig.routers[0].app_state().decode.get(leaving.url)
        assert replica is not None and replica.healthy and replica.draining
        upstream = "disagg_router_upstream_errors_total"
        assert metric(client, upstream, role="decode", replica=leaving.url, kind="connect") == 0
        assert client.get("/health").json()["decode_healthy"] == 1
        staying.server.stop()
        time.sleep(1.0)
        response = ask(client, "c", "anyone there")
        assert response.status_code == 503
        assert client.get("/health").status_code == 503, "only a draining decode is left"


def test_a_draining_prefill_takes_no_new_prefill() -> None:
    with (
        router_rig(prefills=2, decodes=1) as rig,
        httpx.Client(base_url=rig.routers[0].url) as client,
    ):
        leaving, staying = rig.prefill
        pool = rig.routers[0].app_state().prefill
        pool.set_urls([engine.url for engine in rig.prefill], draining=[leaving.url])
        for index in range(4):
            assert ask(client, f"c{index}", "question").status_code == 200
        assert (len(leaving.state.received), len(staying.state.received)) == (0, 4)
