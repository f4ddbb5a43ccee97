"""values.yaml is documented and values.schema.json refuses bad values, naming them."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from disagg_operator.options import LOG_FORMATS, LOG_LEVELS
from helm_chart import CHART, helm

VALUES = CHART / "values.yaml"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())

# Blocks handed to Kubernetes as they are: their inner keys are Kubernetes fields, documented there.
VERBATIM = {
    "resources",
    "podSecurityContext",
    "securityContext",
    "livenessProbe",
    "readinessProbe",
}

BAD_VALUES = [
    ("replicaCount=-1", "/replicaCount", "minimum"),
    ("replicaCount=two", "/replicaCount", "integer"),
    ("logging.level=verbose", "/logging/level", "must be one of"),
    ("logging.format=xml", "/logging/format", "must be one of"),
    ("image.pullPolicy=Sometimes", "/image/pullPolicy", "must be one of"),
    ("image.digest=latest", "/image/digest", "does not match pattern"),
    ("image.repository=", "/image/repository", "minLength"),
    ("watch.namespaces={Team_A}", "/watch/namespaces/0", "does not match pattern"),
    ("watch.namespaces={a,a}", "/watch/namespaces", "items at 0 and 1 are equal"),
    ("health.port=70000", "/health/port", "maximum"),
    ("livenessProbe.periodSeconds=0", "/livenessProbe/periodSeconds", "minimum"),
    ("rbac.readSecrets=no", "/rbac/readSecrets", "boolean"),
    ("metrics.port=70000", "/metrics/port", "maximum"),
    ("metrics.port=0", "/metrics/port", "minimum"),
    ("metrics.enabled=yes", "/metrics/enabled", "boolean"),
    ("metrics.serviceMonitor.interval=often", "/metrics/serviceMonitor/interval", "pattern"),
    ("peering.name=Not_A_Name", "/peering/name", "does not match pattern"),
    ("reuse.interval=-1", "/reuse/interval", "minimum"),
    ("reuse.url=router.svc:8000", "/reuse/url", "does not match pattern"),
    ("replicas=2", "additional properties 'replicas'", "not allowed"),
    ("logging.colour=red", "additional properties 'colour'", "not allowed"),
]

CONTRADICTIONS = [
    (("replicaCount=2", "peering.enabled=false"), "replicaCount=2 needs peering.enabled=true"),
    (
        ("metrics.enabled=false", "metrics.serviceMonitor.enabled=true"),
        "metrics.serviceMonitor.enabled=true needs metrics.enabled=true",
    ),
    (("metrics.port=8080",), "metrics.port=8080 is health.port too"),
    (
        ("serviceAccount.create=false",),
        "serviceAccount.name: name an existing ServiceAccount",
    ),
]


def _sets(values: tuple[str, ...]) -> list[str]:
    return [arg for value in values for arg in ("--set", value)]


@pytest.mark.parametrize(("value", "where", "why"), BAD_VALUES, ids=[v[0] for v in BAD_VALUES])
def test_schema_refuses_a_bad_value_naming_it(value: str, where: str, why: str) -> None:
    proc = helm("template", "r", str(CHART), "--set", value, check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert where in proc.stderr and why in proc.stderr, proc.stderr


@pytest.mark.parametrize(("values", "message"), CONTRADICTIONS, ids=lambda v: str(v)[:40])
def test_contradictory_values_fail_with_a_message(values: tuple[str, ...], message: str) -> None:
    proc = helm("template", "r", str(CHART), *_sets(values), check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_log_choices_are_the_operators() -> None:
    logging = SCHEMA["properties"]["logging"]["properties"]
    assert logging["level"]["enum"] == list(LOG_LEVELS)
    assert logging["format"]["enum"] == list(LOG_FORMATS)


def test_the_defaults_pass_the_schema() -> None:
    assert helm("template", "r", str(CHART)).stdout


def _schema_paths(schema: dict[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for name, prop in schema.get("properties", {}).items():
        found[prefix + name] = prop
        found.update(_schema_paths(prop, f"{prefix}{name}."))
    return found


def _value_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    found = []
    for name, value in values.items():
        found.append(prefix + name)
        if isinstance(value, dict) and name not in VERBATIM:
            found.extend(_value_paths(value, f"{prefix}{name}."))
    return found


def test_every_value_is_in_the_schema_with_a_description() -> None:
    paths = _schema_paths(SCHEMA)
    for path in _value_paths(yaml.safe_load(VALUES.read_text())):
        assert path in paths, f"{path} is in values.yaml but not in values.schema.json"
        assert paths[path].get("description"), f"{path} has no description in the schema"


def test_schema_closes_every_section() -> None:
    for path, prop in _schema_paths(SCHEMA).items():
        if prop.get("type") == "object" and "properties" in prop:
            assert prop.get("additionalProperties") is False, f"{path} accepts unknown keys"


def test_every_value_has_a_comment() -> None:
    lines = VALUES.read_text().splitlines()
    key = re.compile(r"^(?P<indent> *)(?P<name>[A-Za-z][A-Za-z0-9]*):")
    verbatim_indent = -1
    for number, line in enumerate(lines):
        match = key.match(line)
        if not match:
            continue
        indent = len(match["indent"])
        if 0 <= verbatim_indent < indent:
            continue
        verbatim_indent = indent if match["name"] in VERBATIM else -1
        above = lines[number - 1].strip() if number else ""
        assert above.startswith("#"), f"values.yaml line {number + 1} has no comment: {line}"
