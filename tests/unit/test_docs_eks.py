"""docs/eks.md and its files agree with each other and with the product: every file is in the
guide and every path the guide names exists, the model renders, and the facts that cross files
(image tags, the weights claim, hugepages) match. The API server and the published schemas check
the files themselves in tests/cluster/test_docs_manifests.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from disagg_operator.loading import load_resource
from disagg_operator.render import render
from dmodel_samples import REPO

GUIDE = REPO / "docs" / "eks.md"
DOCS = REPO / "docs" / "eks"
MIB_PER_HUGEPAGE = 2


def _guide() -> str:
    return GUIDE.read_text()


def _one(path: Path, kind: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == kind]
    found: dict[str, Any] = doc
    return found


def _model() -> dict[str, Any]:
    return _one(DOCS / "qwen3-32b.yaml", "DisaggregatedModel")


def test_every_file_is_in_the_guide_and_every_named_path_exists() -> None:
    text = _guide()
    for path in sorted(DOCS.iterdir()):
        assert f"(eks/{path.name})" in text, f"docs/eks.md does not link {path.name}"
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    named = re.findall(r"(?<![\w/.-])((?:docs|charts|connector|operator|examples)/[\w./-]+)", text)
    missing = [link for link in links if not (GUIDE.parent / link).exists()]
    missing += [path for path in named if not (REPO / path.rstrip(".")).exists()]
    assert missing == []


def test_the_readme_links_the_guide() -> None:
    assert "[docs/eks.md](docs/eks.md)" in (REPO / "README.md").read_text()


def test_the_model_renders() -> None:
    model = load_resource(_model())
    kinds = {
        child["kind"] for child in render(model.metadata.name, model.metadata.namespace, model.spec)
    }
    assert {"StatefulSet", "Deployment", "NetworkPolicy", "PodMonitor"} <= kinds


def test_the_guide_pushes_the_images_the_files_pull() -> None:
    """The tags `docker push` sends are the model's and the operator chart's images."""
    pushed = set(re.findall(r'docker push "\$REGISTRY/([^"]+)"', _guide()))
    spec = _model()["spec"]
    operator = yaml.safe_load((DOCS / "operator-values.yaml").read_text())["image"]
    pulled = {
        f"{i['repository']}:{i['tag']}" for i in (spec["image"], spec["router"]["image"], operator)
    }
    registry = {p.split("/", 1)[0] for p in pulled}
    assert len(registry) == 1
    assert {p.split("/", 1)[1] for p in pulled} == pushed


def test_the_model_reads_the_weights_claim_under_its_mount() -> None:
    claim = _one(DOCS / "model-weights-s3.yaml", "PersistentVolumeClaim")
    spec = _model()["spec"]
    for role in ("prefill", "decode"):
        (volume,) = spec[role]["volumes"]
        (mount,) = spec[role]["volumeMounts"]
        assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        assert mount["name"] == volume["name"] and mount["readOnly"] is True
        assert spec["model"]["name"].startswith(mount["mountPath"] + "/")
    assert claim["metadata"]["namespace"] == _model()["metadata"]["namespace"]


def test_nodes_reserve_the_hugepages_one_engine_pod_requests() -> None:
    """The node group and Karpenter's user data reserve what spec.efa.hugepages2Mi asks."""
    quantity = _model()["spec"]["efa"]["hugepages2Mi"]
    pages = int(quantity.removesuffix("Mi")) // MIB_PER_HUGEPAGE
    cluster = yaml.safe_load((DOCS / "cluster.yaml").read_text())
    (p5en,) = [g for g in cluster["managedNodeGroups"] if g.get("efaEnabled")]
    user_data = _one(DOCS / "karpenter-ec2nodeclass.yaml", "EC2NodeClass")["spec"]["userData"]
    for script in ("\n".join(p5en["preBootstrapCommands"]), user_data):
        reserved = {int(n) for n in re.findall(r"vm\.nr_hugepages\s*=\s*(\d+)", script)}
        assert reserved == {pages}
