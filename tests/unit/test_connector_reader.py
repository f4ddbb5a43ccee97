"""The reader half of the connector without vLLM: admit, verify, claim off the step, gate.

Claims go to real lease services on 127.0.0.1 (decode's :class:`LeaseService` over a real
:class:`RetentionTable`), and a frozen decode is a socket that accepts and never answers.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from disagg_connector.claims import ClaimDesk
from disagg_connector.lease_service import ClaimTarget, LeaseService, claim
from disagg_connector.offer import MIN_KEY_CHARS, OfferKeys, OfferSigner, model_identity
from disagg_connector.offer_form import Direction
from disagg_connector.prefix_digest import NO_INPUTS, PromptInputs, TokenDigest
from disagg_connector.read_cost import Choice, CostModel, Estimates
from disagg_connector.reader import CLAIM_RECHECK_S, OfferReader, PromptView, ReaderConfig
from disagg_connector.retention import RetentionTable
from disagg_connector.reuse_plan import Verdict
from disagg_contract import (
    CLAIM_HOLD_S,
    EXPIRES_AT_KEY,
    LEASE_KEY,
    OFFER_KEY,
    TOKEN_DIGEST_KEY,
    ReadDecision,
)

BLOCK = 4
KEY = b"k" * MIN_KEY_CHARS
MODEL = model_identity("tiny", BLOCK)
HISTORY = list(range(100, 118))  # decode's retained turn: 4 whole blocks and 2 tokens
D2P, P2D = Direction.DECODE_TO_PREFILL, Direction.PREFILL_TO_DECODE


@dataclass
class Recorder:
    """Collects what the reader counts."""

    verdicts: list[tuple[Direction, Verdict]] = field(default_factory=list)
    reuse: list[tuple[int, int]] = field(default_factory=list)
    decisions: list[Choice] = field(default_factory=list)

    def record_verdict(self, direction: Direction, verdict: Verdict) -> None:
        self.verdicts.append((direction, verdict))

    def record_reuse(self, reused_tokens: int, rejected_tokens: int) -> None:
        self.reuse.append((reused_tokens, rejected_tokens))

    def record_decision(self, choice: Choice) -> None:
        self.decisions.append(choice)

    def record_estimates(self, estimates: Estimates) -> None:
        """Estimates are not checked here."""


@dataclass
class Decode:
    """A decode's retention table served on a real lease port."""

    table: RetentionTable
    service: LeaseService

    def offer(self, request_id: str, held: list[int], **changes: Any) -> dict[str, Any]:
        """Retain ``held`` as ``request_id`` and publish its signed offer."""
        signer = OfferSigner(OfferKeys((KEY,)), MODEL, started_at=0.0)
        now = time.time()
        params: dict[str, Any] = {
            "do_remote_prefill": False,
            "do_remote_decode": True,
            "remote_block_ids": [list(range(-(-len(held) // BLOCK)))],
            "remote_engine_id": "decode-0",
            "remote_request_id": request_id,
            "remote_host": "127.0.0.1",
            "remote_port": 5600,
            "tp_size": 1,
            "remote_num_tokens": len(held),
            TOKEN_DIGEST_KEY: TokenDigest.of_tokens(held, BLOCK).to_wire(),
            EXPIRES_AT_KEY: now + 60,
            LEASE_KEY: {"port": self.service.port, "term_s": 30.0},
        }
        params.update(changes)
        signer.sign(params, now, now + 60)
        self.table.retain(request_id, params[OFFER_KEY]["id"], 5, 60.0)
        return params


@pytest.fixture
def decode() -> Iterator[Decode]:
    table = RetentionTable(30.0, CLAIM_HOLD_S, clock=time.perf_counter)
    service = LeaseService(table, "127.0.0.1", 0, None, lambda path, result: None)
    service.start()
    yield Decode(table, service)
    service.stop()


@pytest.fixture
def frozen_port() -> Iterator[int]:
    """A decode whose lease port accepts connections and never answers (SIGSTOP-like)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


def reader(
    recorder: Recorder,
    *,
    incarnation: str = "prefill-a",
    reads: Direction = D2P,
    costs: CostModel | None = None,
    decision: ReadDecision = ReadDecision.THRESHOLD,
) -> OfferReader:
    config = ReaderConfig(reads, BLOCK, 1, True, incarnation, decision)
    signer = OfferSigner(OfferKeys((KEY,)), MODEL, started_at=0.0)
    desk = ClaimDesk(None, claim, deadline_s=0.3) if reads is D2P else None
    return OfferReader(config, signer, recorder, lambda n: n, desk=desk, costs=costs)


def view(request_id: str, tokens: list[int], inputs: PromptInputs = NO_INPUTS) -> PromptView:
    return PromptView(request_id, tokens, inputs, embeds=False)


def gate_until_answered(
    read: OfferReader, request_id: str, params: dict[str, Any], count: int
) -> tuple[int | None, float]:
    """Ask the gate as vLLM's steps would, until it answers; the answer and the seconds taken."""
    started = time.perf_counter()
    for _ in range(400):
        answer = read.gate(request_id, params, count, 0)
        if answer is not None:
            return answer, time.perf_counter() - started
        time.sleep(0.005)
    return None, time.perf_counter() - started


def test_an_honest_offer_is_verified_claimed_and_read(decode: Decode) -> None:
    recorder = Recorder()
    read = reader(recorder)
    params = decode.offer("turn-1", HISTORY)
    kept = read.arrive(view("turn-2", [*HISTORY, 1, 2, 3]), params)
    assert kept is params and params["remote_num_tokens"] == 16
    answer, _ = gate_until_answered(read, "turn-2", params, 16)
    assert answer == 16
    read.allocated("turn-2", 16, "decode-0")
    assert recorder.verdicts == [(D2P, Verdict.VERIFIED)]
    assert recorder.reuse == [(16, 0)]
    assert decode.table.claim("turn-1", params[OFFER_KEY]["id"], "other").refusal == "claimed"


def test_a_requests_claim_never_blocks_the_gate_of_others(decode: Decode) -> None:
    """The gate answers at once: None while a claim is out, a count for a request without one."""
    read = reader(Recorder())
    params = decode.offer("turn-1", HISTORY)
    read.arrive(view("turn-2", [*HISTORY, 1]), params)
    started = time.perf_counter()
    read.gate("turn-2", params, 16, 0)
    assert read.gate("one-shot", {}, 0, 0) == 0
    assert time.perf_counter() - started < 0.05


def test_a_frozen_decode_costs_only_its_own_requests_each_at_most_the_deadline(
    frozen_port: int, decode: Decode
) -> None:
    recorder = Recorder()
    read = reader(recorder)
    frozen = decode.offer("turn-1", HISTORY, **{LEASE_KEY: {"port": frozen_port, "term_s": 30.0}})
    read.arrive(view("frozen-turn", [*HISTORY, 1]), frozen)
    answer, waited = gate_until_answered(read, "frozen-turn", frozen, 16)
    assert answer == 0 and 0.25 <= waited < 1.0
    assert "remote_block_ids" not in frozen, "a refused claim strips the offer: a recompute"
    # Stalled: one claim probes it, every other one meanwhile is refused without a wait.
    offers = [
        decode.offer(f"turn-1{tag}", HISTORY, **{LEASE_KEY: {"port": frozen_port, "term_s": 30.0}})
        for tag in "bc"
    ]
    read.arrive(view("probe-turn", [*HISTORY, 2]), offers[0])
    read.arrive(view("frozen-turn-2", [*HISTORY, 3]), offers[1])
    answer, waited = gate_until_answered(read, "frozen-turn-2", offers[1], 16)
    assert answer == 0 and waited < 0.05
    assert read.desk is not None and read.desk.stalled() == [f"127.0.0.1:{frozen_port}"]
    assert gate_until_answered(read, "probe-turn", offers[0], 16)[0] == 0
    # A healthy decode's offers still read.
    healthy = decode.offer("turn-9", HISTORY)
    read.arrive(view("healthy-turn", [*HISTORY, 3]), healthy)
    assert gate_until_answered(read, "healthy-turn", healthy, 16)[0] == 16
    read.finished("frozen-turn", aborted=False)
    for request_id in ("frozen-turn-2", "probe-turn"):
        read.finished(request_id, aborted=False)
    assert recorder.verdicts == [(D2P, Verdict.UNCLAIMED)] * 3


def test_a_replay_to_a_restarted_reader_is_refused_by_decodes_claim(decode: Decode) -> None:
    """The restarted prefill is another incarnation, so another claimant: decode, which
    granted the read to the first, refuses it on its own clock; no clock is compared."""
    params = decode.offer("turn-1", HISTORY)
    first = reader(Recorder(), incarnation="prefill-before-restart")
    first.arrive(view("turn-2", [*HISTORY, 1]), dict(params))
    assert gate_until_answered(first, "turn-2", dict(params), 16)[0] == 16
    recorder = Recorder()
    restarted = reader(recorder, incarnation="prefill-after-restart")
    replay = dict(params)
    restarted.arrive(view("turn-2", [*HISTORY, 1]), replay)
    assert gate_until_answered(restarted, "turn-2", replay, 16)[0] == 0
    restarted.finished("turn-2", aborted=False)
    assert recorder.verdicts == [(D2P, Verdict.UNCLAIMED)]


def test_an_offer_of_a_restarted_decode_is_refused(decode: Decode) -> None:
    """A decode restarted since its offer holds no such retention (a new table)."""
    params = decode.offer("turn-1", HISTORY)
    decode.table.release(params["remote_request_id"], params[OFFER_KEY]["id"])
    decode.table.take_due()
    read = reader(Recorder())
    read.arrive(view("turn-2", [*HISTORY, 1]), params)
    assert gate_until_answered(read, "turn-2", params, 16)[0] == 0


def test_a_diverged_history_reads_only_the_verified_prefix(decode: Decode) -> None:
    recorder = Recorder()
    read = reader(recorder)
    params = decode.offer("turn-1", HISTORY)
    read.arrive(view("turn-2", [*HISTORY[:9], 7, *HISTORY[10:], 1]), params)
    assert params["remote_num_tokens"] == 8
    assert gate_until_answered(read, "turn-2", params, 8)[0] == 8
    read.allocated("turn-2", 8, "decode-0")
    assert recorder.verdicts == [(D2P, Verdict.DIVERGED)]
    assert recorder.reuse == [(8, 8)]


def test_another_tenants_salt_verifies_nothing(decode: Decode) -> None:
    """The digest binds the cache salt: KV made under one tenant's salt never verifies for a
    prompt sent under another's, even with the same tokens."""
    recorder = Recorder()
    read = reader(recorder)
    params = decode.offer("turn-1", HISTORY)
    read.arrive(view("turn-2", [*HISTORY, 1], PromptInputs(cache_salt="tenant-b")), params)
    assert params["remote_num_tokens"] == 0
    assert read.gate("turn-2", params, 0, 0) == 0
    read.finished("turn-2", aborted=False)
    assert recorder.verdicts == [(D2P, Verdict.DIVERGED)]


def test_a_prefill_to_decode_offer_of_another_prompt_loads_only_what_matches() -> None:
    """Decode sent prompt B with prefill's signed offer of prompt A's KV."""
    recorder = Recorder()
    read = reader(recorder, reads=P2D)
    prompt_a = list(range(200, 218))
    prompt_b = [*prompt_a[:5], 9, *prompt_a[6:]]
    signer = OfferSigner(OfferKeys((KEY,)), MODEL, started_at=0.0)
    params: dict[str, Any] = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [[0, 1, 2, 3, 4]],
        "remote_engine_id": "prefill-0",
        "remote_request_id": "p-1",
        "remote_host": "127.0.0.1",
        "remote_port": 5600,
        "remote_num_tokens": 18,
        TOKEN_DIGEST_KEY: TokenDigest.of_tokens(prompt_a, BLOCK, with_tail=True).to_wire(),
    }
    now = time.time()
    signer.sign(params, now, now + 30)
    read.arrive(view("d-1", prompt_b), params)
    assert read.gate("d-1", params, 18, 0) == 4
    read.allocated("d-1", 4, "prefill-0")
    assert recorder.verdicts == [(P2D, Verdict.DIVERGED)]


def test_a_read_the_measured_costs_say_is_slower_becomes_a_recompute(decode: Decode) -> None:
    costs = CostModel()
    for tokens in (64, 128, 256, 512):
        costs.record_compute(tokens, 0, tokens * 1e-6)
        costs.record_read(tokens, 1.0 + tokens * 1e-3, "decode-0")
        costs.record_read(tokens, 1.0 + tokens * 1e-3, "decode-0")
    recorder = Recorder()
    read = reader(recorder, costs=costs, decision=ReadDecision.MEASURED)
    params = decode.offer("turn-1", HISTORY)
    read.arrive(view("turn-2", [*HISTORY, 1]), params)
    assert read.gate("turn-2", params, 16, 0) == 0
    assert recorder.decisions == [Choice.RECOMPUTE]
    read.finished("turn-2", aborted=False)
    assert recorder.verdicts == [(D2P, Verdict.RECOMPUTE_CHEAPER)]
    assert decode.table.take_due() == [], "no claim was left holding decode's blocks"


def test_malformed_params_are_refused_without_raising() -> None:
    recorder = Recorder()
    read = reader(recorder)
    assert read.arrive(view("r", [1, 2, 3]), "not an object") is None
    params = {"do_remote_decode": True, "remote_block_ids": "3,4"}
    read.arrive(view("r2", [1, 2, 3]), params)
    assert "remote_block_ids" not in params
    assert recorder.verdicts == [(D2P, Verdict.MALFORMED), (D2P, Verdict.MALFORMED)]


def test_dropping_a_claim_still_out_never_blocks(frozen_port: int) -> None:
    """A request that finishes while its claim is out drops it at once (vLLM's thread)."""
    desk = ClaimDesk(None, claim, deadline_s=0.3, workers=1)
    target = ClaimTarget("127.0.0.1", frozen_port, "turn-1", "o" * 16)
    desk.ask("busy", target, "prefill-a:busy")
    desk.ask("queued", target, "prefill-a:queued")  # waits for the one thread: cancellable
    started = time.perf_counter()
    desk.drop("queued")
    desk.drop("busy")
    assert time.perf_counter() - started < 0.05
    assert desk.answer("queued") == "no claim was sent"
    desk.close()


def test_a_request_queued_past_the_recheck_claims_again_and_sees_a_release(
    decode: Decode,
) -> None:
    """A grant is reused only briefly: a request still queued (no room yet) claims again, so a
    retention the router released meanwhile is not read."""
    recorder = Recorder()
    read = reader(recorder)
    params = decode.offer("turn-1", HISTORY)
    read.arrive(view("turn-2", [*HISTORY, 1]), params)
    assert gate_until_answered(read, "turn-2", params, 16)[0] == 16
    assert read.gate("turn-2", params, 16, 0) == 16, "a fresh grant is reused"
    decode.table.release("turn-1", params[OFFER_KEY]["id"])
    time.sleep(CLAIM_RECHECK_S)
    assert gate_until_answered(read, "turn-2", params, 16)[0] == 0
    read.finished("turn-2", aborted=False)
    assert recorder.verdicts == [(D2P, Verdict.UNCLAIMED)]
