"""The reader half of the connector without vLLM: admit, verify, claim off the step, gate.

Claims go to real lease services on 127.0.0.1 (the issuer's :class:`LeaseService` over a
real :class:`RetentionTable`: decode's retentions for D->P reads, prefill's offers for P->D
reads), and a frozen engine is a socket that accepts and never answers.
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
class Issuer:
    """An engine's table of the blocks it offers, served on a real lease port: decode's
    retentions (D->P, with leases) or prefill's offers of a prompt (P->D, without)."""

    direction: Direction
    table: RetentionTable
    service: LeaseService

    def offer(self, request_id: str, held: list[int], **changes: Any) -> dict[str, Any]:
        """Hold ``held`` as ``request_id`` and publish its signed offer."""
        signer = OfferSigner(OfferKeys((KEY,)), MODEL)
        now = time.time()
        params: dict[str, Any] = {
            "remote_block_ids": [list(range(-(-len(held) // BLOCK)))],
            "remote_request_id": request_id,
            "remote_host": "127.0.0.1",
            "remote_port": 5600,
            "tp_size": 1,
            "remote_num_tokens": len(held),
            LEASE_KEY: {"port": self.service.port, "term_s": self.table.lease_term_s},
        }
        if self.direction is D2P:
            params.update(
                {
                    "do_remote_prefill": False,
                    "do_remote_decode": True,
                    "remote_engine_id": "decode-0",
                    TOKEN_DIGEST_KEY: TokenDigest.of_tokens(held, BLOCK).to_wire(),
                    EXPIRES_AT_KEY: now + 60,
                }
            )
        else:
            params.update(
                {
                    "do_remote_prefill": True,
                    "do_remote_decode": False,
                    "remote_engine_id": "prefill-0",
                    TOKEN_DIGEST_KEY: TokenDigest.of_tokens(held, BLOCK, with_tail=True).to_wire(),
                }
            )
        params.update(changes)
        signer.sign(params, now, now + 60)
        self.table.retain(request_id, params[OFFER_KEY]["id"], 5, 60.0)
        return params


def _serve(direction: Direction, lease_term_s: float | None) -> Iterator[Issuer]:
    table = RetentionTable(lease_term_s, CLAIM_HOLD_S, clock=time.perf_counter)
    service = LeaseService(table, "127.0.0.1", 0, None, lambda path, result: None)
    service.start()
    yield Issuer(direction, table, service)
    service.stop()


@pytest.fixture
def decode() -> Iterator[Issuer]:
    yield from _serve(D2P, 30.0)


@pytest.fixture
def prefill() -> Iterator[Issuer]:
    yield from _serve(P2D, None)


@pytest.fixture(params=[D2P, P2D], ids=["decode-to-prefill", "prefill-to-decode"])
def issuer(request: pytest.FixtureRequest) -> Issuer:
    """Each direction's issuer in turn."""
    name = "decode" if request.param is D2P else "prefill"
    found: Issuer = request.getfixturevalue(name)
    return found


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
    signer = OfferSigner(OfferKeys((KEY,)), MODEL)
    desk = ClaimDesk(None, claim, deadline_s=0.3)
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


def test_an_honest_offer_is_verified_claimed_and_read(decode: Issuer) -> None:
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


def test_a_requests_claim_never_blocks_the_gate_of_others(decode: Issuer) -> None:
    """The gate answers at once: None while a claim is out, a count for a request without one."""
    read = reader(Recorder())
    params = decode.offer("turn-1", HISTORY)
    read.arrive(view("turn-2", [*HISTORY, 1]), params)
    started = time.perf_counter()
    read.gate("turn-2", params, 16, 0)
    assert read.gate("one-shot", {}, 0, 0) == 0
    assert time.perf_counter() - started < 0.05


def test_a_frozen_decode_costs_only_its_own_requests_each_at_most_the_deadline(
    frozen_port: int, decode: Issuer
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


def test_a_replay_to_a_restarted_reader_is_refused_by_the_issuers_claim(issuer: Issuer) -> None:
    """The restarted reader is another incarnation, so another claimant: the issuer, which
    granted the read to the first, refuses it on its own clock; no clock is compared."""
    params = issuer.offer("turn-1", HISTORY)
    prompt = [*HISTORY, 1] if issuer.direction is D2P else HISTORY
    count = 16 if issuer.direction is D2P else len(HISTORY)
    first = reader(Recorder(), incarnation="before-restart", reads=issuer.direction)
    first.arrive(view("turn-2", prompt), dict(params))
    assert gate_until_answered(first, "turn-2", dict(params), count)[0] == count
    recorder = Recorder()
    restarted = reader(recorder, incarnation="after-restart", reads=issuer.direction)
    replay = dict(params)
    restarted.arrive(view("turn-2", prompt), replay)
    assert gate_until_answered(restarted, "turn-2", replay, count)[0] == 0
    restarted.finished("turn-2", aborted=False)
    assert recorder.verdicts == [(issuer.direction, Verdict.UNCLAIMED)]


def test_an_offer_of_a_restarted_issuer_is_refused(issuer: Issuer) -> None:
    """An issuer restarted since its offer holds no such blocks (a new table), and one that
    freed them (read, lapsed, past vLLM's own lease) holds them no more."""
    params = issuer.offer("turn-1", HISTORY)
    issuer.table.forget(params["remote_request_id"])
    prompt = [*HISTORY, 1] if issuer.direction is D2P else HISTORY
    recorder = Recorder()
    read = reader(recorder, reads=issuer.direction)
    read.arrive(view("turn-2", prompt), params)
    assert gate_until_answered(read, "turn-2", params, 16)[0] == 0
    assert "remote_block_ids" not in params, "a refused claim strips the offer: a recompute"
    read.finished("turn-2", aborted=False)
    assert recorder.verdicts == [(issuer.direction, Verdict.UNCLAIMED)]


def test_a_signed_prefill_to_decode_offer_without_a_lease_service_is_a_recompute(
    prefill: Issuer,
) -> None:
    """Nobody could say whether prefill still holds the blocks: decode reads nothing."""
    recorder = Recorder()
    read = reader(recorder, reads=P2D)
    params = prefill.offer("p-1", HISTORY, **{LEASE_KEY: None})
    read.arrive(view("d-1", HISTORY), params)
    assert read.gate("d-1", params, len(HISTORY), 0) == 0
    read.finished("d-1", aborted=False)
    assert recorder.verdicts == [(P2D, Verdict.UNCLAIMED)]


def test_a_diverged_history_reads_only_the_verified_prefix(decode: Issuer) -> None:
    recorder = Recorder()
    read = reader(recorder)
    params = decode.offer("turn-1", HISTORY)
    read.arrive(view("turn-2", [*HISTORY[:9], 7, *HISTORY[10:], 1]), params)
    assert params["remote_num_tokens"] == 8
    assert gate_until_answered(read, "turn-2", params, 8)[0] == 8
    read.allocated("turn-2", 8, "decode-0")
    assert recorder.verdicts == [(D2P, Verdict.DIVERGED)]
    assert recorder.reuse == [(8, 8)]
    report = read.finished("turn-2", aborted=False)
    assert report == {"offered": 18, "verified": 8, "diverged": 8, "read": 8}


def test_the_router_hears_what_became_of_each_offer_once(decode: Issuer, frozen_port: int) -> None:
    """Prefill's answer tells the router the offered, verified, diverged and read tokens: an
    honest offer reads its whole blocks; an unanswered claim reads nothing and is no
    divergence; a request without an offer, or asked twice, has no report."""
    read = reader(Recorder())
    frozen_lease = {LEASE_KEY: {"port": frozen_port, "term_s": 30.0}}
    for request_id, changes, read_tokens in [("honest", {}, 16), ("frozen", frozen_lease, 0)]:
        params = decode.offer(f"{request_id}-turn-1", HISTORY, **changes)
        read.arrive(view(request_id, [*HISTORY, 1]), params)
        assert gate_until_answered(read, request_id, params, 16)[0] == read_tokens
        read.allocated(request_id, read_tokens, "decode-0")
        report = read.finished(request_id, aborted=False)
        assert report == {"offered": 18, "verified": 16, "diverged": 0, "read": read_tokens}
        assert read.finished(request_id, aborted=False) is None
    read.arrive(view("one-shot", HISTORY), None)
    assert read.finished("one-shot", aborted=False) is None


def test_another_tenants_salt_verifies_nothing(decode: Issuer) -> None:
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


def test_a_prefill_to_decode_offer_of_another_prompt_loads_only_what_matches(
    prefill: Issuer,
) -> None:
    """Decode sent prompt B with prefill's signed offer of prompt A's KV."""
    recorder = Recorder()
    read = reader(recorder, reads=P2D)
    prompt_a = list(range(200, 218))
    prompt_b = [*prompt_a[:5], 9, *prompt_a[6:]]
    params = prefill.offer("p-1", prompt_a)
    read.arrive(view("d-1", prompt_b), params)
    assert gate_until_answered(read, "d-1", params, 18)[0] == 4
    read.allocated("d-1", 4, "prefill-0")
    assert recorder.verdicts == [(P2D, Verdict.DIVERGED)]


def test_a_read_the_measured_costs_say_is_slower_becomes_a_recompute(decode: Issuer) -> None:
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
    decode: Issuer,
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


def test_a_failed_read_is_recomputed_and_reads_nothing_in_the_report(decode: Issuer) -> None:
    """A read that failed (a failed handshake or transfer) leaves the request to recompute: asked
    again, the reader strips the offer, so vLLM loads nothing, and the router hears that
    nothing was read; another request's read is untouched."""
    read = reader(Recorder())
    params: dict[str, dict[str, Any]] = {}
    for request_id in ("cut", "whole"):
        params[request_id] = decode.offer(f"{request_id}-turn-1", HISTORY)
        read.arrive(view(request_id, [*HISTORY, 1]), params[request_id])
        assert gate_until_answered(read, request_id, params[request_id], 16)[0] == 16
        read.allocated(request_id, 16, "decode-0")
    assert not read.read_failed("cut", params["cut"])

    read.reads_done(finished=["cut", "whole"], failed=["cut"])

    assert read.read_failed("cut", params["cut"])
    assert params["cut"]["do_remote_prefill"] is False
    assert "remote_block_ids" not in params["cut"]
    assert not read.read_failed("whole", params["whole"])
    assert "remote_block_ids" in params["whole"]
    assert read.finished("cut", aborted=False) == {
        "offered": 18,
        "verified": 16,
        "diverged": 0,
        "read": 0,
    }
    assert read.finished("whole", aborted=False) == {
        "offered": 18,
        "verified": 16,
        "diverged": 0,
        "read": 16,
    }
    assert not read.read_failed("cut", {})
