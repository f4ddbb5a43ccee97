"""The translation of the chart's Grafana dashboard into the Perses resources that render it
for the screenshot in docs (hack/grafana_to_perses.py)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from grafana_to_perses import ALL_VALUE, UNITS, DashboardError, resources, translate

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "charts" / "disagg-operator" / "files" / "grafana" / "disagg.json"


def grafana() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def test_every_panel_and_query_of_the_dashboard_is_kept() -> None:
    source = grafana()
    spec = translate(source)["spec"]
    graphs = [panel for panel in source["panels"] if panel["type"] != "row"]
    rows = [panel["title"] for panel in source["panels"] if panel["type"] == "row"]
    panels = list(spec["panels"].values())
    assert [panel["spec"]["display"]["name"] for panel in panels] == [g["title"] for g in graphs]
    for graph, panel in zip(graphs, panels, strict=True):
        queries = [query["spec"]["plugin"]["spec"] for query in panel["spec"]["queries"]]
        assert [query["query"] for query in queries] == [t["expr"] for t in graph["targets"]]
        assert [query["seriesNameFormat"] for query in queries] == [
            target["legendFormat"] for target in graph["targets"]
        ]
        unit = panel["spec"]["plugin"]["spec"]["yAxis"]["format"]["unit"]
        assert unit == UNITS[graph["fieldConfig"]["defaults"]["unit"]]
    assert [layout["spec"]["display"]["title"] for layout in spec["layouts"]] == rows
    referenced = [
        item["content"]["$ref"].removeprefix("#/spec/panels/")
        for layout in spec["layouts"]
        for item in layout["spec"]["items"]
    ]
    assert referenced == list(spec["panels"])


def test_panels_keep_their_place_below_their_row() -> None:
    spec = translate(grafana())["spec"]
    first = spec["layouts"][1]["spec"]["items"]
    assert [(i["x"], i["y"], i["width"], i["height"]) for i in first] == [
        (0, 0, 12, 8),
        (12, 0, 12, 8),
        (0, 8, 12, 8),
        (12, 8, 12, 8),
    ]


def test_label_values_variables_become_prometheus_list_variables_on_all() -> None:
    variables = translate(grafana())["spec"]["variables"]
    assert [v["spec"]["name"] for v in variables] == ["namespace", "model"]
    model = variables[1]["spec"]
    assert model["plugin"] == {
        "kind": "PrometheusLabelValuesVariable",
        "spec": {
            "labelName": "app_kubernetes_io_instance",
            "matchers": ['disagg_router_requests_total{namespace=~"$namespace"}'],
        },
    }
    assert model["allowAllValue"] and model["allowMultiple"]
    assert model["defaultValue"] == ALL_VALUE


def test_the_dashboard_holds_its_default_prometheus_behind_the_proxy() -> None:
    written = resources(grafana(), "http://127.0.0.1:9090")
    assert written["dashboard"]["metadata"]["project"] == written["project"]["metadata"]["name"]
    (datasource,) = written["dashboard"]["spec"]["datasources"].values()
    assert datasource["default"] is True
    assert datasource["plugin"]["kind"] == "PrometheusDatasource"
    assert datasource["plugin"]["spec"]["proxy"]["spec"]["url"] == "http://127.0.0.1:9090"
    assert datasource["plugin"]["spec"]["scrapeInterval"] == "15s"


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("panels", 1, "type"), "stat", "type 'stat' has no translation"),
        (("panels", 1, "fieldConfig", "defaults", "unit"), "furlongs", "unit 'furlongs'"),
        (("panels", 1, "datasource", "uid"), "loki", "is not the dashboard's Prometheus"),
        (("templating", "list", 1, "query", "query"), "up", "is not label_values"),
        (("templating", "list", 1, "type"), "custom", "type 'custom' has no translation"),
        (("time", "from"), "2024-01-01", "time.from"),
    ],
)
def test_what_has_no_translation_is_refused_by_name(
    path: tuple[str | int, ...], value: str, message: str
) -> None:
    source = copy.deepcopy(grafana())
    node: Any = source
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(DashboardError, match=message.replace("(", r"\(")):
        translate(source)


def test_the_command_writes_the_resources(tmp_path: Path) -> None:
    script = REPO / "hack" / "grafana_to_perses.py"
    command = [sys.executable, str(script), str(DASHBOARD), str(tmp_path)]
    run = subprocess.run([*command, "--prometheus-url", "http://127.0.0.1:1"], check=False)
    assert run.returncode == 0
    kinds = {path.name: json.loads(path.read_text())["kind"] for path in tmp_path.iterdir()}
    assert kinds == {
        "project.json": "Project",
        "dashboard.json": "Dashboard",
    }
