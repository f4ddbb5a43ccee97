"""The metrics pipeline's configuration, checked by the binaries built from the pinned modules
(tests/cluster/metrics/build-metrics.sh): promtool checks the chart's alerting rules as its
PrometheusRule carries them and runs their unit tests, checks the scrape config for clusters
without the Prometheus Operator (deploy/prometheus/prometheus.yml) and runs its relabeling and
that of the jobs the real Prometheus Operator generates from the rendered PodMonitors, for a
stock (kube-prometheus-stack) Prometheus object that selects them by label, over the same pods
of the local cluster (one-shot service discovery: no Prometheus server runs);
prometheus-adapter starts and loads its rules (deploy/prometheus-adapter/rules.yaml) without
serving."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import kube

# The sample CRs are shared with the unit tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from disagg_operator.models import DisaggregatedModelSpec
from disagg_operator.render import render
from dmodel_samples import EXAMPLES, load_example
from metrics_pipeline import built_metrics_bin
from operator_fixtures import REPO, small_model
from stock_prometheus import SELECTOR, install_crds, job_names, operator_config

CHART = REPO / "charts" / "disagg-operator"
RULES = CHART / "files" / "prometheus" / "disagg-rules.yaml"
RULES_TESTS = REPO / "deploy" / "prometheus" / "disagg-rules.test.yaml"
SCRAPE_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
ADAPTER_RULES = REPO / "deploy" / "prometheus-adapter" / "rules.yaml"
SCRAPE_JOB = "disagg"
SD_TIMEOUT = "5s"


@pytest.fixture(scope="module")
def metrics_bin() -> Path:
    """The folder of prometheus, promtool and prometheus-adapter, built (or found cached)."""
    return built_metrics_bin()


def _run(binary: Path, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """`binary args`, its output captured; the caller checks the exit code."""
    return subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )


def _passes(proc: subprocess.CompletedProcess[str]) -> str:
    """The output of a command that must succeed (its output is the failure message)."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    return output


def _alerts(groups: dict[str, Any]) -> set[str]:
    """The alert names of a rule file's groups."""
    return {rule["alert"] for group in groups["groups"] for rule in group["rules"]}


def test_the_chart_rules_pass_promtool_check(
    metrics_bin: Path, helm: kube.Tool, tmp_path: Path
) -> None:
    rules = yaml.safe_load(RULES.read_text())
    out = helm("template", "t", str(CHART), "--set", "monitoring.prometheusRule.enabled=true")
    (rule,) = (d for d in yaml.safe_load_all(out) if d and d["kind"] == "PrometheusRule")
    assert rule["spec"] == rules, "the PrometheusRule's spec is not the rule file"
    loaded = tmp_path / "prometheusrule-spec.yaml"
    loaded.write_text(yaml.safe_dump(rule["spec"]))
    promtool = metrics_bin / "promtool"
    out = _passes(_run(promtool, "check", "rules", str(RULES), str(loaded)))
    assert out.count(f"SUCCESS: {len(_alerts(rules))} rules found") == 2, out
    broken = copy.deepcopy(rules)
    broken["groups"][0]["rules"][0]["expr"] = "sum by (namespace) (rate(x[15m])"
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(broken))
    assert _run(promtool, "check", "rules", str(tmp_path / "broken.yaml")).returncode != 0


def test_every_alert_fires_on_its_case_and_stays_quiet_on_the_other(metrics_bin: Path) -> None:
    tests = yaml.safe_load(RULES_TESTS.read_text())
    assert tests["rule_files"] == [str(Path("..", "..", RULES.relative_to(REPO)))]
    fired = {
        case["alertname"]
        for test in tests["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert fired == _alerts(yaml.safe_load(RULES.read_text()))
    out = _passes(_run(metrics_bin / "promtool", "test", "rules", str(RULES_TESTS)))
    assert "SUCCESS" in out, out


def test_the_scrape_config_passes_promtool_check(metrics_bin: Path) -> None:
    out = _passes(_run(metrics_bin / "promtool", "check", "config", str(SCRAPE_CONFIG)))
    rules = len(_alerts(yaml.safe_load(RULES.read_text())))
    assert "SUCCESS: 1 rule files found" in out, out
    assert f"Checking {RULES}\n  SUCCESS: {rules} rules found" in out, out
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    assert [job["job_name"] for job in config["scrape_configs"]] == [SCRAPE_JOB]


def _stand_in_pods(manifests: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    """Pods as the workload controllers would make them from the rendered workloads, bound to
    a fake node (stand-ins for the StatefulSet, Deployment and LeaderWorkerSet controllers: the
    templates' labels and containers with their ports; kwok runs them and gives them an IP):
    two per StatefulSet, one per Deployment, a LeaderWorkerSet group's leader and worker, and
    a decoy worker made from the leader's template (its serving port must not be scraped)."""
    templates: list[tuple[str, dict[str, Any], dict[str, str]]] = []
    for m in manifests:
        name, spec = m["metadata"]["name"], m.get("spec", {})
        if m["kind"] == "StatefulSet":
            templates += [(f"{name}-{i}", spec["template"], {}) for i in range(2)]
        elif m["kind"] == "Deployment":
            templates.append((f"{name}-0", spec["template"], {}))
        elif m["kind"] == "LeaderWorkerSet":
            group = spec["leaderWorkerTemplate"]
            index = "leaderworkerset.sigs.k8s.io/worker-index"
            templates.append((f"{name}-0", group["leaderTemplate"], {index: "0"}))
            templates.append((f"{name}-0-1", group["workerTemplate"], {index: "1"}))
            templates.append((f"{name}-0-2", group["leaderTemplate"], {index: "2"}))
    pods = []
    for name, template, extra in templates:
        containers = [
            {"name": c["name"], "image": c["image"], "ports": c.get("ports", [])}
            for c in template["spec"]["containers"]
        ]
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": {**template["metadata"]["labels"], **extra}},
                "spec": {
                    "nodeName": node,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": containers,
                },
            }
        )
    return pods


def _targets(promtool: Path, config: Path, job: str) -> list[dict[str, str]]:
    """The label sets of the targets `job` keeps after relabeling (promtool's one-shot service
    discovery, `SD_TIMEOUT` long)."""
    proc = _run(promtool, "check", "service-discovery", f"--timeout={SD_TIMEOUT}", str(config), job)
    _passes(proc)
    results = json.loads(proc.stdout)
    assert all(not r.get("error") for r in results), results
    return [r["labels"] for r in results if r["labels"]]


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """A target's labels, comparable, without the `__tmp` ones that only relabeling reads
    (the Prometheus Operator's job carries its name in one)."""
    return tuple(sorted((k, v) for k, v in labels.items() if not k.startswith("__tmp")))


@pytest.fixture
def monitored_models(kubectl: kube.Kubectl, namespace: str) -> Iterator[list[dict[str, Any]]]:
    """Two models with PodMonitors on, labelled for the stock Prometheus, rendered by the
    operator's builders: a small one (StatefulSets) and the two-node example (LeaderWorkerSets),
    their PodMonitors applied, their stand-in pods running on a fake node, and a pod of another
    app with the same component labels and port; plus a PodMonitor without the label. Yields the
    rendered manifests."""
    monitoring = {"podMonitors": True, "labels": SELECTOR}
    small = small_model("small", namespace, monitoring=monitoring)
    (two_node_path,) = (e for e in EXAMPLES if "2node" in e.name)
    two_node = load_example(two_node_path)
    two_node["spec"]["monitoring"] = monitoring
    manifests = [
        m
        for name, cr in (("small", small), ("twonode", two_node))
        for m in render(name, namespace, DisaggregatedModelSpec.model_validate(cr["spec"]))
    ]
    nodes = kubectl.json("get", "nodes", "-l", "type=kwok")["items"]
    pods = _stand_in_pods(manifests, nodes[0]["metadata"]["name"])
    (router,) = (p for p in pods if p["metadata"]["name"] == "small-router-0")
    other = copy.deepcopy(router)
    other["metadata"]["name"] = "other-app-0"
    other["metadata"]["labels"]["app.kubernetes.io/name"] = "other"
    monitors = [m for m in manifests if m["kind"] == "PodMonitor"]
    unselected = copy.deepcopy(monitors[0])
    unselected["metadata"]["name"] = "unselected"
    unselected["metadata"]["labels"] = {}
    install_crds(kubectl)
    kubectl.apply([*pods, other, *monitors, unselected], "-n", namespace)
    kube.wait_for(
        lambda: all(
            p.get("status", {}).get("podIP")
            for p in kubectl.json("-n", namespace, "get", "pods")["items"]
        ),
        what="IPs for the stand-in pods",
    )
    yield manifests


def test_the_scrape_config_selects_what_the_pod_monitors_select(
    metrics_bin: Path,
    kubeconfig: Path,
    kubectl: kube.Kubectl,
    namespace: str,
    monitored_models: list[dict[str, Any]],
    tmp_path: Path,
) -> None:
    """The scrape config's job and the jobs the real Prometheus Operator generates for the
    PodMonitors a stock Prometheus selects keep the same targets with the same labels."""
    monitors = [m for m in monitored_models if m["kind"] == "PodMonitor"]
    assert len(monitors) == 6
    jobs = {f"podMonitor/{namespace}/{m['metadata']['name']}/0" for m in monitors}
    with operator_config(kubectl, kubeconfig, namespace, jobs) as generated:
        assert job_names(generated) == jobs, "the unlabelled PodMonitor was selected"
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    (job,) = config["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    sd = {"role": "pod", "kubeconfig_file": str(kubeconfig), "namespaces": {"names": [namespace]}}
    job["kubernetes_sd_configs"] = [sd]
    config["scrape_configs"] += generated["scrape_configs"]
    config.pop("rule_files")
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    promtool = metrics_bin / "promtool"

    ours = sorted(map(_key, _targets(promtool, path, SCRAPE_JOB)))
    theirs = sorted(
        _key(labels) for j in sorted(jobs) for labels in _targets(promtool, path, j)
    )  # fmt: skip
    only = {"scrape config": set(ours) - set(theirs), "PodMonitors": set(theirs) - set(ours)}
    assert ours == theirs, f"targets kept by one side only: {only}"
    pods = {dict(k)["pod"] for k in ours}
    assert pods == {
        "small-prefill-0", "small-prefill-1", "small-decode-0", "small-decode-1",
        "small-router-0", "twonode-prefill-0", "twonode-decode-0", "twonode-router-0",
    }  # fmt: skip
    (decode,) = (dict(k) for k in ours if dict(k)["pod"] == "twonode-decode-0")
    assert {k: v for k, v in decode.items() if not k.startswith("__")} == {
        "app_kubernetes_io_component": "decode",
        "app_kubernetes_io_instance": "twonode",
        "container": "vllm",
        "endpoint": "http",
        "instance": decode["__address__"],
        "job": f"{namespace}/twonode-decode",
        "namespace": namespace,
        "pod": "twonode-decode-0",
    }


def test_the_adapter_starts_and_loads_its_rules(metrics_bin: Path, tmp_path: Path) -> None:
    """`--help` prints the usage with the rules flag (and exits 2, as its flag library
    does on --help); with the rules and a kubeconfig that does not exist the
    adapter gets past loading its rules (strictly: unknown fields fail) and stops where it
    first needs the cluster, to build the custom metrics provider the rules ask for (it never
    serves). The same run with a broken rule file stops at loading it."""
    adapter = metrics_bin / "prometheus-adapter"
    usage = _run(adapter, "--help")
    assert usage.returncode == 2, usage.stderr
    assert usage.stderr.startswith(f"Usage of {adapter}:"), usage.stderr
    assert re.search(r"^ +--config string ", usage.stderr, re.MULTILINE), usage.stderr
    missing = tmp_path / "no-kubeconfig"

    def start(rules: Path) -> str:
        proc = _run(adapter, f"--config={rules}", f"--lister-kubeconfig={missing}",
                    "--prometheus-url=http://127.0.0.1:1", timeout_s=60)  # fmt: skip
        assert proc.returncode != 0
        return proc.stderr

    err = start(ADAPTER_RULES)
    assert "unable to load metrics discovery config" not in err, err
    assert "unable to construct custom metrics provider: unable to construct RESTMapper" in err
    assert str(missing) in err, err
    rules = yaml.safe_load(ADAPTER_RULES.read_text())
    rules["rules"][0]["seriesQueries"] = rules["rules"][0].pop("seriesQuery")
    broken = tmp_path / "broken-rules.yaml"
    broken.write_text(yaml.safe_dump(rules))
    assert "unable to load metrics discovery config" in start(broken)
