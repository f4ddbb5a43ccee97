"""The real node's configuration as its scripts produce it (tests/cluster/node), checked without
starting it: the pins agree with the control plane's, the kwokctl settings name the node's
addresses, and the address plan keeps the node's ranges apart."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

import yaml

CLUSTER = Path(__file__).resolve().parents[2] / "tests" / "cluster"
NODE = CLUSTER / "node"


def _env() -> dict[str, str]:
    script = f"source {CLUSTER / 'env.sh'}; " + "; ".join(
        f'echo {name}="${name}"'
        for name in (
            "KUBE_VERSION",
            "NODE_KUBE_VERSION",
            "NODE_HOST_IP",
            "NODE_IP",
            "NODE_LINK_PREFIX",
            "POD_CIDR",
            "POD_GATEWAY",
            "SERVICE_CIDR",
            "KUBERNETES_SERVICE_IP",
            "NODE_TAINT",
        )
    )
    out = subprocess.run(["bash", "-c", script], check=True, capture_output=True, text=True)
    return dict(line.split("=", 1) for line in out.stdout.splitlines())


def test_kubelet_and_kube_proxy_are_the_control_planes_release() -> None:
    env = _env()
    assert env["NODE_KUBE_VERSION"] == env["KUBE_VERSION"]
    replaces = {
        line.split()[0]: line.split()[-1]
        for line in (NODE / "go" / "kubelet" / "go.mod").read_text().splitlines()
        if "=>" in line
    }
    control_plane = {
        line.split()[0]: line.split()[-1]
        for line in (CLUSTER / "go" / "go.mod").read_text().splitlines()
        if "=>" in line
    }
    assert replaces == control_plane, "the staging modules pinned alike"


def test_address_plan_keeps_link_pods_and_services_apart() -> None:
    env = _env()
    link = ipaddress.ip_network(f"{env['NODE_IP']}/{env['NODE_LINK_PREFIX']}", strict=False)
    pods = ipaddress.ip_network(env["POD_CIDR"])
    services = ipaddress.ip_network(env["SERVICE_CIDR"])
    assert ipaddress.ip_address(env["NODE_HOST_IP"]) in link
    assert ipaddress.ip_address(env["POD_GATEWAY"]) in pods
    assert env["KUBERNETES_SERVICE_IP"] == str(next(services.hosts()))
    for a, b in ((link, pods), (link, services), (pods, services)):
        assert not a.overlaps(b), (a, b)
    assert all(net.is_private for net in (link, pods, services))


def test_kwokctl_settings_leave_the_real_node_to_its_kubelet() -> None:
    env = _env()
    out = subprocess.run(
        ["bash", str(NODE / "kwokctl-config.sh")], check=True, capture_output=True, text=True
    ).stdout
    config = yaml.safe_load(out)
    assert config["kind"] == "KwokctlConfiguration"
    assert set(config["options"]["kubeApiserverCertSANs"]) == {
        env["NODE_HOST_IP"],
        env["KUBERNETES_SERVICE_IP"],
    }
    patches = {
        p["name"]: {a["key"]: a for a in p["extraArgs"]} for p in config["componentsPatches"]
    }
    apiserver = patches["kube-apiserver"]
    assert apiserver["advertise-address"]["value"] == env["NODE_HOST_IP"]
    assert apiserver["service-cluster-ip-range"]["value"] == env["SERVICE_CIDR"]
    assert apiserver["kubelet-preferred-address-types"]["value"] == "InternalIP"
    assert Path(apiserver["kubelet-client-certificate"]["value"]).name == "admin.crt"
    kwok = patches["kwok-controller"]
    assert kwok["manage-all-nodes"] == {
        "key": "manage-all-nodes",
        "value": "false",
        "override": True,
    }
    annotation = kwok["manage-nodes-with-annotation-selector"]["value"]
    fake_nodes = subprocess.run(
        ["bash", str(CLUSTER / "nodes.sh")], check=True, capture_output=True, text=True
    ).stdout
    key, value = annotation.split("=")
    for node in yaml.safe_load_all(fake_nodes):
        if node:
            assert node["metadata"]["annotations"][key] == value, node["metadata"]["name"]
