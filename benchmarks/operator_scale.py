"""Operator scale benchmark: N DisaggregatedModels applied at once on the local control plane.

For each N (default 10, 50, 200) a fresh namespace and a fresh `disagg operator` process
(watching that namespace, talking to the API server through the recording proxy of
tests/cluster/operator_harness.py) get N small models in one `kubectl apply`. Reported per N:

* seconds from the apply until every model is Ready at its generation (kwok fakes the kubelet:
  pods are bound, started and marked ready without running containers, see tests/cluster);
* API write requests the operator issued until then, by verb and resource (peering
  keep-alives listed apart), and writes in a quiet window after (expected 0);
* the operator's reconcile passes until then, by result, and the errors its own API client
  got, by method and code, from its /metrics;
* the operator's peak RSS (VmHWM) and CPU seconds, from /proc.

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


def _ready_count(kubectl: kube.Kubectl, namespace: str) -> int:
    items = kubectl.json("-n", namespace, "get", "dmodel")["items"]
    return sum(
        1
        for m in items
        if m.get("status", {}).get("observedGeneration") == m["metadata"]["generation"]
        and kube.condition_true(m, "Ready")
    )


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


def run_one(kubectl: kube.Kubectl, kubeconfig: Path, n: int, timeout_s: float) -> dict[str, Any]:
    """Apply n models at once under a fresh operator; return the figures."""
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
        start = time.monotonic()
        kubectl.apply(models)
        applied_s = time.monotonic() - start
        ready = 0
        while ready < n and time.monotonic() - start < timeout_s:
            time.sleep(1)
            ready = _ready_count(kubectl, namespace)
        all_ready_s = time.monotonic() - start
        writes = proxy.writes(since=start)
        metrics = scrape(port)
        quiet_start = time.monotonic()
        time.sleep(QUIET_WINDOW_S)
        quiet = [w for w in proxy.writes(since=quiet_start) if not is_peering(w)]
        peak_mib, cpu_s = _proc_stats(operator.proc.pid)
        code = operator.stop()
    kubectl("delete", "namespace", namespace, "--wait=false")
    operator_writes = [w for w in writes if not is_peering(w)]
    return {
        "models": n,
        "all_ready": ready == n,
        "ready": ready,
        "kubectl_apply_s": round(applied_s, 1),
        "seconds_until_all_ready": round(all_ready_s, 1),
        "api_writes_until_ready": len(operator_writes),
        "api_writes_per_model": round(len(operator_writes) / n, 1),
        "api_writes_by_kind": _by_kind(operator_writes),
        "reconcile_passes_until_ready": {
            result: int(sample(metrics, "disagg_operator_reconcile_passes_total", result=result))
            for result in ("applied", "noop", "blocked", "error")
        },
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
        "operator_exit_code": code,
    }


def _line(r: dict[str, Any]) -> str:
    passes = sum(r["reconcile_passes_until_ready"].values())
    return (
        f"N={r['models']:4d}  ready {r['ready']}/{r['models']} in "
        f"{r['seconds_until_all_ready']:7.1f} s  writes {r['api_writes_until_ready']:6d} "
        f"({r['api_writes_per_model']}/model)  quiet-window writes "
        f"{r['api_writes_in_quiet_window']}  passes {passes}  "
        f"peak RSS {r['operator_peak_rss_mib']} MiB  cpu {r['operator_cpu_s']} s"
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
