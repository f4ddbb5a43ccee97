"""A small synchronous Kubernetes client: the operator's own reads, applies and status patches.

kopf watches and posts events with its own client; this one sends the requests whose bodies the
operator builds. Calls block: the reconciler runs them in a worker thread.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Sequence
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from disagg_operator.metrics import OperatorMetrics
from disagg_operator.resources import ApiResource

FIELD_MANAGER = "disagg-operator"
"""The one field manager of everything the operator applies."""
HANDOVER_MANAGER = "disagg-operator-handover"
"""Holds an autoscaled workload's replicas for its autoscaler (see `Reconciler`) until the
autoscaler first changes them and so takes them over; never used for anything else."""

USER_AGENT = "disagg-operator"
PASS_THREADS = 8
"""Worker threads in each of the reconciler's two pools (`reconcile.Reconciler`); the client
keeps a connection for each thread of both, where it would keep 5 per CPU and open and drop
one for each request beyond."""
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"

__all__ = ["ApiException", "KubeApi"]


def new_api_client() -> client.ApiClient:
    """An ApiClient for the cluster the operator runs in, else the current kubeconfig context."""
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = 2 * PASS_THREADS
    api = client.ApiClient(configuration)
    api.user_agent = USER_AGENT
    return api


class KubeApi:
    """JSON requests against one cluster; failed requests are counted in `metrics`."""

    def __init__(self, api: client.ApiClient, metrics: OperatorMetrics | None = None) -> None:
        self._api = api
        self._metrics = metrics or OperatorMetrics()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        query: Sequence[tuple[str, str]] = (),
        content_type: str = "application/json",
        expected: Collection[int] = (),
    ) -> dict[str, Any]:
        """Send one request and return the decoded JSON answer (ApiException on an error).

        A status in `expected` still raises but is not counted as a failed request: a 404 is
        how `get` learns that an object does not exist yet.
        """
        method, url, headers, payload, post = self._api.param_serialize(
            method,
            path,
            query_params=list(query),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._api.call_api(method, url, headers, payload, post)
        except ApiException as exc:  # an SSL failure (status 0) or retries exhausted
            self._metrics.api_error(method, str(exc.status or "connection"))
            raise
        except HTTPError:
            self._metrics.api_error(method, "connection")
            raise
        data = response.read() or b"{}"  # type: ignore[no-untyped-call]
        if not 200 <= response.status < 300:
            if response.status not in expected:
                self._metrics.api_error(method, str(response.status))
            raise ApiException(status=response.status, reason=response.reason, body=data.decode())
        decoded: dict[str, Any] = json.loads(data)
        return decoded

    def get(self, resource: ApiResource, namespace: str, name: str) -> dict[str, Any] | None:
        """One object, or None when it does not exist."""
        try:
            return self.request("GET", resource.path(namespace, name), expected=(404,))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def apply(
        self,
        resource: ApiResource,
        manifest: dict[str, Any],
        field_manager: str = FIELD_MANAGER,
        force: bool = True,
    ) -> dict[str, Any]:
        """Server-side apply `manifest` as `field_manager`, forcing conflicts unless `force`
        is false (a conflict is then a 409).

        Call it only for objects the operator controls (see `children.decide`): forcing takes
        back fields a person changed by hand, which is the drift repair.
        """
        meta = manifest["metadata"]
        query = [("fieldManager", field_manager)] + ([("force", "true")] if force else [])
        return self.request(
            "PATCH",
            resource.path(meta["namespace"], meta["name"]),
            body=manifest,
            query=query,
            content_type=APPLY_PATCH,
        )

    def delete(self, resource: ApiResource, namespace: str, name: str, uid: str) -> None:
        """Delete one object, its dependents first (foreground), only while it has `uid`.

        The object stays, with a deletion timestamp, until the garbage collector has deleted
        its dependents (a workload's pods): what replaces it can then take its name.
        """
        body = {"propagationPolicy": "Foreground", "preconditions": {"uid": uid}}
        try:
            self.request("DELETE", resource.path(namespace, name), body=body, expected=(404, 409))
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def patch_status(
        self, resource: ApiResource, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch an object's status subresource."""
        return self.request(
            "PATCH",
            resource.path(namespace, name, "status"),
            body={"status": status},
            content_type=MERGE_PATCH,
        )
