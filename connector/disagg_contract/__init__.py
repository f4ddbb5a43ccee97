"""The wire contract between the operator, the launcher, the connector and the router.

Every name, key, port and number that crosses a process boundary is defined here once and
imported by each side: the operator renders these names into pods and config files, the
launcher (`disagg serve`) reads them at start-up, the connector inside vLLM writes and reads
the keys of ``kv_transfer_params``, and the router carries those params between prefill and
decode. Standard library only, so that every image can import it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import TypedDict


class Role(enum.StrEnum):
    """The serving role of one vLLM server in prefill/decode disaggregation."""

    PREFILL = "prefill"
    DECODE = "decode"


KV_ROLE: Mapping[Role, str] = MappingProxyType(
    {Role.PREFILL: "kv_producer", Role.DECODE: "kv_consumer"}
)
"""The ``kv_role`` vLLM's NIXL connector expects per role (``kv_both`` is deprecated there)."""

# --- The connector as vLLM loads it (--kv-transfer-config) ---------------------------------
CONNECTOR_CLASS = "DisaggConnector"
"""``kv_connector``: the connector class vLLM instantiates."""
CONNECTOR_MODULE = "disagg_connector.connector"
"""``kv_connector_module_path``: where vLLM finds the class (out-of-tree, takes priority)."""

EXTRA_BIDIRECTIONAL = "bidirectional_kv_xfer"
"""``kv_connector_extra_config`` key: decode retains finished KV and prefill may read it back."""
EXTRA_DECODER_TTL = "decoder_kv_blocks_ttl"
"""``kv_connector_extra_config`` key: seconds decode retains a finished request's blocks."""
EXTRA_RECOMPUTE_THRESHOLD = "kv_recompute_threshold"
"""``kv_connector_extra_config`` key: fewest reusable tokens worth a D->P read."""
EXTRA_BACKENDS = "backends"
"""``kv_connector_extra_config`` key: NIXL transport backends (UCX or LIBFABRIC)."""
EXTRA_LEASE_TERM = "disagg_lease_term_s"
"""``kv_connector_extra_config`` key: seconds decode keeps a retention past its last renewal
(see :func:`lease_term_s`); the decoder TTL still caps the retention's whole life."""
EXTRA_READ_DECISION = "disagg_read_decision"
"""``kv_connector_extra_config`` key: how prefill decides to read decode's KV (a
:class:`ReadDecision` value)."""


class PrefillRouting(enum.StrEnum):
    """How the router picks the prefill replica of a conversation's turn (``--prefill-routing``)."""

    AFFINITY = "affinity"
    """The replica of the conversation's previous turn, whose prefix cache holds its prompt so
    far, unless it left, is draining, failed or is much busier than the least loaded one."""
    LEAST_LOADED = "least-loaded"
    """The least loaded replica: for prefills that keep no prefix cache."""


class ReadDecision(enum.StrEnum):
    """How prefill decides between reading decode's retained KV back (D->P) and recomputing it.

    Either way the recompute threshold is the floor: fewer reusable tokens are recomputed.
    """

    MEASURED = "measured"
    """Read only when the connector's running estimate of the read's time (fixed cost plus
    per-token time, measured on its own reads) is below its estimate of computing those tokens
    (measured on its own prefills)."""
    THRESHOLD = "threshold"
    """Read whenever at least the threshold's tokens are reusable (vLLM's own rule)."""


# --- kv_transfer_params: what decode offers and prefill reads ------------------------------
KV_TRANSFER_PARAMS = "kv_transfer_params"
"""The request and response field that carries the connector's params through the router."""
CACHE_SALT_KEY = "cache_salt"
"""The request field (vLLM's) mixed into the request's prefix-cache block hashes, and so into
the connector's token digest: the router sets it on every prefill and decode body, derived per
tenant, so that tenants never share cached blocks."""
EXPIRES_AT_KEY = "disagg_expires_at"
"""Unix time (decode's wall clock) at which decode frees the retained blocks."""
TOKEN_DIGEST_KEY = "disagg_token_digest"
"""The chained per-block digest of the tokens decode's retained KV was computed from."""
DIGEST_WIRE_VERSION = 1
"""Version of the digest's wire format; a reader refuses any version it does not know."""
EXPIRY_MARGIN_S = 5
"""Seconds before expiry at which an offer is no longer read: vLLM's worker declines reads that
expire within this margin, so the router drops entries and the operator sizes TTLs by it."""
OFFER_KEY = "disagg_offer"
"""The signed envelope of an offer (wire version, offer id, expiry, model, HMAC-SHA256 signature):
the engine that publishes retained KV signs it, the engine that would read that KV checks it."""
OFFER_WIRE_VERSION = 1
"""Version of the signed envelope's wire format; a reader refuses any version it does not know."""
RETAIN_KEY = "disagg_retain"
"""Set to ``true`` by the router in the params it sends decode for a turn of a conversation:
decode retains the finished request's KV for a D->P read only when asked (every other request
frees its blocks at once, as with bidirectional off)."""
LEASE_KEY = "disagg_lease"
"""In a signed offer: ``{"port": P, "term_s": T}``, where the issuer's lease service listens
(on ``remote_host``) and how long a retention lives past its last renewal (decode's D->P
offers; None in prefill's P->D offers, which have no lease). Signed with the offer; the reader
claims the blocks there before it reads."""

# --- Leases: blocks an engine holds for a reader --------------------------------------------
# Decode's retained KV is held for the router (renew, release) and claimed by prefill; prefill's
# KV of a prompt is claimed by decode (claim only). Each engine serves these on its lease port
# (JSON over HTTP, ``Authorization: Bearer <engine credential>`` when the engines have one). A
# lease is named by the issuer's request id and the offer id of its signed envelope
# (:class:`LeaseName`). Each path's body and reply are the TypedDicts below; both sides build
# them, so mypy checks every field on each side.
LEASE_CLAIM_PATH = "/disagg/v1/leases/claim"
"""POST :class:`ClaimCall` -> :class:`ClaimReply`: the reader asks when the request arrives
(and again if it is still queued past a recheck), before it reads. The issuer grants one
claimant per offer, then holds the blocks for ``hold_s`` past the grant whatever else happens
(release, lease expiry, memory pressure), so a read that starts within :func:`claim_trust_s`
of sending the claim never sees freed blocks."""
LEASE_RENEW_PATH = "/disagg/v1/leases/renew"
"""POST :class:`RenewCall` -> :class:`RenewReply`: the router extends the leases of open
conversations; ``gone`` names the ones decode no longer holds."""
LEASE_RELEASE_PATH = "/disagg/v1/leases/release"
"""POST :class:`ReleaseCall` -> :class:`ReleaseReply`: the router drops retentions it will never
offer again (superseded, evicted, expired, idle, closed, drained)."""
MAX_LEASES_PER_CALL = 800
"""Most leases one renewal or release names: the router splits larger batches, decode's lease
service refuses a longer list (400). A release of this many leases with the longest ids the
service takes fits its body limit with room to spare."""
LEASE_CALL_TIMEOUT_S = 2.0
"""Seconds one call on the lease port may take from connecting to the last byte of the reply:
the router's and the readers' limit on waiting, and the deadline after which an engine's
lease service closes a connection whatever state it is in."""


class LeaseName(TypedDict):
    """How decode names one retention."""

    request: str
    """Decode's request id (``remote_request_id`` in its offer)."""
    offer: str
    """The offer id of the retention's signed envelope."""


class ReleasedLease(LeaseName):
    """A lease the router releases, with why."""

    reason: str
    """A :class:`ReleaseReason` value, for the router's own counts (decode does not read it)."""


class ClaimCall(TypedDict):
    """The body of a claim: which retention, and who reads it."""

    request: str
    offer: str
    claimant: str
    """The reader, ``<incarnation>:<request id>``: the one claimant a grant names."""


class ClaimReply(TypedDict):
    """The issuer's answer to a claim."""

    granted: bool
    hold_s: float
    """Seconds the issuer holds the blocks past the grant (0 when refused)."""
    reason: str
    """Why not (a ``ClaimRefusal`` value of the connector), empty when granted."""


class RenewCall(TypedDict):
    """The body of a renewal: at most :data:`MAX_LEASES_PER_CALL` leases."""

    leases: list[LeaseName]


class RenewReply(TypedDict):
    """Decode's answer to a renewal."""

    gone: list[LeaseName]
    """The leases named in the call that decode no longer holds."""


class ReleaseCall(TypedDict):
    """The body of a release: at most :data:`MAX_LEASES_PER_CALL` leases."""

    leases: list[ReleasedLease]


class ReleaseReply(TypedDict):
    """Decode's answer to a release."""

    released: int
    """How many of the named leases decode held until now."""


TENANT_SHARE_DIVISOR = 2
"""With client keys (several tenants), one tenant's default bound on the router's request slots
is the router's whole bound divided by this, so that no tenant, slow request bodies included,
can take every slot while another tenant is refused (``--max-requests-per-tenant`` sets
another)."""

CLAIM_HOLD_S = 30.0
"""The longest hold an issuer grants (its own clock); never past the blocks' hard cap (decode's
TTL, prefill's ``kv_lease_duration``)."""
MIN_CLAIM_HOLD_S = 4.0
"""The shortest hold an issuer grants: blocks closer than this to their cap are refused."""


def claim_trust_s(hold_s: float) -> float:
    """Seconds after sending a claim granted ``hold_s`` within which the reader may start the read.

    Measured on the reader's clock from before the claim was sent: the grant happened after the
    send, so the issuer's hold outlasts this window whatever the two clocks say, with half the
    hold to spare for the read itself.
    """
    return hold_s / 2


class ReleaseReason(enum.StrEnum):
    """Why the router releases a lease (the ``reason`` of a release, a metric label)."""

    SUPERSEDED = "superseded"
    """The conversation's next turn made a new retention (and did not read this one)."""
    EVICTED = "evicted"
    """The router's conversation store evicted the entry (capacity)."""
    LAPSED = "lapsed"
    """The router's entry outlived the retention it names (decoder TTL)."""
    IDLE = "idle"
    """No turn within the idle timeout."""
    CLOSED = "closed"
    """The client closed the conversation (DELETE)."""
    DRAINED = "drained"
    """The decode replica holding it is leaving (its endpoint is terminating): no turn reads
    it again, the conversation's next turn recomputes on another replica."""


DEFAULT_IDLE_TIMEOUT_S = 120
"""Seconds without a turn after which a conversation's retained KV is released."""

ROUTER_HEADER_TIMEOUT_S = 10
"""Seconds a client has to send a request's line and headers (``--header-timeout``)."""


def renewal_period_s(idle_timeout_s: float) -> float:
    """How often the router renews the leases of open conversations (and checks idleness)."""
    return min(max(idle_timeout_s / 4, 1.0), 15.0)


def lease_term_s(idle_timeout_s: float) -> float:
    """How long decode keeps a retention past its last renewal: three renewal periods, so one
    lost renewal costs nothing and a router that stops renewing frees decode soon after."""
    return 3 * renewal_period_s(idle_timeout_s)


READ_REPORT_KEY = "disagg_read"
"""In prefill's answer (its ``kv_transfer_params``), for the router only: what became of the D->P
offer the turn carried (:class:`ReadReport`). Not signed; the router never sends it on."""


class ReadReport(TypedDict):
    """Prefill's account of one D->P offer, in tokens."""

    offered: int
    """Tokens of the turn's history decode's offer held."""
    verified: int
    """Of those, the tokens in whole blocks whose digest matched the new prompt."""
    diverged: int
    """Tokens the offer could have covered that failed verification: the history the client
    sent back differs from what decode held (an edited message, an answer re-rendered)."""
    read: int
    """Tokens prefill read back (verified, claimed and worth reading)."""


REUSE_SUMMARY_PATH = "/disagg/v1/reuse"
"""GET on the router -> :class:`ReuseSummary` as JSON: what the operator copies into status."""


class ReuseSummary(TypedDict):
    """The router's reuse counters since it started (the operator sums them over replicas)."""

    turns: int
    """Conversation turns served (turns that carried a conversation id)."""
    hits: int
    """Turns whose prompt was partly read back from decode (D->P)."""
    reused_tokens: int
    """Prompt tokens read back from decode instead of recomputed."""
    recomputed_tokens: int
    """Prompt tokens prefill computed on conversation turns."""
    leases_held: int
    """Decode retentions the router holds now."""
    released: dict[str, int]
    """Leases released, by :class:`ReleaseReason` value and ``gone`` (decode had freed it)."""
    store_errors: int
    """Conversation store operations that failed: each cost a turn its reuse (or left an entry
    to expire on its own); ``disagg_router_store_errors_total`` by operation."""
    offered_tokens: int
    """Tokens decode's offers held on the turns that carried one (prefill's read reports)."""
    verified_tokens: int
    """Of those, the tokens whose digest matched the turn's prompt."""
    diverged_tokens: int
    """Tokens lost to a history that differs from what decode held."""


# --- Ports -----------------------------------------------------------------------------------
ENGINE_PORT = 8000
"""The HTTP port of every vLLM server (OpenAI API, /health, /metrics)."""
ROUTER_PORT = 8000
"""The HTTP port of `disagg router`."""
SIDE_CHANNEL_PORT = 5600
"""The default NIXL side-channel port (handshakes between prefill and decode)."""
LEASE_PORT = 5700
"""The default port of an engine's lease service: prefill's (claims from decode) and decode's
(claims from prefill, renewals and releases from the router)."""

# --- Environment variables -------------------------------------------------------------------
SIDE_CHANNEL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"
"""The address vLLM's NIXL side channel binds and advertises as ``remote_host``."""
SIDE_CHANNEL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
"""The NIXL side-channel port vLLM binds and advertises as ``remote_port``."""
LEASE_PORT_ENV = "DISAGG_LEASE_PORT"
"""The port an engine's lease service binds on the side-channel host (default LEASE_PORT)."""
POD_IP_ENV = "POD_IP"
"""The pod's IP (downward API); the launcher's default side-channel host."""
ENGINE_API_KEY_ENV = "VLLM_API_KEY"
"""The key vLLM requires on its /v1 routes."""
ROUTER_API_KEY_ENV = "DISAGG_API_KEY"
"""A client key `disagg router` accepts (tenant ``default``); sent to the engines only when no
engine credential file is given."""
ROUTER_REDIS_URL_ENV = "DISAGG_REDIS_URL"
"""The router's Redis URL when it comes from a Secret."""
FI_PROVIDER_ENV = "FI_PROVIDER"
"""libfabric's provider (``efa`` on EFA nodes)."""
IDLE_STEP_WAIT_ENV = "DISAGG_IDLE_STEP_WAIT_MS"
"""Milliseconds an engine step with nothing to do but hold retained KV may wait (0: off)."""
NIXL_PROGRESS_DELAY_ENV = "DISAGG_NIXL_PROGRESS_DELAY_US"
"""Microseconds NIXL's progress thread sleeps between polls (unset: NIXL's default)."""
OFFER_KEY_FILE_ENV = "DISAGG_OFFER_KEY_FILE"
"""Path of the file holding the model's offer-signing keys, one a line (the first signs, every
one verifies); only prefill and decode hold it, never the router or a client."""
OFFER_KEY_ENV = "DISAGG_OFFER_KEY"
"""The offer-signing key itself, when it comes as an environment variable instead of a file."""
CLIENT_KEYS_DIR_ENV = "DISAGG_CLIENT_KEYS_DIR"
"""A folder (a mounted Secret) in which every file is one client key of the router: the file's
name is the tenant, its content the key; each tenant is its own conversation scope."""
ENGINE_KEY_FILE_ENV = "DISAGG_ENGINE_KEY_FILE"
"""Path of the engine credential the router sends to prefill and decode (never a client key)."""
REDIS_PREFIX_ENV = "DISAGG_REDIS_PREFIX"
"""The router's Redis key prefix, one per model so that models sharing a Redis never meet."""

# --- Model weights from a source (spec.model.source) -----------------------------------------
MODEL_SOURCE_FIELD = "spec.model.source"
"""The spec field naming where the weights come from; the launcher's refusals name it."""
S3_ENDPOINT_FIELD = "spec.model.s3.endpoint"
"""The spec field of an S3-compatible server's endpoint."""
S3_CREDENTIALS_FIELD = "spec.model.s3.credentialsSecret"
"""The spec field of the Secret holding an S3 access key."""
SERVICE_ACCOUNT_FIELD = "spec.<role>.serviceAccountName"
"""Where S3 credentials come from without a Secret: the pods' ServiceAccount (IRSA, Pod
Identity)."""
WEIGHTS_UNAVAILABLE = "WeightsUnavailable"
"""The first word of the termination message a server writes when it cannot read its weights'
source (``WeightsUnavailable: <field>: <what and the fix>``), and the reason of the model's
condition the operator builds from it."""
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
"""Where a container's termination message goes (the kubelet's default path)."""
S3_SCHEME = "s3://"
"""The scheme of an S3 source, as spec.model.source and vLLM's --model write it."""
SOURCE_MOUNT_PATH = "/model-source"
"""Where a pvc:// source's claim is mounted in the serving pods, read-only; vLLM's ``--model``
is the source's folder below it."""
RUNAI_LOAD_FORMAT = "runai_streamer"
"""vLLM's ``--load-format`` that streams safetensors from object storage (Run:ai streamer)."""
AWS_ENDPOINT_URL_ENV = "AWS_ENDPOINT_URL"
"""The S3 endpoint every AWS SDK (boto3, the Run:ai streamer's C++ one) reads."""
AWS_REGION_ENV = "AWS_REGION"
AWS_DEFAULT_REGION_ENV = "AWS_DEFAULT_REGION"
"""The region: the C++ SDK reads the first, boto3 the second."""
AWS_ACCESS_KEY_ID_ENV = "AWS_ACCESS_KEY_ID"
AWS_SECRET_ACCESS_KEY_ENV = "AWS_SECRET_ACCESS_KEY"
"""An S3 access key, from spec.model.s3.credentialsSecret."""
S3_VIRTUAL_ADDRESSING_ENV = "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"
"""``0``: the Run:ai streamer puts the bucket in the path (an S3-compatible server's
endpoint), not in the host name."""

# --- Files the operator mounts -----------------------------------------------------------------
OFFER_KEY_DIR = "/etc/disagg/offer-key"
"""Where prefill and decode find the model's offer-signing Secret (data key SECRET_KEY_NAME)."""
CLIENT_KEYS_DIR = "/etc/disagg/client-keys"
"""Where the router finds its client keys (every key of the client-keys Secret)."""
ENGINE_KEY_DIR = "/etc/disagg/engine-key"
"""Where the router finds the engine credential Secret (data key SECRET_KEY_NAME)."""
SECRET_KEY_NAME = "disagg-key"
"""The data key of each Secret the operator generates (offer-signing key, engine credential)."""

# --- vLLM options the operator sets -----------------------------------------------------------
# The operator renders these into every prefill and decode command, so a role's `extraArgs` may
# not set them. The admission check (models and CEL) refuses an entry that is one of these flags
# exactly or as `--flag=value`; `disagg serve` reads the extra args with vLLM's own parser and
# refuses every other spelling that sets one (`_` for `-`, abbreviations, dotted keys, -t).
KV_TRANSFER_CONFIG_FLAG = "--kv-transfer-config"
"""The vLLM option `disagg serve` passes the connector config with."""
EXTRA_ARGS_MARKER = "--"
"""Ends the operator's vLLM arguments in `disagg serve --role R --config F -- <operator's> -- <a
role's extraArgs>`: the launcher checks only what follows it (rendered only with extraArgs)."""
_MULTI_NODE = (
    "set nodesPerReplica (beside extraArgs) instead: the operator renders vLLM's multi-node "
    "flags for the leader and each worker of the group"
)
_PROMPT_TOKENS_DETAILS = (
    "drop it: the router's reuse counters read usage.prompt_tokens_details, which the operator "
    "always enables"
)
MANAGED_VLLM_FLAGS: Mapping[str, str] = MappingProxyType(
    {
        # spec.model: one value for both roles
        "--model": "set spec.model.name instead",
        "--served-model-name": "set spec.model.servedName instead",
        "--revision": "set spec.model.revision instead",
        "--dtype": "set spec.model.dtype instead",
        "--max-model-len": "set spec.model.maxModelLen instead",
        # the role's own fields, beside extraArgs
        "--tensor-parallel-size": "set tensorParallelSize (beside extraArgs) instead",
        "-tp": "set tensorParallelSize (beside extraArgs) instead",
        "--pipeline-parallel-size": "set pipelineParallelSize (beside extraArgs) instead",
        "-pp": "set pipelineParallelSize (beside extraArgs) instead",
        # one server across nodes: rendered from nodesPerReplica (LeaderWorkerSet)
        "--nnodes": _MULTI_NODE,
        "-n": _MULTI_NODE,
        "--node-rank": _MULTI_NODE,
        "-r": _MULTI_NODE,
        "--master-addr": _MULTI_NODE,
        "--headless": _MULTI_NODE,
        "--max-num-seqs": "set maxNumSeqs (beside extraArgs) instead",
        "--shutdown-timeout": "set terminationGracePeriodSeconds (beside extraArgs) instead: "
        "the operator renders vLLM's drain of a leaving pod from it",
        "--enable-prefix-caching": "set prefixCaching (beside extraArgs) instead",
        "--no-enable-prefix-caching": "set prefixCaching (beside extraArgs) instead",
        "--disable-prefix-caching": "set prefixCaching (beside extraArgs) instead",
        # the engine credential: generated by the operator, sent by the router only
        "--api-key": "drop it: the operator gives prefill and decode the engine credential it "
        "generates (Secret <name>-engine-key), which only the router holds and sends; client "
        "keys go in spec.auth",
        # fixed by the operator
        "--enable-prompt-tokens-details": _PROMPT_TOKENS_DETAILS,
        "--no-enable-prompt-tokens-details": _PROMPT_TOKENS_DETAILS,
        "--disable-prompt-tokens-details": _PROMPT_TOKENS_DETAILS,
        "--port": f"drop it: vLLM listens on {ENGINE_PORT}, the port the Services and the router "
        "use",
        KV_TRANSFER_CONFIG_FLAG: "drop it: the operator renders the connector config from "
        "spec.kvTransfer",
    }
)
"""Every option string vLLM (0.32, 0.33) has for an option the operator sets, with what to do
instead (inverses included: 0.33 adds ``--disable-*`` beside ``--no-enable-*``)."""
