"""Fixtures for tests on real pods: the local cluster with its real node (tests/cluster/node).

The session builds the images (`images.sh build`, a no-op when their inputs are unchanged),
then starts or reuses the local cluster with DISAGG_REAL_NODE=1 (kwok's fake nodes plus one
real CPU node) and loads the images into the node's containerd (`images.sh import`). The
cluster is named by DISAGG_CLUSTER_NAME (default ``e2e``, apart from the cluster tests' own)
and stopped after the session if the session started it (DISAGG_KEEP_CLUSTER=1 keeps it). Run
this group in its own pytest session (`make test-e2e`): it sets those variables for the whole
process.

Fixtures: `cluster_env`, `node_env` (the node's names and ranges), `images` (the tags),
`kubeconfig`, `kubectl`, `helm`, `namespace` (a fresh namespace per test, deleted afterwards).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CLUSTER_TESTS = Path(__file__).resolve().parents[1] / "cluster"
NODE_SCRIPTS = CLUSTER_TESTS / "node"
# The cluster tests' helpers (kube.py) serve this group too.
sys.path.insert(0, str(CLUSTER_TESTS))
import kube  # noqa: E402

os.environ["DISAGG_REAL_NODE"] = "1"
os.environ.setdefault("DISAGG_CLUSTER_NAME", "e2e")
STARTUP = pytest.StashKey[str]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under tests/e2e with the `cluster` marker (they need the control plane)."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.cluster)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Report the cluster the tests ran on and how long the images and the node took."""
    startup = terminalreporter.config.stash.get(STARTUP, None)
    if startup is not None:
        terminalreporter.write_line(f"real node: {startup}")


def _key_values(*command: str) -> dict[str, str]:
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.fixture(scope="session")
def cluster_env() -> kube.ClusterEnv:
    """Pinned versions and paths of the local control plane (the e2e cluster's)."""
    return kube.cluster_env()


@pytest.fixture(scope="session")
def node_env() -> dict[str, str]:
    """The real node's name, pod and Service ranges and taint, as env.sh prints them."""
    return _key_values("bash", str(CLUSTER_TESTS / "env.sh"))


@pytest.fixture(scope="session")
def images(request: pytest.FixtureRequest) -> dict[str, str]:
    """Build the images when their inputs changed; return their tags (`images.sh env`)."""
    start = time.monotonic()
    subprocess.run(["bash", str(NODE_SCRIPTS / "images.sh"), "build"], check=True)
    request.config.stash[STARTUP] = f"images ready in {time.monotonic() - start:.0f} s"
    return _key_values("bash", str(NODE_SCRIPTS / "images.sh"), "env")


@pytest.fixture(scope="session")
def kubeconfig(
    request: pytest.FixtureRequest, cluster_env: kube.ClusterEnv, images: dict[str, str]
) -> Iterator[Path]:
    """The kubeconfig of the local cluster with its real node, started or reused."""
    session = kube.LocalClusterSession(cluster_env)
    start = time.monotonic()
    try:
        path, started = session.up()
        subprocess.run(["bash", str(NODE_SCRIPTS / "images.sh"), "import"], check=True)
        how = "started" if started else "reused"
        request.config.stash[STARTUP] += (
            f"; cluster {cluster_env.state_dir.name} with its real node {how} in "
            f"{time.monotonic() - start:.0f} s, KUBECONFIG={path}"
        )
        yield path
    finally:
        session.leave(keep=os.environ.get("DISAGG_KEEP_CLUSTER") == "1")


@pytest.fixture(scope="session")
def kubectl(cluster_env: kube.ClusterEnv, kubeconfig: Path) -> kube.Kubectl:
    """kubectl (same release as the API server) bound to the e2e cluster."""
    return kube.Kubectl(cluster_env.kubectl, kubeconfig)


@pytest.fixture(scope="session")
def helm(cluster_env: kube.ClusterEnv, kubeconfig: Path) -> kube.Tool:
    """helm bound to the e2e cluster; its default Kubernetes version is the cluster's."""
    return kube.Tool(cluster_env.helm, kubeconfig, timeout_s=300)


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
