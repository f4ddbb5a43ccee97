"""Files of other projects' pinned Go modules the cluster tests read: eksctl's ClusterConfig
JSON schema, Karpenter's, the Prometheus Operator's and the Gateway API's CRDs.

Each module is fetched once with `go mod download` (the Go module proxy, as the control plane's
modules are) and the files the tests read are copied into $DISAGG_CACHE/docs-modules/
(default ~/.cache/disagg), keyed by module and version; nothing is vendored in the repository.
A failed download fails the test with the module named, never skips it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml


@dataclass(frozen=True)
class PinnedModule:
    """One Go module at one version, and the files of it the tests read (globs in the module)."""

    path: str
    version: str
    files: tuple[str, ...]

    @property
    def cache_dir(self) -> Path:
        """Where the module's files are kept between runs."""
        root = Path(os.environ.get("DISAGG_CACHE", Path.home() / ".cache" / "disagg"))
        return root / "docs-modules" / f"{self.path.replace('/', '+')}@{self.version}"


EKSCTL = PinnedModule(
    "github.com/weaveworks/eksctl",
    "v0.215.0",
    ("pkg/apis/eksctl.io/v1alpha5/assets/schema.json", "pkg/addons/assets/efa-device-plugin.yaml"),
)
"""eksctl: the ClusterConfig schema it publishes, and the EFA device plugin DaemonSet it installs
on a cluster with an efaEnabled node group."""

KARPENTER = PinnedModule(
    "github.com/aws/karpenter-provider-aws",
    "v1.14.1",
    (
        "pkg/apis/crds/karpenter.k8s.aws_ec2nodeclasses.yaml",
        "pkg/apis/crds/karpenter.sh_nodepools.yaml",
        "pkg/apis/crds/karpenter.sh_nodeclaims.yaml",
    ),
)
"""Karpenter's AWS provider: the CRDs its Helm chart installs (NodePool and NodeClaim with the
provider's rules, EC2NodeClass)."""


def gomod_version(module: str, go_mod: Path) -> str:
    """The version of `module` that the go.mod file `go_mod` requires."""
    for line in go_mod.read_text().splitlines():
        words = line.split()
        if module in words:
            return words[words.index(module) + 1]
    raise ValueError(f"{go_mod} requires no {module}")


PROMETHEUS_OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator"
PROMETHEUS_OPERATOR_CRDS = "example/prometheus-operator-crd"
PROMETHEUS_OPERATOR = PinnedModule(
    PROMETHEUS_OPERATOR_MODULE,
    gomod_version(
        PROMETHEUS_OPERATOR_MODULE,
        Path(__file__).resolve().parent / "go" / "prometheus-operator" / "go.mod",
    ),
    tuple(
        f"{PROMETHEUS_OPERATOR_CRDS}/monitoring.coreos.com_{kind}.yaml"
        for kind in (
            "alertmanagerconfigs",
            "alertmanagers",
            "podmonitors",
            "probes",
            "prometheusagents",
            "prometheuses",
            "prometheusrules",
            "scrapeconfigs",
            "servicemonitors",
            "thanosrulers",
        )
    ),
)
"""The Prometheus Operator (what kube-prometheus-stack runs), at the version whose operator
binary the stock-Prometheus test builds (../go/prometheus-operator): all the CRDs its chart
installs, the objects the operator chart and the models render among them."""


GATEWAY_API_STANDARD = "config/crd/standard"
GATEWAY_API = PinnedModule(
    "sigs.k8s.io/gateway-api",
    "v1.6.3",
    tuple(
        f"{GATEWAY_API_STANDARD}/gateway.networking.k8s.io_{kind}.yaml"
        for kind in (
            "backendtlspolicies",
            "gatewayclasses",
            "gateways",
            "grpcroutes",
            "httproutes",
            "listenersets",
            "referencegrants",
            "tcproutes",
            "tlsroutes",
            "udproutes",
        )
    ),
)
"""The Gateway API: its standard-install CRDs (not the ValidatingAdmissionPolicy beside them in
the module, which would outlive the CRDs a test removes), for the router's HTTPRoute."""


def _download(module: PinnedModule) -> Path:
    """Download the module with `go mod download` and return its directory in Go's cache."""
    ref = f"{module.path}@{module.version}"
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    with tempfile.TemporaryDirectory() as outside_any_module:
        try:
            proc = subprocess.run(
                ["go", "mod", "download", "-json", ref],
                cwd=outside_any_module,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            pytest.fail(f"cannot fetch {ref}: `go mod download` did not run ({error})")
    info = json.loads(proc.stdout) if proc.stdout.strip() else {}
    if proc.returncode != 0 or "Dir" not in info:
        reason = info.get("Error") or proc.stderr.strip()
        pytest.fail(f"cannot fetch {ref} from the Go module proxy: {reason}")
    return Path(info["Dir"])


def pinned_files(module: PinnedModule) -> dict[str, Path]:
    """The module's files the tests read, by their path in the module, from the cache (filled
    from `go mod download` on first use)."""
    cached = {name: module.cache_dir / name for name in module.files}
    if all(path.is_file() for path in cached.values()):
        return cached
    source = _download(module)
    staging = module.cache_dir.with_name(module.cache_dir.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    for name in module.files:
        if not (source / name).is_file():
            pytest.fail(f"{module.path}@{module.version} has no {name}")
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, staging / name)
    shutil.rmtree(module.cache_dir, ignore_errors=True)
    staging.rename(module.cache_dir)
    return cached


def crd_name(path: Path) -> str:
    """The name of the CustomResourceDefinition in `path`. Read with YAML's base loader, which
    keeps every scalar a string: the Prometheus Operator's CRDs hold `=` as an enum value, a
    YAML 1.1 "value" tag the safe loader refuses."""
    name: str = yaml.load(path.read_text(), Loader=yaml.BaseLoader)["metadata"]["name"]
    return name
