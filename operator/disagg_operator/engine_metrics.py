"""The vLLM series the operator's autoscalers, the shipped dashboard and its alerts read, and
how each autoscaling signal becomes a custom metric (engine hpa) or a Prometheus query (keda).

vLLM 0.32 registers these series: the engine's in `vllm/v1/metrics/loggers.py`, NIXL's in
`vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py`. They are listed here once, because
neither the operator nor the unit tests import vLLM. The connector's own series
(`vllm:disagg_kv_*`) are registered by `disagg_connector.stats`, the router's
(`disagg_router_*`) by `disagg_router.metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from disagg_operator.models import AutoscalingSignal, AutoscalingSpec

MetricType = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class Series:
    """One Prometheus metric family vLLM exports, as a scrape shows its name."""

    name: str
    type: MetricType
    source: str
    """The vLLM module that registers it."""


_LOGGERS = "vllm/v1/metrics/loggers.py"
_NIXL = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py"

REQUESTS_WAITING = Series("vllm:num_requests_waiting", "gauge", _LOGGERS)
REQUESTS_RUNNING = Series("vllm:num_requests_running", "gauge", _LOGGERS)
KV_CACHE_USAGE = Series("vllm:kv_cache_usage_perc", "gauge", _LOGGERS)
TIME_TO_FIRST_TOKEN = Series("vllm:time_to_first_token_seconds", "histogram", _LOGGERS)

VLLM_SERIES = (
    REQUESTS_WAITING,
    REQUESTS_RUNNING,
    KV_CACHE_USAGE,
    TIME_TO_FIRST_TOKEN,
    Series("vllm:inter_token_latency_seconds", "histogram", _LOGGERS),
    Series("vllm:e2e_request_latency_seconds", "histogram", _LOGGERS),
    Series("vllm:request_queue_time_seconds", "histogram", _LOGGERS),
    Series("vllm:prompt_tokens", "counter", _LOGGERS),
    Series("vllm:generation_tokens", "counter", _LOGGERS),
    Series("vllm:prefix_cache_queries", "counter", _LOGGERS),
    Series("vllm:prefix_cache_hits", "counter", _LOGGERS),
    Series("vllm:num_preemptions", "counter", _LOGGERS),
    Series("vllm:nixl_xfer_time_seconds", "histogram", _NIXL),
    Series("vllm:nixl_bytes_transferred", "histogram", _NIXL),
    Series("vllm:nixl_num_failed_transfers", "counter", _NIXL),
)
"""Every vLLM series the operator or the shipped dashboard and alerts name."""

RATE_WINDOW = "2m"
"""The window of the rates the ttft signal averages over (four 30 s scrapes)."""


@dataclass(frozen=True)
class Signal:
    """How one autoscaling signal is read per server."""

    series: Series
    keda_metric_type: Literal["AverageValue", "Value"]
    """AverageValue: the query sums the role's servers and the autoscaler divides by their
    count; Value: the query is already the role's per-server figure (a mean latency)."""

    @property
    def hpa_metric(self) -> str:
        """The custom metric a metrics adapter serves per pod (the adapter rules of
        docs/observability.md name it so): the series name with ':' as '_'."""
        return self.series.name.replace(":", "_")

    def query(self, selector: str) -> str:
        """The PromQL KEDA evaluates over the pods `selector` matches."""
        name = self.series.name
        if self.series.type == "histogram":
            rate_sum = f"sum(rate({name}_sum{{{selector}}}[{RATE_WINDOW}]))"
            rate_count = f"sum(rate({name}_count{{{selector}}}[{RATE_WINDOW}]))"
            return f"({rate_sum} / ({rate_count} > 0)) or vector(0)"
        return f"sum({name}{{{selector}}})"


SIGNALS: dict[AutoscalingSignal, Signal] = {
    "queueDepth": Signal(REQUESTS_WAITING, "AverageValue"),
    "ttft": Signal(TIME_TO_FIRST_TOKEN, "Value"),
    "kvCacheUsage": Signal(KV_CACHE_USAGE, "AverageValue"),
    "runningRequests": Signal(REQUESTS_RUNNING, "AverageValue"),
}


def role_selector(namespace: str, workload: str) -> str:
    """PromQL label matchers for the serving pods of one role: its StatefulSet's pods
    `<workload>-<ordinal>`, or a LeaderWorkerSet's leaders `<workload>-<group>` (workers,
    `<workload>-<group>-<index>`, run no API server and export no engine series)."""
    return f'namespace="{namespace}",pod=~"{workload}-[0-9]+"'


def hpa_metric_name(autoscaling: AutoscalingSpec) -> str:
    """The custom metric the HorizontalPodAutoscaler reads: `metricName`, else the default."""
    if autoscaling.metric_name is not None:
        return autoscaling.metric_name
    return SIGNALS[autoscaling.signal].hpa_metric


def decimal_text(value: float) -> str:
    """A target as a plain decimal (4.0 -> "4", 0.8 -> "0.8"), valid as a Kubernetes
    quantity and as a KEDA threshold."""
    return format(Decimal(repr(value)).normalize(), "f")
