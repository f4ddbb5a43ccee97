"""The Kubernetes resources the operator reads and writes, in one table.

The operator's client (:mod:`disagg_operator.kubeapi`) builds API paths from it, the handlers
watch the child kinds it lists and ``hack/gen_rbac.py`` derives the operator's permissions from
it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from disagg_operator.models import GROUP, KIND, PLURAL, VERSION


@dataclass(frozen=True)
class ApiResource:
    """One namespaced API resource: where it lives and what it is called."""

    group: str
    version: str
    plural: str
    kind: str
    provided_by: str = ""
    """For a kind a CRD defines that clusters may lack: what installs it."""

    @property
    def api_version(self) -> str:
        """`group/version`, or just `version` for the core group."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str, name: str | None = None, subresource: str = "") -> str:
        """The REST path of the collection, or of one object (and a subresource)."""
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        path = f"{root}/namespaces/{namespace}/{self.plural}"
        if name is not None:
            path += f"/{name}"
        if subresource:
            path += f"/{subresource}"
        return path


CONFIG_MAPS = ApiResource("", "v1", "configmaps", "ConfigMap")
SERVICES = ApiResource("", "v1", "services", "Service")
SERVICE_ACCOUNTS = ApiResource("", "v1", "serviceaccounts", "ServiceAccount")
STATEFUL_SETS = ApiResource("apps", "v1", "statefulsets", "StatefulSet")
DEPLOYMENTS = ApiResource("apps", "v1", "deployments", "Deployment")
LEADER_WORKER_SETS = ApiResource(
    "leaderworkerset.x-k8s.io",
    "v1",
    "leaderworkersets",
    "LeaderWorkerSet",
    "the LeaderWorkerSet controller",
)
ROLES = ApiResource("rbac.authorization.k8s.io", "v1", "roles", "Role")
ROLE_BINDINGS = ApiResource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
POD_DISRUPTION_BUDGETS = ApiResource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
NETWORK_POLICIES = ApiResource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
PODS = ApiResource("", "v1", "pods", "Pod")
SECRETS = ApiResource("", "v1", "secrets", "Secret")
EVENTS = ApiResource("", "v1", "events", "Event")
ENDPOINT_SLICES = ApiResource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")
HORIZONTAL_POD_AUTOSCALERS = ApiResource(
    "autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler"
)
SCALED_OBJECTS = ApiResource("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject", "KEDA")
POD_MONITORS = ApiResource(
    "monitoring.coreos.com", "v1", "podmonitors", "PodMonitor", "the Prometheus Operator"
)
HTTP_ROUTES = ApiResource(
    "gateway.networking.k8s.io", "v1", "httproutes", "HTTPRoute", "the Gateway API CRDs"
)
DISAGGREGATED_MODELS = ApiResource(GROUP, VERSION, PLURAL, KIND)

CHILD_RESOURCES = (
    CONFIG_MAPS,
    SERVICES,
    SERVICE_ACCOUNTS,
    ROLES,
    ROLE_BINDINGS,
    POD_DISRUPTION_BUDGETS,
    NETWORK_POLICIES,
    STATEFUL_SETS,
    LEADER_WORKER_SETS,
    DEPLOYMENTS,
    HORIZONTAL_POD_AUTOSCALERS,
    SCALED_OBJECTS,
    POD_MONITORS,
    HTTP_ROUTES,
)
"""Every kind `render` produces; the operator applies, watches and repairs them."""

ON_REQUEST = (HORIZONTAL_POD_AUTOSCALERS, SCALED_OBJECTS, POD_MONITORS, HTTP_ROUTES)
"""The kinds `render` produces only when the spec asks (a role's autoscaler, the PodMonitors,
the router's HTTPRoute): the operator deletes its own once the spec no longer asks, so that no
autoscaler it left keeps scaling a role the spec fixed (or another engine now scales) and no
route it left keeps exposing the router."""

ROLE_WORKLOADS = (STATEFUL_SETS, LEADER_WORKER_SETS)
"""The kinds a serving role's servers take (one pod each, or one LeaderWorkerSet group each).
A role has one of them at a time under its name: switching `nodesPerReplica` between 1 and more
deletes the other, the only children the operator ever deletes."""


def resource_of(manifest: dict[str, Any]) -> ApiResource:
    """The child resource of a manifest (ValueError for a kind the operator does not own)."""
    for resource in CHILD_RESOURCES:
        if (manifest["apiVersion"], manifest["kind"]) == (resource.api_version, resource.kind):
            return resource
    raise ValueError(f"{manifest['apiVersion']} {manifest['kind']} is not a child kind")
