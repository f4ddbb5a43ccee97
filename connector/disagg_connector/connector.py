"""``DisaggConnector``: vLLM's NIXL pull connector with verified-prefix bidirectional reuse.

Load it with ``--kv-transfer-config '{"kv_connector": "DisaggConnector",
"kv_connector_module_path": "disagg_connector.connector", ...}'``. The facade delegates by
role: the scheduler side is :class:`DisaggConnectorScheduler`, the worker side is vLLM's own
NIXL pull worker (built with a paced progress thread when asked, see :mod:`nixl_pacing`, and
on the compute cores it was given, see :mod:`cpu_affinity`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typing_extensions import override
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlPullConnector
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import (
    NixlPullConnectorWorker,
)

from disagg_connector.cpu_affinity import kept_cpu_affinity
from disagg_connector.nixl_pacing import paced_progress_thread, progress_delay_from_env
from disagg_connector.scheduler import DisaggConnectorScheduler
from disagg_connector.stats import DisaggKVConnectorStats, DisaggPromMetrics

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics,
        KVConnectorStats,
        PromMetric,
        PromMetricT,
    )
    from vllm.v1.kv_cache_interface import KVCacheConfig


class DisaggConnector(NixlPullConnector):
    """NIXL pull connector whose D->P reuse never covers tokens that differ."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig,
    ) -> None:
        # Skip NixlPullConnector.__init__: it would build the stock scheduler/worker.
        super(NixlPullConnector, self).__init__(vllm_config, role, kv_cache_config)
        self.connector_scheduler: DisaggConnectorScheduler | None
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = DisaggConnectorScheduler(
                vllm_config, self.engine_id, kv_cache_config
            )
            self.connector_worker = None
        elif role == KVConnectorRole.WORKER:
            self.connector_scheduler = None
            with (
                kept_cpu_affinity(),
                paced_progress_thread(base_worker.NixlWrapper, progress_delay_from_env()),
            ):
                worker = NixlPullConnectorWorker(vllm_config, self.engine_id, kv_cache_config)
            worker.xfer_stats = DisaggKVConnectorStats()
            self.connector_worker = worker
        else:
            raise ValueError(f"Unsupported KVConnectorRole: {role}")

    @override
    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if isinstance(self.connector_scheduler, DisaggConnectorScheduler):
            return self.connector_scheduler.take_stats()
        stats: KVConnectorStats | None = super().get_kv_connector_stats()
        return stats

    @classmethod
    @override
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats:
        return DisaggKVConnectorStats(data=data) if data is not None else DisaggKVConnectorStats()

    @classmethod
    @override
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics:
        return DisaggPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
