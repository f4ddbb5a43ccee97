"""The router's EndpointSlice discovery follows a real API server (watch, not poll).

EndpointSlices are written directly (as the EndpointSlice controller would for ready pods),
and the router's pools must follow: endpoints joining, turning unready, slices deleted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from kubernetes import client

from disagg_contract import Role
from disagg_router.discovery.kubernetes import SERVICE_NAME_LABEL, EndpointSliceDiscovery
from disagg_router.replicas import ReplicaPool


def endpoint_slice(name: str, service: str, ready: dict[str, bool]) -> client.V1EndpointSlice:
    return client.V1EndpointSlice(
        address_type="IPv4",
        metadata=client.V1ObjectMeta(name=name, labels={SERVICE_NAME_LABEL: service}),
        ports=[client.DiscoveryV1EndpointPort(name="http", port=8200, protocol="TCP")],
        endpoints=[
            client.V1Endpoint(addresses=[ip], conditions=client.V1EndpointConditions(ready=up))
            for ip, up in ready.items()
        ],
    )


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def urls(pool: ReplicaPool) -> list[str]:
    return sorted(replica.url for replica in pool.members())


def test_pools_follow_endpoint_slices(
    k8s_api: client.ApiClient, kubeconfig: Path, namespace: str
) -> None:
    api = client.DiscoveryV1Api(k8s_api)
    api.create_namespaced_endpoint_slice(
        namespace, endpoint_slice("prefill-a", "m-prefill", {"10.0.0.1": True})
    )

    async def scenario() -> None:
        prefill = ReplicaPool(Role.PREFILL, 1.0, 5.0)
        decode = ReplicaPool(Role.DECODE, 1.0, 5.0)
        discovery = EndpointSliceDiscovery(
            namespace, {"m-prefill": prefill, "m-decode": decode}, "http", str(kubeconfig)
        )
        await discovery.start()
        try:
            await until(lambda: urls(prefill) == ["http://10.0.0.1:8200"], "initial list")
            assert urls(decode) == []

            slice_d = endpoint_slice("decode-a", "m-decode", {"10.0.1.1": True, "10.0.1.2": False})
            await asyncio.to_thread(api.create_namespaced_endpoint_slice, namespace, slice_d)
            await until(lambda: urls(decode) == ["http://10.0.1.1:8200"], "a new decode slice")

            slice_d = endpoint_slice("decode-a", "m-decode", {"10.0.1.1": True, "10.0.1.2": True})
            await asyncio.to_thread(
                api.replace_namespaced_endpoint_slice, "decode-a", namespace, slice_d
            )
            await until(
                lambda: urls(decode) == ["http://10.0.1.1:8200", "http://10.0.1.2:8200"],
                "a pod turning ready",
            )

            extra = endpoint_slice("prefill-b", "m-prefill", {"10.0.0.2": True})
            await asyncio.to_thread(api.create_namespaced_endpoint_slice, namespace, extra)
            await until(lambda: len(prefill.members()) == 2, "a second prefill slice")

            await asyncio.to_thread(api.delete_namespaced_endpoint_slice, "prefill-a", namespace)
            await until(lambda: urls(prefill) == ["http://10.0.0.2:8200"], "a deleted slice")
        finally:
            await discovery.stop()

    asyncio.run(scenario())
