"""Reuse health on the control plane (issue 17): the real operator reads a router stand-in's
reuse summary into `status.reuse`, `kubectl get dmodel` shows it in the REUSE column, a changed
summary updates it, and a stand-in that stops answering leaves the last figures (marked stale
once) without flapping the status, making the model Degraded or writing in steady state.

The router pods here are kwok's (no container runs), so `RouterStandIn`, an HTTP server in this
test, serves the ReuseSummary the real router serves; the operator is pointed at it with
`--reuse-url`. The engine tests read the real router.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import kube
from disagg_contract import REUSE_SUMMARY_PATH, ReuseSummary
from disagg_operator.reuse import STALE_AFTER
from operator_fixtures import StartOperator, crds, small_model, start_operator  # noqa: F401
from operator_harness import ApiProxy, condition, dmodel, is_peering, wait_ready

NAME = "m"
INTERVAL_S = 1.0
QUIET_S = 6.0
"""Several readings with nothing new: no write may happen."""


class RouterStandIn:
    """A stand-in for `disagg router`'s reuse summary: GET /<namespace>/<name>/disagg/v1/reuse
    answers the summary set for that model (404 for any other path); `stop` makes it
    unreachable (connection refused) and `start` brings it back on the same port."""

    def __init__(self) -> None:
        self.summaries: dict[str, ReuseSummary] = {}
        self.reads = 0
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def set(
        self,
        namespace: str,
        name: str,
        *,
        turns: int,
        hits: int,
        reused_tokens: int = 0,
        leases_held: int = 0,
    ) -> None:
        """Serve these counters for model `namespace/name`."""
        self.summaries[f"/{namespace}/{name}{REUSE_SUMMARY_PATH}"] = {
            "turns": turns,
            "hits": hits,
            "reused_tokens": reused_tokens,
            "recomputed_tokens": 100 * (turns - hits),
            "leases_held": leases_held,
            "released": {"superseded": max(turns - leases_held, 0)},
            "store_errors": 0,
        }

    def start(self) -> RouterStandIn:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                summary = stand_in.summaries.get(self.path)
                stand_in.reads += 1
                body = json.dumps(summary).encode()
                self.send_response(200 if summary is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        self._server = None

    @property
    def url_template(self) -> str:
        """The operator's --reuse-url for this stand-in."""
        return f"http://127.0.0.1:{self.port}/{{namespace}}/{{name}}"


@pytest.fixture
def router_stand_in() -> Iterator[RouterStandIn]:
    stand_in = RouterStandIn().start()
    yield stand_in
    if stand_in._server is not None:
        stand_in.stop()


def _reuse_column(kubectl: kube.Kubectl, namespace: str) -> str:
    """The REUSE cell of `kubectl get dmodel`, cut out under its header (empty when unset)."""
    header, row = kubectl("-n", namespace, "get", "dmodel", NAME).splitlines()
    start = header.index("REUSE")
    end = header.index("AGE", start)
    return row[start:end].strip()


def _wait_column(kubectl: kube.Kubectl, namespace: str, value: str) -> None:
    kube.wait_for(
        lambda: _reuse_column(kubectl, namespace) == value,
        what=f"REUSE {value} in kubectl get dmodel",
        timeout_s=30,
    )


def _status_writes(proxy: ApiProxy, since: float) -> list[str]:
    return [w.path for w in proxy.writes(since=since) if not is_peering(w)]


def test_reuse_column_follows_the_router_stand_in_and_does_not_flap(
    kubectl: kube.Kubectl,
    kubeconfig: Path,
    namespace: str,
    start_operator: StartOperator,  # noqa: F811
    router_stand_in: RouterStandIn,
    tmp_path: Path,
) -> None:
    with ApiProxy(kubeconfig, tmp_path) as proxy:
        operator = start_operator(
            "--reuse-url",
            router_stand_in.url_template,
            "--reuse-interval",
            str(INTERVAL_S),
            kubeconfig_path=proxy.kubeconfig,
        )
        kubectl.apply(small_model(NAME, namespace))
        wait_ready(kubectl, namespace, NAME)
        assert _reuse_column(kubectl, namespace) == "", "nothing served yet: no reuse"

        router_stand_in.set(namespace, NAME, turns=4, hits=1, reused_tokens=900)
        _wait_column(kubectl, namespace, "25.0%")
        reuse = dmodel(kubectl, namespace, NAME)["status"]["reuse"]
        assert reuse["turns"] == 4 and reuse["reusedTokens"] == 900 and reuse["routers"] == 1
        assert "stale" not in reuse

        mark, reads = time.monotonic(), router_stand_in.reads
        time.sleep(QUIET_S)
        assert router_stand_in.reads > reads + 2, "the operator kept reading the stand-in"
        assert _status_writes(proxy, mark) == [], "the same summary again: no write"

        router_stand_in.set(namespace, NAME, turns=8, hits=6, reused_tokens=5000, leases_held=2)
        _wait_column(kubectl, namespace, "75.0%")
        fresh = dmodel(kubectl, namespace, NAME)["status"]["reuse"]
        assert fresh["leasesHeld"] == 2

        router_stand_in.stop()
        mark = time.monotonic()
        time.sleep(INTERVAL_S * (STALE_AFTER + 2) + QUIET_S)
        model = dmodel(kubectl, namespace, NAME)
        stale = model["status"]["reuse"]
        writes = _status_writes(proxy, mark)
        assert _reuse_column(kubectl, namespace) == "75.0%", "the last figures stay"
        assert stale["stale"] is True and "no reading since" in stale["message"], stale
        assert {k: v for k, v in stale.items() if k not in ("stale", "message")} == fresh
        assert len(writes) == 1 and writes[0].endswith("/status"), writes
        assert condition(model, "Degraded")["status"] == "False"
        assert condition(model, "Ready")["status"] == "True"

        router_stand_in.start()
        _wait_column(kubectl, namespace, "75.0%")
        kube.wait_for(
            lambda: "stale" not in dmodel(kubectl, namespace, NAME)["status"]["reuse"],
            what="the stale marker to go once the stand-in answers again",
            timeout_s=30,
        )
        operator.assert_clean_stop()
