"""The operator's Prometheus metrics: what each counter counts, the /metrics endpoint, the
API client counting failed requests on the wire, and the `--metrics-port` flag."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families
from urllib3.exceptions import HTTPError

from disagg.cli import build_parser
from disagg_operator.conditions import Problem
from disagg_operator.kubeapi import ApiException, KubeApi
from disagg_operator.metrics import OperatorMetrics, serve
from disagg_operator.reconcile import Outcome
from disagg_operator.resources import DISAGGREGATED_MODELS, SECRETS
from disagg_operator.runner import run


def _value(metrics: OperatorMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    assert value is not None, f"no sample {name}{labels}"
    return float(value)


def test_pass_results_are_counted_and_timed() -> None:
    metrics = OperatorMetrics()
    for result in ("applied", "noop", "noop", "blocked", "error"):
        metrics.pass_finished(result, 0.02)
    counts = {
        r: _value(metrics, "disagg_operator_reconcile_passes_total", result=r)
        for r in ("applied", "noop", "blocked", "error")
    }
    assert counts == {"applied": 1, "noop": 2, "blocked": 1, "error": 1}
    assert _value(metrics, "disagg_operator_reconcile_duration_seconds_count") == 5
    assert _value(metrics, "disagg_operator_reconcile_duration_seconds_bucket", le="0.01") == 0
    assert _value(metrics, "disagg_operator_reconcile_duration_seconds_bucket", le="0.025") == 5


def test_child_applies_by_kind_and_action() -> None:
    metrics = OperatorMetrics()
    metrics.child_applied("StatefulSet", "create")
    metrics.child_applied("StatefulSet", "repair")
    metrics.child_applied("StatefulSet", "repair")
    metrics.child_applied("ConfigMap", "update")
    name = "disagg_operator_child_applies_total"
    assert _value(metrics, name, kind="StatefulSet", action="repair") == 2
    assert _value(metrics, name, kind="StatefulSet", action="create") == 1
    assert _value(metrics, name, kind="ConfigMap", action="update") == 1
    assert (
        metrics.registry.get_sample_value(name, {"kind": "ConfigMap", "action": "repair"}) is None
    )


def test_models_gauge_follows_each_models_latest_ready_status() -> None:
    metrics = OperatorMetrics()

    def models() -> dict[str, float]:
        return {
            s: _value(metrics, "disagg_operator_models", ready=s)
            for s in ("true", "false", "unknown")
        }

    assert models() == {"true": 0, "false": 0, "unknown": 0}
    metrics.model_ready("a", "False")
    metrics.model_ready("b", "False")
    metrics.model_ready("a", "True")
    assert models() == {"true": 1, "false": 1, "unknown": 0}
    metrics.forget_model("b")
    metrics.forget_model("never-seen")
    assert models() == {"true": 1, "false": 0, "unknown": 0}


def test_outcome_result_labels() -> None:
    assert Outcome().result == "noop"
    assert Outcome(applied=2).result == "applied"
    blocked = Outcome(applied=1, problems=[Problem("SecretNotFound", "create it")])
    assert blocked.result == "blocked"


def test_serve_exposes_every_series_over_http() -> None:
    metrics = OperatorMetrics()
    metrics.pass_finished("applied", 0.1)
    metrics.child_applied("Service", "create")
    server = serve(metrics, 0, address="127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {
        "disagg_operator_reconcile_passes",
        "disagg_operator_reconcile_duration_seconds",
        "disagg_operator_child_applies",
        "disagg_operator_models",
        "disagg_operator_api_errors",
        "process_resident_memory_bytes",
    } <= families.keys()
    applied = [
        s.value
        for s in families["disagg_operator_reconcile_passes"].samples
        if s.labels == {"result": "applied"} and s.name.endswith("_total")
    ]
    assert applied == [1.0]


class _Refusing(http.server.BaseHTTPRequestHandler):
    """An API server stand-in that refuses every PATCH (422) and finds nothing (404)."""

    def do_PATCH(self) -> None:
        self._answer(422, b'{"kind":"Status","message":"spec.replicas: Invalid value"}')

    def do_GET(self) -> None:
        self._answer(404, b'{"kind":"Status","reason":"NotFound"}')

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@contextlib.contextmanager
def _http_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


def _api(port: int, metrics: OperatorMetrics) -> KubeApi:
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    configuration.retries = 0
    return KubeApi(client.ApiClient(configuration), metrics)


def test_api_client_counts_error_answers_and_unreachable_servers() -> None:
    metrics = OperatorMetrics()
    with _http_server() as port:
        api = _api(port, metrics)
        name = "disagg_operator_api_errors_total"
        assert api.get(SECRETS, "ml", "token") is None
        sample = metrics.registry.get_sample_value(name, {"method": "GET", "code": "404"})
        assert sample is None, "get expects a 404: not a failed request"
        with pytest.raises(ApiException) as missing:
            api.request("GET", SECRETS.path("ml", "token"))
        assert missing.value.status == 404
        with pytest.raises(ApiException) as refused:
            api.patch_status(DISAGGREGATED_MODELS, "ml", "m", {"observedGeneration": 1})
        assert refused.value.status == 422
    assert _value(metrics, name, method="GET", code="404") == 1
    assert _value(metrics, name, method="PATCH", code="422") == 1

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        free_port = closed.getsockname()[1]
    with pytest.raises(HTTPError):
        _api(free_port, metrics).get(SECRETS, "ml", "token")
    assert _value(metrics, name, method="GET", code="connection") == 1


def test_metrics_port_flag() -> None:
    parser = build_parser()
    base = ["operator", "--all-namespaces"]
    assert parser.parse_args(base).metrics_port == 0
    assert parser.parse_args([*base, "--metrics-port=9090"]).metrics_port == 9090


@pytest.mark.parametrize("bad", ["70000", "-1", "http"])
def test_metrics_port_flag_refuses_a_bad_port(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["operator", "-A", f"--metrics-port={bad}"])
    err = capsys.readouterr().err
    assert "--metrics-port" in err and f"{bad!r} is not a port" in err, err


def test_a_taken_metrics_port_stops_the_operator_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = build_parser().parse_args(["operator", "-A", f"--metrics-port={port}"])
        assert run(args) == 2
    assert f"error: --metrics-port {port}:" in capsys.readouterr().err
