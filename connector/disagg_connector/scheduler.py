"""Scheduler side of the connector: signed offers and verified-prefix D->P reuse on vLLM's pull.

Publishing (``request_finished``): when a finished request's blocks are retained for another
engine to read, decode adds the digest of the exact tokens that KV holds and its wall-clock
expiry, and either role signs the offer (see :mod:`offer`).

Retaining (decode): a finished request's KV is retained only when the router asked for it
(``RETAIN_KEY``, turns of a conversation) and decode can sign the offer; every other request
frees its blocks at once. A retention is a lease (see :mod:`retention`): decode's lease service
(see :mod:`lease_service`) lets the router renew and release it and prefill claim it; memory
pressure (a waiting request asked about again, a preemption) releases the least recently
made ones. Freeing goes through vLLM's own path: the retention's deadline in the worker is
moved to now. Once the engine is shutting down (SIGTERM: its pod is leaving), decode retains
nothing more and releases what it holds, so that vLLM's drain (``--shutdown-timeout``) ends
when the requests in flight do, not when the last lease lapses.

Reading: an offer is admitted when the request arrives (``on_new_request``, the first hook
that sees it, before vLLM's pull scheduler reads any field): its shape is checked (see
:mod:`offer_form`), then its signature, expiry and single use. A refused offer is stripped,
so the request is served as a recompute, and counted by verdict. An admitted D->P offer is
then checked against the prompt and cut to the longest verified block-aligned prefix (see
:mod:`reuse_plan`) when vLLM first asks how much to pull. With the measured read decision,
prefill then reads only when its estimate of the read's time is below its estimate of
computing those tokens (see :mod:`read_cost`; it times its own prefills and reads). A read is
claimed on decode at every scheduling attempt that would make it; a refused claim is a
recompute.
"""

from __future__ import annotations

import collections
import os
import time
from typing import TYPE_CHECKING, Any

from typing_extensions import override
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import (
    NixlPullConnectorScheduler,
)
from vllm.logger import init_logger
from vllm.v1.request import RequestStatus

from disagg_connector.idle_wait import EngineInputWaiter, find_engine_core
from disagg_connector.lease_service import ClaimTarget, LeaseService, claim
from disagg_connector.offer import OfferSigner, load_offer_keys, model_identity
from disagg_connector.offer_form import (
    Direction,
    drop_private_keys,
    form_problem,
    pull_direction,
    refuse,
)
from disagg_connector.prefix_digest import (
    MultimodalItem,
    PromptInputs,
    TokenDigest,
    TokenRangeError,
)
from disagg_connector.read_cost import CostModel, Decision
from disagg_connector.retention import FreeReason, Grant, RetentionTable
from disagg_connector.reuse_plan import ReusePlan, Verdict, cut_params, plan_reuse
from disagg_connector.stats import GRANTED, DisaggKVConnectorStats
from disagg_contract import (
    CLAIM_HOLD_S,
    ENGINE_API_KEY_ENV,
    EXPIRES_AT_KEY,
    EXTRA_LEASE_TERM,
    EXTRA_READ_DECISION,
    KV_ROLE,
    LEASE_CLAIM_PATH,
    LEASE_KEY,
    LEASE_PORT,
    LEASE_PORT_ENV,
    LEASE_RELEASE_PATH,
    MIN_CLAIM_HOLD_S,
    OFFER_KEY,
    RETAIN_KEY,
    TOKEN_DIGEST_KEY,
    ReadDecision,
    Role,
    claim_trust_s,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

# Under vLLM's logger tree, so the lines go through vLLM's handlers and format.
logger = init_logger(f"vllm.{__name__}")

CLAIM_RECHECK_S = 0.5
"""Scheduling attempts within this long of a granted claim reuse it instead of asking decode
again, while inside the grant's trust window (decode holds the blocks far longer)."""


def prompt_inputs(request: Request) -> PromptInputs:
    """The salt, LoRA adapter and multimodal items of ``request``, as the digest binds them."""
    lora = request.lora_request
    adapter = (str(lora.lora_name), str(lora.lora_path)) if lora is not None else None
    items = tuple(
        MultimodalItem(
            int(feature.mm_position.offset),
            int(feature.mm_position.length),
            str(feature.identifier),
        )
        for feature in request.mm_features
    )
    return PromptInputs(request.cache_salt, adapter, items)


def _remote_engine(params: dict[str, Any] | None) -> str:
    """The engine id an offer's ``params`` name: the engine its KV would be read from."""
    return str((params or {}).get("remote_engine_id"))


class DisaggConnectorScheduler(NixlPullConnectorScheduler):
    """vLLM's NIXL pull scheduler with signed offers and verified-prefix reuse of decode's KV."""

    def __init__(
        self, vllm_config: VllmConfig, engine_id: str, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, engine_id, kv_cache_config)
        self.reuse_stats = DisaggKVConnectorStats()
        keys = load_offer_keys(os.environ)
        served_name = str(vllm_config.model_config.served_model_name)
        self.signer = OfferSigner(
            keys, model_identity(served_name, self.block_size), started_at=time.time()
        )
        if keys is None:
            logger.warning(
                "No offer-signing key: offers are published unsigned, decode's retained KV "
                "is never read back (D->P) and prefill's KV is read unchecked (P->D)"
            )
        self._num_transfer_groups = len(kv_cache_config.transfer_groups)
        # The way this engine reads KV in the flow it serves: what a shapeless offer counts as.
        self._reads = (
            Direction.DECODE_TO_PREFILL
            if vllm_config.kv_transfer_config.kv_role == KV_ROLE[Role.PREFILL]
            else Direction.PREFILL_TO_DECODE
        )
        self._admitted: set[str] = set()
        self._plans: dict[str, ReusePlan] = {}
        self._live_requests: set[str] = set()
        self._retained_requests: set[str] = set()
        self._idle_waiter = EngineInputWaiter.from_env()
        self._engine_core = find_engine_core()
        self._released_for_shutdown = False
        if self._idle_waiter is not None:
            logger.info(
                "Idle steps holding only retained KV wait up to %.0f ms for input",
                self._idle_waiter.timeout_s * 1000,
            )
        self._credential = os.environ.get(ENGINE_API_KEY_ENV) or None
        self._claimed: dict[str, tuple[float, float]] = {}
        """Per request: when prefill sent the last granted claim, and when its trust ends."""
        self._claim_answers: collections.deque[str] = collections.deque()
        self.retentions: RetentionTable | None = None
        self._lease_service: LeaseService | None = None
        if (
            self._reads is Direction.PREFILL_TO_DECODE
            and self.is_bidirectional_kv_xfer_enabled
            and keys is not None
        ):
            self._start_lease_service(vllm_config)
        self._asked: dict[str, int] = {}
        self._pressure_blocks = 0
        self._freeing_for_pressure: set[str] = set()
        self._retained_seen = (0, 0)
        self.costs: CostModel | None = None
        if self._reads is Direction.DECODE_TO_PREFILL and self.is_bidirectional_kv_xfer_enabled:
            self.costs = CostModel()
        self._read_decision = ReadDecision(
            vllm_config.kv_transfer_config.get_from_extra_config(
                EXTRA_READ_DECISION, ReadDecision.THRESHOLD
            )
        )
        self._decisions: dict[str, Decision] = {}
        self._computing: dict[str, tuple[float, int, int]] = {}
        """Prefill, per request being computed: when it was first scheduled, the tokens it
        computes and the cached or read tokens they follow."""
        self._reading: dict[str, tuple[float, int, str]] = {}
        """Prefill, per D->P read in flight: when it started, the tokens it reads and from which
        decode engine."""

    def _start_lease_service(self, vllm_config: VllmConfig) -> None:
        """Decode: hold retentions as leases and serve them on the lease port."""
        term = vllm_config.kv_transfer_config.get_from_extra_config(EXTRA_LEASE_TERM, None)
        self.retentions = RetentionTable(
            float(term) if term else None,
            CLAIM_HOLD_S,
            clock=time.perf_counter,
            min_hold_s=MIN_CLAIM_HOLD_S,
        )
        port = int(os.environ.get(LEASE_PORT_ENV, LEASE_PORT))
        port += vllm_config.parallel_config.data_parallel_index
        self._lease_service = LeaseService(
            self.retentions, self.side_channel_host, port, self._credential, self._count_call
        )
        self._lease_service.start()
        logger.info(
            "Lease service on %s:%d; retentions live %s past their last renewal, at most %ss",
            self.side_channel_host,
            port,
            f"{float(term):.0f}s" if term else "until read (no lease term)",
            self.decoder_kv_blocks_ttl,
        )

    def _count_call(self, path: str, result: dict[str, Any]) -> None:
        """Count decode's answer to a claim, and wake an idle wait on a release.

        Called on the lease service's threads.
        """
        if path == LEASE_CLAIM_PATH:
            self._claim_answers.append(GRANTED if result["granted"] else str(result["reason"]))
        elif path == LEASE_RELEASE_PATH and result["released"] and self._idle_waiter is not None:
            self._idle_waiter.wake()

    def _shutting_down(self) -> bool:
        """Whether vLLM's engine core was asked to shut down (it drains, then exits)."""
        is_running = getattr(self._engine_core, "is_running", None)
        return callable(is_running) and not is_running()

    def _release_for_shutdown(self) -> None:
        """Decode, engine shutting down: release every retention (logged once)."""
        assert self.retentions is not None
        if not self._released_for_shutdown:
            self._released_for_shutdown = True
            logger.info(
                "Engine shutting down: releasing the %d retained requests' KV (%d blocks); "
                "their conversations recompute on another decode",
                len(self.retentions),
                self.retentions.held_blocks(),
            )
        self.retentions.release_all(FreeReason.SHUTDOWN)

    @override
    def shutdown(self) -> None:
        if self._lease_service is not None:
            self._lease_service.stop()
        super().shutdown()

    @override
    def on_new_request(self, request: Request) -> None:
        self._live_requests.add(request.request_id)
        self._admit_offer(request)
        super().on_new_request(request)

    def _admit_offer(self, request: Request) -> None:
        """Check the offer ``request`` carries, if any; strip it when it is refused."""
        params = request.kv_transfer_params
        if params is None:
            return
        if not isinstance(params, dict):
            request.kv_transfer_params = None
            self.reuse_stats.record_verdict(self._reads, Verdict.MALFORMED)
            logger.warning(
                "Refused params of %s: not an object (%s)",
                request.request_id,
                type(params).__name__,
            )
            return
        drop_private_keys(params)
        direction = pull_direction(params)
        if direction is None:
            return
        problem = form_problem(
            params,
            num_groups=self._num_transfer_groups,
            block_size=self.block_size,
            exact_block_counts=not self._is_hma_required,
        )
        if problem is None and direction is Direction.PREFILL_TO_DECODE:
            problem = self._prompt_problem(request, params)
        if problem is not None:
            self._refuse(request, params, direction, Verdict.MALFORMED, problem)
            return
        admission = self.signer.admit(params, direction, time.time())
        if admission.verdict is Verdict.EXPIRED and direction is Direction.DECODE_TO_PREFILL:
            # Authentic but past decode's retention: the reuse plan refuses it (no read, no
            # notification) and logs and counts its tokens as every D->P verdict.
            self._admitted.add(request.request_id)
        elif not admission.admitted:
            assert admission.verdict is not None
            self._refuse(request, params, direction, admission.verdict, admission.reason)
        elif admission.verdict is not None:
            self.reuse_stats.record_verdict(direction, admission.verdict)
        else:
            self._admitted.add(request.request_id)

    def _prompt_problem(self, request: Request, params: dict[str, Any]) -> str | None:
        """Whether a P->D offer covers the prompt decode will pull (vLLM asserts it does)."""
        pulled = self._get_remote_prefill_token_count(request.num_prompt_tokens)
        if params["remote_num_tokens"] < pulled:
            return (
                f"remote_num_tokens {params['remote_num_tokens']} covers less than the "
                f"{pulled} prompt tokens to pull"
            )
        return None

    def _refuse(
        self,
        request: Request,
        params: dict[str, Any],
        direction: Direction,
        verdict: Verdict,
        reason: str,
    ) -> None:
        refuse(params)
        self.reuse_stats.record_verdict(direction, verdict)
        logger.warning(
            "Refused %s offer for %s: %s (%s); serving it as a recompute",
            direction.value,
            request.request_id,
            verdict.value,
            reason,
        )

    @override
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        if self.retentions is not None:
            self._note_ask(request, num_computed_tokens)
        if request.request_id in self._admitted:
            self._admitted.discard(request.request_id)
            params = request.kv_transfer_params
            assert params is not None
            self._verify_offer(request, params)
        count, load_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
        reads = bool(count) and request.request_id in self._plans
        if reads and not (
            self._read_pays(request, count, num_computed_tokens) and self._claim(request)
        ):
            return 0, False
        return count, load_async

    def _read_pays(self, request: Request, count: int, num_computed_tokens: int) -> bool:
        """Prefill, measured read decision: whether reading ``count`` tokens beats computing them.

        Decided once per request (vLLM may ask again while no blocks are free). A decision
        to recompute turns the offer into a recompute, counted as ``recompute-cheaper``.
        """
        if self.costs is None or self._read_decision is not ReadDecision.MEASURED:
            return True
        decision = self._decisions.get(request.request_id)
        if decision is None:
            engine = _remote_engine(request.kv_transfer_params)
            decision = self.costs.decide(count, num_computed_tokens, engine)
            self._decisions[request.request_id] = decision
            self.reuse_stats.record_decision(decision.choice)
            logger.info(
                "Read decision for %s: %s %d tokens after %d from engine %s (read %s, compute %s)",
                request.request_id,
                decision.choice.value,
                count,
                num_computed_tokens,
                engine,
                _seconds(decision.read_s),
                _seconds(decision.compute_s),
            )
        if decision.choice.reads:
            return True
        params = request.kv_transfer_params
        assert params is not None
        plan = self._plans[request.request_id]
        self._plans[request.request_id] = ReusePlan(
            Verdict.RECOMPUTE_CHEAPER, plan.offered_tokens, plan.usable_tokens, plan.usable_tokens
        )
        refuse(params)
        return False

    def _note_ask(self, request: Request, num_computed_tokens: int) -> None:
        """Decode: a request asked about again found no room; retained KV makes way for it."""
        asks = self._asked.get(request.request_id, 0) + 1
        self._asked[request.request_id] = asks
        if asks > 1:
            missing = request.num_tokens - num_computed_tokens
            self._pressure_blocks = max(self._pressure_blocks, -(-missing // self.block_size))

    def _claim(self, request: Request) -> bool:
        """Prefill: whether decode still grants this request the read of its retained KV.

        Asked at every scheduling attempt that would read; an answer from within
        CLAIM_RECHECK_S is reused. A refused (or unanswered) claim turns the offer into a
        recompute, counted as ``unclaimed``.
        """
        params = request.kv_transfer_params
        assert params is not None
        now = time.perf_counter()
        claimed = self._claimed.get(request.request_id)
        if claimed is not None and now - claimed[0] < CLAIM_RECHECK_S and now < claimed[1]:
            return True
        lease, envelope = params.get(LEASE_KEY), params.get(OFFER_KEY)
        if lease is None or envelope is None:
            answer: Grant | str = f"the offer names no lease service ({LEASE_KEY})"
        else:
            target = ClaimTarget(
                params["remote_host"], lease["port"], params["remote_request_id"], envelope["id"]
            )
            answer = claim(target, f"{self.engine_id}:{request.request_id}", self._credential)
        if isinstance(answer, Grant) and answer.granted:
            self._claimed[request.request_id] = (now, now + claim_trust_s(answer.hold_s))
            return True
        reason = answer if isinstance(answer, str) else f"decode refused: {answer.refusal}"
        plan = self._plans[request.request_id]
        self._plans[request.request_id] = ReusePlan(
            Verdict.UNCLAIMED, plan.offered_tokens, plan.usable_tokens, 0
        )
        self._claimed.pop(request.request_id, None)
        refuse(params)
        logger.warning(
            "Claim of the D->P offer for %s refused (%s); serving it as a recompute",
            request.request_id,
            reason,
        )
        return False

    def _verify_offer(self, request: Request, params: dict[str, Any]) -> None:
        """Cut an admitted D->P offer to the prefix of the prompt decode's digest verifies."""
        plan = plan_reuse(
            params,
            request.prompt_token_ids or [],
            self.block_size,
            inputs=prompt_inputs(request),
            now_unix=time.time(),
            blocks_cuttable=not self._is_hma_required,
        )
        if request.prompt_embeds is not None:
            plan = ReusePlan(Verdict.PROMPT_EMBEDS, plan.offered_tokens, plan.usable_tokens, 0)
        cut_params(params, plan, self.block_size)
        self._plans[request.request_id] = plan
        logger.info(
            "D->P offer for %s from engine %s: %s, offered %d tokens, usable %d, verified %d, "
            "rejected %d",
            request.request_id,
            _remote_engine(params),
            plan.verdict.value,
            plan.offered_tokens,
            plan.usable_tokens,
            plan.verified_tokens,
            plan.rejected_tokens,
        )

    @override
    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self._asked.pop(request.request_id, None)
        self._claimed.pop(request.request_id, None)
        self._decisions.pop(request.request_id, None)
        plan = self._plans.pop(request.request_id, None)
        if plan is not None and num_external_tokens and self.costs is not None:
            self._reading[request.request_id] = (
                time.perf_counter(),
                num_external_tokens,
                _remote_engine(request.kv_transfer_params),
            )
        if plan is not None:
            self.reuse_stats.record_verdict(Direction.DECODE_TO_PREFILL, plan.verdict)
            self.reuse_stats.record_reuse(num_external_tokens, plan.rejected_tokens)
            logger.info(
                "D->P reuse for %s: reading %d tokens from decode, recomputing %d rejected",
                request.request_id,
                num_external_tokens,
                plan.rejected_tokens,
            )
        super().update_state_after_alloc(request, blocks, num_external_tokens)

    @override
    def request_finished(
        self, request: Request, block_ids: Any
    ) -> tuple[bool, dict[str, Any] | None]:
        self._live_requests.discard(request.request_id)
        self._admitted.discard(request.request_id)
        self._asked.pop(request.request_id, None)
        self._claimed.pop(request.request_id, None)
        self._decisions.pop(request.request_id, None)
        self._reading.pop(request.request_id, None)
        self._note_compute(request)
        plan = self._plans.pop(request.request_id, None)
        if plan is not None:
            self.reuse_stats.record_verdict(Direction.DECODE_TO_PREFILL, plan.verdict)
        asked = request.kv_transfer_params
        delay_free, params = super().request_finished(request, block_ids)
        keep = (
            self.retentions is not None
            and isinstance(asked, dict)
            and asked.get(RETAIN_KEY)
            and not self._shutting_down()
        )
        if delay_free and params is not None and params.get("do_remote_decode") and not keep:
            # Nobody will read it back: free the blocks now, as with bidirectional off.
            self._reqs_need_send.pop(request.request_id, None)
            self._reqs_not_processed.add(request.request_id)
            return False, None
        if delay_free:
            self._retained_requests.add(request.request_id)
        if delay_free and params is not None:
            self._publish(request, params)
            if self.retentions is not None and params.get("do_remote_decode"):
                self.retentions.retain(
                    request.request_id,
                    params[OFFER_KEY]["id"],
                    sum(len(group) for group in params["remote_block_ids"]),
                    float(self.decoder_kv_blocks_ttl),
                )
        return delay_free, params

    def _publish(self, request: Request, params: dict[str, Any]) -> None:
        """Sign the offer of retained blocks; decode's also gets the digest and expiry."""
        now = time.time()
        if not params.get("do_remote_decode"):
            self.signer.sign(params, now, now + float(self._kv_lease_duration))
            return
        expires_at = now + float(self.decoder_kv_blocks_ttl)
        params[EXPIRES_AT_KEY] = expires_at
        if self._lease_service is not None and self.retentions is not None:
            params[LEASE_KEY] = {
                "port": self._lease_service.port,
                "term_s": self.retentions.lease_term_s,
            }
        if request.prompt_embeds is None:
            self._publish_digest(request, params)
        self.signer.sign(params, now, expires_at)

    def _publish_digest(self, request: Request, params: dict[str, Any]) -> None:
        """Digest exactly the tokens decode's retained KV holds: ``remote_num_tokens`` of them."""
        held_tokens = request.all_token_ids[: params["remote_num_tokens"]]
        try:
            digest = TokenDigest.of_tokens(held_tokens, self.block_size, prompt_inputs(request))
        except TokenRangeError as exc:
            logger.warning("No digest for %s: %s", request.request_id, exc)
            return
        params[TOKEN_DIGEST_KEY] = digest.to_wire()

    def _note_compute(self, request: Request) -> None:
        """Prefill: a finished request's compute time is a sample of the compute cost."""
        started = self._computing.pop(request.request_id, None)
        if (
            started is None
            or self.costs is None
            or request.status is RequestStatus.FINISHED_ABORTED
        ):
            return
        at, tokens, start = started
        self.costs.record_compute(tokens, start, time.perf_counter() - at)
        self._record_estimates()

    def _note_reads(self, connector_output: KVConnectorOutput) -> None:
        """Prefill: each D->P read reported done is a sample of the read cost."""
        assert self.costs is not None
        for req_id in connector_output.failed_recving:
            self._reading.pop(req_id, None)
        for req_id in connector_output.finished_recving or ():
            started = self._reading.pop(req_id, None)
            if started is None:
                continue
            at, tokens, engine = started
            self.costs.record_read(tokens, time.perf_counter() - at, engine)
            self._record_estimates()

    def _record_estimates(self) -> None:
        assert self.costs is not None
        self.reuse_stats.record_estimates(self.costs.estimates())

    @override
    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        super().update_connector_output(connector_output)
        if self.costs is not None:
            self._note_reads(connector_output)
        for req_id in connector_output.finished_sending or ():
            self._retained_requests.discard(req_id)
            self._freeing_for_pressure.discard(req_id)
            if self.retentions is not None and (reason := self.retentions.forget(req_id)):
                self.reuse_stats.record_free(reason)

    @override
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        if self.costs is not None:
            self._note_scheduled(scheduler_output)
        # Wait first, then free: what comes due during the wait reaches the worker this step.
        # A shutdown waits for nothing: it releases everything and steps until vLLM may exit.
        shutting_down = self.retentions is not None and self._shutting_down()
        if shutting_down:
            self._release_for_shutdown()
        if (
            self._idle_waiter is not None
            and not shutting_down
            and self._retained_requests
            and not self._live_requests
            and not self._reqs_need_recv
            and not self._reqs_need_send
            and scheduler_output.total_num_scheduled_tokens == 0
        ):
            self._idle_waiter.wait(
                self.retentions.seconds_until_due() if self.retentions is not None else None
            )
        if self.retentions is not None:
            self._free_due(scheduler_output)
        return super().build_connector_meta(scheduler_output)

    def _note_scheduled(self, scheduler_output: SchedulerOutput) -> None:
        """Prefill: start timing each request's compute; a preempted one is no sample."""
        now = time.perf_counter()
        for new in scheduler_output.scheduled_new_reqs:
            prompt = len(new.prompt_token_ids or ())
            if prompt > new.num_computed_tokens:
                computed = new.num_computed_tokens
                self._computing[new.req_id] = (now, prompt - computed, computed)
        for req_id in scheduler_output.preempted_req_ids or ():
            self._computing.pop(req_id, None)

    def _free_due(self, scheduler_output: SchedulerOutput) -> None:
        """Decode: free the retentions that are due, making room first if live requests wait.

        A retention is freed through vLLM's worker: its deadline moves to now, and the worker
        reports it sent, so the scheduler frees its blocks as after a read.
        """
        assert self.retentions is not None
        if scheduler_output.preempted_req_ids:
            self._pressure_blocks = max(self._pressure_blocks, 1)
        if self._pressure_blocks and not self._freeing_for_pressure:
            self.retentions.release_for_pressure(self._pressure_blocks)
        self._pressure_blocks = 0
        now = time.perf_counter()
        for req_id, reason in self.retentions.take_due():
            self._reqs_need_send[req_id] = now
            self.reuse_stats.record_free(reason)
            if reason is FreeReason.PRESSURE:
                self._freeing_for_pressure.add(req_id)

    def take_stats(self) -> DisaggKVConnectorStats | None:
        """Hand over the reuse and verdict counts gathered since the last call, if any."""
        while self._claim_answers:
            self.reuse_stats.record_claim(self._claim_answers.popleft())
        if self.retentions is not None:
            retained = (len(self.retentions), self.retentions.held_blocks())
            if retained != self._retained_seen:
                self._retained_seen = retained
                self.reuse_stats.record_retained(*retained)
        if self.reuse_stats.is_empty():
            return None
        return self.reuse_stats.clone_and_reset()


def _seconds(value: float | None) -> str:
    return "unmeasured" if value is None else f"{value * 1000:.1f} ms"
