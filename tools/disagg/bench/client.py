"""HTTP side of the benchmark: streamed chat turns and before/after metric snapshots."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from disagg.bench import prometheus
from disagg.bench.prometheus import Sample

ROUTER_PREFILL = "disagg_router_prefill_duration_seconds"
ROUTER_LOOKUPS = "disagg_router_conversation_lookups_total"
NIXL_XFER = "vllm:nixl_xfer_time_seconds"
NIXL_BYTES = "vllm:nixl_bytes_transferred_sum"
REUSED_TOKENS = "vllm:disagg_kv_reused_tokens_total"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"
QUEUE_TIME = "vllm:request_queue_time_seconds"
ENGINE_PREFILL_TIME = "vllm:request_prefill_time_seconds"


@dataclass(frozen=True)
class Reply:
    """What the client saw of one streamed turn."""

    ttft_ms: float
    e2e_ms: float
    text: str
    prompt_tokens: int
    completion_tokens: int


class ChatClient:
    """Streams chat completions through a router (or any OpenAI-compatible server)."""

    def __init__(self, url: str, timeout_s: float = 600.0, api_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=timeout_s, headers=headers)

    def close(self) -> None:
        self._http.close()

    def model(self) -> str:
        """The first model the server lists."""
        response = self._http.get(self.url + "/v1/models")
        response.raise_for_status()
        models = response.json().get("data") or []
        if not models:
            raise RuntimeError(f"{self.url}/v1/models lists no model; pass --model")
        return str(models[0]["id"])

    def turn(
        self,
        model: str,
        messages: list[dict[str, str]],
        max_tokens: int,
        conversation_id: str | None,
    ) -> Reply:
        """Send one greedy streamed turn; TTFT is the time to the first event with a choice."""
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if conversation_id is not None:
            body["conversation_id"] = conversation_id
        started = time.perf_counter()
        first: float | None = None
        text: list[str] = []
        usage: dict[str, Any] = {}
        with self._http.stream("POST", self.url + "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                response.read()
                raise RuntimeError(
                    f"{self.url} answered {response.status_code}: {response.text[:300]}"
                )
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                if "error" in chunk:
                    raise RuntimeError(f"stream error from {self.url}: {chunk['error']}")
                choices = chunk.get("choices") or []
                if choices and first is None:
                    first = time.perf_counter()
                for choice in choices:
                    text.append((choice.get("delta") or {}).get("content") or "")
                usage = chunk.get("usage") or usage
        ended = time.perf_counter()
        if first is None:
            raise RuntimeError(f"{self.url} streamed no answer token")
        return Reply(
            ttft_ms=(first - started) * 1000,
            e2e_ms=(ended - started) * 1000,
            text="".join(text),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
        )


@dataclass(frozen=True)
class Snapshot:
    """The router's and the prefill engines' metrics at one instant."""

    router: list[Sample]
    prefill: list[Sample]


@dataclass(frozen=True)
class Deltas:
    """What one request added to the metrics (requests run one at a time)."""

    prefill_ms: float | None
    lookup: str | None
    kv_transfer_ms: float | None
    kv_transfers: float | None
    kv_bytes: float | None
    reused_tokens: float | None
    cached_tokens: float | None
    queue_ms: float | None
    engine_prefill_ms: float | None
    engine_requests: float | None


class MetricsProbe:
    """Reads ``/metrics`` of the router and, when given, of the prefill engines."""

    def __init__(self, router_url: str, prefill_metrics_urls: list[str]) -> None:
        self._router = router_url.rstrip("/") + "/metrics"
        self._prefill = [url.rstrip("/") for url in prefill_metrics_urls]
        self._http = httpx.Client(timeout=30)

    def close(self) -> None:
        self._http.close()

    def _read(self, url: str) -> list[Sample]:
        response = self._http.get(url)
        response.raise_for_status()
        return prometheus.parse(response.text)

    def snapshot(self) -> Snapshot:
        prefill: list[Sample] = []
        for url in self._prefill:
            prefill.extend(self._read(url if url.endswith("/metrics") else url + "/metrics"))
        return Snapshot(self._read(self._router), prefill)

    def deltas(self, before: Snapshot, after: Snapshot) -> Deltas:
        """Per-request values; the prefill ones are ``None`` without prefill metrics URLs."""
        return compute_deltas(before, after, engines=bool(self._prefill))

    def settle(self, before: Snapshot, wait_s: float = 3.0) -> Snapshot:
        """Snapshot after a request; waits briefly for prefill's stats to land.

        vLLM publishes connector stats with a later engine step than the request's own, so a
        D->P read can show up in ``/metrics`` a moment after the turn ended; the request's own
        timings land when prefill has finished it.
        """
        deadline = time.monotonic() + wait_s
        while True:
            after = self.snapshot()
            delta = self.deltas(before, after)
            unread = delta.lookup == "hit" and not delta.kv_transfers
            waiting = bool(self._prefill) and (unread or not delta.engine_requests)
            if not waiting or time.monotonic() > deadline:
                return after
            time.sleep(0.2)


def compute_deltas(before: Snapshot, after: Snapshot, engines: bool) -> Deltas:
    """Differences of the counters the benchmark reads, between two snapshots."""

    def grew(samples: tuple[list[Sample], list[Sample]], name: str) -> float:
        return prometheus.total(samples[1], name) - prometheus.total(samples[0], name)

    router = (before.router, after.router)
    count = grew(router, ROUTER_PREFILL + "_count")
    prefill_ms = grew(router, ROUTER_PREFILL + "_sum") * 1000 if count == 1 else None
    old = prometheus.label_values(before.router, ROUTER_LOOKUPS, "result")
    new = prometheus.label_values(after.router, ROUTER_LOOKUPS, "result")
    changed = [result for result, value in new.items() if value - old.get(result, 0.0) > 0]
    lookup = changed[0] if len(changed) == 1 else None
    if not engines:
        return Deltas(prefill_ms, lookup, *([None] * 8))
    prefill = (before.prefill, after.prefill)
    return Deltas(
        prefill_ms=prefill_ms,
        lookup=lookup,
        kv_transfer_ms=grew(prefill, NIXL_XFER + "_sum") * 1000,
        kv_transfers=grew(prefill, NIXL_XFER + "_count"),
        kv_bytes=grew(prefill, NIXL_BYTES),
        reused_tokens=grew(prefill, REUSED_TOKENS),
        cached_tokens=grew(prefill, PREFIX_CACHE_HITS),
        queue_ms=grew(prefill, QUEUE_TIME + "_sum") * 1000,
        engine_prefill_ms=grew(prefill, ENGINE_PREFILL_TIME + "_sum") * 1000,
        engine_requests=grew(prefill, QUEUE_TIME + "_count"),
    )
