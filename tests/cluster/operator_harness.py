"""Running the real operator (`disagg operator`) in cluster tests, and counting its requests.

- `OperatorProcess`: the console script as a subprocess (its log in a file); a clean stop is
  SIGTERM then exit code 0 with no traceback in the log.
- `ApiProxy`: a recording reverse proxy in front of the API server. The operator gets a
  kubeconfig pointing at it, so every request it sends (kopf's and its own) is counted on the
  wire, then forwarded to the real API server with the cluster's credentials.
- `free_port` and `scrape`: run the operator with `--metrics-port` and read its /metrics.
- `CHILD_KINDS`, `children` and `rendered_children`: what the operator made for a model, and
  what `render` says it should make (both from the operator's own tables, never a copied list).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from kubernetes import client, config
from prometheus_client.parser import text_string_to_metric_families

import kube
from disagg_operator.loading import load_resource
from disagg_operator.render import render
from disagg_operator.resources import CHILD_RESOURCES, HTTP_ROUTES, POD_MONITORS, SCALED_OBJECTS

DISAGG = Path(sys.executable).parent / "disagg"
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
HOP_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "accept-encoding", "keep-alive"}
)
DECODED_HEADERS = HOP_HEADERS | {"content-encoding"}
"""Response headers not passed on: the proxy's client session decompresses what it reads, so
a gzip answer (the API server compresses lists over 128 KiB) goes on as plain bytes; passed on
with its `Content-Encoding`, the operator's client failed to decode it and kopf listed again
and again, never watching."""
NOT_SERVED = (SCALED_OBJECTS, POD_MONITORS, HTTP_ROUTES)
"""Child kinds whose CRDs the local control plane lacks (KEDA, the Prometheus Operator, the
Gateway API: test_operator_http_route.py installs its CRDs for its own tests only)."""
CHILD_KINDS = ",".join(
    f"{r.plural}.{r.group}" if r.group else r.plural for r in CHILD_RESOURCES if r not in NOT_SERVED
)
"""Every kind the operator applies that the local control plane serves, as one `kubectl get`
argument."""


class OperatorProcess:
    """`disagg operator` run as a subprocess against one kubeconfig; `pythonpath` runs other
    sources of the packages (an earlier release's) ahead of the installed ones."""

    def __init__(
        self,
        kubeconfig: Path,
        namespaces: Sequence[str],
        log_path: Path,
        *extra: str,
        pythonpath: Sequence[Path] = (),
    ) -> None:
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.pythonpath = os.pathsep.join(str(path) for path in pythonpath)
        scope = [arg for ns in namespaces for arg in ("--namespace", ns)] or ["--all-namespaces"]
        self.args = [str(DISAGG), "operator", *scope, "--retry-delay", "2", *extra]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        """Start the operator and wait until kopf ran its startup activity."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"}
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=env)
        kube.wait_for(
            lambda: "Activity 'startup' succeeded" in self.log() or self.proc_exited(),
            what=f"the operator to start (log: {self.log_path})",
        )
        assert not self.proc_exited(), self.log()
        return self

    def proc_exited(self) -> bool:
        """Whether the process has ended."""
        return self.proc is not None and self.proc.poll() is not None

    def log(self) -> str:
        """Everything the operator printed so far."""
        return self.log_path.read_text() if self.log_path.exists() else ""

    def wait_log(self, text: str, timeout_s: float = 60) -> None:
        """Wait until `text` shows in the log."""
        kube.wait_for(
            lambda: text in self.log(), what=f"{text!r} in {self.log_path}", timeout_s=timeout_s
        )

    def stop(self) -> int:
        """SIGTERM, wait, return the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        """SIGKILL: no cleanup at all (a crashed pod)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)

    def assert_clean_stop(self) -> None:
        """Stop it and check it exited 0 without an unhandled exception."""
        code = self.stop()
        log = self.log()
        assert code == 0, f"operator exited {code}:\n{log[-4000:]}"
        assert "Traceback" not in log, log[-8000:]
        assert "failed with an exception" not in log, log[-8000:]


@dataclass(frozen=True)
class Request:
    """One request the proxy forwarded."""

    at: float
    method: str
    path: str
    query: str
    body: bytes = b""


@dataclass
class ApiProxy:
    """A recording HTTP -> HTTPS reverse proxy to the API server of `upstream_kubeconfig`."""

    upstream_kubeconfig: Path
    workdir: Path
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        cfg = client.Configuration()
        config.load_kube_config(str(self.upstream_kubeconfig), client_configuration=cfg)
        self._upstream = cfg.host.rstrip("/")
        self._ssl = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
        if cfg.cert_file:
            self._ssl.load_cert_chain(cfg.cert_file, cfg.key_file)
        token = (cfg.api_key or {}).get("authorization")
        self._auth = {"Authorization": token} if token else {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.kubeconfig = self.workdir / "proxy-kubeconfig.yaml"

    def __enter__(self) -> ApiProxy:
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "proxy", "cluster": {"server": f"http://127.0.0.1:{port}"}}
                    ],
                    "users": [{"name": "proxy", "user": {}}],
                    "contexts": [
                        {"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}
                    ],
                    "current-context": "proxy",
                }
            )
        )
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    async def _start(self) -> int:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, shutdown_timeout=2, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets
        port: int = server.sockets[0].getsockname()[1]
        return port

    async def _stop(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        at = time.monotonic()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        body = await request.read()
        self.requests.append(Request(at, request.method, request.path, request.query_string, body))
        async with self._session.request(
            request.method,
            self._upstream + request.path_qs,
            headers={**headers, **self._auth},
            data=body or None,
            ssl=self._ssl,
        ) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in DECODED_HEADERS
                },
            )
            try:
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except (ConnectionResetError, aiohttp.ClientError):
                pass  # the client went away (a watch it closed, or a stopped operator)
            return response

    def writes(self, since: float = 0.0) -> list[Request]:
        """Write requests (POST, PUT, PATCH, DELETE) forwarded after `since` (monotonic time)."""
        return [r for r in list(self.requests) if r.method in WRITE_METHODS and r.at >= since]


def is_peering(request: Request) -> bool:
    """A kopf peering keep-alive (or the peering object's creation at start)."""
    return "/kopfpeerings/" in request.path or "/clusterkopfpeerings/" in request.path


def apply_crds(kubectl: kube.Kubectl, crds_dir: Path) -> None:
    """Apply every CRD in crds/, wait until they are Established and their lists are served.
    Only these: another test's CRDs may be on their way out.

    Just after it is Established, a new CRD's list answers 429 while the API server's cache of
    it initializes; an operator started in that moment was once seen to reconcile nothing.
    """
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds_dir))
    names = kubectl("get", "-f", str(crds_dir), "-o", "jsonpath={.items[*].metadata.name}")
    crds = [f"crd/{name}" for name in names.split()]
    kubectl("wait", "--for=condition=Established", *crds, "--timeout=60s")
    for name in names.split():
        kube.wait_for(
            lambda name=name: (
                kubectl.run("get", name, "--all-namespaces", check=False).returncode == 0
            ),
            what=f"the API server to list {name}",
        )


def dmodel(kubectl: kube.Kubectl, namespace: str, name: str) -> dict[str, Any]:
    """The stored DisaggregatedModel."""
    obj: dict[str, Any] = kubectl.json("-n", namespace, "get", "dmodel", name)
    return obj


def children(
    kubectl: kube.Kubectl, namespace: str, name: str, *args: str, kinds: str = CHILD_KINDS
) -> list[dict[str, Any]]:
    """The live objects of `kinds` labelled as model `name`'s (`args`: more kubectl flags)."""
    selector = f"app.kubernetes.io/instance={name}"
    items: list[dict[str, Any]] = kubectl.json(
        "-n", namespace, "get", kinds, "-l", selector, *args
    )["items"]
    return items


def rendered_children(model: dict[str, Any]) -> list[str]:
    """`Kind/name` of every child `render` makes of a DisaggregatedModel manifest, sorted."""
    resource = load_resource(model)
    meta = resource.metadata
    return sorted(
        f"{m['kind']}/{m['metadata']['name']}"
        for m in render(meta.name, meta.namespace, resource.spec)
    )


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    """One status condition (empty when absent)."""
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind:
            found: dict[str, Any] = cond
            return found
    return {}


def wait_ready(
    kubectl: kube.Kubectl, namespace: str, name: str, timeout_s: float = 180
) -> dict[str, Any]:
    """Wait until the model is Ready at its current generation; return it."""

    def ready() -> dict[str, Any] | None:
        obj = dmodel(kubectl, namespace, name)
        status = obj.get("status", {})
        done = status.get("observedGeneration") == obj["metadata"]["generation"]
        return obj if done and kube.condition_true(obj, "Ready") else None

    def last_status() -> str:
        return yaml.safe_dump(dmodel(kubectl, namespace, name).get("status"))

    try:
        return kube.wait_for(
            ready, what=f"{namespace}/{name} Ready", timeout_s=timeout_s, interval_s=1
        )
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; last status:\n{last_status()}") from None


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    """A TCP port nothing listens on now (for the operator's --metrics-port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def scrape(port: int) -> Samples:
    """Every sample of the operator's /metrics, by (sample name, labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 when the series does not exist (nothing counted yet)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)
