"""The Argo CD health check (gitops/argocd/health.lua) run for real in Lua 5.1.

Argo CD runs health scripts with gopher-lua, a Lua 5.1 implementation; lupa's `lua51` module is
the reference interpreter of the same language version. Sample statuses are built through the
operator's own status model, so the field names the script reads are the ones the CRD stores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lupa import lua51

from disagg_operator.models import DisaggregatedModelStatus
from dmodel_samples import minimal_spec, resource

SCRIPT = Path(__file__).resolve().parents[2] / "gitops" / "argocd" / "health.lua"


def _condition(kind: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def _model(generation: int, status: dict[str, Any] | None) -> dict[str, Any]:
    obj = resource(minimal_spec())
    obj["metadata"]["generation"] = generation
    if status is not None:
        stored = DisaggregatedModelStatus.model_validate(status)
        obj["status"] = stored.model_dump(exclude_none=True)
    return obj


def health(obj: dict[str, Any]) -> dict[str, str]:
    """Run the script the way Argo CD does: `obj` global, the chunk returns the result table."""
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(SCRIPT.read_text())
    return dict(result.items())


READY = _condition("Ready", "True", "AllRolesReady", "prefill 1/1, decode 1/1, router 1/1")
NOT_READY = _condition("Ready", "False", "RolesNotReady", "decode 0/1 ready")
ROLLING = _condition("Progressing", "True", "RollingOut", "decode StatefulSet rolling out")
DEGRADED = _condition("Degraded", "True", "SecretNotFound", "secret hf-token not found in ml")
NOT_DEGRADED = _condition("Degraded", "False", "AsExpected")

CASES = [
    pytest.param(None, "Progressing", "report status", id="no-status-yet"),
    pytest.param(
        {"observedGeneration": 2}, "Progressing", "Not ready yet", id="defaults-no-conditions"
    ),
    pytest.param(
        {"observedGeneration": 2, "conditions": [READY, NOT_DEGRADED]},
        "Healthy",
        "AllRolesReady: prefill 1/1",
        id="ready",
    ),
    pytest.param(
        {"observedGeneration": 1, "conditions": [READY]},
        "Progressing",
        "observe generation 2",
        id="stale-generation",
    ),
    pytest.param(
        {"observedGeneration": 2, "conditions": [NOT_READY, ROLLING, NOT_DEGRADED]},
        "Progressing",
        "RollingOut: decode StatefulSet rolling out",
        id="rolling-out",
    ),
    pytest.param(
        {"observedGeneration": 2, "conditions": [NOT_READY]},
        "Progressing",
        "RolesNotReady: decode 0/1 ready",
        id="not-ready-without-progressing",
    ),
    pytest.param(
        {"observedGeneration": 2, "conditions": [NOT_READY, DEGRADED]},
        "Degraded",
        "SecretNotFound: secret hf-token not found in ml",
        id="degraded",
    ),
    pytest.param(
        {"observedGeneration": 2, "conditions": [READY, DEGRADED]},
        "Degraded",
        "SecretNotFound",
        id="degraded-wins-over-ready",
    ),
]


@pytest.mark.parametrize(("status", "expected", "message"), CASES)
def test_health_from_status(status: dict[str, Any] | None, expected: str, message: str) -> None:
    result = health(_model(2, status))
    assert result["status"] == expected
    assert message in result["message"]


def test_object_without_generation_is_judged_by_conditions() -> None:
    obj = _model(1, {"conditions": [READY]})
    del obj["metadata"]["generation"]
    assert health(obj)["status"] == "Healthy"


def test_statuses_are_argo_cd_health_codes() -> None:
    codes = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}
    seen = {health(_model(2, case.values[0]))["status"] for case in CASES}  # type: ignore[arg-type]
    assert seen <= codes
    assert seen == {"Healthy", "Progressing", "Degraded"}
