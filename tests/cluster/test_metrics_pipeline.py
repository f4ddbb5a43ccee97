"""The real metrics pipeline on the local control plane: Prometheus scrapes, prometheus-adapter
serves its series as custom metrics through the API server's aggregation layer
(deploy/prometheus-adapter/rules.yaml), and the real HorizontalPodAutoscaler controller scales
each autoscaled role of a model the real operator reconciles: prefill up on its queue depth and
back down after its stabilization window, decode likewise on its running requests. The
operator never writes either role's replica count (its requests counted through the recording
proxy).

kwok's pods run nothing, so the engines' series come from a stand-in: one loopback HTTP
endpoint serving, per pod, vLLM's series under the names vLLM exports, scraped by the
pipeline's job `targets` with each series labelled with the namespace and name of the kwok
pod it stands for (the labels the PodMonitors give real pods' series). The pipeline's pod
discovery (deploy/prometheus/prometheus.yml's job `disagg`) finds the same kwok pods with the
PodMonitors' labels; their addresses answer nothing, so only the stand-in's values are read.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import kube
from disagg_operator.engine_metrics import REQUESTS_RUNNING, REQUESTS_WAITING, SIGNALS
from disagg_operator.kubeapi import FIELD_MANAGER
from metrics_pipeline import (
    MetricsPipeline,
    custom_metric,
    metrics_pipeline,
    replica_owners,
    spec_replicas,
)
from operator_fixtures import StartOperator, crds, small_model, start_operator  # noqa: F401
from operator_harness import ApiProxy, Request, wait_ready

NAME = "m"
PREFILL = f"{NAME}-prefill"
DECODE = f"{NAME}-decode"
MAX_REPLICAS = 2
SCALE_DOWN_WINDOW_S = 10
"""Each role's scale-down stabilization window: short, so the test sees it pass."""
PREFILL_TARGET = 2
DECODE_TARGET = 4
SCALE_TIMEOUT_S = 120
"""A scale decision: a scrape, the adapter's re-list, one or two HorizontalPodAutoscaler
sync periods (15 s), plus the stabilization window when scaling down."""


def _autoscaling(signal: str, target: int) -> dict[str, Any]:
    return {
        "maxReplicas": MAX_REPLICAS,
        "signal": signal,
        "target": target,
        "behavior": {"scaleDownStabilizationWindowSeconds": SCALE_DOWN_WINDOW_S},
    }


class EngineStandIn:
    """A stand-in for the engines' /metrics: `/metrics/<pod>` serves vLLM's gauges with the
    values the test sets for that pod (0 until set)."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], float] = {}
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                pod = self.path.removeprefix("/metrics/")
                lines = []
                for series in (REQUESTS_WAITING, REQUESTS_RUNNING):
                    value = stand_in.values.get((pod, series.name), 0.0)
                    lines += [f"# TYPE {series.name} gauge", f'{series.name}{{engine="0"}} {value}']
                body = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="module")
def pipeline(kubeconfig: Path) -> Iterator[MetricsPipeline]:
    with metrics_pipeline() as running:
        yield running


@pytest.fixture
def stand_in() -> Iterator[EngineStandIn]:
    served = EngineStandIn()
    yield served
    served.close()


def _ready_pods(kubectl: kube.Kubectl, namespace: str, workload: str) -> int:
    sts = kubectl.json("-n", namespace, "get", "statefulset", workload)
    return int(sts.get("status", {}).get("readyReplicas") or 0)


def _scales_to(kubectl: kube.Kubectl, namespace: str, workload: str, replicas: int) -> None:
    """Wait until the role runs `replicas` Ready pods, as its autoscaler decided."""

    def there() -> bool:
        return (
            spec_replicas(kubectl, namespace, workload) == replicas
            and _ready_pods(kubectl, namespace, workload) == replicas
        )

    kube.wait_for(there, what=f"{workload} at {replicas}", timeout_s=SCALE_TIMEOUT_S, interval_s=1)


def _scale_time_after(
    kubectl: kube.Kubectl, namespace: str, workload: str, after: float = 0.0
) -> float:
    """When the role's autoscaler changed its replicas (its status's ``lastScaleTime``), once
    that is later than ``after``: the status is written just after the scale."""

    def stamp() -> float | None:
        hpa = kubectl.json("-n", namespace, "get", "horizontalpodautoscaler", workload)
        written = hpa.get("status", {}).get("lastScaleTime")
        if written is None:
            return None
        seconds = datetime.fromisoformat(written.replace("Z", "+00:00")).timestamp()
        return seconds if seconds > after else None

    return kube.wait_for(stamp, what=f"{workload}'s autoscaler's lastScaleTime", timeout_s=30)


def _role_writes(proxy: ApiProxy, since: float) -> list[Request]:
    """The operator's writes to either role's StatefulSet (or its scale subresource)."""
    paths = (f"/statefulsets/{PREFILL}", f"/statefulsets/{DECODE}")
    return [
        w
        for w in proxy.writes(since)
        if any(w.path.endswith(p) or f"{p}/" in w.path for p in paths)
    ]


def _sets_replicas(write: Request) -> bool:
    return "replicas" in (json.loads(write.body or b"{}").get("spec") or {})


def test_the_hpa_scales_each_role_on_its_signal_through_prometheus_and_the_adapter(
    kubectl: kube.Kubectl,
    kubeconfig: Path,
    namespace: str,
    pipeline: MetricsPipeline,
    stand_in: EngineStandIn,
    start_operator: StartOperator,  # noqa: F811
    tmp_path: Path,
) -> None:
    pods = [f"{role}-{i}" for role in (PREFILL, DECODE) for i in range(MAX_REPLICAS)]
    pipeline.set_targets(
        namespace,
        [
            {
                "targets": [stand_in.address],
                "labels": {
                    "__metrics_path__": f"/metrics/{pod}",
                    "namespace": namespace,
                    "pod": pod,
                },
            }
            for pod in pods
        ],
    )
    waiting = SIGNALS["queueDepth"].hpa_metric
    running = SIGNALS["runningRequests"].hpa_metric
    with ApiProxy(kubeconfig, tmp_path) as proxy:
        operator = start_operator(kubeconfig_path=proxy.kubeconfig)
        model = small_model(NAME, namespace)
        model["spec"]["prefill"]["autoscaling"] = _autoscaling("queueDepth", PREFILL_TARGET)
        model["spec"]["decode"]["autoscaling"] = _autoscaling("runningRequests", DECODE_TARGET)
        kubectl.apply(model)
        wait_ready(kubectl, namespace, NAME)
        mark = time.monotonic()

        # Prometheus's pod discovery finds the model's kwok pods as the PodMonitors would.
        def discovered() -> set[tuple[str, str]]:
            return {
                (t["labels"]["job"], t["labels"]["pod"])
                for t in pipeline.active_targets()
                if t["labels"].get("namespace") == namespace
                and t["labels"].get("job", "").startswith(f"{namespace}/")
            }

        expected = {
            (f"{namespace}/{NAME}-{role}", f"{NAME}-{role}-0") for role in ("prefill", "decode")
        }
        kube.wait_for(
            lambda: expected <= discovered(), what="the model's pods discovered", timeout_s=60
        )

        # Load on prefill: 6 waiting requests against a target of 2 per server -> the maximum, 2.
        stand_in.values[(f"{PREFILL}-0", REQUESTS_WAITING.name)] = 6
        kube.wait_for(
            lambda: custom_metric(kubectl, namespace, f"{PREFILL}-0", waiting) == 6,
            what="the queue depth served as a custom metric",
            timeout_s=60,
        )
        _scales_to(kubectl, namespace, PREFILL, 2)
        scaled_up = _scale_time_after(kubectl, namespace, PREFILL)
        stand_in.values[(f"{PREFILL}-1", REQUESTS_WAITING.name)] = 6
        assert spec_replicas(kubectl, namespace, DECODE) == 1

        # The load moves to decode: prefill back to 1 after its window, decode up to 2.
        for i in range(MAX_REPLICAS):
            stand_in.values[(f"{PREFILL}-{i}", REQUESTS_WAITING.name)] = 0
        stand_in.values[(f"{DECODE}-0", REQUESTS_RUNNING.name)] = 10
        _scales_to(kubectl, namespace, DECODE, 2)
        _scales_to(kubectl, namespace, PREFILL, 1)
        # Not within the window after the recommendation of 2 that scaled it up (the API's
        # timestamps are in whole seconds).
        scaled_down = _scale_time_after(kubectl, namespace, PREFILL, scaled_up)
        assert scaled_down - scaled_up > SCALE_DOWN_WINDOW_S - 1, (scaled_up, scaled_down)
        stand_in.values[(f"{DECODE}-1", REQUESTS_RUNNING.name)] = 10

        # No load: decode back to 1.
        for i in range(MAX_REPLICAS):
            stand_in.values[(f"{DECODE}-{i}", REQUESTS_RUNNING.name)] = 0
        _scales_to(kubectl, namespace, DECODE, 1)
        assert custom_metric(kubectl, namespace, f"{DECODE}-0", running) == 0
        hpa = kubectl.json("-n", namespace, "get", "horizontalpodautoscaler", DECODE)
        writes = _role_writes(proxy, mark)
        owners = replica_owners(kubectl, namespace, PREFILL, DECODE)
        operator.assert_clean_stop()

    (current,) = hpa["status"]["currentMetrics"]
    assert current["pods"]["metric"]["name"] == running, current
    assert not [w for w in writes if "/scale" in w.path or _sets_replicas(w)], [
        (w.path, w.body) for w in writes
    ]
    assert FIELD_MANAGER not in owners, owners
