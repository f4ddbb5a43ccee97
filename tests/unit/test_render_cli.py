"""`disagg render`: child YAML, the summary table, and field-path errors with a non-zero exit."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg.cli import main
from disagg_operator.loading import load_file
from disagg_operator.render import render
from dmodel_samples import EXAMPLES, REPO, minimal_spec, resource, spec_with


def _write(tmp_path: Path, *documents: dict[str, Any]) -> str:
    path = tmp_path / "cr.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    return str(path)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_render_prints_every_child_as_yaml(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "-f", str(path)]) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [doc["kind"] for doc in documents]
    assert kinds.count("StatefulSet") + kinds.count("LeaderWorkerSet") == 2
    assert kinds.count("ConfigMap") == 1
    assert kinds.count("Deployment") == 1
    assert kinds.count("PodDisruptionBudget") == 3


def test_summary_has_one_line_per_object(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "-f", str(REPO / "examples/qwen3-32b-p5en.yaml"), "--summary"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["KIND", "NAME", "FACTS"]
    assert len(lines) == 17
    budgets = [line for line in lines if line.startswith("PodDisruptionBudget")]
    assert [line.split()[1] for line in budgets] == [
        f"inference/qwen3-32b-{component}" for component in ("prefill", "decode", "router")
    ]
    assert all("maxUnavailable=1 unhealthyPodEvictionPolicy=AlwaysAllow" in b for b in budgets)
    prefill = next(line for line in lines if line.startswith("StatefulSet") and "prefill" in line)
    assert "tp=8" in prefill and "gpus=8" in prefill and "prefixCaching=off" in prefill
    router = next(line for line in lines if line.startswith("Deployment"))
    assert "conversationTtl=450s" in router and "idleTimeout=120s" in router
    (config,) = [line for line in lines if line.startswith("ConfigMap")]
    assert "decode.json: kv_consumer bidir=true ttl=480s leaseTerm=45s" in config
    assert "prefill.json: kv_producer bidir=true ttl=480s backends" in config


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_summary_describes_every_object_of_every_example(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifests = [
        manifest
        for resource in load_file(str(path))
        for manifest in render(resource.metadata.name, resource.metadata.namespace, resource.spec)
    ]
    assert main(["render", "-f", str(path), "--summary"]) == 0
    rows = [line.split(maxsplit=2) for line in capsys.readouterr().out.splitlines()[1:]]
    assert [row[:2] for row in rows] == [
        [m["kind"], f"{m['metadata']['namespace']}/{m['metadata']['name']}"] for m in manifests
    ]
    described = {"StatefulSet", "LeaderWorkerSet", "Deployment", "NetworkPolicy", "Service"}
    assert all(len(row) == 3 for row in rows if row[0] in described)
    for row, manifest in zip(rows, manifests, strict=True):
        if row[0] == "NetworkPolicy":
            assert len(row[2].split()) == 1 + len(manifest["spec"]["ingress"])


def test_summary_of_a_multi_node_example_names_groups_and_open_rules(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["render", "-f", str(REPO / "examples/kimi-k2-2node-p5en.yaml"), "--summary"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {tuple(line.split(maxsplit=2)[:2]): line for line in lines}
    prefill = rows["LeaderWorkerSet", "inference/kimi-k2-prefill"]
    assert "replicas=1 nodesPerReplica=2 role=prefill tp=16 gpus=8 efa=16" in prefill
    policy = rows["NetworkPolicy", "inference/kimi-k2-prefill"]
    assert policy.endswith("ingress router->8000 decode->5600 decode->5700 prefill->all")


def test_several_documents_render_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(
        tmp_path, resource(minimal_spec(), name="one"), resource(minimal_spec(), name="two")
    )
    assert main(["render", "-f", path, "--summary"]) == 0
    out = capsys.readouterr().out
    assert "ml/one-prefill" in out and "ml/two-decode" in out


def test_invalid_spec_exits_non_zero_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = resource(spec_with({"router": {"conversationTtlSeconds": 500}}))
    path = _write(tmp_path, bad)
    assert main(["render", "-f", path]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"error: {path}: spec.router.conversationTtlSeconds: must be less than" in captured.err


def test_every_problem_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = resource(spec_with({"prefill": {"replicas": "2"}, "decode": {"tensorParallelSize": 0}}))
    assert main(["render", "-f", _write(tmp_path, bad)]) == 1
    err = capsys.readouterr().err
    assert "spec.prefill.replicas: Input should be a valid integer" in err
    assert "spec.decode.tensorParallelSize: Input should be greater than or equal to 1" in err


@pytest.mark.parametrize(
    ("text", "message"),
    [("a: [unclosed", "(yaml)"), ("", "no DisaggregatedModel document")],
)
def test_unreadable_input_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "cr.yaml"
    path.write_text(text)
    assert main(["render", "-f", str(path)]) == 1
    assert message in capsys.readouterr().err


def test_missing_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "-f", str(tmp_path / "absent.yaml")]) == 1
    assert "absent.yaml" in capsys.readouterr().err


def test_reads_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(yaml.safe_dump(resource(minimal_spec()))))
    assert main(["render", "-f", "-", "--summary"]) == 0
    assert "ml/demo-connector" in capsys.readouterr().out


def test_console_script_exit_status(tmp_path: Path) -> None:
    bad = _write(tmp_path, resource(spec_with({"kvTransfer": {"backend": "TCP"}})))
    result = subprocess.run(
        [sys.executable, "-m", "disagg.cli", "render", "-f", bad],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "spec.kvTransfer.backend" in result.stderr


def test_render_does_not_import_the_engine_or_operator_runtime() -> None:
    code = (
        "import sys; from disagg.cli import main; "
        f"main(['render', '-f', {str(EXAMPLES[0])!r}, '--summary']); "
        "print(sorted(m for m in ('vllm', 'kopf', 'torch') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.splitlines()[-1] == "[]"
