"""Scheduler side of the connector: verified-prefix D->P reuse on top of vLLM's pull scheduler.

Decode side: when a finished turn's blocks are retained, the published ``kv_transfer_params``
gain the digest of the exact tokens that KV holds and its wall-clock expiry.
Prefill side: before vLLM decides how much to pull, the offer is checked against the new
prompt and cut to the longest verified block-aligned prefix (see :mod:`reuse_plan`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from typing_extensions import override
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import (
    NixlPullConnectorScheduler,
)
from vllm.logger import init_logger

from disagg_connector.idle_wait import EngineInputWaiter
from disagg_connector.prefix_digest import TokenDigest
from disagg_connector.reuse_plan import ReusePlan, cut_params, offers_remote_kv, plan_reuse
from disagg_connector.stats import DisaggKVConnectorStats
from disagg_contract import EXPIRES_AT_KEY, TOKEN_DIGEST_KEY

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

_VERIFIED_FLAG = "_disagg_verified"


class DisaggConnectorScheduler(NixlPullConnectorScheduler):
    """vLLM's NIXL pull scheduler with verified-prefix reuse of decode's retained KV."""

    def __init__(
        self, vllm_config: VllmConfig, engine_id: str, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, engine_id, kv_cache_config)
        self.reuse_stats = DisaggKVConnectorStats()
        self._plans: dict[str, ReusePlan] = {}
        self._live_requests: set[str] = set()
        self._retained_requests: set[str] = set()
        self._idle_waiter = EngineInputWaiter.from_env()
        if self._idle_waiter is not None:
            logger.info(
                "Idle steps holding only retained KV wait up to %.0f ms for input",
                self._idle_waiter.timeout_s * 1000,
            )

    @override
    def on_new_request(self, request: Request) -> None:
        self._live_requests.add(request.request_id)
        super().on_new_request(request)

    @override
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        params = request.kv_transfer_params
        if params is not None and offers_remote_kv(params) and not params.get(_VERIFIED_FLAG):
            self._verify_offer(request, params)
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def _verify_offer(self, request: Request, params: dict[str, Any]) -> None:
        plan = plan_reuse(
            params,
            request.prompt_token_ids or [],
            self.block_size,
            cache_salt=request.cache_salt,
            now_unix=time.time(),
            blocks_cuttable=not self._is_hma_required,
        )
        cut_params(params, plan, self.block_size)
        params[_VERIFIED_FLAG] = True
        self._plans[request.request_id] = plan
        logger.info(
            "D->P offer for %s from engine %s: %s, offered %d tokens, usable %d, verified %d, "
            "rejected %d",
            request.request_id,
            params.get("remote_engine_id"),
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
        plan = self._plans.pop(request.request_id, None)
        if plan is not None:
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
        self._plans.pop(request.request_id, None)
        delay_free, params = super().request_finished(request, block_ids)
        if delay_free:
            self._retained_requests.add(request.request_id)
        if delay_free and params is not None and params.get("do_remote_decode"):
            self._publish_digest(request, params)
        return delay_free, params

    def _publish_digest(self, request: Request, params: dict[str, Any]) -> None:
        held_tokens = request.all_token_ids[: params["remote_num_tokens"]]
        digest = TokenDigest.of_tokens(held_tokens, self.block_size, request.cache_salt)
        params[TOKEN_DIGEST_KEY] = digest.to_wire()
        params[EXPIRES_AT_KEY] = time.time() + float(self.decoder_kv_blocks_ttl)

    @override
    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        super().update_connector_output(connector_output)
        for req_id in connector_output.finished_sending or ():
            self._retained_requests.discard(req_id)

    @override
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        if (
            self._idle_waiter is not None
            and self._retained_requests
            and not self._live_requests
            and not self._reqs_need_recv
            and scheduler_output.total_num_scheduled_tokens == 0
        ):
            self._idle_waiter.wait()
        return super().build_connector_meta(scheduler_output)

    def take_stats(self) -> DisaggKVConnectorStats | None:
        """Hand over the reuse counts gathered since the last call, if any."""
        if self.reuse_stats.is_empty():
            return None
        return self.reuse_stats.clone_and_reset()
