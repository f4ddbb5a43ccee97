"""Translate the chart's Grafana dashboard into the Perses resources that render it.

Grafana is under the AGPL and neither the Go module proxy nor the npm registry here serves it, so
the screenshot in docs is rendered by Perses (tests/cluster/metrics/dashboard-screenshot.sh),
whose Grafana migration needs plugin schemas that only its release archives carry. This covers
what charts/disagg-operator/files/grafana/disagg.json uses, one for one: rows become collapsible
grid sections, `timeseries` panels TimeSeriesChart panels (title, description, unit, legend)
with one PrometheusTimeSeriesQuery per target (expression, legend format), `label_values` query
variables PrometheusLabelValuesVariable list variables, and the `datasource` variable the
project's default Prometheus datasource. Anything else is refused by name, so the rendering
never silently drops part of the dashboard.

`python hack/grafana_to_perses.py DASHBOARD.json OUT_DIR --prometheus-url URL` writes
project.json and dashboard.json into OUT_DIR.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

Resource = dict[str, Any]

PROJECT = "disagg"
DATASOURCE = "prometheus"
# Grafana's unit ids against Perses's format units (ui/core/src/model/units in Perses).
UNITS = {
    "s": "seconds",
    "ms": "milliseconds",
    "percentunit": "percent-decimal",
    "percent": "percent",
    "short": "decimal",
    "none": "decimal",
    "bytes": "bytes",
    "Bps": "bytes/sec",
    "ops": "ops/sec",
    "reqps": "requests/sec",
    "cps": "counts/sec",
}
LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>[A-Za-z_]\w*)\)$")
# Grafana's datasource references this translation maps to the one Prometheus datasource.
# The datasource's scrape interval: the minimum step and a quarter of `$__rate_interval`, as
# in Grafana, whose Prometheus datasources assume 15s where they set none (Perses: 1m).
SCRAPE_INTERVAL = "15s"
# Perses's value of a list variable's "All" choice.
ALL_VALUE = "$__all"
DATASOURCE_REFS = {"${datasource}", "$datasource", DATASOURCE}


class DashboardError(ValueError):
    """A part of the Grafana dashboard that has no translation here."""


def _check_datasource(ref: Any, where: str) -> None:
    if ref is None:
        return
    if ref.get("type") != "prometheus" or ref.get("uid") not in DATASOURCE_REFS:
        raise DashboardError(
            f"{where}: datasource {ref!r} is not the dashboard's Prometheus datasource; "
            f"use {{'type': 'prometheus', 'uid': '${{datasource}}'}}"
        )


def _variable(variable: Resource) -> Resource | None:
    """A Grafana template variable as a Perses ListVariable (None for the datasource one)."""
    name = variable["name"]
    if variable["type"] == "datasource":
        if variable.get("query") != "prometheus":
            raise DashboardError(f"templating.{name}: only a prometheus datasource variable maps")
        return None
    if variable["type"] != "query":
        raise DashboardError(f"templating.{name}: type {variable['type']!r} has no translation")
    _check_datasource(variable.get("datasource"), f"templating.{name}")
    query = variable["query"]
    expression = query["query"] if isinstance(query, dict) else query
    match = LABEL_VALUES.match(expression.strip())
    if match is None:
        raise DashboardError(
            f"templating.{name}: query {expression!r} is not label_values(SELECTOR, LABEL)"
        )
    spec: Resource = {"labelName": match["label"]}
    if match["selector"]:
        spec["matchers"] = [match["selector"].strip()]
    translated: Resource = {
        "name": name,
        "display": {"name": variable.get("label", name), "hidden": variable.get("hide", 0) == 2},
        "allowAllValue": bool(variable.get("includeAll")),
        "allowMultiple": bool(variable.get("multi")),
        "sort": "alphabetical-asc" if variable.get("sort", 0) else "none",
        "plugin": {"kind": "PrometheusLabelValuesVariable", "spec": spec},
    }
    # Grafana selects "All" first where the dashboard stores no current value.
    if variable.get("includeAll") and not variable.get("current"):
        translated["defaultValue"] = ALL_VALUE
    return {"kind": "ListVariable", "spec": translated}


def _panel(panel: Resource) -> Resource:
    """A Grafana timeseries panel as a Perses TimeSeriesChart panel."""
    title = panel.get("title", "")
    if panel["type"] != "timeseries":
        raise DashboardError(f"panel {title!r}: type {panel['type']!r} has no translation")
    _check_datasource(panel.get("datasource"), f"panel {title!r}")
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
    if unit not in UNITS:
        raise DashboardError(f"panel {title!r}: unit {unit!r} is not one of {sorted(UNITS)}")
    legend = panel.get("options", {}).get("legend", {})
    queries = []
    for target in panel.get("targets", []):
        _check_datasource(target.get("datasource"), f"panel {title!r} target {target.get('refId')}")
        query: Resource = {"query": target["expr"]}
        if target.get("legendFormat"):
            query["seriesNameFormat"] = target["legendFormat"]
        queries.append(
            {
                "kind": "TimeSeriesQuery",
                "spec": {"plugin": {"kind": "PrometheusTimeSeriesQuery", "spec": query}},
            }
        )
    display = {"name": title}
    if panel.get("description"):
        display["description"] = panel["description"]
    return {
        "kind": "Panel",
        "spec": {
            "display": display,
            "plugin": {
                "kind": "TimeSeriesChart",
                "spec": {
                    "legend": {
                        "position": "right" if legend.get("placement") == "right" else "bottom",
                        "mode": "table" if legend.get("displayMode") == "table" else "list",
                    },
                    "yAxis": {"format": {"unit": UNITS[unit]}},
                },
            },
            "queries": queries,
        },
    }


def _layouts(grafana: Resource, panels: dict[str, Resource]) -> list[Resource]:
    """Rows as grid sections holding the panels that follow them, placed relative to the row
    (both use a 24-column grid)."""
    layouts: list[Resource] = []
    section: Resource | None = None
    top = 0
    for index, panel in enumerate(grafana.get("panels", [])):
        if panel["type"] == "row":
            if panel.get("panels"):
                raise DashboardError(f"row {panel.get('title')!r}: collapsed rows do not map")
            section = {
                "kind": "Grid",
                "spec": {
                    "display": {"title": panel.get("title", ""), "collapse": {"open": True}},
                    "items": [],
                },
            }
            layouts.append(section)
            top = panel["gridPos"]["y"] + panel["gridPos"]["h"]
            continue
        if section is None:
            section = {"kind": "Grid", "spec": {"items": []}}
            layouts.append(section)
        key = f"panel{index}"
        panels[key] = _panel(panel)
        grid = panel["gridPos"]
        section["spec"]["items"].append(
            {
                "x": grid["x"],
                "y": grid["y"] - top,
                "width": grid["w"],
                "height": grid["h"],
                "content": {"$ref": f"#/spec/panels/{key}"},
            }
        )
    return layouts


def _duration(value: str, field: str) -> str:
    match = re.fullmatch(r"now-(\d+[smhdw])", value)
    if match is None:
        raise DashboardError(f"{field}: {value!r} is not now-<duration>")
    return match[1]


def translate(grafana: Resource) -> Resource:
    """The Perses Dashboard resource of a Grafana dashboard model."""
    if grafana.get("annotations", {}).get("list"):
        raise DashboardError("annotations: annotation queries have no translation")
    if grafana.get("time", {}).get("to", "now") != "now":
        raise DashboardError("time.to: only a range ending now maps")
    variables = [
        translated
        for variable in grafana.get("templating", {}).get("list", [])
        if (translated := _variable(variable)) is not None
    ]
    panels: dict[str, Resource] = {}
    layouts = _layouts(grafana, panels)
    spec: Resource = {
        "display": {"name": grafana["title"], "description": grafana.get("description", "")},
        "duration": _duration(grafana.get("time", {}).get("from", "now-1h"), "time.from"),
        "variables": variables,
        "panels": panels,
        "layouts": layouts,
    }
    if grafana.get("refresh"):
        spec["refreshInterval"] = grafana["refresh"]
    return {
        "kind": "Dashboard",
        "metadata": {"name": grafana["uid"], "project": PROJECT},
        "spec": spec,
    }


def resources(grafana: Resource, prometheus_url: str) -> dict[str, Resource]:
    """The project and the dashboard, holding its default Prometheus datasource (the server
    proxies its queries). A datasource inside the dashboard is resolved from the dashboard
    itself; a project's datasource is looked up from a list the UI may not have loaded yet
    when the first panels query, which fails those panels."""
    dashboard = translate(grafana)
    proxy = {"kind": "HTTPProxy", "spec": {"url": prometheus_url}}
    dashboard["spec"]["datasources"] = {
        DATASOURCE: {
            "default": True,
            "plugin": {
                "kind": "PrometheusDatasource",
                "spec": {"proxy": proxy, "scrapeInterval": SCRAPE_INTERVAL},
            },
        }
    }
    return {
        "project": {"kind": "Project", "metadata": {"name": PROJECT}, "spec": {}},
        "dashboard": dashboard,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dashboard", type=Path, help="the Grafana dashboard JSON")
    parser.add_argument("out", type=Path, help="folder for project.json and dashboard.json")
    parser.add_argument("--prometheus-url", required=True, help="the datasource's Prometheus")
    args = parser.parse_args()
    try:
        written = resources(json.loads(args.dashboard.read_text()), args.prometheus_url)
    except DashboardError as error:
        print(f"grafana_to_perses: {args.dashboard}: {error}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for name, resource in written.items():
        (args.out / f"{name}.json").write_text(json.dumps(resource, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
