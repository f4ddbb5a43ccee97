"""Pods on the real node: each image's entrypoint runs in a pod with an address on the node's
bridge, Services reach pods through kube-proxy, the API server reaches the kubelet (logs), and
nothing routes from the pods to an outside interface."""

from __future__ import annotations

import ipaddress
import json
import subprocess
from typing import Any

import pytest

import kube


def _toleration(node_env: dict[str, str]) -> dict[str, str]:
    key, _, rest = node_env["NODE_TAINT"].partition("=")
    value, _, effect = rest.partition(":")
    return {"key": key, "operator": "Equal", "value": value, "effect": effect}


def _pod(name: str, image: str, node_env: dict[str, str], **container: Any) -> dict[str, Any]:
    """A pod pinned to the real node, running `image` (present there: never pulled)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {"type": "real"},
            "tolerations": [_toleration(node_env)],
            "restartPolicy": container.pop("restartPolicy", "Always"),
            "containers": [
                {"name": "main", "image": image, "imagePullPolicy": "Never", **container}
            ],
        },
    }


def _in_pod_cidr(pod: dict[str, Any], node_env: dict[str, str]) -> bool:
    ip = pod["status"].get("podIP")
    return ip is not None and ipaddress.ip_address(ip) in ipaddress.ip_network(node_env["POD_CIDR"])


@pytest.mark.parametrize(
    ("key", "subcommand"),
    [("OPERATOR_IMAGE", "operator"), ("ROUTER_IMAGE", "router"), ("SERVING_IMAGE", "serve")],
)
def test_each_images_entrypoint_runs_in_a_pod_on_the_bridge(
    kubectl: kube.Kubectl,
    namespace: str,
    images: dict[str, str],
    node_env: dict[str, str],
    key: str,
    subcommand: str,
) -> None:
    pod = _pod("entry", images[key], node_env, args=[subcommand, "--help"], restartPolicy="Never")
    kubectl.apply(pod, "-n", namespace)
    done = kube.wait_for(
        lambda: (
            (
                (p := kubectl.json("-n", namespace, "get", "pod", "entry"))["status"].get("phase")
                in ("Succeeded", "Failed")
            )
            and p
        ),
        what=f"pod entry of {images[key]} to finish",
        timeout_s=300,
    )
    logs = kubectl("-n", namespace, "logs", "entry")
    assert done["status"]["phase"] == "Succeeded", logs
    assert done["spec"]["nodeName"] == node_env["NODE_NAME"]
    assert _in_pod_cidr(done, node_env), done["status"]
    assert logs.startswith(f"usage: disagg {subcommand}"), logs


def test_a_service_reaches_a_pod_from_another_pod_and_from_the_host(
    kubectl: kube.Kubectl, namespace: str, images: dict[str, str], node_env: dict[str, str]
) -> None:
    image = images["ROUTER_IMAGE"]
    server = _pod(
        "web",
        image,
        node_env,
        command=["python", "-m", "http.server", "8080"],
        readinessProbe={"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
    )
    client = _pod("client", image, node_env, command=["sleep", "infinity"])
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    kubectl.apply([server, client, service], "-n", namespace)
    kubectl(
        "-n", namespace, "wait", "--for=condition=Ready", "pod/web", "pod/client", "--timeout=120s"
    )
    cluster_ip = kubectl.json("-n", namespace, "get", "service", "web")["spec"]["clusterIP"]
    assert ipaddress.ip_address(cluster_ip) in ipaddress.ip_network(node_env["SERVICE_CIDR"])
    fetch = (
        "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).status)"
    )

    def from_client() -> bool:
        run = kubectl.run(
            "-n",
            namespace,
            "exec",
            "client",
            "--",
            "python",
            "-c",
            fetch,
            f"http://{cluster_ip}/",
            check=False,
        )
        return run.stdout.strip() == "200"

    kube.wait_for(from_client, what="the Service from the client pod (kube-proxy)", timeout_s=30)
    host = subprocess.run(
        [
            "curl",
            "-fsS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
            f"http://{cluster_ip}/",
        ],
        capture_output=True,
        text=True,
    )
    assert host.stdout == "200", host.stderr
    assert "GET / HTTP/1.1" in kubectl("-n", namespace, "logs", "web")


def test_nothing_routes_from_the_pods_to_an_outside_interface(
    kubectl: kube.Kubectl, namespace: str, images: dict[str, str], node_env: dict[str, str]
) -> None:
    routes = json.loads(
        subprocess.run(
            ["ip", "-j", "route", "show", "default"], check=True, capture_output=True, text=True
        ).stdout
    )
    outside = [route["gateway"] for route in routes if "gateway" in route]
    netns_routes = subprocess.run(
        ["ip", "-n", node_env["NODE_NETNS"], "route", "show", "default"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert netns_routes == "", "the node's namespace must not have a default route"
    kubectl.apply(
        _pod("probe", images["ROUTER_IMAGE"], node_env, command=["sleep", "infinity"]),
        "-n",
        namespace,
    )
    kubectl("-n", namespace, "wait", "--for=condition=Ready", "pod/probe", "--timeout=120s")
    connect = (
        "import socket, sys\n"
        "for host in sys.argv[1:]:\n"
        "    s = socket.socket(); s.settimeout(3)\n"
        "    try: s.connect((host, 80)); print(host, 'connected')\n"
        "    except OSError as e: print(host, e.errno)\n"
    )
    out = kubectl(
        "-n", namespace, "exec", "probe", "--", "python", "-c", connect, *outside, "8.8.8.8"
    )
    assert "connected" not in out, out
