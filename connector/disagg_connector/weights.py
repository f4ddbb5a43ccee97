"""Can this server read its weights? Checked by ``disagg serve`` before vLLM starts.

A server whose weights' source is wrong (no such bucket, nothing under the prefix, refused
credentials, an unreachable endpoint, a claim path without a model) would otherwise die deep in
vLLM's start-up with a stack trace, again after each restart. The launcher asks the source first,
within a short deadline, and on a failure ends with one line naming the spec field to fix
(:class:`WeightsUnavailable`), which it also writes as the container's termination message,
where the operator reads it into the model's conditions.

An ``s3://`` source is asked with boto3 (the Run:ai streamer's own dependency, so in every image
that can stream from S3), with the environment the operator renders (endpoint, region, access
key) or, without a key, boto3's own chain: the credentials the pod's ServiceAccount brings
(IRSA's web identity token, Pod Identity's container credentials), else the node's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from disagg_contract import (
    AWS_ACCESS_KEY_ID_ENV,
    AWS_DEFAULT_REGION_ENV,
    AWS_ENDPOINT_URL_ENV,
    AWS_REGION_ENV,
    AWS_SECRET_ACCESS_KEY_ENV,
    MODEL_SOURCE_FIELD,
    S3_CREDENTIALS_FIELD,
    S3_ENDPOINT_FIELD,
    S3_SCHEME,
    SERVICE_ACCOUNT_FIELD,
    SOURCE_MOUNT_PATH,
    WEIGHTS_UNAVAILABLE,
)

CONFIG_FILE = "config.json"
WEIGHTS_SUFFIX = ".safetensors"
CHECK_TIMEOUT_S = 10
"""Connect and read timeout of each S3 request of the check (two attempts): a wrong endpoint
fails the start in seconds, not after the startup probe's budget."""
CREDENTIAL_ERRORS = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "AllAccessDisabled",
        "403",
    }
)
"""S3 error codes that mean the credentials were refused, not that the source is wrong."""
MISSING_BUCKET_ERRORS = frozenset({"NoSuchBucket", "404"})


class WeightsUnavailable(Exception):
    """The weights' source cannot be read: `field` is the spec field to fix, `reason` says
    what is wrong and how to fix it."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason

    @property
    def termination_message(self) -> str:
        """The one line the container ends with (the operator's condition quotes it)."""
        return f"{WEIGHTS_UNAVAILABLE}: {self}"


def model_arg(vllm_args: list[str]) -> str | None:
    """The value of vLLM's ``--model`` in the operator's arguments (None when absent)."""
    for index, arg in enumerate(vllm_args):
        if arg == "--model" and index + 1 < len(vllm_args):
            return vllm_args[index + 1]
        if arg.startswith("--model="):
            return arg.removeprefix("--model=")
    return None


def split_s3(uri: str) -> tuple[str, str]:
    """An ``s3://bucket/prefix`` URI's bucket and its prefix with a trailing slash ('' for the
    whole bucket)."""
    bucket, _, prefix = uri.removeprefix(S3_SCHEME).partition("/")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def _credentials_fix(env: Mapping[str, str]) -> str:
    """What to fix about refused credentials, by where they came from."""
    if env.get(AWS_ACCESS_KEY_ID_ENV):
        return "fix the access key in that Secret"
    return (
        "give the pods' ServiceAccount a role that may read the bucket (IRSA or Pod Identity), "
        f"or set {S3_CREDENTIALS_FIELD}"
    )


def _client_error(exc: Any, uri: str, env: Mapping[str, str]) -> WeightsUnavailable:
    """A boto3 ClientError as the field to fix."""
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    bucket, _ = split_s3(uri)
    if code in MISSING_BUCKET_ERRORS:
        return WeightsUnavailable(
            MODEL_SOURCE_FIELD,
            f"bucket {bucket!r} of {uri} does not exist ({code}): name an existing bucket",
        )
    if code in CREDENTIAL_ERRORS:
        return WeightsUnavailable(
            _credentials_field(env),
            f"reading {uri} was refused ({code}: {error.get('Message', '')}): "
            + _credentials_fix(env),
        )
    return WeightsUnavailable(MODEL_SOURCE_FIELD, f"reading {uri} failed ({code}): {exc}")


def _credentials_field(env: Mapping[str, str]) -> str:
    return S3_CREDENTIALS_FIELD if env.get(AWS_ACCESS_KEY_ID_ENV) else SERVICE_ACCOUNT_FIELD


def _listed_keys(uri: str, env: Mapping[str, str]) -> list[str]:
    """The object keys under the source's prefix (one page, enough to find a model's files)."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    bucket, prefix = split_s3(uri)
    config = Config(
        connect_timeout=CHECK_TIMEOUT_S,
        read_timeout=CHECK_TIMEOUT_S,
        retries={"max_attempts": 2, "mode": "standard"},
        s3={"addressing_style": "path" if env.get(AWS_ENDPOINT_URL_ENV) else "auto"},
    )
    try:
        client = boto3.session.Session().client(
            "s3",
            config=config,
            endpoint_url=env.get(AWS_ENDPOINT_URL_ENV) or None,
            region_name=env.get(AWS_DEFAULT_REGION_ENV) or env.get(AWS_REGION_ENV) or None,
            aws_access_key_id=env.get(AWS_ACCESS_KEY_ID_ENV) or None,
            aws_secret_access_key=env.get(AWS_SECRET_ACCESS_KEY_ENV) or None,
        )
        page = client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1000)
    except NoCredentialsError:
        raise WeightsUnavailable(
            SERVICE_ACCOUNT_FIELD,
            f"no credentials to read {uri}: give the pods' ServiceAccount a role (IRSA or Pod "
            f"Identity) or set {S3_CREDENTIALS_FIELD}",
        ) from None
    except ClientError as exc:
        raise _client_error(exc, uri, env) from None
    except BotoCoreError as exc:
        where = env.get(AWS_ENDPOINT_URL_ENV)
        field = S3_ENDPOINT_FIELD if where else MODEL_SOURCE_FIELD
        raise WeightsUnavailable(
            field, f"cannot reach S3 for {uri} ({type(exc).__name__}: {exc})"
        ) from None
    return [str(item["Key"]) for item in page.get("Contents", [])]


def check_s3(uri: str, env: Mapping[str, str]) -> None:
    """Refuse an ``s3://`` source that lists no model: the bucket must exist, the credentials
    must be accepted and the prefix must hold config.json and at least one safetensors file."""
    _, prefix = split_s3(uri)
    names = {key.removeprefix(prefix) for key in _listed_keys(uri, env)}
    missing = [
        what
        for what, found in (
            (CONFIG_FILE, CONFIG_FILE in names),
            (f"*{WEIGHTS_SUFFIX}", any(n.endswith(WEIGHTS_SUFFIX) for n in names)),
        )
        if not found
    ]
    if missing:
        raise WeightsUnavailable(
            MODEL_SOURCE_FIELD,
            f"no {' or '.join(missing)} under {uri}: point the prefix at the folder holding "
            "the model's config.json and *.safetensors files",
        )


def check_folder(path: Path, source: str) -> None:
    """Refuse a mounted folder (a pvc:// source) that holds no model's config.json."""
    if not (path / CONFIG_FILE).is_file():
        raise WeightsUnavailable(
            MODEL_SOURCE_FIELD,
            f"no {CONFIG_FILE} in {path} (from {source}): point the path at the folder on the "
            "claim holding the model",
        )


def check_source(vllm_args: list[str], env: Mapping[str, str]) -> None:
    """Check the weights' source the operator's ``--model`` names: an ``s3://`` URI, or a
    folder where a pvc:// source is mounted; anything else (a Hugging Face id, a cache path)
    is left to vLLM."""
    model = model_arg(vllm_args)
    if model is None:
        return
    if model.startswith(S3_SCHEME):
        check_s3(model, env)
    elif model == SOURCE_MOUNT_PATH or model.startswith(f"{SOURCE_MOUNT_PATH}/"):
        check_folder(Path(model), f"pvc://<claim>{model.removeprefix(SOURCE_MOUNT_PATH)}")
