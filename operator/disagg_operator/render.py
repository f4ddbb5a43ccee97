"""Render a DisaggregatedModel's children: a pure function from (name, namespace, spec).

Python computes every value here; the templates under `templates/<component>/<kind>.yaml.j2`
(`templates/shared/` for a kind every workload gets) only lay them out. The manifests carry
name, namespace and labels but no owner reference: the operator adopts them before applying.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from typing import Any

import jinja2
import yaml

from disagg_contract import (
    AWS_ACCESS_KEY_ID_ENV,
    AWS_DEFAULT_REGION_ENV,
    AWS_ENDPOINT_URL_ENV,
    AWS_REGION_ENV,
    AWS_SECRET_ACCESS_KEY_ENV,
    CLIENT_KEYS_DIR,
    ENGINE_API_KEY_ENV,
    ENGINE_KEY_DIR,
    ENGINE_PORT,
    EXTRA_ARGS_MARKER,
    FI_PROVIDER_ENV,
    LEASE_PORT,
    LEASE_PORT_ENV,
    OFFER_KEY_DIR,
    OFFER_KEY_FILE_ENV,
    POD_IP_ENV,
    ROUTER_API_KEY_ENV,
    ROUTER_REDIS_URL_ENV,
    RUNAI_LOAD_FORMAT,
    S3_SCHEME,
    S3_VIRTUAL_ADDRESSING_ENV,
    SECRET_KEY_NAME,
    SIDE_CHANNEL_HOST_ENV,
    SIDE_CHANNEL_PORT_ENV,
    SOURCE_MOUNT_PATH,
    PrefillRouting,
    Role,
)
from disagg_operator.connector_config import config_file, config_hash, config_map_data
from disagg_operator.engine_metrics import SIGNALS, decimal_text, hpa_metric_name, role_selector
from disagg_operator.errors import SpecError
from disagg_operator.models import (
    CACHE_VOLUME,
    CONFIG_DIR,
    CONNECTOR_VOLUME,
    DRAIN_DELAY_SECONDS,
    HASH_SEED_ENV,
    MAX_MULTI_NODE_NAME_LENGTH,
    MULTI_NODE_NAME_MESSAGE,
    OFFER_KEY_VOLUME,
    ROUTER_MAX_CONCURRENT_REQUESTS,
    SHM_MOUNT_PATH,
    SHM_VOLUME,
    SOURCE_VOLUME,
    STARTUP_PROBE_PERIOD_SECONDS,
    AutoscalingSpec,
    DisaggregatedModelSpec,
    ModelSpec,
    NetworkPeer,
    RedisUrlSecret,
    ResourceOverrides,
    RoleSpec,
    RouterSpec,
    RouterTenantsSpec,
    SecretKeyRef,
    Toleration,
    TopologySpreadConstraint,
)
from disagg_operator.names import (
    COMPONENT_LABEL,
    CONFIG_HASH_ANNOTATION,
    LABEL_PREFIX,
    ROLES,
    Component,
    child_name,
    instance_labels,
    labels,
    redis_prefix,
    selector_labels,
)

Manifest = dict[str, Any]

DRAIN_LIFECYCLE: dict[str, Any] = {"preStop": {"sleep": {"seconds": DRAIN_DELAY_SECONDS}}}
"""A leaving server's first step: wait, still serving, while its endpoint's terminating
condition reaches whoever sends it requests (the routers for an engine, kube-proxy for a
router), which stop sending it new ones; then SIGTERM: each drains the requests it has
(--shutdown-timeout). Without it a router would stop listening while kube-proxy still sends it
new connections."""

ENGINE_REQUESTS: dict[str, int | str] = {"cpu": "8", "memory": "64Gi"}
ROUTER_REQUESTS: dict[str, int | str] = {"cpu": "500m", "memory": "512Mi"}
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
HUGEPAGES_RESOURCE = "hugepages-2Mi"
ZONE_TOPOLOGY_KEY = "topology.kubernetes.io/zone"
HOSTNAME_TOPOLOGY_KEY = "kubernetes.io/hostname"
HEALTH_PATH = "/health"
ENGINE_PORT_NAME = "http"
LEASE_PORT_NAME = "lease"
ENGINE_KEY_VOLUME = "engine-key"
CLIENT_KEYS_VOLUME = "client-keys"
OFFER_KEY_FILE = f"{OFFER_KEY_DIR}/{SECRET_KEY_NAME}"
"""The offer-signing keys as prefill and decode read them (the Secret's one data key)."""
ENGINE_KEY_FILE = f"{ENGINE_KEY_DIR}/{SECRET_KEY_NAME}"
"""The engine credential as the router reads it."""
ALL_PORTS_BUT_ENGINE = ((1, ENGINE_PORT - 1), (ENGINE_PORT + 1, 65535))
"""The TCP ports prefill and decode open to each other over UCX: NIXL's side channel and the
ports UCX's TCP transport listens on, which the kernel picks (the vLLM port stays the
router's)."""
ROUTER_RULES: list[dict[str, list[str]]] = [
    {
        "apiGroups": ["discovery.k8s.io"],
        "resources": ["endpointslices"],
        "verbs": ["get", "list", "watch"],
    }
]
"""The router's Role: it discovers prefill and decode pods from their EndpointSlices."""
MAX_UNAVAILABLE = 1
"""Per role, voluntary evictions (node drains, Karpenter consolidation) take one pod at a time;
with one replica that pod can still go (a `minAvailable` budget would block every drain)."""
UNHEALTHY_POD_EVICTION_POLICY = "AlwaysAllow"
"""A pod that is not Ready (crash-looping, still loading weights) never blocks a drain."""

LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
"""On every pod of a LeaderWorkerSet (set by its controller): the LeaderWorkerSet's name."""
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
"""On every pod of a LeaderWorkerSet group: 0 on the leader, 1.. on the workers."""
LWS_GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
"""On every pod of a LeaderWorkerSet group: a hash naming the group, the same on each of its
pods (the pod affinity that keeps a group together matches its own value of it)."""
LWS_LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
"""The group leader's DNS name, which the LeaderWorkerSet webhook puts in every pod's env."""
LWS_WORKER_INDEX = "$(LWS_WORKER_INDEX)"
"""The pod's index in its group (the leader's is 0), from the same webhook."""
LWS_REVISION_LABEL = "leaderworkerset.sigs.k8s.io/template-revision-hash"
"""On every pod of a LeaderWorkerSet group (set by its controller): the revision of the group's
templates, the leader's on its workers too."""
LWS_REVISION_ENV = "DISAGG_LWS_REVISION"
"""The pod's group revision (its `LWS_REVISION_LABEL`) in its environment, for `_group_args`."""
LWS_REVISION = f"$({LWS_REVISION_ENV})"
LWS_STARTUP_POLICY = "LeaderCreated"
"""Workers start with their leader: the leader is Ready only once every worker has joined."""
LWS_RESTART_POLICY = "RecreateGroupOnPodRestart"
"""A lost or restarted pod restarts its whole group: vLLM's ranks cannot rejoin a running one."""
LWS_SUBDOMAIN_POLICY = "UniquePerReplica"
"""One headless Service per group (by the LeaderWorkerSet controller, every pod, not-ready ones
included): workers resolve their leader before it is Ready, and the role's own Service, named
like the LeaderWorkerSet, stays the router's (leaders only, Ready only)."""


def _to_yaml(value: Any) -> str:
    """Flow-style YAML (the JSON subset), safe at any indentation."""
    return json.dumps(value)


TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("disagg_operator", "templates"),
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=True,
    auto_reload=False,
)
"""The templates, loaded once: they are package data and never change while the operator runs
(with jinja's default auto_reload every render would stat each template file again)."""
TEMPLATES.filters["to_yaml"] = _to_yaml

YAML_LOADER: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = (
    yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader
)
"""PyYAML's safe loader in C (libyaml) where PyYAML was built with it, as its wheels are: parsing
the rendered templates is most of a render, and the pure-Python loader is several times slower."""


def _render(template: str, **values: Any) -> Manifest:
    text = TEMPLATES.get_template(template).render(**values)
    manifest: Manifest = yaml.load(text, Loader=YAML_LOADER)
    return manifest


def hash_seed(name: str, namespace: str) -> int:
    """PYTHONHASHSEED shared by every pod of one model (hash-based KV bookkeeping must agree)."""
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def _resources(
    base_requests: dict[str, int | str], limits: dict[str, int | str], user: ResourceOverrides
) -> dict[str, dict[str, int | str]]:
    return {"requests": {**base_requests, **user.requests}, "limits": {**limits, **user.limits}}


def _pull_secrets(names: list[str]) -> list[dict[str, str]]:
    return [{"name": secret} for secret in names]


def _http_probe(period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": HEALTH_PATH, "port": ENGINE_PORT_NAME},
        "periodSeconds": period,
        "failureThreshold": failures,
    }


def _secret_env(name: str, ref: SecretKeyRef | RedisUrlSecret) -> dict[str, Any]:
    """An environment variable read from a Secret key."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def _secret_volume(volume: str, secret: str) -> dict[str, Any]:
    """A volume holding every key of a Secret, one file each."""
    return {"name": volume, "secret": {"secretName": secret}}


def _read_only(volume: str, path: str) -> dict[str, Any]:
    return {"name": volume, "mountPath": path, "readOnly": True}


def _vllm_args(
    spec: DisaggregatedModelSpec, role: RoleSpec, multi_node: list[str] | None = None
) -> list[str]:
    """The role's vLLM arguments: the operator's (with `multi_node`'s, for one rank of a
    multi-node server), then the role's extraArgs after the marker.

    ``disagg serve`` reads what follows the marker with vLLM's own parser and refuses any
    argument that sets one of the operator's options (the API server refuses only exact flags).
    """
    model = spec.model
    args = [
        "--model",
        model.vllm_model,
        "--served-model-name",
        model.served_model_name,
        "--port",
        str(ENGINE_PORT),
        "--tensor-parallel-size",
        str(role.tensor_parallel_size),
        "--dtype",
        model.dtype,
    ]
    if role.pipeline_parallel_size > 1:
        args += ["--pipeline-parallel-size", str(role.pipeline_parallel_size)]
    if model.source_scheme == S3_SCHEME:
        args += ["--load-format", RUNAI_LOAD_FORMAT]
    if model.revision is not None:
        args += ["--revision", model.revision]
    if model.max_model_len is not None:
        args += ["--max-model-len", str(model.max_model_len)]
    if role.max_num_seqs is not None:
        args += ["--max-num-seqs", str(role.max_num_seqs)]
    args += ["--shutdown-timeout", str(role.shutdown_timeout_seconds)]
    args.append("--enable-prefix-caching" if role.prefix_caching else "--no-enable-prefix-caching")
    args.append("--enable-prompt-tokens-details")
    args += multi_node or []
    extra = [EXTRA_ARGS_MARKER, *role.extra_args] if role.extra_args else []
    return [*args, *extra]


def _multi_node_args(role: RoleSpec, leader: bool) -> list[str]:
    """vLLM's multi-node flags for the leader (rank 0, with the API server) or a worker
    (its index in the group, headless); all reach the leader at its group's DNS name."""
    rank = "0" if leader else LWS_WORKER_INDEX
    args = [
        "--nnodes",
        str(role.nodes_per_replica),
        "--node-rank",
        rank,
        "--master-addr",
        LWS_LEADER_ADDRESS,
    ]
    return args if leader else [*args, "--headless"]


def _group_args(leader: bool) -> list[str]:
    """``disagg serve``'s options for one rank of a multi-node server, the leader or a
    headless worker.

    Every rank must run with one NIXL engine id (a peer refuses a rank whose id is not the
    leader's) and a recreated group with a new one (peers handshake again only with an id
    they have not seen): the launcher builds it from the group's leader address, its revision
    and the leader pod's IPs, which it resolves from the address.
    """
    args = ["--leader-address", LWS_LEADER_ADDRESS, "--group-revision", LWS_REVISION]
    return args if leader else [*args, "--headless-worker"]


def _serves_leases(spec: DisaggregatedModelSpec, component: Component) -> bool:
    """Whether the component's pods run a lease service: prefill always (decode claims each
    P->D read there), decode when bidirectional (prefill claims D->P reads, the router renews
    and releases retentions)."""
    return component is Component.PREFILL or spec.kv_transfer.bidirectional


def _declares_lease_port(spec: DisaggregatedModelSpec, component: Component) -> bool:
    """Whether the pod template names the lease port (container port and its variable): decode
    when bidirectional. Prefill's service binds the same default port without either, so
    that an operator upgrade rolls no prefill pod for it."""
    return component is Component.DECODE and spec.kv_transfer.bidirectional


def _engine_env(
    name: str, namespace: str, spec: DisaggregatedModelSpec, component: Component, role: RoleSpec
) -> list[dict[str, Any]]:
    injected: list[dict[str, Any]] = [
        {"name": HASH_SEED_ENV, "value": str(hash_seed(name, namespace))},
        {
            "name": SIDE_CHANNEL_HOST_ENV,
            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
        },
        {"name": SIDE_CHANNEL_PORT_ENV, "value": str(spec.kv_transfer.side_channel_port)},
        {"name": "HF_HOME", "value": spec.model.cache_mount_path},
    ]
    if spec.model.token_secret is not None:
        injected.append(_secret_env("HF_TOKEN", spec.model.token_secret))
    injected += _s3_env(spec.model)
    engine_key = SecretKeyRef(name=child_name(name, Component.ENGINE_KEY), key=SECRET_KEY_NAME)
    injected.append(_secret_env(ENGINE_API_KEY_ENV, engine_key))
    injected.append({"name": OFFER_KEY_FILE_ENV, "value": OFFER_KEY_FILE})
    if spec.efa.enabled:
        injected.append({"name": FI_PROVIDER_ENV, "value": spec.efa.provider})
    if _declares_lease_port(spec, component):
        injected.append({"name": LEASE_PORT_ENV, "value": str(LEASE_PORT)})
    if role.multi_node:
        revision = {"fieldPath": f"metadata.labels['{LWS_REVISION_LABEL}']"}
        injected.append({"name": LWS_REVISION_ENV, "valueFrom": {"fieldRef": revision}})
        pod_ip = {"fieldPath": "status.podIP"}
        injected.append({"name": POD_IP_ENV, "valueFrom": {"fieldRef": pod_ip}})
    user = [var.model_dump(exclude_none=True) for var in role.env]
    user_names = {var.name for var in role.env}
    return [var for var in injected if var["name"] not in user_names] + user


def _s3_env(model: ModelSpec) -> list[dict[str, Any]]:
    """What the servers need to read an s3:// source: the endpoint (path-style addressing for
    an S3-compatible server), the region and the access key of a Secret; none without `s3`
    (AWS S3, with the ServiceAccount's credentials that IRSA or Pod Identity inject)."""
    s3 = model.s3
    if s3 is None:
        return []
    env: list[dict[str, Any]] = []
    if s3.endpoint is not None:
        env.append({"name": AWS_ENDPOINT_URL_ENV, "value": s3.endpoint})
        env.append({"name": S3_VIRTUAL_ADDRESSING_ENV, "value": "0"})
    if s3.region is not None:
        env += [
            {"name": var, "value": s3.region} for var in (AWS_REGION_ENV, AWS_DEFAULT_REGION_ENV)
        ]
    if s3.credentials_secret is not None:
        key_id, secret_key = s3.credentials_secret.key_refs
        env.append(_secret_env(AWS_ACCESS_KEY_ID_ENV, key_id))
        env.append(_secret_env(AWS_SECRET_ACCESS_KEY_ENV, secret_key))
    return env


def _source_volumes(model: ModelSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A pvc:// source's claim, as a read-only volume and its mount (none for other sources)."""
    claim = model.source_claim
    if claim is None:
        return [], []
    volume = {
        "name": SOURCE_VOLUME,
        "persistentVolumeClaim": {"claimName": claim[0], "readOnly": True},
    }
    return [volume], [_read_only(SOURCE_VOLUME, SOURCE_MOUNT_PATH)]


def _startup_probe(model: ModelSpec) -> dict[str, Any]:
    """/health asked every period until the model's startup budget is spent."""
    failures = math.ceil(model.startup_budget / STARTUP_PROBE_PERIOD_SECONDS)
    return _http_probe(period=STARTUP_PROBE_PERIOD_SECONDS, failures=failures)


def _cache_volume(spec: DisaggregatedModelSpec) -> dict[str, Any]:
    cache = spec.model.cache
    if cache is not None and cache.pvc is not None:
        return {
            "name": CACHE_VOLUME,
            "persistentVolumeClaim": {
                "claimName": cache.pvc.claim_name,
                "readOnly": cache.pvc.read_only,
            },
        }
    if cache is not None and cache.host_path is not None:
        return {
            "name": CACHE_VOLUME,
            "hostPath": {"path": cache.host_path.path, "type": "DirectoryOrCreate"},
        }
    return {"name": CACHE_VOLUME, "emptyDir": {}}


def _user_tolerations(tolerations: list[Toleration]) -> list[dict[str, Any]]:
    return [toleration.model_dump(exclude_none=True) for toleration in tolerations]


def _tolerations(spec: DisaggregatedModelSpec, role: RoleSpec) -> list[dict[str, Any]]:
    keys = [GPU_RESOURCE, EFA_RESOURCE] if spec.efa.enabled else [GPU_RESOURCE]
    base = [{"key": key, "operator": "Exists", "effect": "NoSchedule"} for key in keys]
    return base + _user_tolerations(role.tolerations)


def _spread(
    constraints: list[TopologySpreadConstraint], selector: dict[str, str]
) -> list[dict[str, Any]]:
    """Topology spread constraints as Kubernetes takes them; one without a labelSelector
    counts the component's own pods (`selector`)."""
    spread = []
    for constraint in constraints:
        rendered = constraint.model_dump(exclude_none=True)
        if constraint.label_selector is None:
            rendered["labelSelector"] = {"matchLabels": selector}
        else:
            rendered["labelSelector"] = constraint.label_selector.model_dump(exclude_defaults=True)
        spread.append(rendered)
    return spread


def _pod_extras(owner: RoleSpec | RouterSpec, selector: dict[str, str]) -> dict[str, Any]:
    """The pod-spec fields a role (or the router) sets beyond the operator's, only those set:
    an unset field adds no key, so that an operator upgrade that brings a new field rolls no
    pod."""
    extras: dict[str, Any] = {}
    if isinstance(owner, RoleSpec) and owner.service_account_name is not None:
        extras["serviceAccountName"] = owner.service_account_name
    if isinstance(owner, RoleSpec) and owner.pod_security_context is not None:
        extras["securityContext"] = owner.pod_security_context.model_dump(exclude_defaults=True)
    if owner.priority_class_name is not None:
        extras["priorityClassName"] = owner.priority_class_name
    if owner.topology_spread_constraints:
        extras["topologySpreadConstraints"] = _spread(owner.topology_spread_constraints, selector)
    return extras


def _affinity(name: str, component: Component, role: RoleSpec) -> dict[str, Any]:
    """The user's affinity, plus (unless it has podAffinity) prefill and decode in one zone,
    and for a multi-node role (unless it has podAntiAffinity) each of its pods on a node of
    its own, so that a group spans nodesPerReplica nodes, and always the pods of one group
    on nodes sharing the role's `groupTopologyKey` value."""
    affinity = copy.deepcopy(role.affinity) if role.affinity is not None else {}
    same_role = {"matchLabels": {LWS_NAME_LABEL: child_name(name, component)}}
    if role.multi_node and "podAntiAffinity" not in affinity:
        affinity["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": same_role, "topologyKey": HOSTNAME_TOPOLOGY_KEY}
            ]
        }
    if "podAffinity" not in affinity:
        same_model = {
            "matchLabels": instance_labels(name),
            "matchExpressions": [
                {"key": COMPONENT_LABEL, "operator": "In", "values": [str(r) for r in ROLES]}
            ],
        }
        affinity["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": same_model, "topologyKey": ZONE_TOPOLOGY_KEY}
            ]
        }
    if role.multi_node:
        together = {
            "labelSelector": same_role,
            "matchLabelKeys": [LWS_GROUP_KEY_LABEL],
            "topologyKey": role.group_topology_key,
        }
        required = affinity["podAffinity"].setdefault(
            "requiredDuringSchedulingIgnoredDuringExecution", []
        )
        required.append(together)
    return affinity


def _engine_resources(spec: DisaggregatedModelSpec, role: RoleSpec) -> dict[str, Any]:
    limits: dict[str, int | str] = {GPU_RESOURCE: role.gpus}
    if spec.efa.enabled:
        limits[EFA_RESOURCE] = spec.efa.devices_per_pod
        limits[HUGEPAGES_RESOURCE] = spec.efa.hugepages2_mi
    return _resources(ENGINE_REQUESTS, limits, role.resources)


def _tcp(port: int, end_port: int | None = None) -> dict[str, Any]:
    ports: dict[str, Any] = {"protocol": "TCP", "port": port}
    if end_port is not None:
        ports["endPort"] = end_port
    return ports


def _pods_of(name: str, component: Component) -> dict[str, Any]:
    """A NetworkPolicy peer: one component's pods of this model."""
    return {"podSelector": {"matchLabels": selector_labels(name, component)}}


def _peers(peers: list[NetworkPeer]) -> list[dict[str, Any]]:
    return [peer.model_dump(exclude_defaults=True) for peer in peers]


def _kv_ports(spec: DisaggregatedModelSpec) -> list[dict[str, Any]]:
    """What prefill and decode open to each other: NIXL's side channel, and over UCX also the
    ports UCX's TCP transport picks; EFA's SRD traffic never reaches the IP stack a
    NetworkPolicy filters."""
    if spec.kv_backend == "LIBFABRIC":
        return [_tcp(spec.kv_transfer.side_channel_port)]
    return [_tcp(first, last) for first, last in ALL_PORTS_BUT_ENGINE]


def _engine_ingress(
    name: str, spec: DisaggregatedModelSpec, component: Component, role: RoleSpec
) -> list[dict[str, Any]]:
    """Who may reach a role's pods: the model's router on the vLLM port, the other role on
    the KV-transfer ports, the lease port (when it serves leases) from the other role (claims)
    and on decode from the model's router (renewals, releases), the role's `allowedFrom` on
    the vLLM port, and for a multi-node role its own pods on every port."""
    peer = Component.DECODE if component is Component.PREFILL else Component.PREFILL
    ingress = [
        {"from": [_pods_of(name, Component.ROUTER)], "ports": [_tcp(ENGINE_PORT)]},
        {"from": [_pods_of(name, peer)], "ports": _kv_ports(spec)},
    ]
    if _serves_leases(spec, component):
        router = [_pods_of(name, Component.ROUTER)] if component is Component.DECODE else []
        ingress.append({"from": [*router, _pods_of(name, peer)], "ports": [_tcp(LEASE_PORT)]})
    if role.allowed_from:
        ingress.append({"from": _peers(role.allowed_from), "ports": [_tcp(ENGINE_PORT)]})
    if role.multi_node:
        # The ranks of one server talk on ports vLLM and NCCL pick (master port, ZMQ, sockets).
        ingress.append({"from": [_pods_of(name, component)]})
    return ingress


def _network_policy(
    name: str, namespace: str, component: Component, ingress: list[dict[str, Any]]
) -> Manifest:
    """The NetworkPolicy of one component's pods: ingress only (egress stays open: the
    router calls the API server and Redis, the engines the model hub)."""
    return _render(
        "shared/networkpolicy.yaml.j2",
        name=child_name(name, component),
        namespace=namespace,
        labels=labels(name, component),
        selector=selector_labels(name, component),
        ingress=ingress,
    )


def _disruption_budget(name: str, namespace: str, component: Component) -> Manifest:
    """The PodDisruptionBudget of one component's pods (its workload's own selector).

    Rendered whatever the replicas (with none it selects no pod and does nothing), so the set
    of children never shrinks and the operator never has to delete one.
    """
    return _render(
        "shared/poddisruptionbudget.yaml.j2",
        name=child_name(name, component),
        namespace=namespace,
        labels=labels(name, component),
        selector=selector_labels(name, component),
        max_unavailable=MAX_UNAVAILABLE,
        unhealthy_pod_eviction_policy=UNHEALTHY_POD_EVICTION_POLICY,
    )


def _engine(
    name: str, namespace: str, spec: DisaggregatedModelSpec, component: Component, hash_: str
) -> list[Manifest]:
    """A role's children: its Service (the router's: one address per server, a multi-node
    server's leader), budget, NetworkPolicy and workload (a StatefulSet, or with
    nodesPerReplica > 1 a LeaderWorkerSet)."""
    role = spec.prefill if component is Component.PREFILL else spec.decode
    child = child_name(name, component)
    if role.multi_node and len(name) > MAX_MULTI_NODE_NAME_LENGTH:
        raise SpecError([f"metadata.name: {MULTI_NODE_NAME_MESSAGE}"])
    selector = selector_labels(name, component)
    service_selector = {**selector, LWS_WORKER_INDEX_LABEL: "0"} if role.multi_node else selector
    side_channel = {"name": "side-channel", "containerPort": spec.kv_transfer.side_channel_port}
    ports = [{"name": ENGINE_PORT_NAME, "containerPort": ENGINE_PORT}, side_channel]
    if _declares_lease_port(spec, component):
        ports.append({"name": LEASE_PORT_NAME, "containerPort": LEASE_PORT})
    source_volumes, source_mounts = _source_volumes(spec.model)
    volumes = [
        {"name": CONNECTOR_VOLUME, "configMap": {"name": child_name(name, Component.CONNECTOR)}},
        _secret_volume(OFFER_KEY_VOLUME, child_name(name, Component.OFFER_KEY)),
        _cache_volume(spec),
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
        *source_volumes,
        *(volume.model_dump(exclude_defaults=True) for volume in role.volumes),
    ]
    mounts = [
        _read_only(CONNECTOR_VOLUME, CONFIG_DIR),
        _read_only(OFFER_KEY_VOLUME, OFFER_KEY_DIR),
        {"name": CACHE_VOLUME, "mountPath": spec.model.cache_mount_path},
        {"name": SHM_VOLUME, "mountPath": SHM_MOUNT_PATH},
        *source_mounts,
        *(mount.model_dump(exclude_defaults=True) for mount in role.volume_mounts),
    ]
    pod = {
        "pod_labels": {**role.pod_labels, **labels(name, component)},
        "pod_annotations": {**role.pod_annotations, CONFIG_HASH_ANNOTATION: hash_},
        "image": spec.image.reference,
        "pull_policy": spec.image.pull_policy,
        "pull_secrets": _pull_secrets(spec.image.pull_secrets),
        "env": _engine_env(name, namespace, spec, component, role),
        "resources": _engine_resources(spec, role),
        "security_context": {"capabilities": {"add": ["IPC_LOCK"]}} if spec.efa.enabled else {},
        "volume_mounts": mounts,
        "volumes": volumes,
        "node_selector": role.node_selector,
        "tolerations": _tolerations(spec, role),
        "affinity": _affinity(name, component, role),
        "extras": _pod_extras(role, selector),
        "termination_grace_period_seconds": role.termination_grace_period_seconds,
    }
    serve = ["disagg", "serve", "--role", str(component), "--config", config_file(Role(component))]
    multi_node = _multi_node_args(role, True) if role.multi_node else None
    group = _group_args(True) if role.multi_node else []
    server = _render(
        "engine/pod.yaml.j2",
        **pod,
        command=[*serve, *group, "--", *_vllm_args(spec, role, multi_node)],
        ports=ports,
        probes={
            "startupProbe": _startup_probe(spec.model),
            "readinessProbe": _http_probe(period=5, failures=3),
            "livenessProbe": _http_probe(period=10, failures=6),
        },
        lifecycle=DRAIN_LIFECYCLE,
    )
    common = {"name": child, "namespace": namespace, "labels": labels(name, component)}
    if role.multi_node:
        worker = _render(
            "engine/pod.yaml.j2",
            **pod,
            command=[
                *serve,
                *_group_args(False),
                "--",
                *_vllm_args(spec, role, _multi_node_args(role, False)),
            ],
            ports=[side_channel],
            probes={},
            lifecycle={},
        )
        workload = _render(
            "engine/leaderworkerset.yaml.j2",
            **common,
            replicas=role.fixed_replicas,
            startup_policy=LWS_STARTUP_POLICY,
            subdomain_policy=LWS_SUBDOMAIN_POLICY,
            max_unavailable=MAX_UNAVAILABLE,
            size=role.nodes_per_replica,
            restart_policy=LWS_RESTART_POLICY,
            leader=server,
            worker=worker,
        )
    else:
        workload = _render(
            "engine/statefulset.yaml.j2",
            **common,
            selector=selector,
            replicas=role.fixed_replicas,
            pod_template=server,
        )
    autoscaler = (
        [] if role.autoscaling is None else [_autoscaler(namespace, component, role, workload)]
    )
    return [
        _render(
            "engine/service.yaml.j2",
            **common,
            selector=service_selector,
            side_channel_port=spec.kv_transfer.side_channel_port,
            vllm_port=ENGINE_PORT,
        ),
        _disruption_budget(name, namespace, component),
        _network_policy(name, namespace, component, _engine_ingress(name, spec, component, role)),
        workload,
        *autoscaler,
    ]


def _scale_target(workload: Manifest) -> dict[str, str]:
    """A reference to a role's workload through its scale subresource."""
    return {
        "apiVersion": workload["apiVersion"],
        "kind": workload["kind"],
        "name": workload["metadata"]["name"],
    }


def _behavior(autoscaling: AutoscalingSpec) -> dict[str, Any]:
    """The HorizontalPodAutoscaler behavior (KEDA passes it to the one it makes)."""
    windows = autoscaling.behavior
    return {
        "scaleUp": {"stabilizationWindowSeconds": windows.scale_up_stabilization_window_seconds},
        "scaleDown": {
            "stabilizationWindowSeconds": windows.scale_down_stabilization_window_seconds
        },
    }


def _autoscaler(
    namespace: str, component: Component, role: RoleSpec, workload: Manifest
) -> Manifest:
    """The autoscaler of a role (its `autoscaling`): a HorizontalPodAutoscaler on the signal's
    per-pod custom metric, or a KEDA ScaledObject querying Prometheus, either scaling the
    role's workload through its scale subresource; named like the workload."""
    autoscaling = role.autoscaling
    assert autoscaling is not None
    common = {
        "name": workload["metadata"]["name"],
        "namespace": namespace,
        "labels": workload["metadata"]["labels"],
        "target_ref": _scale_target(workload),
        "min_replicas": autoscaling.min_replicas,
        "max_replicas": autoscaling.max_replicas,
        "behavior": _behavior(autoscaling),
        "target": decimal_text(autoscaling.target),
    }
    if autoscaling.engine == "hpa":
        return _render(
            "autoscaling/horizontalpodautoscaler.yaml.j2",
            **common,
            metric=hpa_metric_name(autoscaling),
        )
    signal = SIGNALS[autoscaling.signal]
    return _render(
        "autoscaling/scaledobject.yaml.j2",
        **common,
        metric_type=signal.keda_metric_type,
        server_address=autoscaling.prometheus_address,
        query=signal.query(role_selector(namespace, workload["metadata"]["name"])),
    )


POD_TARGET_LABELS = [f"{LABEL_PREFIX}instance", COMPONENT_LABEL]
"""Pod labels a PodMonitor copies onto every series it scrapes (as `app_kubernetes_io_*`),
so that the dashboard tells models and roles apart."""


def _pod_monitors(name: str, namespace: str, spec: DisaggregatedModelSpec) -> list[Manifest]:
    """One PodMonitor per component (prefill, decode, router) scraping /metrics on the serving
    port; a multi-node role's leaders only (its workers run no API server)."""
    if not spec.monitoring.pod_monitors:
        return []
    monitors = []
    for component in (*ROLES, Component.ROUTER):
        selector = selector_labels(name, component)
        role = spec.prefill if component is Component.PREFILL else spec.decode
        if component in ROLES and role.multi_node:
            selector = {**selector, LWS_WORKER_INDEX_LABEL: "0"}
        monitors.append(
            _render(
                "monitoring/podmonitor.yaml.j2",
                name=child_name(name, component),
                namespace=namespace,
                labels={**spec.monitoring.labels, **labels(name, component)},
                selector=selector,
                pod_target_labels=POD_TARGET_LABELS,
                port=ENGINE_PORT_NAME,
                interval=spec.monitoring.interval,
            )
        )
    return monitors


def _k8s_literal(value: str) -> str:
    """`value` escaped from Kubernetes `$(VAR)` expansion in command and args."""
    return value.replace("$", "$$")


def _router_store(
    name: str, namespace: str, spec: DisaggregatedModelSpec
) -> tuple[list[str], list[dict[str, Any]]]:
    """The router's conversation-store flags (with the model's own Redis key prefix) and the
    environment they read."""
    redis = spec.router.redis
    if redis is None:
        return [], []
    store = ["--store", "redis", "--redis-prefix", redis_prefix(name, namespace)]
    if redis.url_secret is None:
        assert redis.url is not None
        return [*store, "--redis-url", _k8s_literal(redis.url)], []
    env = [_secret_env(ROUTER_REDIS_URL_ENV, redis.url_secret)]
    return [*store, "--redis-url", f"$({ROUTER_REDIS_URL_ENV})"], env


def _router_keys(
    name: str, spec: DisaggregatedModelSpec
) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The router's key flags, environment, volumes and mounts.

    It always gets the engine credential, as a file; with `spec.auth`, the client keys: the
    API key (tenant `default`) from the environment, the client-keys Secret as a folder. The
    offer-signing Secret is never mounted here.
    """
    args = ["--engine-key-file", ENGINE_KEY_FILE]
    env: list[dict[str, Any]] = []
    volumes = [_secret_volume(ENGINE_KEY_VOLUME, child_name(name, Component.ENGINE_KEY))]
    mounts = [_read_only(ENGINE_KEY_VOLUME, ENGINE_KEY_DIR)]
    auth = spec.auth
    if auth is not None and auth.api_key_secret is not None:
        env.append(_secret_env(ROUTER_API_KEY_ENV, auth.api_key_secret))
    if auth is not None and auth.client_keys_secret is not None:
        args += ["--client-keys-dir", CLIENT_KEYS_DIR]
        volumes.append(_secret_volume(CLIENT_KEYS_VOLUME, auth.client_keys_secret.name))
        mounts.append(_read_only(CLIENT_KEYS_VOLUME, CLIENT_KEYS_DIR))
    return args, env, volumes, mounts


def _router_tenants(tenants: RouterTenantsSpec) -> list[str]:
    """The router's per-tenant bounds: the conversation share always, the request share when
    set, and each override's own numbers, by tenant name."""
    args = ["--max-conversations-per-tenant", str(tenants.max_conversations_per_tenant)]
    if tenants.max_requests_per_tenant is not None:
        args += ["--max-requests-per-tenant", str(tenants.max_requests_per_tenant)]
    for tenant, override in sorted(tenants.overrides.items()):
        if override.requests is not None:
            args += ["--tenant-requests", f"{tenant}={override.requests}"]
        if override.conversations is not None:
            args += ["--tenant-conversations", f"{tenant}={override.conversations}"]
    return args


def _router_ingress(spec: DisaggregatedModelSpec) -> list[dict[str, Any]]:
    """The router's port, from anyone or only from `spec.router.allowedFrom`."""
    rule: dict[str, Any] = {"ports": [_tcp(spec.router.port)]}
    if spec.router.allowed_from:
        rule["from"] = _peers(spec.router.allowed_from)
    return [rule]


def _router(name: str, namespace: str, spec: DisaggregatedModelSpec) -> list[Manifest]:
    router = spec.router
    image = spec.router_image
    store_args, store_env = _router_store(name, namespace, spec)
    key_args, key_env, volumes, mounts = _router_keys(name, spec)
    common = {
        "name": child_name(name, Component.ROUTER),
        "namespace": namespace,
        "labels": labels(name, Component.ROUTER),
    }
    deployment = _render(
        "router/deployment.yaml.j2",
        **common,
        selector=selector_labels(name, Component.ROUTER),
        pod_labels={**router.pod_labels, **labels(name, Component.ROUTER)},
        pod_annotations=router.pod_annotations,
        extras=_pod_extras(router, selector_labels(name, Component.ROUTER)),
        port=router.port,
        replicas=router.replicas,
        image=image.reference,
        pull_policy=image.pull_policy,
        pull_secrets=_pull_secrets(image.pull_secrets),
        command=[
            "disagg",
            "router",
            "--port",
            str(router.port),
            "--discovery",
            "kubernetes",
            "--namespace",
            namespace,
            "--prefill-service",
            child_name(name, Component.PREFILL),
            "--decode-service",
            child_name(name, Component.DECODE),
            "--port-name",
            ENGINE_PORT_NAME,
            "--conversation-ttl",
            str(spec.conversation_ttl_seconds),
            "--decode-kv-ttl",
            str(spec.kv_transfer.decoder_kv_blocks_ttl_seconds),
            "--idle-timeout-s",
            str(spec.kv_transfer.idle_timeout_seconds),
            "--shutdown-timeout",
            str(router.shutdown_timeout_seconds),
            "--header-timeout",
            str(router.header_timeout_seconds),
            "--max-concurrent-requests",
            str(ROUTER_MAX_CONCURRENT_REQUESTS),
            *_prefill_routing(spec),
            *_router_tenants(router.tenants),
            *store_args,
            *key_args,
        ],
        env=[*store_env, *key_env],
        volume_mounts=mounts,
        volumes=volumes,
        resources=_resources(ROUTER_REQUESTS, {}, router.resources),
        node_selector=router.node_selector,
        tolerations=_user_tolerations(router.tolerations),
        readiness_probe=_http_probe(period=5, failures=3),
        liveness_probe={"tcpSocket": {"port": "http"}, "periodSeconds": 10, "failureThreshold": 6},
        lifecycle=DRAIN_LIFECYCLE,
        termination_grace_period_seconds=router.termination_grace_period_seconds,
    )
    return [
        _render("router/serviceaccount.yaml.j2", **common),
        _render("router/role.yaml.j2", **common, rules=ROUTER_RULES),
        _render("router/rolebinding.yaml.j2", **common),
        _render(
            "router/service.yaml.j2",
            **common,
            selector=selector_labels(name, Component.ROUTER),
            port=router.port,
            service_type=router.service_type,
            annotations=router.service.annotations,
            source_ranges=router.service.load_balancer_source_ranges,
        ),
        *_http_route(common, router),
        _disruption_budget(name, namespace, Component.ROUTER),
        _network_policy(name, namespace, Component.ROUTER, _router_ingress(spec)),
        deployment,
    ]


def _http_route(common: dict[str, Any], router: RouterSpec) -> list[Manifest]:
    """The router's HTTPRoute when `spec.router.httpRoute` asks for one: the Gateways it names
    send every request for its hostnames to the router Service (named as the route), on the
    Service's port. Gateway API defaults a parent's group and kind to a Gateway's and a
    backend's kind to Service, so neither is rendered."""
    route = router.http_route
    if route is None:
        return []
    return [
        _render(
            "router/httproute.yaml.j2",
            **common,
            parent_refs=[ref.model_dump(exclude_none=True) for ref in route.parent_refs],
            hostnames=route.hostnames,
            service=common["name"],
            port=router.port,
        )
    ]


def _prefill_routing(spec: DisaggregatedModelSpec) -> list[str]:
    """The router's prefill routing flag; its default (affinity) is left off the command, so
    that a model that keeps it renders the router as releases before the field did."""
    if spec.router.prefill_routing is PrefillRouting.AFFINITY:
        return []
    return ["--prefill-routing", spec.router.prefill_routing.value]


def render(name: str, namespace: str, spec: DisaggregatedModelSpec) -> list[Manifest]:
    """Every child manifest of one DisaggregatedModel, in apply order."""
    data = config_map_data(spec)
    hash_ = config_hash(data)
    config_map = _render(
        "connector/configmap.yaml.j2",
        name=child_name(name, Component.CONNECTOR),
        namespace=namespace,
        labels=labels(name, Component.CONNECTOR),
        annotations={CONFIG_HASH_ANNOTATION: hash_},
        data=data,
    )
    engines = [m for role in ROLES for m in _engine(name, namespace, spec, role, hash_)]
    monitors = _pod_monitors(name, namespace, spec)
    return [config_map, *engines, *_router(name, namespace, spec), *monitors]
