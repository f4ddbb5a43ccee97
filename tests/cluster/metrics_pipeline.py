"""The local cluster's metrics pipeline for the cluster and e2e tests: Prometheus and
prometheus-adapter as host processes serving custom.metrics.k8s.io to the cluster's
HorizontalPodAutoscalers (tests/cluster/metrics/metrics-up.sh, stopped by metrics-down.sh),
the few Prometheus HTTP API reads the tests make, and what they read of the autoscaled roles
through the API server (a pod's custom metric, the field managers of a workload's replicas)."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kube

METRICS = Path(__file__).resolve().parent / "metrics"
UP_TIMEOUT_S = 300
"""metrics-up.sh's bound: the binaries cached, its own waits are a minute each."""
BUILD_TIMEOUT_S = 3600
"""build-metrics.sh's bound: cold, it downloads the modules and compiles all three."""


def built_metrics_bin() -> Path:
    """The folder of prometheus, promtool and prometheus-adapter, built (or found cached)."""
    subprocess.run(["bash", str(METRICS / "build-metrics.sh")], check=True, timeout=BUILD_TIMEOUT_S)
    out = subprocess.run(
        ["bash", str(METRICS / "env.sh")], check=True, capture_output=True, text=True
    ).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return Path(env["METRICS_BIN"])


@dataclass(frozen=True)
class MetricsPipeline:
    """A running pipeline: Prometheus's address and the folder of its job `targets`."""

    prometheus_url: str
    targets: Path

    def _get(self, path: str, **params: str) -> Any:
        url = f"{self.prometheus_url}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector `promql` evaluates to now."""
        data = self._get("/api/v1/query", query=promql)
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def value(self, promql: str) -> float | None:
        """The single value `promql` evaluates to now, None while it has none."""
        result = self.query(promql)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def active_targets(self) -> list[dict[str, Any]]:
        """The scrape targets Prometheus has discovered, with their labels and health."""
        targets: list[dict[str, Any]] = self._get("/api/v1/targets", state="active")[
            "activeTargets"
        ]
        return targets

    def set_targets(self, name: str, groups: list[dict[str, Any]]) -> None:
        """Make the job `targets` scrape `groups` (file service discovery, picked up at once)."""
        tmp = self.targets / f".{name}.json.tmp"
        tmp.write_text(json.dumps(groups))
        tmp.rename(self.targets / f"{name}.json")


@contextmanager
def metrics_pipeline() -> Iterator[MetricsPipeline]:
    """Start the pipeline of the cluster the environment names (DISAGG_CLUSTER_NAME) and stop
    it afterwards (its APIService gone, so no client's discovery waits on it). The binaries
    are built first, under the build's own bound (metrics-up.sh's is for starting them)."""
    built_metrics_bin()
    proc = subprocess.run(
        ["bash", str(METRICS / "metrics-up.sh")],
        capture_output=True,
        text=True,
        timeout=UP_TIMEOUT_S,
        check=False,
        env=os.environ.copy(),
    )
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
        yield MetricsPipeline(out["PROMETHEUS_URL"], Path(out["METRICS_TARGETS"]))
    finally:
        subprocess.run(["bash", str(METRICS / "metrics-down.sh")], check=True, timeout=120)


METRIC_REQUEST_TIMEOUT = "15s"
"""kubectl's deadline for one custom-metrics read (its own default waits forever)."""


def custom_metric(kubectl: kube.Kubectl, namespace: str, pod: str, metric: str) -> float | None:
    """The pod's custom metric as the API server serves it (aggregated from the adapter), None
    while the adapter has no value for it or does not answer within METRIC_REQUEST_TIMEOUT (a
    loaded node can leave one aggregated call hanging; the caller's poll asks again)."""
    path = f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/{pod}/{metric}"
    proc = kubectl.run(
        "get", "--raw", path, f"--request-timeout={METRIC_REQUEST_TIMEOUT}", check=False
    )
    if proc.returncode != 0:
        return None
    (item,) = json.loads(proc.stdout)["items"]
    text: str = item["value"]
    # A plain number or milli-units (`1500m`).
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def spec_replicas(kubectl: kube.Kubectl, namespace: str, statefulset: str) -> int:
    """The StatefulSet's spec.replicas (its autoscaler's decision while it has one)."""
    sts = kubectl.json("-n", namespace, "get", "statefulset", statefulset)
    return int(sts["spec"]["replicas"])


def replica_owners(kubectl: kube.Kubectl, namespace: str, *statefulsets: str) -> set[str]:
    """The field managers owning the StatefulSets' spec.replicas."""
    owners: set[str] = set()
    for name in statefulsets:
        sts = kubectl.json("-n", namespace, "get", "statefulset", name, "--show-managed-fields")
        for entry in sts["metadata"]["managedFields"]:
            if "f:replicas" in (entry.get("fieldsV1") or {}).get("f:spec", {}):
                owners.add(entry["manager"])
    return owners
