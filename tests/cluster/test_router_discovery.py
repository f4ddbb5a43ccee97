"""The router's EndpointSlice discovery follows a real API server (watch, not poll).

First EndpointSlices are written directly (as the EndpointSlice controller would for ready
pods), and the router's pools must follow: endpoints joining, turning unready, slices deleted.
Then the EndpointSlice controller itself publishes kwok pods behind a Service, and a pod being
deleted (held terminating by a finalizer, as a real pod is held by its grace period) drains:
still a member, never chosen, until it is gone.
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
from disagg_router.routing import Affinity, ConversationAffinity

HOLD = "disagg.dev/test-hold"
"""A finalizer of this test's: kwok deletes a pod at once, this keeps it terminating."""


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


def _decode_pod(name: str, hold: bool) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name, labels={"app": "drain-decode"}, finalizers=[HOLD] if hold else None
        ),
        spec=client.V1PodSpec(
            node_selector={"type": "kwok"},
            containers=[
                client.V1Container(
                    name="vllm",
                    image="fake",
                    ports=[client.V1ContainerPort(name="http", container_port=8200)],
                )
            ],
        ),
    )


def _drop_hold(core: client.CoreV1Api, namespace: str, name: str) -> None:
    patch = {"metadata": {"finalizers": None}}
    try:
        core.patch_namespaced_pod(name, namespace, patch)
    except client.ApiException as exc:
        if exc.status != 404:
            raise


def test_a_pod_being_deleted_drains_out_of_the_pool_it_is_never_chosen_from(
    k8s_api: client.ApiClient, kubeconfig: Path, namespace: str
) -> None:
    core = client.CoreV1Api(k8s_api)
    service = client.V1Service(
        metadata=client.V1ObjectMeta(name="m-decode"),
        spec=client.V1ServiceSpec(
            selector={"app": "drain-decode"},
            ports=[client.V1ServicePort(name="http", port=8200, target_port="http")],
        ),
    )
    core.create_namespaced_service(namespace, service)
    for name, hold in (("decode-leaving", True), ("decode-staying", False)):
        core.create_namespaced_pod(namespace, _decode_pod(name, hold))

    def url_of(name: str) -> str:
        status = core.read_namespaced_pod(name, namespace).status
        assert status is not None and status.pod_ip, f"{name} has an IP once it is ready"
        return f"http://{status.pod_ip}:8200"

    async def scenario() -> None:
        decode = ReplicaPool(Role.DECODE, 1.0, 5.0)
        discovery = EndpointSliceDiscovery(namespace, {"m-decode": decode}, "http", str(kubeconfig))
        await discovery.start()
        routing = ConversationAffinity(slack=2)
        try:
            await until(lambda: len(decode.available()) == 2, "both kwok pods ready", 60)
            leaving = await asyncio.to_thread(url_of, "decode-leaving")
            staying = await asyncio.to_thread(url_of, "decode-staying")
            kept = routing.choose(decode, leaving)
            assert (kept.replica and kept.replica.url, kept.affinity) == (leaving, Affinity.KEPT)

            await asyncio.to_thread(core.delete_namespaced_pod, "decode-leaving", namespace)
            await until(lambda: [r.url for r in decode.draining()] == [leaving], "draining")
            assert urls(decode) == sorted([leaving, staying]), "still a member while it drains"
            moved = routing.choose(decode, leaving)
            assert (moved.replica and moved.replica.url, moved.affinity) == (
                staying,
                Affinity.DRAINING,
            )
            chosen = {routing.choose(decode).replica for _ in range(6)}
            assert {r.url for r in chosen if r is not None} == {staying}, "no new request"

            await asyncio.to_thread(_drop_hold, core, namespace, "decode-leaving")
            await until(lambda: urls(decode) == [staying], "the deleted pod gone")
            assert decode.draining() == []
        finally:
            await discovery.stop()
            await asyncio.to_thread(_drop_hold, core, namespace, "decode-leaving")

    asyncio.run(scenario())
