"""Weights from a source URI (spec.model.source): what an s3://, pvc:// or hf:// source renders
into the prefill and decode pods (vLLM's --model and load format, the S3 environment, the
claim mounted read-only), the startup probe's budget and its default sized from the weights,
what the models refuse with the field named, and the condition a server that cannot read its
source leaves on the model."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from disagg_contract import S3_CREDENTIALS_FIELD, WEIGHTS_UNAVAILABLE
from disagg_operator.conditions import Observed, build_status, pod_state
from disagg_operator.errors import SpecError
from disagg_operator.loading import load_spec
from disagg_operator.models import DEFAULT_STARTUP_BUDGET_SECONDS
from disagg_operator.names import Component
from disagg_operator.reconcile import secret_refs
from disagg_operator.render import render
from dmodel_samples import spec_with

Manifest = dict[str, Any]
KUBERNETES_VERSION = kubernetes_validate.latest_version()
S3_SOURCE = {
    "source": "s3://models/qwen3/32b",
    "s3": {
        "endpoint": "http://10.89.0.1:7070",
        "region": "eu-west-1",
        "credentialsSecret": {"name": "weights-key"},
    },
}


def _server(model: dict[str, Any]) -> dict[str, Any]:
    """The prefill server container and its pod spec, rendered from a spec with `model`."""
    manifests = render("demo", "ml", load_spec(spec_with({"model": model})))
    for manifest in manifests:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    (workload,) = [m for m in manifests if m["metadata"]["name"] == "demo-prefill"
                   and m["kind"] == "StatefulSet"]  # fmt: skip
    pod: dict[str, Any] = workload["spec"]["template"]["spec"]
    return pod


def _arg(command: list[str], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


def test_an_s3_source_streams_with_the_runai_loader_and_the_s3_environment() -> None:
    pod = _server({"name": "qwen3-32b", **S3_SOURCE})
    (container,) = pod["containers"]
    command = container["command"]
    assert _arg(command, "--model") == "s3://models/qwen3/32b"
    assert _arg(command, "--load-format") == "runai_streamer"
    assert _arg(command, "--served-model-name") == "qwen3-32b"
    env = {var["name"]: var for var in container["env"]}
    assert env["AWS_ENDPOINT_URL"]["value"] == "http://10.89.0.1:7070"
    assert env["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"]["value"] == "0"
    assert env["AWS_REGION"]["value"] == env["AWS_DEFAULT_REGION"]["value"] == "eu-west-1"
    key_id = env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]
    secret = env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]
    assert key_id == {"name": "weights-key", "key": "AWS_ACCESS_KEY_ID"}
    assert secret == {"name": "weights-key", "key": "AWS_SECRET_ACCESS_KEY"}


def test_an_s3_source_without_s3_settings_uses_the_service_accounts_credentials() -> None:
    pod = _server({"name": "m", "source": "s3://models/m"})
    (container,) = pod["containers"]
    assert not [var for var in container["env"] if var["name"].startswith(("AWS_", "RUNAI_"))]
    assert _arg(container["command"], "--load-format") == "runai_streamer"


def test_the_credentials_secret_is_checked_like_every_secret_pods_read() -> None:
    refs = secret_refs(load_spec(spec_with({"model": {"name": "m", **S3_SOURCE}})))
    assert [(field, ref.name, getattr(ref, "key", None)) for field, ref in refs] == [
        (S3_CREDENTIALS_FIELD, "weights-key", "AWS_ACCESS_KEY_ID"),
        (S3_CREDENTIALS_FIELD, "weights-key", "AWS_SECRET_ACCESS_KEY"),
    ]


def test_a_pvc_source_mounts_its_claim_read_only_and_serves_its_folder() -> None:
    pod = _server({"name": "m", "source": "pvc://fsx-weights/qwen3/32b/"})
    (container,) = pod["containers"]
    assert _arg(container["command"], "--model") == "/model-source/qwen3/32b"
    assert "--load-format" not in container["command"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["model-source"]["persistentVolumeClaim"] == {
        "claimName": "fsx-weights",
        "readOnly": True,
    }
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    assert mounts["model-source"] == {
        "name": "model-source",
        "mountPath": "/model-source",
        "readOnly": True,
    }


def test_an_hf_source_names_the_model_id() -> None:
    (container,) = _server({"name": "qwen", "source": "hf://Qwen/Qwen3-32B"})["containers"]
    assert _arg(container["command"], "--model") == "Qwen/Qwen3-32B"
    assert _arg(container["command"], "--served-model-name") == "qwen"


@pytest.mark.parametrize(
    ("model", "budget"),
    [
        ({}, DEFAULT_STARTUP_BUDGET_SECONDS),
        ({"weightsSize": "750Gi"}, 4800),
        ({"weightsSize": "1Ti", "startupBudgetSeconds": 600}, 600),
        ({"weightsSize": "100Ti"}, 86400),
    ],
)
def test_the_startup_budget_is_the_field_or_sized_from_the_weights(
    model: dict[str, Any], budget: int
) -> None:
    (container,) = _server({"name": "m", **model})["containers"]
    probe = container["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] == budget


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ({"source": "gs://models/x"}, "spec.model.source: must be hf://<org>/<model>"),
        ({"source": "s3://Models/x"}, "spec.model.source: must be hf://<org>/<model>"),
        ({"s3": {"region": "us-east-1"}}, "spec.model.s3: applies only to an s3:// source"),
        (
            {"source": "hf://a/b", "s3": {"region": "us-east-1"}},
            "spec.model.s3: applies only to an s3:// source",
        ),
    ],
)
def test_bad_sources_are_refused_naming_the_field(model: dict[str, Any], says: str) -> None:
    with pytest.raises(SpecError) as refused:
        load_spec(spec_with({"model": {"name": "m", **model}}))
    assert says in str(refused.value)


def test_a_role_may_not_mount_over_the_source() -> None:
    role = {
        "volumes": [{"name": "mine", "emptyDir": {}}],
        "volumeMounts": [{"name": "mine", "mountPath": "/model-source"}],
    }
    with pytest.raises(SpecError) as refused:
        load_spec(spec_with({"prefill": role}))
    assert "spec.prefill.volumeMounts: must not mount at a path the operator mounts" in str(
        refused.value
    )


def _crash_looping(message: str) -> dict[str, Any]:
    """A server pod waiting to restart after its container ended with `message`."""
    return {
        "metadata": {"name": "m-prefill-0"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                    "lastState": {"terminated": {"exitCode": 3, "message": message}},
                }
            ],
        },
    }


def test_a_server_that_cannot_read_its_weights_puts_the_field_in_the_conditions() -> None:
    reason = "spec.model.source: bucket 'nope' of s3://nope/m does not exist (NoSuchBucket)"
    state = pod_state(_crash_looping(f"{WEIGHTS_UNAVAILABLE}: {reason}"), "prefill")
    assert state.failing and state.reason == WEIGHTS_UNAVAILABLE and state.detail == reason
    observed = Observed(
        spec=load_spec(spec_with({"model": {"name": "m", "source": "s3://nope/m"}})),
        name="m",
        namespace="ml",
        generation=1,
        workloads={c: None for c in (Component.PREFILL, Component.DECODE, Component.ROUTER)},
        pods=[state],
        in_sync=True,
    )
    conditions = {c.type: c for c in build_status(observed, "2026-01-01T00:00:00Z").conditions}
    for kind in ("Ready", "Degraded"):
        assert conditions[kind].reason == WEIGHTS_UNAVAILABLE
        assert f"pod m-prefill-0: {reason}" in conditions[kind].message


def test_other_crashes_stay_pod_failing() -> None:
    state = pod_state(_crash_looping("Traceback (most recent call last): ..."), "prefill")
    assert state.failing and state.reason == "PodFailing"
    assert state.detail == "CrashLoopBackOff: back-off"


def test_a_ready_server_is_not_failing_for_an_earlier_weights_message() -> None:
    """A message left from an earlier start (the source fixed since) is no current failure."""
    pod = _crash_looping(f"{WEIGHTS_UNAVAILABLE}: spec.model.source: bucket 'nope' missing")
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    pod["status"]["containerStatuses"][0]["state"] = {"running": {}}
    state = pod_state(pod, "prefill")
    assert state.ready and not state.failing
