"""The reading side of reuse: admit an offer, verify it against the prompt, claim, then read.

Both roles read KV another engine offers: prefill reads decode's retained blocks back (D->P),
decode reads prefill's blocks of this turn's prompt (P->D). For each request that carries an
offer, :class:`OfferReader` keeps one :class:`ReadState` and takes it through these stages,
each driven by one hook of vLLM's scheduler (the facade in :mod:`scheduler` calls them):

1. ``arrive`` (the request arrives): the offer's shape, signature and single use are checked
   (see :mod:`offer_form`, :mod:`offer`); a refused offer is stripped and the request
   recomputes. An admitted offer is checked against the request's own prompt with the digest
   of the tokens the offered KV holds, and cut to the verified prefix (see :mod:`reuse_plan`).
   The read is claimed on the offering engine's lease service right away, off the scheduling
   thread (see :mod:`claims`): the offering engine alone, on its own clock, says whether it
   still holds the blocks, and grants them to one reader.
2. ``gate`` (vLLM asks how many tokens to load): a D->P read that the measured costs say is
   slower than recomputing becomes a recompute (see :mod:`read_cost`); a read waits for its
   claim's answer (the request stays queued, nothing else waits) and recomputes when the
   claim is refused or unanswered in time; a P->D read loads only its verified prefix.
3. ``allocated`` (blocks allocated, the read starts): the verdict and the tokens read are
   counted; prefill times the read.
4. ``finished``: prefill's compute time is a sample of the compute cost.

Pure logic, no vLLM: the facade hands in plain values (:class:`PromptView`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from disagg_connector.claims import ClaimDesk
from disagg_connector.lease_service import ClaimTarget
from disagg_connector.offer import OfferSigner
from disagg_connector.offer_form import (
    Direction,
    drop_private_keys,
    form_problem,
    pull_direction,
    refuse,
)
from disagg_connector.prefix_digest import PromptInputs
from disagg_connector.read_cost import Choice, CostModel, Decision, Estimates
from disagg_connector.retention import Grant
from disagg_connector.reuse_plan import ReusePlan, Verdict, cut_params, plan_pull, plan_reuse
from disagg_contract import LEASE_KEY, OFFER_KEY, ReadDecision, ReadReport, claim_trust_s

logger = logging.getLogger(f"vllm.{__name__}")

CLAIM_RECHECK_S = 0.5
"""A request still queued this long after its claim was granted claims again before it reads
(off the scheduling thread too), so that a retention decode released meanwhile (the router,
memory pressure) is not read: decode would hold its blocks through the hold, but wants them
back."""


class ReuseRecorder(Protocol):
    """Where the reader counts what it did (the connector's stats)."""

    def record_verdict(self, direction: Direction, verdict: Verdict) -> None: ...

    def record_reuse(self, reused_tokens: int, rejected_tokens: int) -> None: ...

    def record_decision(self, choice: Choice) -> None: ...

    def record_estimates(self, estimates: Estimates) -> None: ...


@dataclass(frozen=True)
class PromptView:
    """What the reader needs of a vLLM request."""

    request_id: str
    token_ids: Sequence[int]
    inputs: PromptInputs
    embeds: bool
    """The prompt comes as embeddings, which no digest covers."""


@dataclass(frozen=True)
class ReaderConfig:
    """How this engine's offers look and how it decides to read."""

    reads: Direction
    """The way this engine reads KV in the flow it serves: what a shapeless offer counts as."""
    block_size: int
    num_groups: int
    exact_block_counts: bool
    """Every group full attention: block lists hold exactly the blocks their tokens fill."""
    incarnation: str
    """This engine's incarnation: claims name it, so a restarted engine is another claimant."""
    read_decision: ReadDecision = ReadDecision.THRESHOLD


@dataclass
class ReadState:
    """Where one request's read stands."""

    direction: Direction
    plan: ReusePlan
    checked: ReusePlan
    """The plan as the digest left it, before a claim or a read decision turned it into a
    recompute: what the router is told of the offer."""
    decision: Decision | None = None
    trust_until: float = 0.0
    """A granted claim may start the read until then (the desk's clock)."""
    granted_at: float = 0.0
    """When the claim last granted was sent (the desk's clock)."""


class OfferReader:
    """Admits, verifies, claims and times the reads of one engine, one state per request."""

    def __init__(
        self,
        config: ReaderConfig,
        signer: OfferSigner,
        recorder: ReuseRecorder,
        pulled_tokens: Callable[[int], int],
        desk: ClaimDesk | None = None,
        costs: CostModel | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``pulled_tokens(n)``: the prompt tokens vLLM pulls P->D for an ``n``-token prompt.

        ``desk`` sends the claims of signed offers (none: every signed offer is refused
        unclaimed; an unsigned P->D offer, ``unchecked``, is read as vLLM reads it);
        ``costs`` are prefill's measured costs (None on decode).
        """
        self.config = config
        self.signer = signer
        self.recorder = recorder
        self.desk = desk
        self.costs = costs
        self._pulled_tokens = pulled_tokens
        self._clock = clock
        self._states: dict[str, ReadState] = {}
        self._computing: dict[str, tuple[float, int, int]] = {}
        """Prefill, per request computing: when first scheduled, its tokens, the tokens before."""
        self._reading: dict[str, tuple[float, int, str]] = {}
        """Prefill, per D->P read in flight: when it started, its tokens, the decode engine."""
        self._failed: set[str] = set()
        """Requests whose read vLLM reported failed (a failed handshake or transfer)."""
        self._reports: dict[str, ReadReport] = {}
        """Prefill, per request whose D->P offer was verified: what became of it, until the
        request finishes and its answer carries it to the router."""

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._states

    # --- 1. arrive ------------------------------------------------------------------------
    def arrive(self, view: PromptView, params: object) -> object:
        """Admit and verify the offer ``params`` of a new request; return the params to keep.

        Params that are not an object become None; a refused offer is rewritten in place so
        that nothing is read (see :func:`offer_form.refuse`).
        """
        if params is None:
            return None
        if not isinstance(params, dict):
            self.recorder.record_verdict(self.config.reads, Verdict.MALFORMED)
            logger.warning(
                "Refused params of %s: not an object (%s)",
                view.request_id,
                type(params).__name__,
            )
            return None
        drop_private_keys(params)
        direction = pull_direction(params)
        if direction is None:
            return params
        problem = form_problem(
            params,
            num_groups=self.config.num_groups,
            block_size=self.config.block_size,
            exact_block_counts=self.config.exact_block_counts,
        )
        if problem is None and direction is Direction.PREFILL_TO_DECODE:
            problem = self._prompt_problem(view, params)
        if problem is not None:
            self._refuse(view.request_id, params, direction, Verdict.MALFORMED, problem)
            return params
        admission = self.signer.admit(params, direction)
        if not admission.admitted:
            assert admission.verdict is not None
            self._refuse(view.request_id, params, direction, admission.verdict, admission.reason)
        elif admission.verdict is Verdict.UNCHECKED:
            self.recorder.record_verdict(direction, admission.verdict)
        else:
            self.verify(view, params, direction)
        return params

    def _prompt_problem(self, view: PromptView, params: dict[str, Any]) -> str | None:
        """Whether a P->D offer covers the prompt decode will pull (vLLM asserts it does)."""
        pulled = self._pulled_tokens(len(view.token_ids))
        if params["remote_num_tokens"] < pulled:
            return (
                f"remote_num_tokens {params['remote_num_tokens']} covers less than the "
                f"{pulled} prompt tokens to pull"
            )
        return None

    def verify(self, view: PromptView, params: dict[str, Any], direction: Direction) -> None:
        """Cut an admitted offer to the prefix of the prompt its digest verifies; claim it."""
        plan_for = plan_reuse if direction is Direction.DECODE_TO_PREFILL else plan_pull
        plan = plan_for(
            params,
            view.token_ids,
            self.config.block_size,
            inputs=view.inputs,
            blocks_cuttable=self.config.exact_block_counts,
        )
        if view.embeds:
            plan = ReusePlan(Verdict.PROMPT_EMBEDS, plan.offered_tokens, plan.usable_tokens, 0)
        cut_params(params, plan, self.config.block_size)
        self._states[view.request_id] = ReadState(direction, plan, plan)
        logger.info(
            "%s offer for %s from engine %s: %s, offered %d tokens, usable %d, verified %d, "
            "rejected %d",
            _arrow(direction),
            view.request_id,
            remote_engine(params),
            plan.verdict.value,
            plan.offered_tokens,
            plan.usable_tokens,
            plan.verified_tokens,
            plan.rejected_tokens,
        )
        if plan.verified_tokens:
            self._send_claim(view.request_id, params)

    def _send_claim(self, request_id: str, params: dict[str, Any]) -> None:
        lease, envelope = params.get(LEASE_KEY), params.get(OFFER_KEY)
        if self.desk is None or lease is None or envelope is None:
            return
        target = ClaimTarget(
            params["remote_host"], lease["port"], params["remote_request_id"], envelope["id"]
        )
        self.desk.ask(request_id, target, f"{self.config.incarnation}:{request_id}")

    # --- 2. gate --------------------------------------------------------------------------
    def gate(
        self, request_id: str, params: dict[str, Any], count: int, num_computed_tokens: int
    ) -> int | None:
        """How many of the ``count`` tokens vLLM would load to load now; None: not yet."""
        state = self._states.get(request_id)
        if state is None or not count:
            return count
        if state.direction is Direction.PREFILL_TO_DECODE:
            verified = max(0, min(count, state.plan.verified_tokens - num_computed_tokens))
            return self._claimed(request_id, state, params, verified) if verified else 0
        if not self._read_pays(request_id, state, params, count, num_computed_tokens):
            return 0
        return self._claimed(request_id, state, params, count)

    def _read_pays(
        self,
        request_id: str,
        state: ReadState,
        params: dict[str, Any],
        count: int,
        num_computed_tokens: int,
    ) -> bool:
        """Prefill, measured read decision: whether reading ``count`` tokens beats computing them.

        Decided once per request (vLLM may ask again while no blocks are free). A decision
        to recompute turns the offer into a recompute, counted as ``recompute-cheaper``.
        """
        if self.costs is None or self.config.read_decision is not ReadDecision.MEASURED:
            return True
        if state.decision is None:
            engine = remote_engine(params)
            state.decision = self.costs.decide(count, num_computed_tokens, engine)
            self.recorder.record_decision(state.decision.choice)
            logger.info(
                "Read decision for %s: %s %d tokens after %d from engine %s (read %s, compute %s)",
                request_id,
                state.decision.choice.value,
                count,
                num_computed_tokens,
                engine,
                _seconds(state.decision.read_s),
                _seconds(state.decision.compute_s),
            )
        if state.decision.choice.reads:
            return True
        plan = state.plan
        state.plan = ReusePlan(
            Verdict.RECOMPUTE_CHEAPER, plan.offered_tokens, plan.usable_tokens, plan.usable_tokens
        )
        self._drop_claim(request_id)
        refuse(params)
        return False

    def _claimed(
        self, request_id: str, state: ReadState, params: dict[str, Any], count: int
    ) -> int | None:
        """The tokens to read once the offering engine granted the claim; None while its
        answer is out.

        A grant is good for CLAIM_RECHECK_S, within its trust window, from when the claim was
        sent; a request still queued past it claims again. A refused or unanswered claim turns
        the offer into a recompute, counted as ``unclaimed``.
        """
        now = self._clock()
        if state.trust_until and now < state.trust_until:
            if now - state.granted_at < CLAIM_RECHECK_S:
                return count
            state.trust_until = 0.0
            self._send_claim(request_id, params)
            return None
        answer = self._claim_answer(request_id, params)
        if answer is None:
            return None
        if isinstance(answer, Grant) and answer.granted:
            sent_at = self.desk.sent_at(request_id) if self.desk is not None else None
            state.granted_at = now if sent_at is None else sent_at
            state.trust_until = state.granted_at + claim_trust_s(answer.hold_s)
            if now < state.trust_until and now - state.granted_at < CLAIM_RECHECK_S:
                return count
            state.trust_until = 0.0
            self._send_claim(request_id, params)
            return None
        reason = answer if isinstance(answer, str) else f"refused: {answer.refusal}"
        plan = state.plan
        state.plan = ReusePlan(Verdict.UNCLAIMED, plan.offered_tokens, plan.usable_tokens, 0)
        self._drop_claim(request_id)
        refuse(params)
        logger.warning(
            "Claim of the %s offer for %s not granted (%s); serving it as a recompute",
            _arrow(state.direction),
            request_id,
            reason,
        )
        return 0

    def _claim_answer(self, request_id: str, params: dict[str, Any]) -> Grant | str | None:
        if params.get(LEASE_KEY) is None or params.get(OFFER_KEY) is None:
            return f"the offer names no lease service ({LEASE_KEY})"
        if self.desk is None:
            return "this engine sends no claims"
        return self.desk.answer(request_id)

    # --- 3. allocated ---------------------------------------------------------------------
    def allocated(self, request_id: str, num_external_tokens: int, engine: str) -> None:
        """vLLM allocated the request's blocks: count the verdict, start timing the read."""
        state = self._states.pop(request_id, None)
        self._drop_claim(request_id)
        if state is None:
            return
        self.recorder.record_verdict(state.direction, state.plan.verdict)
        if state.direction is Direction.PREFILL_TO_DECODE:
            return
        if num_external_tokens and self.costs is not None:
            self._reading[request_id] = (self._clock(), num_external_tokens, engine)
        self._reports[request_id] = _report(state.checked, num_external_tokens)
        self.recorder.record_reuse(num_external_tokens, state.plan.rejected_tokens)
        logger.info(
            "D->P reuse for %s: reading %d tokens from decode, recomputing %d rejected",
            request_id,
            num_external_tokens,
            state.plan.rejected_tokens,
        )

    # --- 4. finished ----------------------------------------------------------------------
    def finished(self, request_id: str, aborted: bool) -> ReadReport | None:
        """The request ended: count an offer never allocated, sample prefill's compute, and
        return what became of its D->P offer (None without one)."""
        self._drop_claim(request_id)
        self._reading.pop(request_id, None)
        self._failed.discard(request_id)
        report = self._reports.pop(request_id, None)
        state = self._states.pop(request_id, None)
        if state is not None:
            self.recorder.record_verdict(state.direction, state.plan.verdict)
            if state.direction is Direction.DECODE_TO_PREFILL:
                report = _report(state.checked, 0)
        started = self._computing.pop(request_id, None)
        if started is not None and self.costs is not None and not aborted:
            at, tokens, start = started
            self.costs.record_compute(tokens, start, self._clock() - at)
            self.recorder.record_estimates(self.costs.estimates())
        return report

    def scheduled(self, new: Iterable[tuple[str, int, int]], preempted: Iterable[str]) -> None:
        """Prefill: start timing each new request's compute (request id, prompt tokens,
        computed tokens); a preempted one is no sample."""
        if self.costs is None:
            return
        now = self._clock()
        for request_id, prompt, computed in new:
            if prompt > computed:
                self._computing[request_id] = (now, prompt - computed, computed)
        for request_id in preempted:
            self._computing.pop(request_id, None)

    def reads_done(self, finished: Iterable[str], failed: Iterable[str]) -> None:
        """A failed read is remembered (the request recomputes, see :meth:`read_failed`) and
        reads nothing in the router's report; on prefill, each D->P read reported done is a
        sample of the read cost."""
        for request_id in failed:
            self._reading.pop(request_id, None)
            self._failed.add(request_id)
            if (report := self._reports.get(request_id)) is not None:
                report["read"] = 0
        if self.costs is None:
            return
        for request_id in finished:
            started = self._reading.pop(request_id, None)
            if started is None:
                continue
            at, tokens, engine = started
            self.costs.record_read(tokens, self._clock() - at, engine)
            self.recorder.record_estimates(self.costs.estimates())

    def read_failed(self, request_id: str, params: object) -> bool:
        """Whether the request's read failed. Its offer is then stripped, so that vLLM, which
        asks again how many tokens to load for the request it now recomputes, loads none: its
        pull scheduler would otherwise offer the D->P read again and wait for a read it never
        starts."""
        if request_id not in self._failed:
            return False
        if isinstance(params, dict):
            refuse(params)
        return True

    def _drop_claim(self, request_id: str) -> None:
        if self.desk is not None:
            self.desk.drop(request_id)

    def _refuse(
        self,
        request_id: str,
        params: dict[str, Any],
        direction: Direction,
        verdict: Verdict,
        reason: str,
    ) -> None:
        refuse(params)
        self.recorder.record_verdict(direction, verdict)
        logger.warning(
            "Refused %s offer for %s: %s (%s); serving it as a recompute",
            direction.value,
            request_id,
            verdict.value,
            reason,
        )


def remote_engine(params: dict[str, Any] | None) -> str:
    """The engine id an offer's ``params`` name: the engine its KV would be read from."""
    return str((params or {}).get("remote_engine_id"))


def _report(checked: ReusePlan, read: int) -> ReadReport:
    """The router's account of an offer the digest ``checked``, of which ``read`` tokens were
    read: only a history that differs from decode's counts as diverged."""
    diverged = checked.rejected_tokens if checked.verdict is Verdict.DIVERGED else 0
    return ReadReport(
        offered=checked.offered_tokens,
        verified=checked.verified_tokens,
        diverged=diverged,
        read=read,
    )


def _arrow(direction: Direction) -> str:
    return "D->P" if direction is Direction.DECODE_TO_PREFILL else "P->D"


def _seconds(value: float | None) -> str:
    return "unmeasured" if value is None else f"{value * 1000:.1f} ms"
