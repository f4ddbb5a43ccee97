"""A Prometheus set up the way kube-prometheus-stack sets it up, for the test that the models'
PodMonitors and the operator chart's ServiceMonitor are picked up by a stock monitoring stack.

The real Prometheus Operator (built from its pinned Go module by
metrics/build-prometheus-operator.sh) runs as a host process against the cluster, watching one
namespace. A `Prometheus` object there selects PodMonitors and ServiceMonitors as
kube-prometheus-stack's does when installed as it comes: by the label
`release: <its release name>`, in every namespace. The operator turns what it selected into a
Prometheus configuration (the Secret `prometheus-<name>`), which the project's own Prometheus
binary runs as a host process. The operator's StatefulSet for that Prometheus has no replicas:
the host process takes its place, so the one change made to the generated configuration is
the cluster's kubeconfig for pod and endpoint discovery (in a pod, Prometheus reads its service
account instead) and no rule files (the operator mounts them into its pods).
"""

from __future__ import annotations

import base64
import gzip
import re
import socket
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

import kube
from metrics_pipeline import METRICS, MetricsPipeline, built_metrics_bin
from pinned_files import PROMETHEUS_OPERATOR, crd_name, pinned_files

RELEASE = "kube-prometheus-stack"
"""The Helm release name of the stock stack: the label value its Prometheus selects by."""
SELECTOR = {"release": RELEASE}
PROMETHEUS_NAME = f"{RELEASE}-prometheus"
"""The name kube-prometheus-stack gives its Prometheus object."""
CONFIG_KEY = "prometheus.yaml.gz"
"""The key of the generated configuration in the operator's Secret."""
RELOADER_ENV = {"SHARD": "0", "POD_NAME": f"prometheus-{PROMETHEUS_NAME}-0"}
"""What the Prometheus pod's config reloader puts for `$(NAME)` in the generated configuration:
the one shard, 0, which keeps every target of a job, and the name of its first pod."""
BUILD_TIMEOUT_S = 3600
"""build-prometheus-operator.sh's bound: cold, it downloads the modules and compiles."""
START_TIMEOUT_S = 60


def built_operator_bin() -> Path:
    """The Prometheus Operator binary, built (or found cached)."""
    script = METRICS / "build-prometheus-operator.sh"
    subprocess.run(["bash", str(script)], check=True, timeout=BUILD_TIMEOUT_S)
    out = subprocess.run(
        ["bash", str(METRICS / "env.sh")], check=True, capture_output=True, text=True
    ).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return Path(env["PROMETHEUS_OPERATOR_BIN"]) / "prometheus-operator"


def install_crds(kubectl: kube.Kubectl) -> None:
    """The Prometheus Operator's CRDs, as its chart installs them, Established."""
    paths = list(pinned_files(PROMETHEUS_OPERATOR).values())
    for path in paths:
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    names = [crd_name(path) for path in paths]
    kubectl("wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in names))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _api_flags(kubeconfig: Path) -> list[str]:
    """The Prometheus Operator's flags that reach the API server the kubeconfig names (it takes
    no kubeconfig, only the server and certificate files)."""
    doc = yaml.safe_load(kubeconfig.read_text())
    context = next(c for c in doc["contexts"] if c["name"] == doc["current-context"])["context"]
    cluster = next(c for c in doc["clusters"] if c["name"] == context["cluster"])["cluster"]
    user = next(u for u in doc["users"] if u["name"] == context["user"])["user"]
    return [
        f"--apiserver={cluster['server']}",
        f"--ca-file={cluster['certificate-authority']}",
        f"--cert-file={user['client-certificate']}",
        f"--key-file={user['client-key']}",
    ]


def _prometheus_object(namespace: str, version: str, interval: str) -> dict[str, Any]:
    """kube-prometheus-stack's Prometheus as installed as it comes, less its pods."""
    everywhere: dict[str, Any] = {}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Prometheus",
        "metadata": {"name": PROMETHEUS_NAME, "namespace": namespace},
        "spec": {
            "replicas": 0,
            "version": version,
            "scrapeInterval": interval,
            "evaluationInterval": interval,
            "podMonitorSelector": {"matchLabels": SELECTOR},
            "podMonitorNamespaceSelector": everywhere,
            "serviceMonitorSelector": {"matchLabels": SELECTOR},
            "serviceMonitorNamespaceSelector": everywhere,
        },
    }


def generated_config(kubectl: kube.Kubectl, namespace: str) -> dict[str, Any] | None:
    """The configuration the operator generated for the Prometheus object, None before it has."""
    proc = kubectl.run(
        "-n", namespace, "get", "secret", f"prometheus-{PROMETHEUS_NAME}", "-o", "json", check=False
    )
    if proc.returncode != 0:
        return None
    data = yaml.safe_load(proc.stdout)["data"].get(CONFIG_KEY)
    if data is None:
        return None
    config: dict[str, Any] = yaml.safe_load(gzip.decompress(base64.b64decode(data)))
    return config


def job_names(config: dict[str, Any]) -> set[str]:
    """The scrape jobs of a configuration."""
    return {job["job_name"] for job in config.get("scrape_configs") or []}


def for_host(config: dict[str, Any], kubeconfig: Path) -> dict[str, Any]:
    """The generated configuration run by a host process: discovery through the kubeconfig,
    no rule files (the operator mounts them into its own pods), and every `$(NAME)` replaced
    as the config reloader beside Prometheus replaces it (`RELOADER_ENV`)."""
    jobs = [
        {
            **job,
            "kubernetes_sd_configs": [
                {**sd, "kubeconfig_file": str(kubeconfig)}
                for sd in job.get("kubernetes_sd_configs", [])
            ],
        }
        for job in config.get("scrape_configs") or []
    ]
    host = {**{k: v for k, v in config.items() if k != "rule_files"}, "scrape_configs": jobs}
    return _expanded(host)


def _expanded(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with each `$(NAME)` replaced by `RELOADER_ENV[NAME]`; a name it lacks fails."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in RELOADER_ENV, f"the generated configuration uses $({name})"
        return RELOADER_ENV[name]

    expanded: dict[str, Any] = yaml.safe_load(re.sub(r"\$\((\w+)\)", value, yaml.safe_dump(config)))
    return expanded


@contextmanager
def _process(args: list[str], log: Path) -> Iterator[None]:
    """A host process logging to `log`, stopped on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def _log_tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log.exists() else ""


def _prometheus_version(metrics_bin: Path) -> str:
    """The version of the project's Prometheus, which the generated configuration targets."""
    out = subprocess.run(
        [str(metrics_bin / "prometheus"), "--version"], check=True, capture_output=True, text=True
    ).stdout
    return f"v{out.split()[2]}"


@contextmanager
def operator_config(
    kubectl: kube.Kubectl, kubeconfig: Path, namespace: str, jobs: set[str], interval: str = "2s"
) -> Iterator[dict[str, Any]]:
    """Run the Prometheus Operator over `namespace` and the stock Prometheus object there; yield
    the configuration it generates (for a host process: `for_host`) once it has `jobs`. The
    object is deleted and the operator stopped afterwards."""
    operator_bin = built_operator_bin()
    version = _prometheus_version(built_metrics_bin())
    with tempfile.TemporaryDirectory(prefix="prometheus-operator-") as tmp:
        log = Path(tmp) / "prometheus-operator.log"
        args = [
            str(operator_bin),
            *_api_flags(kubeconfig),
            f"--namespaces={namespace}",
            f"--web.listen-address=127.0.0.1:{_free_port()}",
        ]
        with _process(args, log):
            kubectl.apply(_prometheus_object(namespace, version, interval))
            try:
                yield for_host(_wait_for_config(kubectl, namespace, jobs, log), kubeconfig)
            finally:
                kubectl.run("-n", namespace, "delete", "prometheus", PROMETHEUS_NAME, check=False)


def _wait_for_config(
    kubectl: kube.Kubectl, namespace: str, jobs: set[str], operator_log: Path
) -> dict[str, Any]:
    """The generated configuration once it has `jobs`; fails with the operator's log."""

    def complete() -> dict[str, Any] | None:
        config = generated_config(kubectl, namespace)
        return config if config is not None and jobs <= job_names(config) else None

    try:
        return kube.wait_for(
            complete,
            what=f"the Prometheus Operator's configuration with the jobs {sorted(jobs)}",
            timeout_s=START_TIMEOUT_S * 2,
            interval_s=1,
        )
    except TimeoutError as timeout:
        seen = generated_config(kubectl, namespace)
        found = sorted(job_names(seen)) if seen else "no configuration"
        raise AssertionError(f"{timeout}; found {found}\n{_log_tail(operator_log)}") from None


@contextmanager
def stock_prometheus(
    kubectl: kube.Kubectl, kubeconfig: Path, namespace: str, jobs: set[str], interval: str = "2s"
) -> Iterator[MetricsPipeline]:
    """The project's Prometheus running the configuration the Prometheus Operator generates
    for the stock Prometheus object (`operator_config`), on a free port of 127.0.0.1."""
    metrics_bin = built_metrics_bin()
    with (
        operator_config(kubectl, kubeconfig, namespace, jobs, interval) as config,
        tempfile.TemporaryDirectory(prefix="stock-prometheus-") as tmp,
    ):
        state = Path(tmp)
        config_file = state / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        url = f"http://127.0.0.1:{_free_port()}"
        log = state / "prometheus.log"
        args = [
            str(metrics_bin / "prometheus"),
            f"--config.file={config_file}",
            f"--storage.tsdb.path={state / 'data'}",
            f"--web.listen-address={url.removeprefix('http://')}",
        ]
        with _process(args, log):
            kube.wait_for(
                lambda: _ready(url),
                what=f"Prometheus ready at {url}",
                timeout_s=START_TIMEOUT_S,
            )
            yield MetricsPipeline(url, state)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False
