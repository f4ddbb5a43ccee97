"""Scheduler side of the connector: a thin facade over vLLM's NIXL pull scheduler.

Each vLLM scheduler hook goes to one of two halves, both free of vLLM:

* the reader (:mod:`reader`), on both roles: admits the offers a request carries (shape,
  signature, single use), verifies them against the request's own prompt with the digest of
  the tokens the offered KV holds, claims the read on the issuer's lease service off the
  scheduling thread, and gates the load on the claim's answer and prefill's measured costs;
* the retainer (:mod:`retainer`), on decode: keeps finished turns' KV as leases served on the
  lease port and frees them when released, lapsed, needed by live requests or at shutdown.
  Prefill keeps its signed offers to decode in one too, served for decode's claims only.

What stays here is what touches vLLM: turning a request into plain values, publishing the
offers this engine makes (the digest of the tokens its KV holds, the lease service, decode's
expiry, the signature, see :mod:`offer`), moving a due retention onto vLLM's freeing path,
and letting an idle engine that only holds retained KV wait for input (see :mod:`idle_wait`).
"""

from __future__ import annotations

import os
import secrets
import time
from typing import TYPE_CHECKING, Any

from typing_extensions import override
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import (
    NixlPullConnectorScheduler,
)
from vllm.logger import init_logger
from vllm.v1.request import RequestStatus

from disagg_connector.claims import ClaimDesk
from disagg_connector.idle_wait import EngineInputWaiter, find_engine_core
from disagg_connector.lease_service import claim
from disagg_connector.offer import OfferSigner, load_offer_keys, model_identity
from disagg_connector.offer_form import Direction
from disagg_connector.prefix_digest import (
    MultimodalItem,
    PromptInputs,
    TokenDigest,
    TokenRangeError,
)
from disagg_connector.read_cost import CostModel
from disagg_connector.reader import OfferReader, PromptView, ReaderConfig, remote_engine
from disagg_connector.retainer import Retainer
from disagg_connector.retention import RetentionTable
from disagg_connector.stats import DisaggKVConnectorStats
from disagg_contract import (
    CLAIM_HOLD_S,
    ENGINE_API_KEY_ENV,
    EXPIRES_AT_KEY,
    EXTRA_LEASE_TERM,
    EXTRA_READ_DECISION,
    KV_ROLE,
    LEASE_KEY,
    LEASE_PORT,
    LEASE_PORT_ENV,
    MIN_CLAIM_HOLD_S,
    OFFER_KEY,
    READ_REPORT_KEY,
    RETAIN_KEY,
    TOKEN_DIGEST_KEY,
    ReadDecision,
    Role,
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

HOLD_WARNING_S = 0.1
"""A hook that keeps vLLM's scheduling thread longer than this is logged: no hook may wait on
the network (claims go off the thread), so such a line means a bug or a starved machine."""
HOLD_WARNING = "Connector held vLLM's scheduling thread for %.0f ms in %s of %s"


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


def prompt_view(request: Request) -> PromptView:
    """What the reader needs of ``request``."""
    return PromptView(
        request.request_id,
        request.prompt_token_ids or [],
        prompt_inputs(request),
        request.prompt_embeds is not None,
    )


class DisaggConnectorScheduler(NixlPullConnectorScheduler):
    """vLLM's NIXL pull scheduler with signed, verified, claimed reuse of another engine's KV."""

    def __init__(
        self, vllm_config: VllmConfig, engine_id: str, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, engine_id, kv_cache_config)
        self.reuse_stats = DisaggKVConnectorStats()
        keys = load_offer_keys(os.environ)
        served_name = str(vllm_config.model_config.served_model_name)
        self.signer = OfferSigner(keys, model_identity(served_name, self.block_size))
        if keys is None:
            logger.warning(
                "No offer-signing key: offers are published unsigned, decode's retained KV "
                "is never read back (D->P) and prefill's KV is read unchecked (P->D)"
            )
        transfer = vllm_config.kv_transfer_config
        reads = (
            Direction.DECODE_TO_PREFILL
            if transfer.kv_role == KV_ROLE[Role.PREFILL]
            else Direction.PREFILL_TO_DECODE
        )
        credential = os.environ.get(ENGINE_API_KEY_ENV) or None
        self._idle_waiter = EngineInputWaiter.from_env()
        self._engine_core = find_engine_core()
        if self._idle_waiter is not None:
            logger.info(
                "Idle steps holding only retained KV wait up to %.0f ms for input",
                self._idle_waiter.timeout_s * 1000,
            )
        self.retainer: Retainer | None = None
        """Decode's retentions for D->P reads (bidirectional, signed offers)."""
        self.offered: Retainer | None = None
        """Prefill's KV offered to decode (signed offers): claimed by decode before it reads."""
        if keys is not None and reads is Direction.DECODE_TO_PREFILL:
            self.offered = self._start_offered(vllm_config, credential)
        if (
            reads is Direction.PREFILL_TO_DECODE
            and self.is_bidirectional_kv_xfer_enabled
            and keys is not None
        ):
            self.retainer = self._start_retainer(vllm_config, credential)
        prefill_reads_back = reads is Direction.DECODE_TO_PREFILL and (
            self.is_bidirectional_kv_xfer_enabled
        )
        claims = prefill_reads_back or (reads is Direction.PREFILL_TO_DECODE and keys is not None)
        config = ReaderConfig(
            reads,
            self.block_size,
            len(kv_cache_config.transfer_groups),
            exact_block_counts=not self._is_hma_required,
            incarnation=secrets.token_hex(8),
            read_decision=ReadDecision(
                transfer.get_from_extra_config(EXTRA_READ_DECISION, ReadDecision.THRESHOLD)
            ),
        )
        self.reader = OfferReader(
            config,
            self.signer,
            self.reuse_stats,
            self._get_remote_prefill_token_count,
            desk=ClaimDesk(credential, claim) if claims else None,
            costs=CostModel() if prefill_reads_back else None,
        )
        self._live_requests: set[str] = set()
        self._retained_requests: set[str] = set()

    def _start_retainer(self, vllm_config: VllmConfig, credential: str | None) -> Retainer:
        """Decode: hold retentions as leases and serve them on the lease port."""
        term = vllm_config.kv_transfer_config.get_from_extra_config(EXTRA_LEASE_TERM, None)
        table = _claimed_table(float(term) if term else None)
        waiter = self._idle_waiter
        retainer = Retainer(table, self.block_size, waiter.wake if waiter is not None else None)
        port = self._serve_leases(retainer, vllm_config, credential)
        logger.info(
            "Lease service on %s:%d; retentions live %s past their last renewal, at most %ss",
            self.side_channel_host,
            port,
            f"{float(term):.0f}s" if term else "until read (no lease term)",
            self.decoder_kv_blocks_ttl,
        )
        return retainer

    def _start_offered(self, vllm_config: VllmConfig, credential: str | None) -> Retainer:
        """Prefill: hold each signed P->D offer until decode read it or vLLM's own lease on
        the blocks (``kv_lease_duration``, counted from when the request finished) ends, and
        serve decode's claims on the lease port: decode reads only what prefill, on its own
        clock, says it still holds, and only once."""
        offered = Retainer(_claimed_table(None), self.block_size)
        port = self._serve_leases(offered, vllm_config, credential)
        logger.info("Lease service on %s:%d for decode's claims", self.side_channel_host, port)
        return offered

    def _serve_leases(
        self, holder: Retainer, vllm_config: VllmConfig, credential: str | None
    ) -> int:
        """Start ``holder``'s lease service on this engine's lease port (0: any free port);
        return the port it listens on."""
        port = int(os.environ.get(LEASE_PORT_ENV, LEASE_PORT))
        if port:
            port += vllm_config.parallel_config.data_parallel_index
        holder.serve(self.side_channel_host, port, credential)
        return int(holder.lease_key()["port"])

    def _shutting_down(self) -> bool:
        """Whether vLLM's engine core was asked to shut down (it drains, then exits)."""
        is_running = getattr(self._engine_core, "is_running", None)
        return callable(is_running) and not is_running()

    @override
    def shutdown(self) -> None:
        for holder in (self.retainer, self.offered):
            if holder is not None:
                holder.stop()
        if self.reader.desk is not None:
            self.reader.desk.close()
        super().shutdown()

    @override
    def on_new_request(self, request: Request) -> None:
        started = time.perf_counter()
        self._live_requests.add(request.request_id)
        request.kv_transfer_params = self.reader.arrive(
            prompt_view(request), request.kv_transfer_params
        )
        super().on_new_request(request)
        _note_hold(started, "on_new_request", request.request_id)

    @override
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """vLLM's count of tokens to load, gated by the reader: None while a claim is out."""
        started = time.perf_counter()
        try:
            return self._matched_tokens(request, num_computed_tokens)
        finally:
            _note_hold(started, "get_num_new_matched_tokens", request.request_id)

    def _matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        params = request.kv_transfer_params
        if self.reader.read_failed(request.request_id, params):
            count, load_async = 0, False
        else:
            count, load_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
        if request.request_id in self.reader and isinstance(params, dict):
            gated = self.reader.gate(request.request_id, params, count, num_computed_tokens)
            if gated is None:
                # Waiting for its claim's answer: vLLM will ask again, which is no sign that
                # the request found no room, so the retainer does not hear of it.
                return None, False
            count, load_async = gated, load_async and gated > 0
        if self.retainer is not None:
            self.retainer.asked(request.request_id, request.num_tokens, num_computed_tokens)
        return count, load_async

    @override
    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        if self.retainer is not None:
            self.retainer.allocated(request.request_id)
        params = request.kv_transfer_params
        engine = remote_engine(params)
        self.reader.allocated(request.request_id, num_external_tokens, engine)
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        if self.retainer is not None and isinstance(params, dict) and params.get(RETAIN_KEY):
            # vLLM hands its worker a decode turn to track for sending only while the turn
            # reads prefill's KV; one whose offer was refused (a recompute) is retained all
            # the same, and a worker not tracking it would never free its blocks.
            self._reqs_in_batch.add(request.request_id)

    @override
    def request_finished(
        self, request: Request, block_ids: Any
    ) -> tuple[bool, dict[str, Any] | None]:
        self._live_requests.discard(request.request_id)
        aborted = request.status is RequestStatus.FINISHED_ABORTED
        report = self.reader.finished(request.request_id, aborted)
        asked = request.kv_transfer_params
        delay_free, params = super().request_finished(request, block_ids)
        keep = (
            self.retainer is not None
            and isinstance(asked, dict)
            and bool(asked.get(RETAIN_KEY))
            and not self._shutting_down()
        )
        if delay_free and params is not None and params.get("do_remote_decode") and not keep:
            # Nobody will read it back: free the blocks now, as with bidirectional off.
            self._reqs_need_send.pop(request.request_id, None)
            self._reqs_not_processed.add(request.request_id)
            if self.retainer is not None:
                self.retainer.finished(request.request_id)
            return False, None
        if delay_free:
            self._retained_requests.add(request.request_id)
        if delay_free and params is not None:
            self._publish(request, params)
            if self.offered is not None and OFFER_KEY in params:
                self.offered.retain(
                    request.request_id,
                    params[OFFER_KEY]["id"],
                    sum(len(group) for group in params["remote_block_ids"]),
                    float(self._kv_lease_duration),
                )
            if self.retainer is not None and params.get("do_remote_decode"):
                self.retainer.retain(
                    request.request_id,
                    params[OFFER_KEY]["id"],
                    sum(len(group) for group in params["remote_block_ids"]),
                    float(self.decoder_kv_blocks_ttl),
                )
        elif self.retainer is not None:
            self.retainer.finished(request.request_id)
        if report is not None and params is not None:
            params[READ_REPORT_KEY] = dict(report)
        return delay_free, params

    def _publish(self, request: Request, params: dict[str, Any]) -> None:
        """Sign the offer of retained blocks with the digest of the tokens they hold and the
        lease service that answers its claims; decode's also gets its expiry."""
        now = time.time()
        if not params.get("do_remote_decode"):
            if self.offered is not None:
                params[LEASE_KEY] = self.offered.lease_key()
            self._publish_digest(request, params, whole_prompt=True)
            self.signer.sign(params, now, now + float(self._kv_lease_duration))
            return
        expires_at = now + float(self.decoder_kv_blocks_ttl)
        params[EXPIRES_AT_KEY] = expires_at
        if self.retainer is not None:
            params[LEASE_KEY] = self.retainer.lease_key()
        self._publish_digest(request, params, whole_prompt=False)
        self.signer.sign(params, now, expires_at)

    def _publish_digest(
        self, request: Request, params: dict[str, Any], *, whole_prompt: bool
    ) -> None:
        """Digest exactly the tokens the offered KV holds: ``remote_num_tokens`` of them.

        Prefill's offer of a whole prompt to decode also covers the last partial block.
        """
        if request.prompt_embeds is not None:
            return
        held_tokens = request.all_token_ids[: params["remote_num_tokens"]]
        try:
            digest = TokenDigest.of_tokens(
                held_tokens, self.block_size, prompt_inputs(request), with_tail=whole_prompt
            )
        except TokenRangeError as exc:
            logger.warning("No digest for %s: %s", request.request_id, exc)
            return
        params[TOKEN_DIGEST_KEY] = digest.to_wire()

    @override
    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        super().update_connector_output(connector_output)
        self.reader.reads_done(
            connector_output.finished_recving or (), connector_output.failed_recving
        )
        sent = connector_output.finished_sending or ()
        self._retained_requests.difference_update(sent)
        if self.retainer is not None:
            self.retainer.freed(sent, self.reuse_stats)
        if self.offered is not None:
            self.offered.forget(sent)

    @override
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        self.reader.scheduled(
            (
                (new.req_id, len(new.prompt_token_ids or ()), new.num_computed_tokens)
                for new in scheduler_output.scheduled_new_reqs
            ),
            scheduler_output.preempted_req_ids or (),
        )
        # Wait first, then free: what comes due during the wait reaches the worker this step.
        # A shutdown waits for nothing: it releases everything and steps until vLLM may exit.
        shutting_down = self.retainer is not None and self._shutting_down()
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
                self.retainer.table.seconds_until_due() if self.retainer is not None else None
            )
        if self.retainer is not None:
            now = time.perf_counter()
            preempted = bool(scheduler_output.preempted_req_ids)
            for request_id in self.retainer.due(preempted, shutting_down, self.reuse_stats):
                self._reqs_need_send[request_id] = now
        return super().build_connector_meta(scheduler_output)

    def take_stats(self) -> DisaggKVConnectorStats | None:
        """Hand over the reuse and verdict counts gathered since the last call, if any."""
        if self.retainer is not None:
            self.retainer.report(self.reuse_stats)
        if self.offered is not None:
            self.offered.report_service(self.reuse_stats)
        if self.reuse_stats.is_empty():
            return None
        return self.reuse_stats.clone_and_reset()


def _claimed_table(lease_term_s: float | None) -> RetentionTable:
    """A table of blocks held for readers, granting claims the contract's holds (this
    process's ``perf_counter``: the clock vLLM's worker frees blocks by)."""
    return RetentionTable(
        lease_term_s, CLAIM_HOLD_S, clock=time.perf_counter, min_hold_s=MIN_CLAIM_HOLD_S
    )


def _note_hold(started: float, hook: str, request_id: str) -> None:
    """Log a hook that kept the scheduling thread past HOLD_WARNING_S."""
    held = time.perf_counter() - started
    if held > HOLD_WARNING_S:
        logger.warning(HOLD_WARNING, held * 1000, hook, request_id)
