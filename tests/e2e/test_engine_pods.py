"""The operator's rendered engines running for real: the operator chart's pod reconciles the CPU
demo model (examples/demo-cpu.yaml, filled in by demo/model.py) into prefill, decode and router
pods on the real node, the model turns Ready only once its pods pass their /health probes, a
conversation through the router pod reads decode's KV back on turn 2 and answers as a
recomputed turn does, and a decode pod deleted between turns comes back while the next turn
recomputes without a client error, the operator pod killed while it reconciles a change
converges when its Deployment brings it back, and a connector config change rolls the engine
pods while the turns after it still reuse."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

import kube
from disagg.bench import prometheus
from disagg.bench.client import REUSED_TOKENS, ChatClient
from disagg_contract import EXTRA_DECODER_TTL

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "demo-cpu.yaml"
MODEL = "demo-cpu"
READY_TIMEOUT_S = 1200
"""vLLM's CPU build starts in a few minutes on 2 shared cores; a first start also compiles."""
ANSWER_TOKENS = 8
TURN_TIMEOUT_S = 300


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


def _model_manifest(images: dict[str, str], namespace: str) -> str:
    return subprocess.run(
        [
            sys.executable, str(REPO / "demo" / "model.py"), str(EXAMPLE),
            "--serving-image", images["SERVING_IMAGE"], "--router-image", images["ROUTER_IMAGE"],
            "--namespace", namespace,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout  # fmt: skip


@pytest.fixture(scope="module")
def served(
    kubectl: kube.Kubectl,
    helm: kube.Tool,
    images: dict[str, str],
    install_operator: Callable[[str, str], None],
    pods_report: Callable[[str], str],
    heavy_lock: None,
) -> Iterator[Served]:
    """The operator chart and the demo model in a namespace of their own, the model Ready."""
    namespace = kube.namespace_name("engine-pods")
    kubectl("create", "namespace", namespace)
    readiness = Readiness()
    watcher = threading.Thread(target=_watch, args=(kubectl, namespace, readiness), daemon=True)
    try:
        install_operator("engines", namespace)
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


def _reused(prefill: str) -> float:
    text = httpx.get(f"{prefill}/metrics", timeout=10).text
    return prometheus.total(prometheus.parse(text), REUSED_TOKENS)


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
        before = _reused(served.prefill)
        on = _turns(client, model, "e2e-reuse")
        reused = _reused(served.prefill) - before
        off = _turns(client, model, None)
    finally:
        client.close()
    assert reused > 0, "turn 2 read no KV back from decode (prefill's reused-token counter)"
    assert on == off, f"with reuse {on!r}, recomputed {off!r}"


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
        before = _reused(served.prefill)
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
    assert _reused(served.prefill) == before, "read KV back from a decode pod that is gone"
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


def test_a_connector_config_change_rolls_the_engine_pods_and_reuse_goes_on(
    served: Served, kubectl: kube.Kubectl, pods_report: Callable[[str], str]
) -> None:
    namespace = served.namespace
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in _engine_pods(kubectl, namespace)}
    config = kubectl.json("-n", namespace, "get", "configmap", f"{MODEL}-connector")["data"]
    kubectl(
        "-n", namespace, "patch", "dmodel", MODEL, "--type=merge",
        "-p", '{"spec":{"kvTransfer":{"decoderKvBlocksTtlSeconds":540}}}',
    )  # fmt: skip

    def rolled() -> bool:
        pods = _engine_pods(kubectl, namespace)
        return (
            {p["metadata"]["name"] for p in pods} == set(before)
            and all(p["metadata"]["uid"] != before[p["metadata"]["name"]] for p in pods)
            and all(kube.condition_true(p, "Ready") for p in pods)
            and _converged(kubectl, namespace)
        )

    try:
        kube.wait_for(rolled, what="both engine pods rolled and Ready", timeout_s=READY_TIMEOUT_S)
    except TimeoutError as timeout:
        pytest.fail(f"{timeout}\n{pods_report(namespace)}", pytrace=False)
    rolled_config = kubectl.json("-n", namespace, "get", "configmap", f"{MODEL}-connector")
    assert rolled_config["data"] != config
    decode = json.loads(rolled_config["data"]["decode.json"])
    assert decode["kv_connector_extra_config"][EXTRA_DECODER_TTL] == 540
    # While both roles' only pods rolled the router had no engine to serve with and left its
    # Service's endpoints (its readiness is its /health); it rejoins once it has checked the
    # new pods.
    kube.wait_for(
        lambda: _answers(f"{served.router}/health"),
        what="the router Service serving again after the roll",
        timeout_s=180,
    )
    prefill = served.prefill_url(kubectl)
    client = ChatClient(served.router, timeout_s=TURN_TIMEOUT_S)
    try:
        model = client.model()
        reused_before = _reused(prefill)
        on = _turns(client, model, "e2e-after-roll")
        reused = _reused(prefill) - reused_before
        off = _turns(client, model, None)
    finally:
        client.close()
    assert reused > 0, "no KV read back from decode after the roll"
    assert on == off
