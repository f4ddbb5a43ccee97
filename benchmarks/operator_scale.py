"""Operator scale benchmark: N DisaggregatedModels applied at once on the local control plane.

For each N (default 10, 50, 200) a fresh namespace and a fresh `disagg operator` process
(watching that namespace, talking to the API server through the recording proxy of
tests/cluster/operator_harness.py) get N small models in one `kubectl apply`. Reported per N:

* seconds from the apply until every model is Ready at its generation (kwok fakes the kubelet:
  pods are bound, started and marked ready without running containers, see tests/cluster);
* each model's own apply-to-Ready, p50 and p99: from its creationTimestamp to its Ready
  condition's lastTransitionTime, so the time `kubectl apply` takes to send the later models
  does not count. Both timestamps have a resolution of one second (the API server's and the
  operator's clocks are this machine's), so each figure is within a second either way;
* where that time goes, p50 and p99 of each stage of each model, from the same timestamps:
  until the operator's first child (the operator's first pass), until its last pod exists
  (the workload controllers), until its last pod is Ready (scheduler and kwok), until the
  model's Ready (the operator's pass that sees it), to tell the operator's share from the
  control plane's;
* API write requests the operator issued until then, by verb and resource (peering
  keep-alives listed apart), and writes in a quiet window after (expected 0);
* the operator's reconcile passes until then, by result, and the errors its own API client
  got, by method and code, from its /metrics;
* the operator's peak RSS (VmHWM) and CPU seconds, from /proc, and the CPU seconds of each
  control plane process (API server, etcd, controllers, scheduler, kwok) until all are Ready;
* a restart: the operator stopped and a fresh one started over the N unchanged models, its
  writes until its /metrics count every model Ready (each has had a pass) and a quiet window
  after (expected 0).

Extra fake nodes (tests/cluster/nodes.sh with more GPU and CPU nodes) give every pod a place;
they are removed at the end. Each N waits until the namespaces of earlier runs are gone: every
router Service holds an address of the cluster's small Service range (`SERVICE_CIDR` in
tests/cluster/env.sh) until then, and with too few left the API server refuses Services
("range is full"). Run under the heavy-job lock (CPU is scarce):

    flock /tmp/disagg-heavy.lock .venv/bin/python benchmarks/operator_scale.py
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "cluster"), str(REPO / "tests" / "unit")]

import kube  # noqa: E402
from operator_fixtures import small_model  # noqa: E402
from operator_harness import (  # noqa: E402
    ApiProxy,
    OperatorProcess,
    Samples,
    apply_crds,
    free_port,
    is_peering,
    sample,
    scrape,
)

OUTPUT = REPO / "docs" / "benchmarks" / "operator_scale.json"
BASE_GPU_NODES, BASE_CPU_NODES = 4, 2
ENGINE_PODS_PER_GPU_NODE = 8  # one GPU per engine pod, 8 per p5en node
ROUTER_PODS_PER_CPU_NODE = 50  # under the fake m7i node's 58-pod cap
QUIET_WINDOW_S = 10
NAMESPACE_PREFIX = "disagg-bench-"


def _nodes(kubectl: kube.Kubectl, gpu: int, cpu: int) -> None:
    env = {**os.environ, "DISAGG_GPU_NODES": str(gpu), "DISAGG_CPU_NODES": str(cpu)}
    nodes = subprocess.run(
        ["bash", str(REPO / "tests" / "cluster" / "nodes.sh")],
        env=env, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    kubectl("apply", "-f", "-", input=nodes)


def _remove_extra_nodes(kubectl: kube.Kubectl, gpu: int, cpu: int) -> None:
    extra = [f"p5en-gpu-{i}" for i in range(BASE_GPU_NODES, gpu)]
    extra += [f"cpu-{i}" for i in range(BASE_CPU_NODES, cpu)]
    if extra:
        kubectl("delete", "node", "--ignore-not-found", *extra)


def _proc_stats(pid: int) -> tuple[float, float]:
    """Peak RSS (MiB) and CPU seconds (user + system) of a live process."""
    status = Path(f"/proc/{pid}/status").read_text()
    peak_kib = next(
        int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")
    )
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return peak_kib / 1024, (int(fields[11]) + int(fields[12])) / ticks


CONTROL_PLANE = (
    "kube-apiserver",
    "etcd",
    "kube-controller",
    "kube-scheduler",
    "kwok-controller",
)
"""The local control plane's processes by their /proc comm (15 characters at most, so
kube-controller-manager is `kube-controller`), whose CPU seconds each phase reports."""


def _control_plane_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each control plane process so far, by name."""
    ticks = os.sysconf("SC_CLK_TCK")
    cpu: dict[str, float] = {}
    for proc in Path("/proc").iterdir():
        try:
            name = (proc / "comm").read_text().strip()
            if name in CONTROL_PLANE:
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                cpu[name] = cpu.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
        except (OSError, ValueError):
            continue
    return cpu


def _cpu_since(before: dict[str, float]) -> dict[str, float]:
    return {name: round(s - before.get(name, 0.0), 1) for name, s in _control_plane_cpu().items()}


def _ready_at_generation(model: dict[str, Any]) -> bool:
    """Whether the model's status says Ready for its current generation."""
    status = model.get("status", {})
    return status.get("observedGeneration") == model["metadata"]["generation"] and (
        kube.condition_true(model, "Ready")
    )


def _ready_count(kubectl: kube.Kubectl, namespace: str) -> int:
    items = kubectl.json("-n", namespace, "get", "dmodel")["items"]
    return sum(1 for m in items if _ready_at_generation(m))


def _timestamp(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)


def _apply_to_ready(kubectl: kube.Kubectl, namespace: str) -> list[float]:
    """Each Ready model's seconds from its creation timestamp to its Ready condition's
    lastTransitionTime (both whole seconds, as the API server writes them)."""
    seconds = []
    for model in kubectl.json("-n", namespace, "get", "dmodel")["items"]:
        if not _ready_at_generation(model):
            continue
        ready = next(c for c in model["status"]["conditions"] if c["type"] == "Ready")
        created = _timestamp(model["metadata"]["creationTimestamp"])
        seconds.append((_timestamp(ready["lastTransitionTime"]) - created).total_seconds())
    return sorted(seconds)


STAGES = ("first_child", "pods_created", "pods_ready", "model_ready")
"""The stages of a model's apply-to-Ready, each ending at the timestamp it is named after."""


def _stages(kubectl: kube.Kubectl, namespace: str) -> dict[str, dict[str, float | None]]:
    """p50 and p99 over the Ready models of each stage's seconds (see `STAGES`): creation to
    the first child's creation, to the last pod's creation, to the last pod's Ready, to the
    model's Ready (whole seconds, as the API server writes them)."""
    label = "app.kubernetes.io/instance"
    first_child: dict[str, datetime.datetime] = {}
    for kind in ("serviceaccounts", "configmaps", "services"):
        for child in kubectl.json("-n", namespace, "get", kind, "-l", label)["items"]:
            owner, created = (
                child["metadata"]["labels"][label],
                child["metadata"]["creationTimestamp"],
            )
            first_child[owner] = min(
                first_child.get(owner, _timestamp(created)), _timestamp(created)
            )
    pods_created: dict[str, datetime.datetime] = {}
    pods_ready: dict[str, datetime.datetime] = {}
    for pod in kubectl.json("-n", namespace, "get", "pods", "-l", label)["items"]:
        owner = pod["metadata"]["labels"][label]
        created = _timestamp(pod["metadata"]["creationTimestamp"])
        pods_created[owner] = max(pods_created.get(owner, created), created)
        ready = [c for c in pod["status"].get("conditions", []) if c["type"] == "Ready"]
        if ready and ready[0]["status"] == "True":
            at = _timestamp(ready[0]["lastTransitionTime"])
            pods_ready[owner] = max(pods_ready.get(owner, at), at)
    seconds: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for model in kubectl.json("-n", namespace, "get", "dmodel")["items"]:
        name = model["metadata"]["name"]
        if not _ready_at_generation(model) or name not in pods_ready:
            continue
        ready = next(c for c in model["status"]["conditions"] if c["type"] == "Ready")
        marks = [
            _timestamp(model["metadata"]["creationTimestamp"]),
            first_child[name],
            pods_created[name],
            pods_ready[name],
            _timestamp(ready["lastTransitionTime"]),
        ]
        for stage, start, end in zip(STAGES, marks, marks[1:], strict=False):
            seconds[stage].append((end - start).total_seconds())
    return {
        stage: {"p50": _percentile(sorted(v), 0.50), "p99": _percentile(sorted(v), 0.99)}
        for stage, v in seconds.items()
    }


def _percentile(values: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile of sorted `values` (None when empty)."""
    if not values:
        return None
    return values[max(0, math.ceil(fraction * len(values)) - 1)]


def _passes(metrics: Samples) -> dict[str, int]:
    return {
        result: int(sample(metrics, "disagg_operator_reconcile_passes_total", result=result))
        for result in ("applied", "noop", "blocked", "error")
    }


def _by_kind(requests: list[Any]) -> dict[str, int]:
    counts: collections.Counter[str] = collections.Counter()
    for r in requests:
        parts = r.path.strip("/").split("/")
        resource = parts[parts.index("namespaces") + 2] if "namespaces" in parts else parts[-1]
        if r.path.endswith("/status"):
            resource += "/status"
        counts[f"{r.method} {resource}"] += 1
    return dict(sorted(counts.items()))


def _earlier_runs_gone(kubectl: kube.Kubectl) -> bool:
    names = kubectl("get", "namespaces", "-o", "name").split()
    return not any(name.startswith(f"namespace/{NAMESPACE_PREFIX}") for name in names)


def _restart(
    proxy: ApiProxy, namespace: str, n: int, log: Path, timeout_s: float
) -> dict[str, Any]:
    """A fresh operator over the n unchanged Ready models: its writes until it has found every
    one Ready (its models gauge counts n Ready) and a quiet window after, expected none."""
    port = free_port()
    start, cpu = time.monotonic(), _control_plane_cpu()
    operator = OperatorProcess(proxy.kubeconfig, [namespace], log, f"--metrics-port={port}")
    operator.start()
    assert operator.proc is not None

    def reconciled() -> bool:
        return sample(scrape(port), "disagg_operator_models", ready="true") >= n

    kube.wait_for(reconciled, what=f"the restarted operator to see {n} models Ready",
                  timeout_s=timeout_s, interval_s=1)  # fmt: skip
    reconciled_s = time.monotonic() - start
    time.sleep(QUIET_WINDOW_S)
    writes = [w for w in proxy.writes(since=start) if not is_peering(w)]
    metrics = scrape(port)
    _, cpu_s = _proc_stats(operator.proc.pid)
    code = operator.stop()
    return {
        "seconds_until_all_reconciled": round(reconciled_s, 1),
        "api_writes": len(writes),
        "api_writes_by_kind": _by_kind(writes),
        "reconcile_passes": _passes(metrics),
        "operator_cpu_s": round(cpu_s, 1),
        "control_plane_cpu_s": _cpu_since(cpu),
        "operator_exit_code": code,
    }


def run_one(kubectl: kube.Kubectl, kubeconfig: Path, n: int, timeout_s: float) -> dict[str, Any]:
    """Apply n models at once under a fresh operator, then restart it; return the figures."""
    kube.wait_for(
        lambda: _earlier_runs_gone(kubectl),
        what=f"the {NAMESPACE_PREFIX}* namespaces of earlier runs to be deleted",
        timeout_s=timeout_s,
        interval_s=2,
    )
    namespace = f"{NAMESPACE_PREFIX}{n}-{os.urandom(2).hex()}"
    kubectl("create", "namespace", namespace)
    kube.wait_for(
        lambda: kubectl.run("-n", namespace, "get", "sa", "default", check=False).returncode == 0,
        what="the namespace's default ServiceAccount",
    )
    models = [small_model(f"b{i}", namespace) for i in range(n)]
    with tempfile.TemporaryDirectory() as tmp, ApiProxy(kubeconfig, Path(tmp)) as proxy:
        port = free_port()
        log = Path(tmp) / "operator.log"
        operator = OperatorProcess(proxy.kubeconfig, [namespace], log, f"--metrics-port={port}")
        operator.start()
        assert operator.proc is not None
        start, cpu = time.monotonic(), _control_plane_cpu()
        kubectl.apply(models)
        applied_s = time.monotonic() - start
        ready = 0
        while ready < n and time.monotonic() - start < timeout_s:
            time.sleep(1)
            ready = _ready_count(kubectl, namespace)
        all_ready_s = time.monotonic() - start
        control_plane_cpu = _cpu_since(cpu)
        writes = proxy.writes(since=start)
        metrics = scrape(port)
        latencies = _apply_to_ready(kubectl, namespace)
        stages = _stages(kubectl, namespace)
        quiet_start = time.monotonic()
        time.sleep(QUIET_WINDOW_S)
        quiet = [w for w in proxy.writes(since=quiet_start) if not is_peering(w)]
        peak_mib, cpu_s = _proc_stats(operator.proc.pid)
        code = operator.stop()
        restart = _restart(proxy, namespace, n, Path(tmp) / "restarted.log", timeout_s)
    kubectl("delete", "namespace", namespace, "--wait=false")
    operator_writes = [w for w in writes if not is_peering(w)]
    by_kind = _by_kind(operator_writes)
    return {
        "models": n,
        "all_ready": ready == n,
        "ready": ready,
        "kubectl_apply_s": round(applied_s, 1),
        "seconds_until_all_ready": round(all_ready_s, 1),
        "apply_to_ready_s": {
            "p50": _percentile(latencies, 0.50),
            "p99": _percentile(latencies, 0.99),
            "max": _percentile(latencies, 1.0),
        },
        "apply_to_ready_stages_s": stages,
        "api_writes_until_ready": len(operator_writes),
        "api_writes_per_model": round(len(operator_writes) / n, 1),
        "status_patches_per_model": round(
            sum(v for k, v in by_kind.items() if k.endswith("/status")) / n, 1
        ),
        "api_writes_by_kind": by_kind,
        "reconcile_passes_until_ready": _passes(metrics),
        "operator_api_errors_until_ready": {
            f"{dict(labels)['method']} {dict(labels)['code']}": int(value)
            for (name, labels), value in sorted(metrics.items())
            if name == "disagg_operator_api_errors_total"
        },
        "peering_keepalives": len(writes) - len(operator_writes),
        "api_writes_in_quiet_window": len(quiet),
        "quiet_window_s": QUIET_WINDOW_S,
        "operator_peak_rss_mib": round(peak_mib, 1),
        "operator_cpu_s": round(cpu_s, 1),
        "control_plane_cpu_s_until_ready": control_plane_cpu,
        "operator_exit_code": code,
        "restart": restart,
    }


def _line(r: dict[str, Any]) -> str:
    passes = sum(r["reconcile_passes_until_ready"].values())
    latency = r["apply_to_ready_s"]
    stages = "  ".join(
        f"{stage} {v['p50']}/{v['p99']}" for stage, v in r["apply_to_ready_stages_s"].items()
    )
    return (
        f"N={r['models']:4d}  ready {r['ready']}/{r['models']} in "
        f"{r['seconds_until_all_ready']:7.1f} s  writes {r['api_writes_until_ready']:6d} "
        f"({r['api_writes_per_model']}/model)  apply-to-Ready p50 {latency['p50']} s "
        f"p99 {latency['p99']} s  quiet-window writes {r['api_writes_in_quiet_window']}  "
        f"restart writes {r['restart']['api_writes']}  passes {passes}  "
        f"peak RSS {r['operator_peak_rss_mib']} MiB  cpu {r['operator_cpu_s']} s\n"
        f"        stages p50/p99: {stages}\n"
        f"        control plane CPU s: {r['control_plane_cpu_s_until_ready']}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark for each N, print a table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, nargs="+", default=[10, 50, 200])
    parser.add_argument("--timeout", type=float, default=900, help="per N, seconds")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)

    env = kube.cluster_env()
    kubeconfig = kube.cluster_up()
    kubectl = kube.Kubectl(env.kubectl, kubeconfig, timeout_s=300)
    apply_crds(kubectl, REPO / "crds")
    biggest = max(args.models)
    gpu = max(BASE_GPU_NODES, BASE_GPU_NODES + math.ceil(2 * biggest / ENGINE_PODS_PER_GPU_NODE))
    cpu = max(BASE_CPU_NODES, BASE_CPU_NODES + math.ceil(biggest / ROUTER_PODS_PER_CPU_NODE))
    _nodes(kubectl, gpu, cpu)
    results = []
    try:
        for n in args.models:
            result = run_one(kubectl, kubeconfig, n, args.timeout)
            results.append(result)
            print(_line(result), flush=True)
    finally:
        _remove_extra_nodes(kubectl, gpu, cpu)
    report = {
        "benchmark": "operator_scale",
        "what": "N small DisaggregatedModels applied at once; one fresh operator per N",
        "cluster": f"local kwok control plane {env.kube_version}, "
        f"{gpu} fake p5en + {cpu} CPU nodes",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "results": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0 if all(r["all_ready"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
