"""Offers replayed across a restart of their reader or their issuer, with skewed clocks (issue 28).

Decode's wall clock runs 120 s ahead of, or behind, prefill's (libfaketime on the decode
process), so each direction is checked with its issuer's clock both ahead of and behind its
reader's. One honest read is made each way: prefill reads back decode's KV of a conversation
(D->P) and decode reads prefill's KV of a prompt (P->D). Decode then restarts: an offer it made
before is refused (the issuer's retention went with it), and prefill's offer that the old decode
read is refused when replayed to the new one (a new incarnation, whose table of spent offers is
empty). Prefill restarts next, the same two cases the other way round. Each replay must be
answered as a recompute: neither reader compares the issuer's times with its own; the issuer's
claim decides, on the issuer's clock. One restart of each engine covers both directions.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

from conftest import DECODE_CORE, MODEL_DIR, PREFILL_CORE, Rig
from conversations import tokenizer, user_text
from disagg.rig.engine import EngineServer, ServerSpec, start_all
from disagg_contract import Role
from disagg_router.payloads import prefill_params
from driver import Conversation, PDDriver
from test_hostile_offers import (
    P2D,
    Answer,
    as_sent_to_prefill,
    ask_prefill,
    assert_recompute,
    completion,
    offers,
    wait_counted,
)

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


def first_turn(driver: PDDriver, first: list[int]) -> Conversation:
    """A conversation's first turn, which decode retains and offers."""
    conversation = Conversation()
    driver.token_turn(conversation, first, ANSWER_TOKENS)
    assert conversation.offer is not None
    return conversation


def read_back(
    driver: PDDriver, prefill: EngineServer, first: list[int], follow: list[int]
) -> tuple[list[int], Any]:
    """A conversation whose second turn reads decode's KV of the first: its history and the
    offer prefill read (spent from then on)."""
    conversation = first_turn(driver, first)
    offer = conversation.offer
    history = [*first, *conversation.turns[0].token_ids, *follow]
    before = len(prefill.log_text())
    driver.token_turn(conversation, history, ANSWER_TOKENS)
    read = re.search(r"D->P reuse for \S+: reading (\d+) tokens", prefill.log_text()[before:])
    assert read is not None and int(read.group(1)) > 0, "the honest turn read decode's KV"
    return history, offer


def replay_to_prefill(prefill: EngineServer, history: list[int], offer: Any, rig: Rig) -> None:
    """Decode's offer sent again to prefill: answered as a recompute, its claim refused."""
    recompute = ask_prefill(rig.off.prefill, history, None)
    before = len(prefill.log_text())
    assert_recompute(ask_prefill(prefill, history, as_sent_to_prefill(offer)), recompute, "replay")
    log = prefill.log_text()[before:]
    assert re.search(r"Claim of the D->P offer for \S+ not granted", log), log[-2000:]
    assert "D->P reuse" not in log or re.search(r"reading 0 tokens", log), log[-2000:]


def prefill_offer(prefill: EngineServer, prompt: list[int]) -> dict[str, object]:
    """Prefill's signed offer of ``prompt``'s KV, as the router gets it."""
    params: dict[str, object] = completion(prefill, prompt, prefill_params(None), max_tokens=1)[
        "kv_transfer_params"
    ]
    return params


def read_by_decode(
    decode: EngineServer, prompt: list[int], offer: dict[str, object], verdict: str
) -> Answer:
    """Decode's answer to ``prompt`` with ``offer``, once its verdict on the offer is counted."""
    before = offers(decode, verdict, P2D)
    answer = ask_prefill(decode, prompt, copy.deepcopy(offer))
    wait_counted(decode, verdict, P2D, before)
    return answer


@pytest.mark.parametrize("skew", ["ahead", "behind"])
def test_an_offer_replayed_after_either_engine_restarted_is_refused_whatever_the_skew(
    rig: Rig, servers: tuple[EngineServer, dict[str, EngineServer]], skew: str
) -> None:
    prefill, decodes = servers
    decode = decodes[skew]
    tok: PreTrainedTokenizerBase = tokenizer(MODEL_DIR)
    driver = PDDriver(prefill.url, decode.url)
    first = tok.encode(user_text(980 if skew == "ahead" else 990, 300))
    follow = tok.encode(user_text(981, 30))
    prompt = tok.encode(user_text(960 if skew == "ahead" else 965, 300))
    recompute = ask_prefill(rig.off.decode, prompt, None)

    history, _ = read_back(driver, prefill, first, follow)
    p2d = prefill_offer(prefill, prompt)
    honest = read_by_decode(decode, prompt, p2d, "verified")
    assert_recompute(honest, recompute, "the honest P->D read, whatever decode's clock says")
    unread = first_turn(driver, first).offer  # nobody reads it before decode restarts

    restart(decode)  # D->P: the issuer's retention is gone; P->D: the reader's spent offers
    replay_to_prefill(prefill, history, unread, rig)
    replay = read_by_decode(decode, prompt, p2d, "unclaimed")
    assert_recompute(replay, recompute, "a P->D offer replayed to a restarted decode")

    history, spent = read_back(driver, prefill, first, follow)
    fresh = prefill_offer(prefill, prompt)
    restart(prefill)  # D->P: the reader's spent offers are gone; P->D: the issuer's blocks
    replay_to_prefill(prefill, history, spent, rig)
    replay = read_by_decode(decode, prompt, fresh, "unclaimed")
    assert_recompute(replay, recompute, "a P->D offer of a restarted prefill")
