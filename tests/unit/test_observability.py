"""The shipped Grafana dashboard and alerting rules read only series the code exports.

Every metric name in every dashboard query and alert expression must be one a registry
defines, in the form a scrape shows it (a counter's `_total`, a histogram's `_bucket`, `_sum`,
`_count`). The registries: the router's (`disagg_router.metrics.RouterMetrics`, instantiated
here), the connector's (`disagg_connector.stats`, read from its source because it imports vLLM,
which the unit tests do not install) and vLLM's own (`disagg_operator.engine_metrics`, listed
there once with the vLLM module that registers each). The rules are a valid PrometheusRule from
the chart, and the chart ships the same dashboard and rules as the files.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from disagg_operator.engine_metrics import SIGNALS, VLLM_SERIES
from disagg_operator.render import POD_TARGET_LABELS
from disagg_router.metrics import RouterMetrics
from helm_chart import CHART, by_kind, template

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = CHART / "files" / "grafana" / "disagg.json"
RULES = CHART / "files" / "prometheus" / "disagg-rules.yaml"
CONNECTOR_STATS = REPO / "connector" / "disagg_connector" / "stats.py"
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
}
"""The names a scrape shows for each metric type (prometheus_client's exposition)."""
CLASS_TYPES = {"_counter_cls": "counter", "_gauge_cls": "gauge", "_histogram_cls": "histogram"}
"""How vLLM's metric classes are named where the connector registers its series."""
PROMQL_WORDS = frozenset(
    {"and", "or", "unless", "offset", "bool", "by", "without", "on", "ignoring", "inf", "nan"}
)


def _scraped(name: str, kind: str) -> list[str]:
    return [name + suffix for suffix in SUFFIXES[kind]]


def _router_names() -> set[str]:
    registry: CollectorRegistry = RouterMetrics().registry
    return {
        scraped for family in registry.collect() for scraped in _scraped(family.name, family.type)
    }


def _connector_patterns() -> list[re.Pattern[str]]:
    """The connector's series from the source of `disagg_connector.stats`: every `name=` given
    to one of vLLM's metric classes, an f-string part standing for any one lowercase word."""
    patterns = []
    for node in ast.walk(ast.parse(CONNECTOR_STATS.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        kind = CLASS_TYPES.get(node.func.attr)
        name = next((k.value for k in node.keywords if k.arg == "name"), None)
        if kind is None or name is None:
            continue
        if isinstance(name, ast.Constant):
            base = re.escape(str(name.value))
        else:
            assert isinstance(name, ast.JoinedStr), ast.dump(name)
            base = "".join(
                re.escape(str(part.value)) if isinstance(part, ast.Constant) else "[a-z]+"
                for part in name.values
            )
        suffixes = "|".join(re.escape(s) for s in SUFFIXES[kind])
        patterns.append(re.compile(f"{base}({suffixes})"))
    return patterns


@cache
def known() -> tuple[frozenset[str], tuple[re.Pattern[str], ...]]:
    """Every scraped name the code exports: exact names, and the connector's patterns."""
    vllm = {scraped for s in VLLM_SERIES for scraped in _scraped(s.name, s.type)}
    return frozenset(_router_names() | vllm), tuple(_connector_patterns())


def is_exported(name: str) -> bool:
    names, patterns = known()
    return name in names or any(p.fullmatch(name) for p in patterns)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or Grafana's label_values query) reads."""
    expr = re.sub(r"label_values\(([^,]*),[^)]*\)", r"\1", expr)
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for match in re.finditer(r"(?<![A-Za-z0-9_:.])[A-Za-z_:][A-Za-z0-9_:]*", expr):
        after = expr[match.end() :].lstrip()
        word = match.group()
        if after.startswith("(") or word.lower() in PROMQL_WORDS:
            continue
        names.add(word)
    return names


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def dashboard_queries() -> Iterator[tuple[str, str]]:
    """(where, query) for every panel target and templating query of the dashboard."""
    board = dashboard()
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            yield f"variable {variable['name']}", variable["query"]["query"]


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return groups


def alert_expressions() -> Iterator[tuple[str, str]]:
    for group in rule_groups():
        for rule in group["rules"]:
            yield f"alert {rule['alert']}", rule["expr"]


def test_the_name_extractor_finds_names_and_nothing_else() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, pod) (rate(a:b_bucket{x="y",c=~"d|e"}[5m]))) '
        "/ on (pod) group_left(node) c_total offset 1h and vector(0) > 0.5 "
        'or label_values(g{namespace="$ns"}, app_kubernetes_io_instance)'
    )
    assert metric_names(expr) == {"a:b_bucket", "c_total", "g"}


def test_the_registries_are_read() -> None:
    assert is_exported("disagg_router_reuse_turns_total")
    assert is_exported("disagg_router_ttft_seconds_bucket")
    assert is_exported("vllm:disagg_kv_retained_blocks")
    assert is_exported("vllm:disagg_kv_offers_total")
    assert is_exported("vllm:time_to_first_token_seconds_count")
    assert not is_exported("disagg_router_reuse_turns"), "a counter is scraped as _total"
    assert not is_exported("vllm:disagg_kv_retained_blocks_total"), "a gauge has no suffix"
    assert not is_exported("vllm:num_requests_queued")


@pytest.mark.parametrize(
    ("where", "expr"), [*dashboard_queries(), *alert_expressions()], ids=lambda v: str(v)[:60]
)
def test_every_expression_reads_exported_series_only(where: str, expr: str) -> None:
    names = metric_names(expr)
    assert names, f"{where}: no metric in {expr}"
    unknown = sorted(name for name in names if not is_exported(name))
    assert not unknown, f"{where} reads series no registry exports: {unknown}"


def test_the_dashboard_shows_what_the_issue_asks_for() -> None:
    read = {name for _, expr in dashboard_queries() for name in metric_names(expr)}
    for name in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "disagg_router_reuse_turns_total",
        "disagg_router_reuse_prompt_tokens_total",
        "vllm:nixl_xfer_time_seconds_bucket",
        "vllm:nixl_bytes_transferred_sum",
        "vllm:disagg_kv_retained_blocks",
        "disagg_router_lease_releases_total",
        "vllm:num_requests_waiting",
    ):
        assert name in read, name


def test_the_dashboard_selects_by_the_labels_the_pod_monitors_copy() -> None:
    labels = {re.sub(r"[^A-Za-z0-9_]", "_", label) for label in POD_TARGET_LABELS}
    assert labels == {"app_kubernetes_io_instance", "app_kubernetes_io_component"}
    text = DASHBOARD.read_text() + RULES.read_text()
    for label in labels:
        assert label in text
    board = dashboard()
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel.get("description"), panel["title"]


def test_the_rules_are_alerts_with_a_severity_and_words() -> None:
    alerts = {}
    for group in rule_groups():
        assert set(group) == {"name", "rules"}
        for rule in group["rules"]:
            assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule
            assert re.fullmatch(r"[0-9]+[smh]", rule["for"])
            assert rule["labels"]["severity"] in {"warning", "critical"}
            assert set(rule["annotations"]) == {"summary", "description"}
            alerts[rule["alert"]] = rule
    assert set(alerts) == {
        "DisaggReuseHitRatioCollapsed",
        "DisaggKvTransfersFailingOverToRecompute",
        "DisaggKvOffersRecomputed",
        "DisaggDecodeKvSaturatedByRetention",
        "DisaggRouterErrors",
        "DisaggRouterStoreErrors",
    }


def test_the_chart_ships_the_rules_as_a_prometheus_rule() -> None:
    assert not by_kind(template(), "PrometheusRule")
    docs = template("monitoring.prometheusRule.enabled=true",
                    "monitoring.prometheusRule.labels.release=prom", namespace="ops")  # fmt: skip
    (rule,) = by_kind(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "ops"
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"] == {"groups": rule_groups()}


def test_the_chart_ships_the_dashboard_for_grafanas_sidecar() -> None:
    assert not [d for d in by_kind(template(), "ConfigMap") if "dashboard" in d["metadata"]["name"]]
    docs = template("monitoring.grafanaDashboard.enabled=true",
                    "monitoring.grafanaDashboard.namespace=grafana",
                    "monitoring.grafanaDashboard.annotations.grafana_folder=serving")  # fmt: skip
    (config_map,) = by_kind(docs, "ConfigMap")
    assert config_map["metadata"]["namespace"] == "grafana"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "serving"}
    assert json.loads(config_map["data"]["disagg.json"]) == dashboard()


ADAPTER_RULES = REPO / "deploy" / "prometheus-adapter" / "rules.yaml"


def _adapter_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = yaml.safe_load(ADAPTER_RULES.read_text())["rules"]
    return rules


def _selects(rule: dict[str, Any], series: str) -> bool:
    """Whether the rule's seriesQuery selects the scraped series `series`."""
    query = rule["seriesQuery"]
    exact = re.search(r'__name__="([^"]+)"', query)
    pattern = re.search(r'__name__=~"([^"]+)"', query)
    if exact:
        return exact.group(1) == series
    return pattern is not None and re.fullmatch(pattern.group(1), series) is not None


def _served(series: str) -> set[str]:
    """The custom metric names the adapter rules serve a scraped series under."""
    served = set()
    for rule in _adapter_rules():
        renamed = re.fullmatch(rule["name"]["matches"], series)
        if _selects(rule, series) and renamed:
            served.add(renamed.expand(re.sub(r"\$\{(\d+)\}", r"\\g<\1>", rule["name"]["as"])))
    return served


@pytest.mark.parametrize("signal", sorted(SIGNALS), ids=str)
def test_the_adapter_rules_serve_every_signal_under_the_hpa_default_name(signal: str) -> None:
    series = SIGNALS[signal].series  # type: ignore[index]
    scraped = series.name + ("_count" if series.type == "histogram" else "")
    assert SIGNALS[signal].hpa_metric in _served(scraped)  # type: ignore[index]


def test_the_adapter_queries_read_exported_series_only() -> None:
    scraped = sorted(known()[0])
    for rule in _adapter_rules():
        selected = [name for name in scraped if _selects(rule, name)]
        assert selected, rule["seriesQuery"]
        for series in selected:
            query = (
                rule["metricsQuery"]
                .replace("<<.Series>>", series)
                .replace("<<.LabelMatchers>>", 'pod="p"')
                .replace("<<.GroupBy>>", "pod")
            )
            for name in metric_names(query):
                assert is_exported(name), (name, rule["metricsQuery"])
