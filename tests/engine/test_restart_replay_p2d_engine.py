"""Prefill's offers to decode replayed across a restart of either engine, with skewed clocks.

The P->D half of issue 28's replay check. Prefill's wall clock runs 120 s ahead of, or behind,
decode's (libfaketime on the prefill process). Prefill's offer of a prompt is read once by
decode; then the same offer is replayed straight to decode after decode restarted (a new
incarnation, whose table of spent offers is empty), and a fresh offer is sent after prefill
restarted (the blocks went with the old process). The honest read must happen whatever the
skew, and each replay must be refused and answered as a recompute: decode compares none of
prefill's times with its own; prefill's answer to decode's claim decides, on prefill's clock.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
from transformers import PreTrainedTokenizerBase

from conftest import DECODE_CORE, MODEL_DIR, Rig
from conversations import tokenizer, user_text
from disagg.rig.engine import EngineServer, ServerSpec, start_all
from disagg_contract import Role
from disagg_router.payloads import prefill_params
from test_hostile_offers import (
    P2D,
    Answer,
    ask_prefill,
    assert_recompute,
    completion,
    offers,
    wait_counted,
)
from test_restart_replay_engine import restart, skewed

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def servers(rig: Rig) -> Iterator[tuple[dict[str, EngineServer], EngineServer]]:
    """Two prefills, 120 s ahead and 120 s behind, and a decode of its own (to restart)."""
    prefills = {
        "ahead": skewed(rig, Role.PREFILL, "prefill-ahead", 18220, 15631, "+120s"),
        "behind": skewed(rig, Role.PREFILL, "prefill-behind", 18221, 15633, "-120s"),
    }
    decode = rig.decode_server(
        ServerSpec("decode-restarting", Role.DECODE, 18222, 15635, DECODE_CORE)
    )
    everything = [*prefills.values(), decode]
    start_all(everything)
    yield prefills, decode
    for server in everything:
        server.stop()


def offer_of(prefill: EngineServer, prompt: list[int]) -> dict[str, object]:
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
def test_a_prefill_offer_replayed_after_either_engine_restarted_is_refused_whatever_the_skew(
    rig: Rig,
    servers: tuple[dict[str, EngineServer], EngineServer],
    skew: str,
) -> None:
    prefills, decode = servers
    prefill = prefills[skew]
    tok: PreTrainedTokenizerBase = tokenizer(MODEL_DIR)
    prompt = tok.encode(user_text(960 if skew == "ahead" else 965, 300))
    recompute = ask_prefill(rig.off.decode, prompt, None)

    offer = offer_of(prefill, prompt)
    honest = read_by_decode(decode, prompt, offer, "verified")
    assert_recompute(honest, recompute, "the honest read, whatever prefill's clock says")

    restart(decode)  # the reader restarts: its spent offers are gone
    replay = read_by_decode(decode, prompt, offer, "unclaimed")
    assert_recompute(replay, recompute, "the offer replayed to a restarted decode")

    fresh = offer_of(prefill, prompt)
    restart(prefill)  # the issuer restarts: the blocks went with it
    replay = read_by_decode(decode, prompt, fresh, "unclaimed")
    assert_recompute(replay, recompute, "an offer of a restarted prefill")
