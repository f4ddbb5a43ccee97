"""The demo model served from ``s3://`` on the real node: its weights put into a real S3 server
(versitygw, built from its pinned Go module, tests/cluster/s3_server.py) that the test starts on
the host's end of the node's link (the address the pods reach the host at, as they reach the
API server), the access key in a Secret named by spec.model.s3.credentialsSecret. With a key
the server refuses, the servers end at start with one line and the model's Ready condition
says WeightsUnavailable naming spec.model.s3.credentialsSecret (no vLLM start, no stack
trace); with the right key, vLLM's Run:ai streamer loads the weights, the model turns Ready and
a multi-turn conversation through the router reads decode's KV back on its second turn."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from demo_model import (
    ANSWER_TOKENS,
    MODEL,
    READY_TIMEOUT_S,
    TURN_TIMEOUT_S,
    demo_model,
    reused_tokens,
)

import kube
from disagg.bench.client import ChatClient
from disagg.rig.bench_model import MODEL_DIR, ensure_bench_model
from disagg_contract import (
    AWS_ACCESS_KEY_ID_ENV,
    AWS_SECRET_ACCESS_KEY_ENV,
    ENGINE_PORT,
    S3_CREDENTIALS_FIELD,
    WEIGHTS_UNAVAILABLE,
)
from s3_server import S3Server, s3_server

BUCKET = "models"
S3_PORT = 7071
SECRET = "weights-key"
REFUSAL_TIMEOUT_S = 300
"""The refused servers end before vLLM starts: seconds after their container starts."""


@pytest.fixture(scope="module")
def s3(
    kubeconfig: Path, node_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[S3Server]:
    """The S3 server on the host's end of the node's link, the demo model's files uploaded."""
    ensure_bench_model()
    with s3_server(
        tmp_path_factory.mktemp("s3") / "root", host=node_env["NODE_HOST_IP"], port=S3_PORT
    ) as server:
        server.put_folder(MODEL_DIR, BUCKET, MODEL_DIR.name)
        yield server


def _manifest(images: dict[str, str], namespace: str, endpoint: str) -> str:
    """The demo model with its weights from the S3 server instead of the node's folder."""
    model = demo_model(images, namespace)
    spec = model["spec"]["model"]
    del spec["cache"]
    spec["source"] = f"s3://{BUCKET}/{MODEL_DIR.name}"
    spec["s3"] = {"endpoint": endpoint, "credentialsSecret": {"name": SECRET}}
    return yaml.safe_dump(model)


def _key_secret(kubectl: kube.Kubectl, namespace: str, key_id: str, secret: str) -> None:
    kubectl(
        "-n", namespace, "create", "secret", "generic", SECRET,
        f"--from-literal={AWS_ACCESS_KEY_ID_ENV}={key_id}",
        f"--from-literal={AWS_SECRET_ACCESS_KEY_ENV}={secret}",
    )  # fmt: skip


def _ready(kubectl: kube.Kubectl, namespace: str) -> dict[str, Any]:
    model = kubectl.json("-n", namespace, "get", "dmodel", MODEL)
    conditions = (model.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Ready"), {})


@pytest.fixture
def deploy(
    kubectl: kube.Kubectl,
    helm: kube.Tool,
    images: dict[str, str],
    install_operator: Callable[..., None],
    s3: S3Server,
) -> Iterator[Callable[[str, str], str]]:
    """`deploy(release, secret)`: a namespace with the operator chart, the key Secret (the
    server's key id with `secret`) and the demo model from s3://; returns the namespace."""
    namespaces: list[str] = []

    def run(release: str, secret: str) -> str:
        namespace = kube.namespace_name(f"s3-{release}")
        kubectl("create", "namespace", namespace)
        namespaces.append(namespace)
        _key_secret(kubectl, namespace, s3.access_key_id, secret)
        install_operator(release, namespace)
        manifest = _manifest(images, namespace, s3.endpoint)
        kubectl("-n", namespace, "apply", "-f", "-", input=manifest)
        return namespace

    yield run
    for namespace in namespaces:
        for release in helm.run("list", "-n", namespace, "-q", check=False).stdout.split():
            helm.run("uninstall", release, "-n", namespace, "--wait", check=False)
        kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)


def test_refused_credentials_show_in_the_models_condition_naming_the_field(
    deploy: Callable[[str, str], str],
    kubectl: kube.Kubectl,
    pods_report: Callable[[str], str],
) -> None:
    namespace = deploy("refused", "not-the-secret")
    try:
        kube.wait_for(
            lambda: _ready(kubectl, namespace).get("reason") == WEIGHTS_UNAVAILABLE,
            what=f"{MODEL}'s Ready condition with reason {WEIGHTS_UNAVAILABLE}",
            timeout_s=REFUSAL_TIMEOUT_S,
            interval_s=3,
        )
    except TimeoutError as timeout:
        pytest.fail(f"{timeout}\n{_ready(kubectl, namespace)}\n{pods_report(namespace)}")
    ready = _ready(kubectl, namespace)
    assert ready["status"] == "False"
    assert (
        f"{S3_CREDENTIALS_FIELD}: reading s3://{BUCKET}/{MODEL_DIR.name} was refused"
        in (ready["message"])
    ), ready
    pods = kubectl.json("-n", namespace, "get", "pods", "-l", "app.kubernetes.io/component=prefill")
    pod = pods["items"][0]
    (status,) = pod["status"]["containerStatuses"]
    ended = status["state"].get("terminated")
    previous = ended is None
    ended = ended or status["lastState"]["terminated"]
    assert ended["exitCode"] == 3 and "\n" not in ended["message"].strip(), ended
    which = ["--previous"] if previous else []
    logs = kubectl("-n", namespace, "logs", pod["metadata"]["name"], *which)
    assert ended["message"].strip() in logs and "Traceback" not in logs, logs


def test_the_demo_model_from_s3_is_ready_and_a_conversation_reads_kv_back(
    heavy_lock: None,
    deploy: Callable[[str, str], str],
    kubectl: kube.Kubectl,
    s3: S3Server,
    pods_report: Callable[[str], str],
) -> None:
    namespace = deploy("served", s3.secret_access_key)
    try:
        kube.wait_for(
            lambda: _ready(kubectl, namespace).get("status") == "True",
            what=f"{MODEL} Ready with its weights from s3://",
            timeout_s=READY_TIMEOUT_S,
            interval_s=5,
        )
    except TimeoutError as timeout:
        pytest.fail(f"{timeout}\n{_ready(kubectl, namespace)}\n{pods_report(namespace)}")
    (prefill,) = kubectl.json(
        "-n", namespace, "get", "pods", "-l", "app.kubernetes.io/component=prefill"
    )["items"]
    logs = kubectl("-n", namespace, "logs", prefill["metadata"]["name"])
    assert "runai_streamer" in logs and f"s3://{BUCKET}/{MODEL_DIR.name}" in logs, logs[-3000:]
    service = kubectl.json("-n", namespace, "get", "service", f"{MODEL}-router")
    router = f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"
    prefill_url = f"http://{prefill['status']['podIP']}:{ENGINE_PORT}"
    client = ChatClient(router, timeout_s=TURN_TIMEOUT_S)
    try:
        model = client.model()
        facts = " ".join(f"Fact {i}: item {i} is {i * 7 % 101}." for i in range(120))
        messages = [{"role": "user", "content": f"Remember these. {facts} Summarise item 3."}]
        first = client.turn(model, messages, ANSWER_TOKENS, "e2e-s3")
        before = reused_tokens(prefill_url)
        follow_up = [
            *messages,
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "And item 4?"},
        ]
        second = client.turn(model, follow_up, ANSWER_TOKENS, "e2e-s3")
    finally:
        client.close()
    assert first.text and second.text
    assert reused_tokens(prefill_url) > before, "turn 2 read no KV back from decode"
