"""The Prometheus text reader and the per-request metric differences."""

from __future__ import annotations

from disagg.bench import prometheus
from disagg.bench.client import Snapshot, compute_deltas

ROUTER_BEFORE = """# HELP disagg_router_prefill_duration_seconds Prefill request duration.
# TYPE disagg_router_prefill_duration_seconds histogram
disagg_router_prefill_duration_seconds_bucket{le="0.5"} 3.0
disagg_router_prefill_duration_seconds_count 4.0
disagg_router_prefill_duration_seconds_sum 2.5
disagg_router_conversation_lookups_total{result="miss"} 1.0
disagg_router_conversation_lookups_total{result="hit"} 2.0
"""
ROUTER_AFTER = (
    ROUTER_BEFORE.replace("_count 4.0", "_count 5.0")
    .replace("_sum 2.5", "_sum 3.25")
    .replace('result="hit"} 2.0', 'result="hit"} 3.0')
)
ENGINE_BEFORE = """vllm:nixl_xfer_time_seconds_sum{engine="0",model_name="m"} 0.5
vllm:nixl_xfer_time_seconds_count{engine="0",model_name="m"} 2.0
vllm:nixl_bytes_transferred_sum{engine="0",model_name="m"} 1000.0
vllm:disagg_kv_reused_tokens_total{engine="0",model_name="m"} 256.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 128.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 1.0
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 4.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 9.0
"""
ENGINE_AFTER = """vllm:nixl_xfer_time_seconds_sum{engine="0",model_name="m"} 0.52
vllm:nixl_xfer_time_seconds_count{engine="0",model_name="m"} 3.0
vllm:nixl_bytes_transferred_sum{engine="0",model_name="m"} 5000.0
vllm:disagg_kv_reused_tokens_total{engine="0",model_name="m"} 1280.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 128.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 1.03
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 5.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 9.7
"""


def test_parse_reads_names_labels_and_values_and_skips_comments() -> None:
    samples = prometheus.parse(ROUTER_BEFORE + 'garbage line\nname{a="x"} notanumber\n')
    assert len(samples) == 5
    assert samples[0].name == "disagg_router_prefill_duration_seconds_bucket"
    assert samples[0].labels == {"le": "0.5"}
    assert prometheus.total(samples, "disagg_router_prefill_duration_seconds_sum") == 2.5
    lookups = "disagg_router_conversation_lookups_total"
    assert prometheus.total(samples, lookups) == 3.0
    assert prometheus.total(samples, lookups, result="hit") == 2.0
    assert prometheus.label_values(samples, lookups, "result") == {"miss": 1.0, "hit": 2.0}
    assert prometheus.total(samples, "absent") == 0.0


def snapshot(router: str, engine: str) -> Snapshot:
    return Snapshot(prometheus.parse(router), prometheus.parse(engine))


def test_deltas_attribute_one_request() -> None:
    deltas = compute_deltas(
        snapshot(ROUTER_BEFORE, ENGINE_BEFORE), snapshot(ROUTER_AFTER, ENGINE_AFTER), engines=True
    )
    assert deltas.prefill_ms == 750.0
    assert deltas.lookup == "hit"
    assert round(deltas.kv_transfer_ms or 0, 6) == 20.0
    assert (deltas.kv_transfers, deltas.kv_bytes, deltas.reused_tokens) == (1.0, 4000.0, 1024.0)
    assert deltas.cached_tokens == 0.0, "prefill found nothing of this prompt in its own cache"
    assert round(deltas.queue_ms or 0, 6) == 30.0, "arrival to first step, the read included"
    assert round(deltas.engine_prefill_ms or 0, 6) == 700.0
    assert deltas.engine_requests == 1.0


def test_deltas_without_engines_or_with_overlapping_requests_are_unknown() -> None:
    two = ROUTER_AFTER.replace("_count 5.0", "_count 6.0")
    deltas = compute_deltas(snapshot(ROUTER_BEFORE, ""), snapshot(two, ""), engines=False)
    assert deltas.prefill_ms is None, "two prefills in between: not one request's duration"
    assert deltas.kv_transfer_ms is None and deltas.reused_tokens is None
    assert deltas.queue_ms is None and deltas.cached_tokens is None
    assert deltas.lookup == "hit"
