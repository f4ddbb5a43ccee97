"""Replicas from the prefill/decode Services' EndpointSlices, followed with a watch.

The Kubernetes client is synchronous, so each Service is watched on a daemon thread that
hands every membership change to the event loop. A pod joins when its endpoint is ready. When
its endpoint turns terminating (the pod is being deleted: scale-down, rollout, eviction), serving
or not, it stays a member as draining: it finishes the requests it has and takes no new one (see
:mod:`disagg_router.replicas`). It leaves when its endpoint goes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from disagg_router.replicas import ReplicaPool

log = logging.getLogger(__name__)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
_WATCH_TIMEOUT_S = 300
_RETRY_S = 2.0


def slice_endpoints(endpoint_slice: Any, port_name: str) -> dict[str, bool]:
    """The members one EndpointSlice (``V1EndpointSlice``) names: base URL -> draining.

    An endpoint counts when it is ready (an unset condition counts as ready), or when it is
    terminating, then as draining whatever ``serving`` says. The port is the one named
    ``port_name``, else the slice's only port.
    """
    ports = endpoint_slice.ports or []
    named = [p for p in ports if p.name == port_name]
    chosen = named[0] if named else (ports[0] if len(ports) == 1 else None)
    if chosen is None or chosen.port is None:
        return {}
    members: dict[str, bool] = {}
    for endpoint in endpoint_slice.endpoints or []:
        conditions = endpoint.conditions
        terminating = conditions is not None and conditions.terminating is True
        if not terminating and conditions is not None and conditions.ready is False:
            continue
        for address in endpoint.addresses or []:
            host = f"[{address}]" if ":" in address else address
            members[f"http://{host}:{chosen.port}"] = terminating
    return members


class _SliceState:
    """The members of every EndpointSlice of one Service, by slice name."""

    def __init__(self, port_name: str) -> None:
        self._port_name = port_name
        self._slices: dict[str, dict[str, bool]] = {}

    def reset(self, slices: list[Any]) -> None:
        self._slices = {s.metadata.name: slice_endpoints(s, self._port_name) for s in slices}

    def apply(self, event_type: str, endpoint_slice: Any) -> None:
        name = endpoint_slice.metadata.name
        if event_type == "DELETED":
            self._slices.pop(name, None)
        else:
            self._slices[name] = slice_endpoints(endpoint_slice, self._port_name)

    def urls(self) -> list[str]:
        """Every member's URL."""
        return sorted({url for members in self._slices.values() for url in members})

    def draining(self) -> list[str]:
        """The URLs of members some slice names terminating."""
        return sorted(
            {
                url
                for members in self._slices.values()
                for url, leaving in members.items()
                if leaving
            }
        )

    def publish(self, loop: asyncio.AbstractEventLoop, pool: ReplicaPool) -> None:
        """Hand the current membership to ``pool`` on its event loop."""
        loop.call_soon_threadsafe(pool.set_urls, self.urls(), self.draining())


class EndpointSliceDiscovery:
    """Watches the EndpointSlices of each Service and keeps its pool in step."""

    def __init__(
        self,
        namespace: str,
        pools: Mapping[str, ReplicaPool],
        port_name: str,
        kubeconfig: str | None = None,
    ) -> None:
        self._namespace = namespace
        self._pools = pools
        self._port_name = port_name
        self._kubeconfig = kubeconfig
        self._stopping = threading.Event()
        self._watches: list[watch.Watch] = []

    async def start(self) -> None:
        """Load credentials, then start one watch thread per Service.

        Credentials come from ``kubeconfig`` when given, else in-cluster, else the default
        kubeconfig; each discovery has its own API client.
        """
        api_client = client.ApiClient(self._credentials())
        api = client.DiscoveryV1Api(api_client)
        loop = asyncio.get_running_loop()
        for service, pool in self._pools.items():
            thread = threading.Thread(
                target=self._follow,
                args=(api, service, pool, loop),
                name=f"endpointslices-{service}",
                daemon=True,
            )
            thread.start()

    def _credentials(self) -> client.Configuration:
        credentials = client.Configuration()
        if self._kubeconfig is None:
            try:
                config.load_incluster_config(client_configuration=credentials)  # type: ignore[no-untyped-call]
                return credentials
            except config.ConfigException:
                pass
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=self._kubeconfig, client_configuration=credentials
        )
        return credentials

    async def stop(self) -> None:
        """Ask the watch threads to end."""
        self._stopping.set()
        for w in self._watches:
            w.stop()  # type: ignore[no-untyped-call]

    def _follow(
        self,
        api: client.DiscoveryV1Api,
        service: str,
        pool: ReplicaPool,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        selector = f"{SERVICE_NAME_LABEL}={service}"
        state = _SliceState(self._port_name)
        while not self._stopping.is_set():
            try:
                listed = api.list_namespaced_endpoint_slice(
                    self._namespace, label_selector=selector
                )
                state.reset(listed.items)
                version = listed.metadata.resource_version if listed.metadata else None
                state.publish(loop, pool)
                w = watch.Watch()  # type: ignore[no-untyped-call]
                self._watches.append(w)
                try:
                    for event in w.stream(  # type: ignore[no-untyped-call]
                        api.list_namespaced_endpoint_slice,
                        self._namespace,
                        label_selector=selector,
                        resource_version=version,
                        timeout_seconds=_WATCH_TIMEOUT_S,
                    ):
                        if event["type"] == "ERROR":
                            break
                        state.apply(event["type"], event["object"])
                        state.publish(loop, pool)
                finally:
                    self._watches.remove(w)
            except ApiException as exc:
                if exc.status != 410:
                    log.warning("watching EndpointSlices of %s failed: %s", service, exc)
                    self._stopping.wait(_RETRY_S)
            except Exception:
                log.exception("watching EndpointSlices of %s failed", service)
                self._stopping.wait(_RETRY_S)
