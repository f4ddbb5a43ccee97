"""``disagg serve``'s weights check against a real S3 server (versitygw, built from its pinned
Go module, tests/cluster/s3_server.py) on 127.0.0.1: a readable source passes; a wrong bucket, a
prefix without a model, a refused key and an unreachable endpoint each end in one line naming
the spec field to fix, and a pvc:// folder without config.json does too."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from disagg_connector.launcher import write_termination_message
from disagg_connector.weights import (
    CHECK_TIMEOUT_S,
    WeightsUnavailable,
    check_source,
    model_arg,
)
from disagg_contract import (
    AWS_ACCESS_KEY_ID_ENV,
    AWS_DEFAULT_REGION_ENV,
    AWS_ENDPOINT_URL_ENV,
    AWS_SECRET_ACCESS_KEY_ENV,
    MODEL_SOURCE_FIELD,
    S3_CREDENTIALS_FIELD,
    S3_ENDPOINT_FIELD,
    SOURCE_MOUNT_PATH,
    WEIGHTS_UNAVAILABLE,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from s3_server import REGION, S3Server, s3_server

BUCKET = "models"
PREFIX = "tiny/v1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The S3 server with a model's files (a config and a safetensors file) under PREFIX."""
    tmp = tmp_path_factory.mktemp("s3")
    model = tmp / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    with s3_server(tmp / "root", port=_free_port()) as running:
        running.put_folder(model, BUCKET, PREFIX)
        yield running


def _env(server: S3Server, secret: str | None = None) -> dict[str, str]:
    """The environment the operator renders for an s3:// source with a credentials Secret."""
    return {
        AWS_ENDPOINT_URL_ENV: server.endpoint,
        AWS_DEFAULT_REGION_ENV: REGION,
        AWS_ACCESS_KEY_ID_ENV: server.access_key_id,
        AWS_SECRET_ACCESS_KEY_ENV: secret or server.secret_access_key,
    }


def _refusal(source: str, env: dict[str, str]) -> WeightsUnavailable:
    with pytest.raises(WeightsUnavailable) as refused:
        check_source(["--model", source, "--port", "8000"], env)
    assert "\n" not in str(refused.value), "a refusal is one line"
    return refused.value


def test_a_source_holding_a_model_passes(server: S3Server) -> None:
    check_source(["--model", f"s3://{BUCKET}/{PREFIX}"], _env(server))
    check_source(["--model", f"s3://{BUCKET}/{PREFIX}/"], _env(server))


def test_a_wrong_bucket_names_the_source(server: S3Server) -> None:
    refusal = _refusal(f"s3://no-such-bucket/{PREFIX}", _env(server))
    assert refusal.field == MODEL_SOURCE_FIELD
    assert "'no-such-bucket'" in refusal.reason and "does not exist" in refusal.reason


def test_a_prefix_without_a_model_names_the_source(server: S3Server) -> None:
    refusal = _refusal(f"s3://{BUCKET}/tiny/v2", _env(server))
    assert refusal.field == MODEL_SOURCE_FIELD
    assert "no config.json or *.safetensors under s3://models/tiny/v2" in refusal.reason


def test_a_refused_key_names_the_credentials_secret(server: S3Server) -> None:
    refusal = _refusal(f"s3://{BUCKET}/{PREFIX}", _env(server, secret="not-the-secret"))
    assert refusal.field == S3_CREDENTIALS_FIELD
    assert "refused" in refusal.reason and "SignatureDoesNotMatch" in refusal.reason


def test_an_unreachable_endpoint_names_the_endpoint_within_the_deadline(
    server: S3Server,
) -> None:
    env = {**_env(server), AWS_ENDPOINT_URL_ENV: f"http://127.0.0.1:{_free_port()}"}
    start = time.monotonic()
    refusal = _refusal(f"s3://{BUCKET}/{PREFIX}", env)
    assert refusal.field == S3_ENDPOINT_FIELD
    assert time.monotonic() - start < 4 * CHECK_TIMEOUT_S


def test_a_claim_folder_without_config_names_the_source(tmp_path: Path) -> None:
    with pytest.raises(WeightsUnavailable) as refused:
        check_source(["--model", f"{SOURCE_MOUNT_PATH}/no/such/model"], {})
    assert refused.value.field == MODEL_SOURCE_FIELD
    assert "no config.json in /model-source/no/such/model" in refused.value.reason


def test_other_models_are_left_to_vllm() -> None:
    check_source(["--model", "Qwen/Qwen3-32B"], {})
    check_source(["--model", "/models/bench-llama-h1024-l8-v1"], {})


def test_model_arg_reads_both_spellings() -> None:
    assert model_arg(["--port", "1", "--model", "s3://a/b"]) == "s3://a/b"
    assert model_arg(["--model=s3://a/b"]) == "s3://a/b"
    assert model_arg(["--port", "1"]) is None


def test_the_termination_message_is_written_only_where_the_kubelet_mounts_it(
    tmp_path: Path,
) -> None:
    message = WeightsUnavailable(
        MODEL_SOURCE_FIELD, "bucket 'x' does not exist"
    ).termination_message
    assert message == f"{WEIGHTS_UNAVAILABLE}: spec.model.source: bucket 'x' does not exist"
    mounted = tmp_path / "termination-log"
    mounted.touch()
    write_termination_message(mounted, message)
    assert mounted.read_text() == message
    write_termination_message(tmp_path / "absent", message)
    assert not (tmp_path / "absent").exists()
