"""The disagg-operator chart under the real `helm` (built with the local control plane).

`helm template` needs no cluster, so these helpers serve the unit tests; `helm` itself comes
from tests/cluster/build.sh (a no-op once its cache holds the binaries).
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "disagg-operator"
RULES_FILE = CHART / "files" / "operator-rbac-rules.yaml"

sys.path.insert(0, str(REPO / "tests" / "cluster"))
import kube  # noqa: E402


@functools.cache
def toolchain() -> kube.ClusterEnv:
    """The local control plane's binaries (helm, kubectl), built when missing."""
    kube.build_binaries()
    return kube.cluster_env()


def helm_binary() -> Path:
    """The real helm, its default Kubernetes version the local control plane's."""
    binary: Path = toolchain().helm
    return binary


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm with `args` (no cluster access); raise on a non-zero exit when `check`."""
    proc = subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def template(
    *values: str,
    release: str = "disagg",
    namespace: str = "disagg-system",
    include_crds: bool = False,
) -> list[dict[str, Any]]:
    """The chart's objects rendered by `helm template` with `--set` `values` (and its CRDs)."""
    args = [arg for value in values for arg in ("--set", value)]
    if include_crds:
        args.append("--include-crds")
    out = helm("template", release, str(CHART), "--namespace", namespace, *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The rendered objects of one kind."""
    return [doc for doc in docs if doc["kind"] == kind]


def operator_rules() -> dict[str, Any]:
    """The operator's RBAC rules as the chart reads them."""
    rules: dict[str, Any] = yaml.safe_load(RULES_FILE.read_text())
    return rules
