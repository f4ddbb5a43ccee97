"""Offers replayed across a restart of their reader or their issuer, with skewed clocks (issue 28).

Decode's wall clock runs 120 s ahead of, or behind, prefill's (libfaketime on the decode
process). A conversation's turn is read back once; then the
same offer is replayed straight to prefill after prefill restarted (a new incarnation, whose
table of spent offers is empty), and again after decode restarted (the retention is gone with
the old process). Each replay must be refused and answered as a recompute, whatever the skew:
prefill compares none of decode's times with its own; decode's claim decides, on decode's clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import DECODE_CORE, MODEL_DIR, PREFILL_CORE, Rig
from conversations import tokenizer, user_text
from disagg.rig.engine import EngineServer, ServerSpec, start_all
from disagg_contract import Role
from driver import Conversation, PDDriver
from test_hostile_offers import as_sent_to_prefill, ask_prefill, assert_recompute

pytestmark = pytest.mark.engine

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
ANSWER_TOKENS = 8


def skewed(
    rig: Rig, role: Role, name: str, port: int, side_channel: int, skew: str
) -> EngineServer:
    """An engine whose wall clock is ``skew`` (libfaketime's "+120s" or "-120s") off.

    Its monotonic clock moves by the same constant (libfaketime cannot leave it alone without
    breaking Python's timed waits), which changes no duration the engine measures."""
    assert FAKETIME.exists(), "tests/engine/setup_env.sh installs libfaketime"
    core = PREFILL_CORE if role is Role.PREFILL else DECODE_CORE
    server = rig.decode_server(ServerSpec(name, role, port, side_channel, core))
    server.env.update(
        {
            "LD_PRELOAD": str(FAKETIME),
            "FAKETIME": skew,
            "FAKETIME_DONT_RESET": "1",
        }
    )
    return server


@pytest.fixture(scope="module")
def servers(rig: Rig) -> Iterator[tuple[EngineServer, dict[str, EngineServer]]]:
    """A prefill of its own (to restart) and two decodes, 120 s ahead and 120 s behind."""
    prefill = rig.decode_server(
        ServerSpec("prefill-restarting", Role.PREFILL, 18207, 15613, PREFILL_CORE)
    )
    decodes = {
        "ahead": skewed(rig, Role.DECODE, "decode-ahead", 18213, 15623, "+120s"),
        "behind": skewed(rig, Role.DECODE, "decode-behind", 18214, 15625, "-120s"),
    }
    everything = [prefill, *decodes.values()]
    start_all(everything)
    yield prefill, decodes
    for server in everything:
        server.stop()


def restart(server: EngineServer) -> None:
    server.stop()
    start_all([server])


def replay_is_refused(
    prefill: EngineServer, history: list[int], offer: dict[str, Any], rig: Rig
) -> None:
    """The offer sent again to prefill: answered as a recompute, its claim refused."""
    recompute = ask_prefill(rig.off.prefill, history, None)
    before = len(prefill.log_text())
    assert_recompute(ask_prefill(prefill, history, as_sent_to_prefill(offer)), recompute, "replay")
    log = prefill.log_text()[before:]
    assert re.search(r"Claim of the D->P offer for \S+ not granted", log), log[-2000:]
    assert "D->P reuse" not in log or re.search(r"reading 0 tokens", log), log[-2000:]


@pytest.mark.parametrize("skew", ["ahead", "behind"])
def test_a_replay_after_either_engine_restarted_is_refused_whatever_the_skew(
    rig: Rig, servers: tuple[EngineServer, dict[str, EngineServer]], skew: str
) -> None:
    prefill, decodes = servers
    decode = decodes[skew]
    tok = tokenizer(MODEL_DIR)
    driver = PDDriver(prefill.url, decode.url)
    conversation = Conversation()
    first = tok.encode(user_text(980 if skew == "ahead" else 990, 300))
    driver.token_turn(conversation, first, ANSWER_TOKENS)
    offer = conversation.offer
    assert offer is not None
    history = [*first, *conversation.turns[0].token_ids, *tok.encode(user_text(981, 30))]
    before = len(prefill.log_text())
    driver.token_turn(conversation, history, ANSWER_TOKENS)
    read = re.search(r"D->P reuse for \S+: reading (\d+) tokens", prefill.log_text()[before:])
    assert read is not None and int(read.group(1)) > 0, "the honest turn read decode's KV"

    restart(prefill)  # the reader restarts: its spent offers are gone
    replay_is_refused(prefill, history, offer, rig)

    # A fresh offer, then the issuer restarts: the retention went with it.
    again = Conversation()
    driver.token_turn(again, first, ANSWER_TOKENS)
    assert again.offer is not None
    restart(decode)
    replay_is_refused(prefill, history, again.offer, rig)
