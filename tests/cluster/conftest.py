"""Fixtures for tests on a real Kubernetes control plane.

The cluster is the one named by $KUBECONFIG when the user set it; otherwise the local
kwokctl cluster (`cluster-up.sh`) is started or reused, and stopped after the last test
session that uses it ends if a test session started it (DISAGG_KEEP_CLUSTER=1 keeps it).

Fixtures: `cluster_env`, `kubeconfig`, `kubectl`, `helm`, `k8s_api` (session scope) and
`namespace` (a fresh namespace per test, deleted afterwards).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

import kube

STARTUP = pytest.StashKey[str]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under tests/cluster with the `cluster` marker."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def cluster_env() -> kube.ClusterEnv:
    """Pinned versions and binary paths of the local control plane."""
    return kube.cluster_env()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Report which cluster the tests ran on and how long it took to get it ready."""
    startup = terminalreporter.config.stash.get(STARTUP, None)
    if startup is not None:
        terminalreporter.write_line(f"cluster: {startup}")


@pytest.fixture(scope="session")
def kubeconfig(request: pytest.FixtureRequest, cluster_env: kube.ClusterEnv) -> Iterator[Path]:
    """Path of the kubeconfig of the cluster under test (see the module docstring)."""
    user_kubeconfig = kube.kubeconfig_from_environment()
    if user_kubeconfig is not None:
        kube.build_binaries()
        request.config.stash[STARTUP] = f"the user's cluster, KUBECONFIG={user_kubeconfig}"
        yield user_kubeconfig
        return
    session = kube.LocalClusterSession(cluster_env)
    start = time.monotonic()
    try:
        path, started = session.up()
        how = "started" if started else "reused"
        request.config.stash[STARTUP] = (
            f"local kwokctl cluster {how}, ready in {time.monotonic() - start:.1f} s, "
            f"KUBECONFIG={path}"
        )
        yield path
    finally:
        session.leave(keep=os.environ.get("DISAGG_KEEP_CLUSTER") == "1")


@pytest.fixture(scope="session")
def kubectl(cluster_env: kube.ClusterEnv, kubeconfig: Path) -> kube.Kubectl:
    """kubectl (same release as the API server) bound to the cluster under test."""
    return kube.Kubectl(cluster_env.kubectl, kubeconfig)


@pytest.fixture(scope="session")
def helm(cluster_env: kube.ClusterEnv, kubeconfig: Path) -> kube.Tool:
    """helm bound to the cluster under test; its default Kubernetes version is the cluster's."""
    return kube.Tool(cluster_env.helm, kubeconfig, timeout_s=300)


@pytest.fixture(scope="session")
def k8s_api(kubeconfig: Path) -> Iterator[client.ApiClient]:
    """A kubernetes python ApiClient for the cluster under test."""
    api = kube.api_client(kubeconfig)
    yield api
    api.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def namespace(request: pytest.FixtureRequest, kubectl: kube.Kubectl) -> Iterator[str]:
    """A fresh namespace (its default ServiceAccount ready) for one test, deleted afterwards."""
    name = kube.namespace_name(request.node.name)
    kubectl("create", "namespace", name)
    kube.wait_for(
        lambda: (
            kubectl.run("-n", name, "get", "serviceaccount", "default", check=False).returncode == 0
        ),
        what=f"the default ServiceAccount of namespace {name}",
    )
    yield name
    kubectl("delete", "namespace", name, "--wait=false")
