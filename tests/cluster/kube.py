"""Helpers for tests that run against the local Kubernetes control plane.

The control plane is built and started by the shell scripts next to this module
(`build.sh`, `cluster-up.sh`, `cluster-down.sh`); `env.sh` is the one place that names its
versions and paths. The pytest fixtures in `conftest.py` wrap these helpers.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client, config

HERE = Path(__file__).resolve().parent
T = TypeVar("T")


@dataclass(frozen=True)
class ClusterEnv:
    """Pinned versions and paths of the local control plane, as `env.sh` prints them."""

    kube_version: str
    bin_dir: Path
    state_dir: Path
    kubeconfig: Path

    @property
    def kubectl(self) -> Path:
        """The kubectl built from the same Kubernetes release as the API server."""
        return self.bin_dir / "kubectl"

    @property
    def helm(self) -> Path:
        """The helm whose default Kubernetes version matches the cluster."""
        return self.bin_dir / "helm"


def cluster_env() -> ClusterEnv:
    """Read the control plane's versions and paths from `env.sh`."""
    out = subprocess.run(
        ["bash", str(HERE / "env.sh")], check=True, capture_output=True, text=True
    ).stdout
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return ClusterEnv(
        kube_version=values["KUBE_VERSION"],
        bin_dir=Path(values["CLUSTER_BIN"]),
        state_dir=Path(values["CLUSTER_STATE"]),
        kubeconfig=Path(values["CLUSTER_KUBECONFIG"]),
    )


def build_binaries() -> None:
    """Build kubectl, helm and the control plane into the cache (a no-op when cached)."""
    subprocess.run(["bash", str(HERE / "build.sh")], check=True, stdout=subprocess.DEVNULL)


def cluster_up() -> Path:
    """Build the binaries if needed, start (or reuse) the local cluster, return its kubeconfig."""
    out = subprocess.run(
        ["bash", str(HERE / "cluster-up.sh")], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    return Path(out.strip().splitlines()[-1])


def cluster_down() -> None:
    """Stop the local cluster and remove its state."""
    subprocess.run(["bash", str(HERE / "cluster-down.sh")], check=True, capture_output=True)


class LocalClusterSession:
    """One test session's use of the local cluster.

    Sessions hold a shared lock on a file in the cluster's state folder while they use it. The
    last session to leave stops the cluster if a test session started it; a cluster started by
    hand (`make cluster-up`) keeps running.
    """

    def __init__(self, env: ClusterEnv) -> None:
        self.env = env
        env.state_dir.mkdir(parents=True, exist_ok=True)
        self._started_by_tests = env.state_dir / "started-by-tests"
        self._users = (env.state_dir / "users.lock").open("a")
        fcntl.flock(self._users, fcntl.LOCK_SH)

    def up(self) -> tuple[Path, bool]:
        """Start or reuse the cluster; return its kubeconfig and whether this call started it."""
        started = not local_cluster_running(self.env)
        if started:
            self._started_by_tests.touch()
        return cluster_up(), started

    def leave(self, keep: bool) -> None:
        """Stop using the cluster; stop it too when last out, unless `keep`."""
        try:
            if not keep and self._started_by_tests.exists():
                fcntl.flock(self._users, fcntl.LOCK_EX | fcntl.LOCK_NB)
                cluster_down()
                self._started_by_tests.unlink(missing_ok=True)
        except BlockingIOError:
            pass  # another session still uses the cluster; the last one stops it
        finally:
            self._users.close()


def local_cluster_running(env: ClusterEnv) -> bool:
    """Whether the local cluster's API server answers ready on its kubeconfig."""
    if not env.kubeconfig.is_file() or not env.kubectl.is_file():
        return False
    probe = Tool(env.kubectl, env.kubeconfig).run("get", "--raw", "/readyz", check=False)
    return probe.returncode == 0


def kubeconfig_from_environment() -> Path | None:
    """The kubeconfig file named by $KUBECONFIG, or None when the variable is unset or empty.

    Raises ValueError when it names several files or a missing one: the tests need one file.
    """
    value = os.environ.get("KUBECONFIG", "")
    if not value:
        return None
    if os.pathsep in value:
        raise ValueError(f"KUBECONFIG={value!r}: name a single kubeconfig file for the tests")
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"KUBECONFIG={value!r}: no such file; unset it to use the local cluster")
    return path


class CommandFailed(AssertionError):
    """A kubectl or helm command exited non-zero; the message carries its stderr."""


@dataclass(frozen=True)
class Tool:
    """Runs a Kubernetes CLI (kubectl, helm) against one cluster (KUBECONFIG set for it)."""

    binary: Path
    kubeconfig: Path
    timeout_s: float = 120

    def run(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run the tool with `args`; raise CommandFailed on a non-zero exit when `check`."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        proc = subprocess.run(
            [str(self.binary), *args],
            input=input,
            capture_output=True,
            text=True,
            env=env,
            timeout=self.timeout_s,
        )
        if check and proc.returncode != 0:
            cmd = " ".join([self.binary.name, *args])
            raise CommandFailed(f"`{cmd}` exited {proc.returncode}:\n{proc.stderr.strip()}")
        return proc

    def __call__(self, *args: str, input: str | None = None) -> str:
        """Run the tool with `args` and return its stdout (CommandFailed on error)."""
        return self.run(*args, input=input).stdout


class Kubectl(Tool):
    """kubectl with helpers for JSON output and manifests."""

    def json(self, *args: str) -> Any:
        """Run `kubectl <args> -o json` and return the decoded object."""
        return json.loads(self(*args, "-o", "json"))

    def apply(self, manifests: dict[str, Any] | Sequence[dict[str, Any]], *args: str) -> str:
        """Apply manifests (one object or a list) with `kubectl apply -f -` and extra `args`."""
        docs = [manifests] if isinstance(manifests, dict) else list(manifests)
        return self("apply", "-f", "-", *args, input=yaml.safe_dump_all(docs))


def api_client(kubeconfig: Path) -> client.ApiClient:
    """A kubernetes python ApiClient for the cluster of `kubeconfig`."""
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig)
    )
    return api


def wait_for(
    probe: Callable[[], T | None], *, what: str, timeout_s: float = 60, interval_s: float = 0.5
) -> T:
    """Call `probe` until it returns a truthy value and return that value.

    Raises TimeoutError naming `what` and the last value seen after `timeout_s` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


def namespace_name(test_name: str) -> str:
    """A valid, unique namespace name derived from a test name."""
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:40].rstrip("-")
    return f"t-{slug}-{os.urandom(3).hex()}"


def condition_true(obj: dict[str, Any], kind: str) -> bool:
    """Whether `obj.status.conditions` holds a condition of type `kind` with status True."""
    conditions = obj.get("status", {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)
