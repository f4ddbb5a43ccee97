"""The operator's rendered engines running for real: the operator chart's pod reconciles the CPU
demo model (examples/demo-cpu.yaml, filled in by demo/model.py) into prefill, decode and router
pods on the real node, the model turns Ready only once its pods pass their /health probes, a
conversation through the router pod reads decode's KV back on turn 2 and answers as a
recomputed turn does, and a decode pod deleted between turns comes back while the next turn
recomputes without a client error, the operator pod killed while it reconciles a change
converges when its Deployment brings it back, a connector config change rolls the engine
pods while the turns after it still reuse, decode scaled from two pods to one mid-conversation
moves the leaving pod's conversations without an error, and each role, once autoscaled, scales
out on its own signal through the real metrics pipeline (tests/cluster/metrics) and back."""

from __future__ import annotations

import ipaddress
import itertools
import json
import math
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from demo_model import (
    ANSWER_TOKENS,
    MODEL,
    READY_TIMEOUT_S,
    REPO,
    TURN_TIMEOUT_S,
    demo_model,
    reused_tokens,
)

import kube
from disagg.bench import prometheus
from disagg.bench.client import REUSED_TOKENS, ChatClient
from disagg_connector.offer_form import Direction
from disagg_connector.reuse_plan import Verdict
from disagg_contract import ENGINE_PORT, EXTRA_DECODER_TTL
from disagg_operator.engine_metrics import REQUESTS_RUNNING, SIGNALS
from disagg_operator.kubeapi import FIELD_MANAGER
from disagg_operator.models import DRAIN_DELAY_SECONDS
from metrics_pipeline import (
    MetricsPipeline,
    custom_metric,
    metrics_pipeline,
    replica_owners,
    spec_replicas,
)
from stock_prometheus import SELECTOR as STOCK_SELECTOR
from stock_prometheus import install_crds, stock_prometheus

STOCK_SCRAPE_INTERVAL = "2s"
"""The PodMonitors' and the ServiceMonitor's scrape interval: a few turns make series."""


@dataclass
class Readiness:
    """What a watcher saw while the model started: (model Ready, every engine pod Ready)."""

    samples: list[tuple[bool, bool]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Served:
    """The running model: its namespace, router and prefill URLs, and the start-up watch."""

    namespace: str
    router: str
    prefill: str
    readiness: Readiness

    def prefill_url(self, kubectl: kube.Kubectl) -> str:
        """The prefill pod's base URL now (a rolled pod has a new IP)."""
        (pod,) = _engine_pods(kubectl, self.namespace, "prefill")
        return f"http://{pod['status']['podIP']}:8000"


def _engine_pods(kubectl: kube.Kubectl, namespace: str, *roles: str) -> list[dict[str, Any]]:
    """The model's pods of `roles` (default: prefill and decode)."""
    pods: list[dict[str, Any]] = kubectl.json(
        "-n", namespace, "get", "pods", "-l", f"app.kubernetes.io/instance={MODEL}"
    )["items"]
    wanted = roles or ("prefill", "decode")
    return [
        pod
        for pod in pods
        if pod["metadata"]["labels"].get("app.kubernetes.io/component") in wanted
        and "deletionTimestamp" not in pod["metadata"]
    ]


def _model_ready(kubectl: kube.Kubectl, namespace: str) -> bool:
    model = kubectl.json("-n", namespace, "get", "dmodel", MODEL)
    return kube.condition_true(model, "Ready")


def _watch(kubectl: kube.Kubectl, namespace: str, readiness: Readiness) -> None:
    """Sample the model's Ready condition against its pods' until told to stop."""
    while not readiness.stop.wait(2):
        pods = _engine_pods(kubectl, namespace)
        pods_ready = len(pods) == 2 and all(kube.condition_true(p, "Ready") for p in pods)
        readiness.samples.append((_model_ready(kubectl, namespace), pods_ready))


IDLE_TIMEOUT_S = 480
"""The router's idle timeout for the e2e model: the decoder TTL. The demo binds every decode pod to
one core, so while a test runs two decode pods, one streaming a long answer starves the other's
steps (a minute without one was seen); the turns the test sends meanwhile to some conversations
(a drain's moved turns) can keep the others idle past the default 120 s, and the router would then
rightly release their retained KV before the turn that checks they read it back."""


def _model_manifest(images: dict[str, str], namespace: str) -> str:
    """The demo model on the images built here, its PodMonitors on for the stock Prometheus, its
    conversations kept while idle for the decoder TTL (IDLE_TIMEOUT_S)."""
    model = demo_model(images, namespace)
    ttl = model["spec"]["kvTransfer"]["decoderKvBlocksTtlSeconds"]
    assert ttl >= IDLE_TIMEOUT_S, f"the demo's decoder TTL {ttl} s is below {IDLE_TIMEOUT_S} s"
    model["spec"]["kvTransfer"]["idleTimeoutSeconds"] = IDLE_TIMEOUT_S
    model["spec"]["monitoring"] = {
        "podMonitors": True,
        "interval": STOCK_SCRAPE_INTERVAL,
        "labels": STOCK_SELECTOR,
    }
    return yaml.safe_dump(model)


@pytest.fixture(scope="module")
def served(
    kubectl: kube.Kubectl,
    helm: kube.Tool,
    images: dict[str, str],
    install_operator: Callable[..., None],
    pods_report: Callable[[str], str],
    heavy_lock: None,
) -> Iterator[Served]:
    """The operator chart (its ServiceMonitor on) and the demo model (its PodMonitors on) in a
    namespace of their own, the model Ready. The Prometheus Operator's CRDs are installed
    first: the operator finds the kinds it applies when it starts."""
    namespace = kube.namespace_name("engine-pods")
    kubectl("create", "namespace", namespace)
    readiness = Readiness()
    watcher = threading.Thread(target=_watch, args=(kubectl, namespace, readiness), daemon=True)
    try:
        install_crds(kubectl)
        install_operator(
            "engines",
            namespace,
            "metrics.serviceMonitor.enabled=true",
            f"metrics.serviceMonitor.interval={STOCK_SCRAPE_INTERVAL}",
            *(f"metrics.serviceMonitor.labels.{k}={v}" for k, v in STOCK_SELECTOR.items()),
        )
        kubectl("-n", namespace, "apply", "-f", "-", input=_model_manifest(images, namespace))
        watcher.start()
        try:
            kube.wait_for(
                lambda: _model_ready(kubectl, namespace),
                what=f"{MODEL} Ready (its engine pods passing /health)",
                timeout_s=READY_TIMEOUT_S,
                interval_s=5,
            )
        except TimeoutError as timeout:
            pytest.fail(f"{timeout}\n{pods_report(namespace)}", pytrace=False)
        finally:
            readiness.stop.set()
            watcher.join(timeout=30)
        service = kubectl.json("-n", namespace, "get", "service", f"{MODEL}-router")
        port = service["spec"]["ports"][0]["port"]
        router = f"http://{service['spec']['clusterIP']}:{port}"
        kube.wait_for(
            lambda: _answers(f"{router}/health"),
            what="the router Service from the host (kube-proxy)",
            timeout_s=120,
        )
        (prefill,) = _engine_pods(kubectl, namespace, "prefill")
        yield Served(namespace, router, f"http://{prefill['status']['podIP']}:8000", readiness)
    finally:
        readiness.stop.set()
        helm.run("uninstall", "engines", "-n", namespace, "--wait", check=False)
        kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _conversation(turn: int) -> list[dict[str, str]]:
    """A first user message long enough to fill many KV blocks, then short follow-ups."""
    facts = " ".join(f"Fact {i}: the value of item {i} is {i * 7 % 101}." for i in range(120))
    return [{"role": "user", "content": f"Remember these. {facts} Turn {turn}: summarise item 3."}]


def _turns(client: ChatClient, model: str, conversation_id: str | None) -> tuple[str, str]:
    """Two turns of one conversation (the second resends the first and its answer)."""
    messages = _conversation(1)
    first = client.turn(model, messages, ANSWER_TOKENS, conversation_id)
    follow_up = [
        *messages,
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "And item 4?"},
    ]
    second = client.turn(model, follow_up, ANSWER_TOKENS, conversation_id)
    return first.text, second.text


def test_the_model_is_ready_only_once_its_pods_pass_their_probes(
    served: Served, kubectl: kube.Kubectl, node_env: dict[str, str]
) -> None:
    samples = served.readiness.samples
    assert samples, "the watcher took no sample while the model started"
    assert (False, False) in samples, f"never saw the model not Ready while starting: {samples}"
    assert (True, False) not in samples, f"Ready while an engine pod was not: {samples}"
    pods = _engine_pods(kubectl, served.namespace)
    bridge = ipaddress.ip_network(node_env["POD_CIDR"])
    for pod in pods:
        assert pod["spec"]["nodeName"] == node_env["NODE_NAME"]
        assert ipaddress.ip_address(pod["status"]["podIP"]) in bridge
        (container,) = pod["spec"]["containers"]
        assert container["readinessProbe"]["httpGet"]["path"] == "/health"
        logs = kubectl("-n", served.namespace, "logs", pod["metadata"]["name"])
        assert "kv_transfer_config" in logs and "DisaggConnector" in logs, logs[-3000:]


def test_turn_two_reads_decodes_kv_back_and_answers_as_a_recomputed_turn(
    served: Served,
) -> None:
    client = ChatClient(served.router, timeout_s=TURN_TIMEOUT_S)
    try:
        model = client.model()
        before = reused_tokens(served.prefill)
        on = _turns(client, model, "e2e-reuse")
        reused = reused_tokens(served.prefill) - before
        off = _turns(client, model, None)
    finally:
        client.close()
    assert reused > 0, "turn 2 read no KV back from decode (prefill's reused-token counter)"
    assert on == off, f"with reuse {on!r}, recomputed {off!r}"


def test_a_stock_prometheus_scrapes_the_engines_the_router_and_the_operator(
    served: Served, kubectl: kube.Kubectl, kubeconfig: Path
) -> None:
    """kube-prometheus-stack as it comes (the real Prometheus Operator; a Prometheus object
    selecting PodMonitors and ServiceMonitors labelled `release: kube-prometheus-stack`, in
    every namespace) picks up the model's PodMonitors (`spec.monitoring.labels`) and the
    operator chart's ServiceMonitor (`metrics.serviceMonitor.labels`): after a conversation,
    the engines', the router's and the operator's series arrive, each with the labels the
    dashboard selects by."""
    namespace = served.namespace
    (service_monitor,) = kubectl.json("-n", namespace, "get", "servicemonitor")["items"]
    operator_name = service_monitor["metadata"]["name"]
    monitors = {f"podMonitor/{namespace}/{MODEL}-{c}/0": c for c in ("prefill", "decode", "router")}
    operator_job = f"serviceMonitor/{namespace}/{operator_name}/0"
    with stock_prometheus(kubectl, kubeconfig, namespace, {*monitors, operator_job}) as stock:
        client = ChatClient(served.router, timeout_s=TURN_TIMEOUT_S)
        for conversation in range(2):
            _turns(client, client.model(), f"stock-{conversation}")
        per_component = {
            "prefill": 'vllm:prompt_tokens_total{app_kubernetes_io_component="prefill"}',
            "decode": 'vllm:prompt_tokens_total{app_kubernetes_io_component="decode"}',
            "router": 'disagg_router_requests_total{app_kubernetes_io_component="router"}',
        }
        for component, series in per_component.items():
            selector = f'namespace="{namespace}",app_kubernetes_io_instance="{MODEL}"'
            query = f"sum({series.replace('{', '{' + selector + ',')})"
            kube.wait_for(
                lambda q=query: (stock.value(q) or 0) > 0,
                what=f"the {component}'s series in the stock Prometheus ({query})",
                timeout_s=60,
            )
        operator = f'disagg_operator_models{{namespace="{namespace}",ready="true"}}'
        kube.wait_for(
            lambda: stock.value(operator) == 1,
            what=f"the operator's series in the stock Prometheus ({operator})",
            timeout_s=60,
        )
        up = {t["labels"]["job"]: t["health"] for t in stock.active_targets()}
        assert up == {
            **{f"{namespace}/{MODEL}-{c}": "up" for c in monitors.values()},
            f"{operator_name}-metrics": "up",
        }, up


def _render_dashboard(prometheus_url: str) -> None:
    """The chart's dashboard over `prometheus_url` (`make dashboard-screenshot`), into
    $DISAGG_DASHBOARD_PNG when set: the figure in docs/observability.md, made from this run."""
    out = os.environ.get("DISAGG_DASHBOARD_PNG")
    if out:
        subprocess.run(
            ["bash", str(REPO / "tests" / "cluster" / "metrics" / "dashboard-screenshot.sh"),
             prometheus_url, out],
            check=True,
            timeout=600,
        )  # fmt: skip


def test_a_deleted_decode_pod_comes_back_and_the_next_turn_recomputes(
    served: Served, kubectl: kube.Kubectl, pods_report: Callable[[str], str]
) -> None:
    namespace = served.namespace
    client = ChatClient(served.router, timeout_s=TURN_TIMEOUT_S)
    try:
        model = client.model()
        messages = _conversation(2)
        first = client.turn(model, messages, ANSWER_TOKENS, "e2e-lost-decode")
        old = kubectl.json("-n", namespace, "get", "pod", f"{MODEL}-decode-0")["metadata"]["uid"]
        kubectl("-n", namespace, "delete", "pod", f"{MODEL}-decode-0", "--wait=true")

        def replaced() -> bool:
            pod = kubectl.run(
                "-n", namespace, "get", "pod", f"{MODEL}-decode-0", "-o", "yaml", check=False
            )
            if pod.returncode != 0:
                return False
            manifest = yaml.safe_load(pod.stdout)
            return manifest["metadata"]["uid"] != old and kube.condition_true(manifest, "Ready")

        try:
            kube.wait_for(replaced, what="decode-0 recreated and Ready", timeout_s=READY_TIMEOUT_S)
            kube.wait_for(
                lambda: _model_ready(kubectl, namespace), what=f"{MODEL} Ready", timeout_s=120
            )
        except TimeoutError as timeout:
            pytest.fail(f"{timeout}\n{pods_report(namespace)}", pytrace=False)
        before = reused_tokens(served.prefill)
        follow_up = [
            *messages,
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "And item 5?"},
        ]
        started = time.monotonic()
        second = client.turn(model, follow_up, ANSWER_TOKENS, "e2e-lost-decode")
        recomputed = client.turn(model, follow_up, ANSWER_TOKENS, None)
    finally:
        client.close()
    assert reused_tokens(served.prefill) == before, "read KV back from a decode pod that is gone"
    assert second.text == recomputed.text
    assert time.monotonic() - started < 2 * TURN_TIMEOUT_S


def _converged(kubectl: kube.Kubectl, namespace: str) -> bool:
    """The model Ready with its status written for its latest generation."""
    model = kubectl.json("-n", namespace, "get", "dmodel", MODEL)
    observed = model.get("status", {}).get("observedGeneration")
    return observed == model["metadata"]["generation"] and kube.condition_true(model, "Ready")


def _router_ttl(kubectl: kube.Kubectl, namespace: str) -> str:
    """The conversation TTL on the router Deployment's command line."""
    deployment = kubectl.json("-n", namespace, "get", "deployment", f"{MODEL}-router")
    command: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    return command[command.index("--conversation-ttl") + 1]


def test_the_operator_pod_killed_mid_reconcile_converges_when_it_comes_back(
    served: Served, kubectl: kube.Kubectl, pods_report: Callable[[str], str]
) -> None:
    """A spec change, the operator pod killed at once (SIGKILL, no grace) while it reconciles
    it, and a second change once its Deployment's new pod is Ready: the new pod finishes both."""
    namespace = served.namespace
    selector = "app.kubernetes.io/name=disagg-operator"

    def patch_ttl(seconds: int) -> None:
        body = json.dumps({"spec": {"router": {"conversationTtlSeconds": seconds}}})
        kubectl("-n", namespace, "patch", "dmodel", MODEL, "--type=merge", "-p", body)

    def operator_pod() -> dict[str, Any] | None:
        pods = kubectl.json("-n", namespace, "get", "pods", "-l", selector)["items"]
        live = [p for p in pods if "deletionTimestamp" not in p["metadata"]]
        return live[0] if len(live) == 1 else None

    old = operator_pod()
    assert old is not None
    patch_ttl(400)
    kubectl(
        "-n", namespace, "delete", "pod", old["metadata"]["name"],
        "--grace-period=0", "--force", "--wait=false",
    )  # fmt: skip
    try:
        new = kube.wait_for(
            lambda: (
                pod
                if (pod := operator_pod()) is not None
                and pod["metadata"]["uid"] != old["metadata"]["uid"]
                and kube.condition_true(pod, "Ready")
                else None
            ),
            what="the operator Deployment's new pod Ready",
            timeout_s=300,
            interval_s=2,
        )
        patch_ttl(380)
        kube.wait_for(
            lambda: _router_ttl(kubectl, namespace) == "380" and _converged(kubectl, namespace),
            what="the new operator pod to roll the router and write the model's status",
            timeout_s=300,
            interval_s=2,
        )
    except TimeoutError as timeout:
        pytest.fail(f"{timeout}\n{pods_report(namespace)}", pytrace=False)
    logs = kubectl("-n", namespace, "logs", new["metadata"]["name"])
    assert MODEL in logs, logs[-3000:]
    kube.wait_for(
        lambda: _answers(f"{served.router}/health"),
        what="the rolled router pod behind its Service",
        timeout_s=180,
    )


ROLL_REQUESTS_MAX = 20_000
"""Bound of the client loop that runs through a router roll (it stops when the roll is over)."""
ROLL_SETTLE_S = 5.0
"""How long the client goes on after the old router pod is gone."""


def _router_pods(kubectl: kube.Kubectl, namespace: str) -> list[dict[str, Any]]:
    """The model's router pods, terminating ones included."""
    selector = f"app.kubernetes.io/instance={MODEL},app.kubernetes.io/component=router"
    pods: list[dict[str, Any]] = kubectl.json("-n", namespace, "get", "pods", "-l", selector)[
        "items"
    ]
    return pods


def _one_new_router(pods: list[dict[str, Any]], old: set[str]) -> bool:
    """Only one router pod is left, not one of the `old` uids, and it is Ready."""
    return (
        len(pods) == 1
        and pods[0]["metadata"]["uid"] not in old
        and kube.condition_true(pods[0], "Ready")
    )


class _Poller(threading.Thread):
    """A client that opens a new connection to the router Service for every request until
    told to stop, keeping every failure (an exception or a status other than 200)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.sent = 0
        self.failures: list[str] = []

    def run(self) -> None:
        while self.sent < ROLL_REQUESTS_MAX and not self.stop.wait(0.005):
            self.sent += 1
            try:
                status = httpx.get(self.url, timeout=10).status_code
            except httpx.HTTPError as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")
                continue
            if status != 200:
                self.failures.append(f"HTTP {status}")


def test_a_router_roll_drops_no_client_request_and_cuts_no_stream(
    served: Served, kubectl: kube.Kubectl, pods_report: Callable[[str], str]
) -> None:
    """A router-only spec change rolls the router Deployment while a long answer streams
    through the old pod and a client keeps opening connections to the Service. Every request
    is answered: the leaving pod serves on until its endpoint has left kube-proxy's rules, so no
    connection reaches a pod that stopped listening; then it finishes the stream in flight."""
    namespace = served.namespace
    old = {p["metadata"]["uid"] for p in _router_pods(kubectl, namespace)}
    (decode,) = _engine_pods(kubectl, namespace, "decode")
    decode_url = f"http://{decode['status']['podIP']}:{ENGINE_PORT}"
    client = ChatClient(served.router, timeout_s=TURN_TIMEOUT_S)
    try:
        stream = _Stream(_Chat("e2e-router-roll-stream"), served.router, client.model())
    finally:
        client.close()
    stream.start_generating(decode_url, "the roll")
    poller = _Poller(f"{served.router}/v1/models")
    poller.start()
    leaving: list[float] = []
    try:
        kubectl(
            "-n", namespace, "patch", "dmodel", MODEL, "--type=merge",
            "-p", '{"spec":{"router":{"conversationTtlSeconds":360}}}',
        )  # fmt: skip

        def rolled() -> bool:
            pods = _router_pods(kubectl, namespace)
            if not leaving and any(
                "deletionTimestamp" in p["metadata"] and p["metadata"]["uid"] in old for p in pods
            ):
                leaving.append(time.monotonic())
            return _one_new_router(pods, old)

        try:
            kube.wait_for(
                rolled,
                what="the old router pod drained and gone, the new one Ready",
                timeout_s=READY_TIMEOUT_S,
                interval_s=0.5,
            )
        except TimeoutError as timeout:
            pytest.fail(f"{timeout}\n{pods_report(namespace)}", pytrace=False)
        time.sleep(ROLL_SETTLE_S)
    finally:
        poller.stop.set()
        poller.join(timeout=30)
        stream.join(TURN_TIMEOUT_S)
    assert _router_ttl(kubectl, namespace) == "360"
    assert not poller.failures, (
        f"{len(poller.failures)} of {poller.sent} requests failed while the router rolled, "
        f"first: {poller.failures[:5]}"
    )
    assert poller.sent > 20, f"the client sent only {poller.sent} requests through the roll"
    assert stream.ended is not None, (
        f"the stream through the old router broke off: {stream.failure}"
    )
    assert leaving, "the old router pod was never seen terminating"
    assert stream.ended > leaving[0] + DRAIN_DELAY_SECONDS, (
        "the stream ended before the old router pod got SIGTERM: it proves no drain"
    )


def test_a_connector_config_change_rolls_the_engine_pods_and_reuse_goes_on(
    served: Served, kubectl: kube.Kubectl, pods_report: Callable[[str], str]
) -> None:
    namespace = served.namespace
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in _engine_pods(kubectl, namespace)}
    routers = {p["metadata"]["uid"] for p in _router_pods(kubectl, namespace)}
    config = kubectl.json("-n", namespace, "get", "configmap", f"{MODEL}-connector")["data"]
    kubectl(
        "-n", namespace, "patch", "dmodel", MODEL, "--type=merge",
        "-p", '{"spec":{"kvTransfer":{"decoderKvBlocksTtlSeconds":540}}}',
    )  # fmt: skip

    def rolled() -> bool:
        # The router rolls too and keeps conversations in memory: until the old router pod is
        # gone, turn 1 may reach it and turn 2 the new one, which has no record of turn 1.
        pods = _engine_pods(kubectl, namespace)
        return (
            {p["metadata"]["name"] for p in pods} == set(before)
            and all(p["metadata"]["uid"] != before[p["metadata"]["name"]] for p in pods)
            and all(kube.condition_true(p, "Ready") for p in pods)
            and _one_new_router(_router_pods(kubectl, namespace), routers)
            and _converged(kubectl, namespace)
        )

    try:
        kube.wait_for(
            rolled,
            what="both engine pods and the router rolled and Ready",
            timeout_s=READY_TIMEOUT_S,
        )
    except TimeoutError as timeout:
        pytest.fail(f"{timeout}\n{pods_report(namespace)}", pytrace=False)
    rolled_config = kubectl.json("-n", namespace, "get", "configmap", f"{MODEL}-connector")
    assert rolled_config["data"] != config
    decode = json.loads(rolled_config["data"]["decode.json"])
    assert decode["kv_connector_extra_config"][EXTRA_DECODER_TTL] == 540
    # While both roles' only pods rolled the router had no engine to serve with and left its
    # Service's endpoints (its readiness is its /health); it rejoins once it has checked the
    # new pods. The router rolls too (decode's TTL is on its command line): the new pod is
    # Ready before the old one leaves, and the old one serves until kube-proxy has let it go.
    kube.wait_for(
        lambda: _answers(f"{served.router}/health"),
        what="the router Service serving again after the roll",
        timeout_s=180,
    )
    prefill = served.prefill_url(kubectl)
    client = ChatClient(served.router, timeout_s=TURN_TIMEOUT_S)
    try:
        model = client.model()
        reused_before = reused_tokens(prefill)
        on = _turns(client, model, "e2e-after-roll")
        reused = reused_tokens(prefill) - reused_before
        off = _turns(client, model, None)
    finally:
        client.close()
    assert reused > 0, "no KV read back from decode after the roll"
    assert on == off


SCALED_CONVERSATIONS = 10
STREAM_TOKENS = 1000
"""The answer streaming on the leaving decode pod when it is told to go: long enough to still
be generating through its preStop wait while the other conversations' next turns start."""
STATS_LAG_S = 10.0
"""How long a turn's D->P read may take to show in prefill's counter after the answer."""
DECODE_SUCCESSES = "vllm:request_success_total"
SHUTDOWN_RELEASE = "Engine shutting down: releasing"
ROUTER_AFFINITY = "disagg_router_decode_affinity_total"
ROUTER_DRAINING = "disagg_router_replica_draining"
ROUTER_HEALTHY = "disagg_router_replica_healthy"
ROUTER_REQUESTS = "disagg_router_requests_total"
OFFERS = "vllm:disagg_kv_offers_total"


@dataclass
class _Chat:
    """One conversation as its client keeps it, with each turn's request and answer kept for
    the bidirectional-off replay."""

    conversation_id: str
    messages: list[dict[str, str]] = field(default_factory=list)
    turns: list[tuple[list[dict[str, str]], int, str]] = field(default_factory=list)

    def ask(
        self, client: ChatClient, model: str, question: str, max_tokens: int = ANSWER_TOKENS
    ) -> None:
        """One turn: the question after the conversation so far; the answer must be whole."""
        sent = [*self.messages, {"role": "user", "content": question}]
        reply = client.turn(model, sent, max_tokens, self.conversation_id)
        assert reply.completion_tokens == max_tokens, (
            f"{self.conversation_id}: {reply.completion_tokens} of {max_tokens} answer tokens"
        )
        self.messages = [*sent, {"role": "assistant", "content": reply.text}]
        self.turns.append((sent, max_tokens, reply.text))


def _opening(index: int, facts: int = 16) -> str:
    """A first message of its own per conversation; by default a few KV blocks more than
    prefill's recompute threshold: short, so that the moved conversations' recomputed turns all
    run while decode-1 drains."""
    listed = " ".join(
        f"Fact {i}: item {i} of list {index} is {(i * 7 + index) % 101}." for i in range(facts)
    )
    return f"Remember these. {listed} Summarise item {index % facts}."


def _samples(url: str) -> list[prometheus.Sample]:
    return prometheus.parse(httpx.get(f"{url}/metrics", timeout=10).text)


def _successes(urls: list[str]) -> dict[str, float]:
    """Each decode's finished requests, by URL."""
    return {url: prometheus.total(_samples(url), DECODE_SUCCESSES) for url in urls}


def _served_by(before: dict[str, float]) -> str:
    """The decode whose finished requests grew by one since `before` (its metrics may lag)."""

    def grown() -> list[str] | None:
        now = _successes(list(before))
        return [url for url in before if now[url] > before[url]] or None

    grew = kube.wait_for(grown, what="a decode pod counting the turn", timeout_s=15, interval_s=0.2)
    assert len(grew) == 1, f"{len(grew)} decode pods finished the turn"
    return grew[0]


@dataclass(frozen=True)
class _Reuse:
    """Prefill's tokens read back from decode and its verdicts on decode's offers (D->P), by
    verdict: its totals, or what grew since a mark."""

    read: float
    verdicts: dict[str, float]

    def since(self, mark: _Reuse) -> _Reuse:
        """What grew from ``mark`` to these totals."""
        grew = {v: n - mark.verdicts.get(v, 0.0) for v, n in self.verdicts.items()}
        return _Reuse(self.read - mark.read, {v: n for v, n in grew.items() if n > 0})

    @property
    def taken(self) -> bool:
        """One offer reached prefill verified and was read back, or was left for a recompute
        because prefill's measured read decision (the demo's default) priced computing its
        tokens below reading them: on two shared cores either can win a turn."""
        if self.verdicts == {Verdict.VERIFIED: 1}:
            return self.read > 0
        return self.verdicts == {Verdict.RECOMPUTE_CHEAPER: 1}


def _reuse_counts(prefill: str) -> _Reuse:
    """Prefill's totals so far."""
    samples = _samples(prefill)
    offers = [s for s in samples if s.labels.get("direction") == Direction.DECODE_TO_PREFILL]
    return _Reuse(
        prometheus.total(samples, REUSED_TOKENS),
        prometheus.label_values(offers, OFFERS, "verdict"),
    )


def _reuse_since(prefill: str, mark: _Reuse) -> _Reuse:
    """What prefill made of decode's offers since `mark`, waited for a while until one offer
    was taken (prefill's counters lag the answer)."""
    deadline = time.monotonic() + STATS_LAG_S
    while not (reuse := _reuse_counts(prefill).since(mark)).taken:
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    return reuse


def _router_replicas(router: str, name: str) -> dict[str, float]:
    """A per-replica router gauge's decode values, by replica URL."""
    return {
        sample.labels["replica"]: sample.value
        for sample in _samples(router)
        if sample.name == name and sample.labels.get("role") == "decode"
    }


def _chat_outcomes(router: str) -> dict[str, float]:
    """The router's chat completions by outcome (success, or the error's kind)."""
    return {
        sample.labels["outcome"]: sample.value
        for sample in _samples(router)
        if sample.name == ROUTER_REQUESTS
        and sample.labels.get("endpoint") == "/v1/chat/completions"
    }


def _scale_decode(kubectl: kube.Kubectl, namespace: str, replicas: int) -> None:
    body = json.dumps({"spec": {"decode": {"replicas": replicas}}})
    kubectl("-n", namespace, "patch", "dmodel", MODEL, "--type=merge", "-p", body)


def _decodes_serving(
    kubectl: kube.Kubectl, namespace: str, router: str, count: int
) -> dict[str, str] | None:
    """Each decode pod's base URL by pod name once `count` of them are Ready, the model has
    converged and the router counts exactly them, healthy; else None."""
    pods = _engine_pods(kubectl, namespace, "decode")
    if len(pods) != count or not all(kube.condition_true(pod, "Ready") for pod in pods):
        return None
    urls = {p["metadata"]["name"]: f"http://{p['status']['podIP']}:{ENGINE_PORT}" for p in pods}
    healthy = _router_replicas(router, ROUTER_HEALTHY) == dict.fromkeys(urls.values(), 1.0)
    return urls if healthy and _converged(kubectl, namespace) else None


@contextmanager
def _following_logs(kubectl: kube.Kubectl, namespace: str, pod: str, path: Path) -> Iterator[Path]:
    """`kubectl logs -f` of `pod` into `path` while the block runs, so that the log of a pod
    that goes away (its container's last lines included) stays readable."""
    command = [
        str(kubectl.binary), "--kubeconfig", str(kubectl.kubeconfig),
        "-n", namespace, "logs", "-f", pod,
    ]  # fmt: skip
    with path.open("wb") as log:
        follower = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield path
    finally:
        if follower.poll() is None:
            follower.kill()
        follower.wait()


class _Stream(threading.Thread):
    """One long turn of a conversation streaming in the background: when it ended, or why not."""

    def __init__(self, chat: _Chat, router: str, model: str) -> None:
        super().__init__(daemon=True)
        self.chat, self.router, self.model = chat, router, model
        self.ended: float | None = None
        self.failure: Exception | None = None

    def run(self) -> None:
        client = ChatClient(self.router, timeout_s=TURN_TIMEOUT_S)
        try:
            self.chat.ask(client, self.model, "Now list every item.", STREAM_TOKENS)
            self.ended = time.monotonic()
        except Exception as failure:  # the test's thread reports it
            self.failure = failure
        finally:
            client.close()

    def start_generating(self, decode: str, event: str) -> None:
        """Start, and return once decode (its base URL) is generating the answer; the
        stream must still be running then, before `event`."""
        self.start()
        kube.wait_for(
            lambda: (
                prometheus.total(_samples(decode), REQUESTS_RUNNING.name) >= 1
                or not self.is_alive()
            ),
            what=f"the stream generating on {decode}",
            timeout_s=TURN_TIMEOUT_S,
            interval_s=0.1,
        )
        assert self.is_alive(), f"the stream ended before {event}: {self.failure}"


def _holders(
    chats: list[_Chat],
    client: ChatClient,
    model: str,
    urls: list[str],
    question: Callable[[int], str],
) -> dict[str, str]:
    """One turn of each conversation in order: the decode URL that served each."""
    served_by: dict[str, str] = {}
    for index, chat in enumerate(chats):
        before = _successes(urls)
        chat.ask(client, model, question(index))
        served_by[chat.conversation_id] = _served_by(before)
    return served_by


def _moves(router: str) -> float:
    """Turns the router moved off their conversation's decode because it was leaving: draining,
    or already gone (on two shared cores a moved turn can outlast decode-1's drain)."""
    samples = _samples(router)
    return sum(
        prometheus.total(samples, ROUTER_AFFINITY, result=result) for result in ("draining", "gone")
    )


def test_decode_scaled_from_two_to_one_mid_conversation_moves_the_leaving_pods_conversations(
    served: Served, kubectl: kube.Kubectl, pods_report: Callable[[str], str], tmp_path: Path
) -> None:
    """Decode scaled to 2, ten conversations two turns in (each turn 2 offered decode's KV and
    taking it), a stream in flight on decode-1 when decode is scaled back to 1: the router drains
    decode-1, the stream finishes, decode-1 releases its retained KV as it shuts down, each
    conversation that was on decode-1 recomputes its next turn on decode-0 once and takes
    decode's KV again after, the others keep taking it, no client sees an error, and every answer
    equals the same turn without a conversation_id. Taking an offer is reading it back, or
    recomputing because prefill's measured read decision priced the read above the compute."""
    namespace, router = served.namespace, served.router
    leaving_pod = f"{MODEL}-decode-1"
    _scale_decode(kubectl, namespace, 2)
    client = ChatClient(router, timeout_s=TURN_TIMEOUT_S)
    try:
        try:
            urls = kube.wait_for(
                lambda: _decodes_serving(kubectl, namespace, router, 2),
                what="decode-1 Ready and healthy in the router's view",
                timeout_s=READY_TIMEOUT_S,
                interval_s=2,
            )
        except TimeoutError as timeout:
            pytest.fail(f"{timeout}\n{pods_report(namespace)}", pytrace=False)
        leaving, staying = urls[leaving_pod], urls[f"{MODEL}-decode-0"]
        prefill = served.prefill_url(kubectl)
        model = client.model()
        outcomes_before = _chat_outcomes(router)
        moves_before = _moves(router)
        tag = f"e2e-scale-{time.time_ns():x}"
        chats = [_Chat(f"{tag}-{i}") for i in range(SCALED_CONVERSATIONS)]
        # Turn 1 of every conversation, then turn 2 of each: a new conversation goes to the
        # least busy decode, ties taken in turn, so half of them land on decode-1.
        holder = _holders(chats, client, model, [leaving, staying], _opening)
        for chat in chats:
            before, mark = _successes([leaving, staying]), _reuse_counts(prefill)
            chat.ask(client, model, "And item 4?")
            assert _served_by(before) == holder[chat.conversation_id], "turn 2 changed decode"
            reuse = _reuse_since(prefill, mark)
            assert reuse.taken, f"{chat.conversation_id}: {reuse}"
        moved = [c for c in chats if holder[c.conversation_id] == leaving]
        kept = [c for c in chats if holder[c.conversation_id] == staying]
        assert moved and kept, f"conversations by decode: {holder}"

        # A conversation of its own on decode-1 streams a long answer while decode-1 leaves.
        starts = [_Chat(f"{tag}-stream-{i}") for i in range(2)]
        landed = _holders(
            starts, client, model, [leaving, staying], lambda i: _opening(SCALED_CONVERSATIONS + i)
        )
        (stream_chat,) = [c for c in starts if landed[c.conversation_id] == leaving]
        stream = _Stream(stream_chat, router, model)
        mark = _reuse_counts(prefill)
        stream.start_generating(leaving, "decode-1 left")
        reuse = _reuse_since(prefill, mark)
        assert reuse.taken, f"the streamed turn: {reuse}"
        with _following_logs(kubectl, namespace, leaving_pod, tmp_path / "decode-1.log") as log:
            _scale_decode(kubectl, namespace, 1)
            kube.wait_for(
                lambda: _router_replicas(router, ROUTER_DRAINING).get(leaving) == 1,
                what="the router draining decode-1",
                timeout_s=60,
                interval_s=0.2,
            )
            draining = time.monotonic()
            # The next turn of each conversation that was on decode-1, one at a time while
            # decode-1 drains: it recomputes on decode-0 (prefill reads nothing back).
            recomputed: dict[str, float] = {}
            unread = reused_tokens(prefill)
            for chat in moved:
                reused = reused_tokens(prefill)
                chat.ask(client, model, "And item 5?")
                recomputed[chat.conversation_id] = reused_tokens(prefill) - reused
            moves_took = time.monotonic() - draining
            stream.join(TURN_TIMEOUT_S)
            assert stream.ended is not None, f"the stream on decode-1 broke off: {stream.failure}"
            assert stream.ended > draining, "the stream ended before decode-1 drained"
            kube.wait_for(
                lambda: _decodes_serving(kubectl, namespace, router, 1),
                what="decode-1 gone, the router serving with decode-0 alone",
                timeout_s=TURN_TIMEOUT_S,
            )
        shutdown = log.read_text(errors="replace")
        assert SHUTDOWN_RELEASE in shutdown, shutdown[-3000:]
        # The wait for decode-1 to go gave a late count the time to show.
        assert reused_tokens(prefill) == unread, f"read back from a leaving decode: {recomputed}"
        moves = _moves(router)
        assert moves - moves_before == len(moved), (
            f"{moves - moves_before:g} turns moved off decode-1 for {len(moved)} "
            f"conversations on it (their turns took {moves_took:.1f} s from the drain, the "
            f"stream ended {stream.ended - draining:.1f} s after it)"
        )

        # The others keep taking decode-0's KV; the moved ones take it again.
        reuses: dict[str, _Reuse] = {}
        for chat in [*kept, *moved]:
            mark = _reuse_counts(prefill)
            chat.ask(client, model, "And item 6?")
            reuses[chat.conversation_id] = _reuse_since(prefill, mark)
        untaken = {name: reuse for name, reuse in reuses.items() if not reuse.taken}
        assert not untaken, f"decode's KV not taken on the turn after: {untaken}"
        replayed = [
            (chat.conversation_id, client.turn(model, sent, tokens, None).text, text)
            for chat in [*chats, *starts]
            for sent, tokens, text in chat.turns
        ]
        outcomes = _chat_outcomes(router)
    finally:
        client.close()
        _scale_decode(kubectl, namespace, 1)
    differ = [(name, off, on) for name, off, on in replayed if off != on]
    assert not differ, f"answers unlike bidirectional off (conversation, off, on): {differ}"
    grew = {outcome: outcomes[outcome] - outcomes_before.get(outcome, 0.0) for outcome in outcomes}
    assert grew.pop("success", 0.0) == 2 * len(replayed), f"chat outcomes grew by {grew}"
    assert not any(grew.values()), f"client errors: {grew}"


AUTOSCALED_MAX = 2
QUEUE_TARGET = 2
"""Prefill's queue-depth target: its load's clients (twice its maxNumSeqs, 4) keep about 4
requests waiting, twice the target, so its autoscaler asks for its maximum."""
RUNNING_TARGET = 2
"""Decode's running-requests target: its load's clients (its maxNumSeqs), each streaming a long
answer after a short prefill, keep about 4 streams running."""
PREFILL_LOAD_CLIENTS = 8
DECODE_LOAD_CLIENTS = 4
DECODE_LOAD_TOKENS = 800
HOLD_WINDOW_S = 3600
"""The scale-down window while the added pods start: they start on the cores the load left."""
RELEASE_WINDOW_S = 20
"""The scale-down window the test then sets, short enough to see it pass."""
HPA_SYNC_S = 15
"""The HorizontalPodAutoscaler controller's sync period (kube-controller-manager's default)."""
SCALE_TIMEOUT_S = 240
"""A scale decision: a scrape (2 s), the adapter's re-list (5 s), one or two autoscaler syncs,
after the load's requests reached their steady queue."""
REUSE_TURNS = "disagg_router_reuse_turns_total"


def _long_opening(index: int) -> str:
    """A first message of its own of about 1,000 tokens: a CPU prefill of a few seconds."""
    return _opening(index, facts=30)


class _Load:
    """`clients` threads sending turns through the router, each a new first message without a
    conversation_id, from entering the block until leaving it (or SCALE_TIMEOUT_S twice over):
    what failed."""

    def __init__(
        self,
        router: str,
        model: str,
        clients: int,
        prompt: Callable[[int], str],
        max_tokens: int,
    ) -> None:
        self.router, self.model, self.prompt, self.max_tokens = router, model, prompt, max_tokens
        self.failures: list[Exception] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)
        ]

    def _client(self, index: int) -> None:
        client = ChatClient(self.router, timeout_s=TURN_TIMEOUT_S)
        deadline = time.monotonic() + 2 * SCALE_TIMEOUT_S
        sent = 0
        try:
            while not self._stop.is_set() and time.monotonic() < deadline:
                message = {"role": "user", "content": self.prompt(index * 1000 + sent)}
                client.turn(self.model, [message], self.max_tokens, None)
                sent += 1
        except Exception as failure:  # the test's thread reports it
            self.failures.append(failure)
        finally:
            client.close()

    def __enter__(self) -> _Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(TURN_TIMEOUT_S)


@contextmanager
def _statefulset_versions(
    kubectl: kube.Kubectl, namespace: str
) -> Iterator[list[tuple[str, int, int]]]:
    """Every version of the model's StatefulSets the API server serves while the block runs, as
    (name, spec.replicas, metadata.generation): a watch of the API itself, one event a line."""
    selector = f"app.kubernetes.io/instance={MODEL}"
    path = f"/apis/apps/v1/namespaces/{namespace}/statefulsets?watch=1&labelSelector={selector}"
    command = [str(kubectl.binary), "--kubeconfig", str(kubectl.kubeconfig), "get", "--raw", path]
    versions: list[tuple[str, int, int]] = []
    watcher = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert watcher.stdout is not None
    stdout = watcher.stdout

    def read() -> None:
        for line in stdout:
            sts = json.loads(line)["object"]
            meta = sts["metadata"]
            versions.append((meta["name"], int(sts["spec"]["replicas"]), int(meta["generation"])))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        kube.wait_for(lambda: len(versions) >= 2, what="the watch of both StatefulSets")
        yield versions
    finally:
        watcher.kill()
        watcher.wait()
        reader.join(10)


def _scale_steps(versions: list[tuple[str, int, int]], name: str) -> list[int]:
    """The replica counts one StatefulSet went through, in order, repeats folded."""
    steps: list[int] = []
    for version, replicas, _ in versions:
        if version == name and steps[-1:] != [replicas]:
            steps.append(replicas)
    return steps


def _rewrites(versions: list[tuple[str, int, int]], name: str) -> list[tuple[int, int]]:
    """One StatefulSet's spec changes (a new generation) that left its replica count as it was:
    (generation, replicas) of each."""
    ours = [(replicas, generation) for version, replicas, generation in versions if version == name]
    return [
        (generation, replicas)
        for (was, before), (replicas, generation) in itertools.pairwise(ours)
        if generation > before and replicas == was
    ]


def _autoscale(kubectl: kube.Kubectl, namespace: str) -> None:
    """Hand both roles' replica counts to autoscalers (prefill on its queue depth, decode on its
    running requests), holding added replicas for HOLD_WINDOW_S."""
    ops = []
    for role, signal, target in (
        ("prefill", "queueDepth", QUEUE_TARGET),
        ("decode", "runningRequests", RUNNING_TARGET),
    ):
        autoscaling = {
            "maxReplicas": AUTOSCALED_MAX,
            "signal": signal,
            "target": target,
            "behavior": {"scaleDownStabilizationWindowSeconds": HOLD_WINDOW_S},
        }
        ops += [
            {"op": "remove", "path": f"/spec/{role}/replicas"},
            {"op": "add", "path": f"/spec/{role}/autoscaling", "value": autoscaling},
        ]
    kubectl("-n", namespace, "patch", "dmodel", MODEL, "--type=json", "-p", json.dumps(ops))


def _release_window(kubectl: kube.Kubectl, namespace: str, seconds: int) -> None:
    behavior = {"autoscaling": {"behavior": {"scaleDownStabilizationWindowSeconds": seconds}}}
    body = json.dumps({"spec": {"prefill": behavior, "decode": behavior}})
    kubectl("-n", namespace, "patch", "dmodel", MODEL, "--type=merge", "-p", body)


def _serving(kubectl: kube.Kubectl, namespace: str, router: str, count: int) -> bool:
    """`count` Ready pods of each role, the model converged, the router counting exactly them
    healthy."""
    pods = _engine_pods(kubectl, namespace)
    if len(pods) != 2 * count or not all(kube.condition_true(pod, "Ready") for pod in pods):
        return False
    healthy = {
        sample.labels["replica"]
        for sample in _samples(router)
        if sample.name == ROUTER_HEALTHY and sample.value == 1
    }
    urls = {f"http://{p['status']['podIP']}:{ENGINE_PORT}" for p in pods}
    return healthy == urls and _converged(kubectl, namespace)


def _hit_ratios(
    router: str, pipeline: MetricsPipeline, namespace: str
) -> tuple[float, float] | None:
    """The reuse hit ratio as the router's /metrics has it and as Prometheus's query of the
    router pod's series gives it, once they agree (None before: not scraped since)."""
    turns = {
        sample.labels["result"]: sample.value
        for sample in _samples(router)
        if sample.name == REUSE_TURNS
    }
    own = turns["hit"] / (turns["hit"] + turns["miss"])
    selector = f'namespace="{namespace}",app_kubernetes_io_component="router"'
    queried = pipeline.value(
        f'sum({REUSE_TURNS}{{{selector},result="hit"}}) / sum({REUSE_TURNS}{{{selector}}})'
    )
    return (own, queried) if queried is not None and math.isclose(own, queried) else None


def test_each_role_scales_on_its_own_signal_through_the_real_metrics_pipeline_and_back(
    served: Served, kubectl: kube.Kubectl, pods_report: Callable[[str], str]
) -> None:
    """Both roles autoscaled (the last test of the module: the model keeps its autoscalers),
    Prometheus scraping the real pods and prometheus-adapter serving their series: queued
    prefills make the real HorizontalPodAutoscaler add a prefill pod, then long answers a decode
    pod; both new pods start, serve and stay while the scale-down window holds them, and both
    roles return to one pod once a short window passes. Neither role's replica count is ever set
    back under its autoscaler (every StatefulSet version watched, none rewritten but for its
    replicas, the operator owning neither count), no load turn fails, and Prometheus's reuse hit
    ratio equals the router's."""
    namespace, router = served.namespace, served.router
    queue = SIGNALS["queueDepth"].hpa_metric
    running = SIGNALS["runningRequests"].hpa_metric
    client = ChatClient(router, timeout_s=TURN_TIMEOUT_S)
    try:
        with metrics_pipeline() as pipeline, _statefulset_versions(kubectl, namespace) as versions:
            _autoscale(kubectl, namespace)
            kube.wait_for(
                lambda: (
                    custom_metric(kubectl, namespace, f"{MODEL}-prefill-0", queue) is not None
                    and custom_metric(kubectl, namespace, f"{MODEL}-decode-0", running) is not None
                ),
                what="both engines' signals served as custom metrics",
                timeout_s=120,
            )
            model = client.model()
            peaks = {"prefill": 0.0, "decode": 0.0}

            def scaled(role: str, metric: str) -> bool:
                value = custom_metric(kubectl, namespace, f"{MODEL}-{role}-0", metric) or 0.0
                peaks[role] = max(peaks[role], value)
                return spec_replicas(kubectl, namespace, f"{MODEL}-{role}") == AUTOSCALED_MAX

            with _Load(router, model, PREFILL_LOAD_CLIENTS, _long_opening, 2) as prefill_load:
                kube.wait_for(
                    lambda: scaled("prefill", queue),
                    what="the prefill autoscaler adding a pod",
                    timeout_s=SCALE_TIMEOUT_S,
                    interval_s=1,
                )
            decode_before = spec_replicas(kubectl, namespace, f"{MODEL}-decode")
            with _Load(
                router, model, DECODE_LOAD_CLIENTS, _opening, DECODE_LOAD_TOKENS
            ) as decode_load:
                kube.wait_for(
                    lambda: scaled("decode", running),
                    what="the decode autoscaler adding a pod",
                    timeout_s=SCALE_TIMEOUT_S,
                    interval_s=1,
                )
            unloaded = time.monotonic()
            try:
                kube.wait_for(
                    lambda: _serving(kubectl, namespace, router, AUTOSCALED_MAX),
                    what="the added prefill and decode pods Ready and in the router's view",
                    timeout_s=READY_TIMEOUT_S,
                    interval_s=2,
                )
            except TimeoutError as timeout:
                pytest.fail(f"{timeout}\n{pods_report(namespace)}", pytrace=False)
            # Idle long enough for a short window to have let them go, the long one holds them.
            time.sleep(max(0.0, unloaded + RELEASE_WINDOW_S + 2 * HPA_SYNC_S - time.monotonic()))
            held = {
                role: spec_replicas(kubectl, namespace, f"{MODEL}-{role}")
                for role in ("prefill", "decode")
            }
            # Idle for longer than the short window already: the autoscaler may let them go at
            # its next sync, so how soon they go after this patch has no lower bound.
            _release_window(kubectl, namespace, RELEASE_WINDOW_S)
            try:
                kube.wait_for(
                    lambda: _serving(kubectl, namespace, router, 1),
                    what="both roles back to one pod once the short window passed",
                    timeout_s=SCALE_TIMEOUT_S + RELEASE_WINDOW_S,
                    interval_s=1,
                )
            except TimeoutError as timeout:
                pytest.fail(f"{timeout}\n{pods_report(namespace)}", pytrace=False)
            hpas = {
                role: kubectl.json(
                    "-n", namespace, "get", "horizontalpodautoscaler", f"{MODEL}-{role}"
                )
                for role in ("prefill", "decode")
            }
            owners = replica_owners(kubectl, namespace, f"{MODEL}-prefill", f"{MODEL}-decode")
            # A conversation of its own, so the router counts a miss (turn 1) and a hit (turn 2)
            # whichever tests ran before.
            chat = _Chat(f"e2e-autoscaled-{time.time_ns():x}")
            chat.ask(client, model, _opening(0))
            chat.ask(client, model, "And item 4?")
            ratios = kube.wait_for(
                lambda: _hit_ratios(router, pipeline, namespace),
                what="Prometheus's reuse hit ratio of the router pod equal to the router's own",
                timeout_s=60,
            )
            _render_dashboard(pipeline.prometheus_url)
    finally:
        client.close()
    assert not prefill_load.failures and not decode_load.failures, (
        f"load turns failed: {[*prefill_load.failures, *decode_load.failures]}"
    )
    assert peaks["prefill"] > QUEUE_TARGET, f"the prefill queue never passed its target: {peaks}"
    assert peaks["decode"] > RUNNING_TARGET, f"decode's streams never passed their target: {peaks}"
    assert decode_before == 1, "decode scaled on prefill's load"
    assert held == {"prefill": AUTOSCALED_MAX, "decode": AUTOSCALED_MAX}, (
        f"idle {RELEASE_WINDOW_S + 2 * HPA_SYNC_S} s, the long window let pods go: {held}"
    )
    for role, metric in (("prefill", queue), ("decode", running)):
        name = f"{MODEL}-{role}"
        assert _scale_steps(versions, name) == [1, AUTOSCALED_MAX, 1], versions
        assert not _rewrites(versions, name), f"{name} rewritten under its autoscaler: {versions}"
        (current,) = hpas[role]["status"]["currentMetrics"]
        assert current["pods"]["metric"]["name"] == metric, current
    assert FIELD_MANAGER not in owners, owners
    assert 0 < ratios[0] < 1, f"reuse hit ratio {ratios[0]}: the module's turns hit and missed"
