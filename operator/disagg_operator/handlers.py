"""kopf handlers: thin wiring from cluster events to the reconciler.

- `reconcile` (resume, create, spec update of a DisaggregatedModel) converges the model and
  retries with `kopf.TemporaryError` while it cannot be realized; it returns nothing, so kopf
  writes no handler result into status (status is the reconciler's).
- Indexes hold every model and every managed child and pod in memory, so child events re-check
  a model without any API read.
- Child and pod events (drift, deletions by hand, rollout progress) re-run the same reconcile.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, cast

import kopf

from disagg_operator.conditions import pod_state
from disagg_operator.kubeapi import KubeApi, new_api_client
from disagg_operator.metrics import OperatorMetrics
from disagg_operator.models import GROUP, PLURAL, VERSION
from disagg_operator.names import COMPONENT_LABEL, LABEL_PREFIX, MANAGED_BY
from disagg_operator.options import OperatorOptions
from disagg_operator.peering import PeeringMissing, ensure_peering
from disagg_operator.reconcile import Live, Outcome, Reconciler
from disagg_operator.resources import CHILD_RESOURCES, PODS, ApiResource
from disagg_operator.settings import configure

INSTANCE_LABEL = f"{LABEL_PREFIX}instance"
MANAGED = {f"{LABEL_PREFIX}managed-by": MANAGED_BY}
MODELS_INDEX = "models_index"
PODS_INDEX = "pods_index"
OwnerKey = tuple[str, str]


def _index_id(resource: ApiResource) -> str:
    return f"{resource.plural}_index"


def _snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """A plain copy of a watched object without its managedFields."""
    snapshot = copy.deepcopy(dict(body))
    snapshot["metadata"] = {
        k: v for k, v in snapshot.get("metadata", {}).items() if k != "managedFields"
    }
    return snapshot


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Apply the operator-wide settings, connect, and make sure the peering object exists."""
    options: OperatorOptions = memo.options
    metrics: OperatorMetrics = memo.metrics
    configure(settings, options)
    api = KubeApi(new_api_client(), metrics)
    try:
        ensure_peering(api, options)
    except PeeringMissing as exc:
        raise kopf.PermanentError(str(exc)) from None
    memo.reconciler = Reconciler(api, metrics)


@kopf.index(GROUP, VERSION, PLURAL, id=MODELS_INDEX)
def index_model(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """Every DisaggregatedModel by (namespace, name)."""
    return {(namespace, name): _snapshot(body)}


def index_child(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Any, Any]:
    """A managed child by its model's (namespace, name)."""
    return {(namespace, labels[INSTANCE_LABEL]): _snapshot(body)}


def index_pod(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Any, Any]:
    """A managed pod's state by its model's (namespace, name)."""
    return {(namespace, labels[INSTANCE_LABEL]): pod_state(body, labels.get(COMPONENT_LABEL, ""))}


def _live(key: OwnerKey, indexes: Mapping[str, Any]) -> Live:
    children = {
        (child["kind"], child["metadata"]["name"]): child
        for resource in CHILD_RESOURCES
        for child in indexes[_index_id(resource)].get(key, [])
    }
    return Live(children=children, pods=sorted(indexes[PODS_INDEX].get(key, []), key=str))


def _post(owner: Mapping[str, Any], outcome: Outcome) -> None:
    for event in outcome.events:
        kopf.event(
            kopf.Body(cast(kopf.RawBody, dict(owner))),
            type=event.type,
            reason=event.reason,
            message=event.message[:1024],
        )


async def _reconcile(owner: Mapping[str, Any], memo: kopf.Memo, indexes: Any) -> Outcome:
    key = (owner["metadata"]["namespace"], owner["metadata"]["name"])
    reconciler: Reconciler = memo.reconciler
    outcome = await reconciler.reconcile(owner, _live(key, indexes))
    _post(owner, outcome)
    return outcome


@kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile")
@kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile")
@kopf.on.update(GROUP, VERSION, PLURAL, id="reconcile", field="spec")
async def reconcile(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """Converge a model; retry later while it cannot be realized (it ends Degraded meanwhile)."""
    outcome = await _reconcile(_snapshot(body), memo, kwargs)
    if outcome.blocked:
        options: OperatorOptions = memo.options
        reasons = "; ".join(p.message for p in outcome.problems)
        raise kopf.TemporaryError(reasons, delay=options.retry_delay_s)


@kopf.on.event(GROUP, VERSION, PLURAL)
def forget_deleted(type: str, uid: str, memo: kopf.Memo, **_: Any) -> None:
    """Drop the reconciler's memory of a deleted model."""
    if type == "DELETED":
        reconciler: Reconciler = memo.reconciler
        reconciler.forget(uid)


async def child_changed(
    type: str | None,
    body: kopf.Body,
    namespace: str | None,
    labels: kopf.Labels,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    """A child or pod changed (or vanished): re-check its model soon (bursts coalesce)."""
    key = (namespace or "", labels.get(INSTANCE_LABEL, ""))
    reconciler: Reconciler = memo.reconciler
    models = kwargs[MODELS_INDEX]
    for owner in list(models.get(key, [])):
        uid = owner["metadata"]["uid"]
        if type == "DELETED":
            reconciler.forget_child(uid, (body["kind"], body["metadata"]["name"]))

        def read(uid: str = uid) -> tuple[Mapping[str, Any], Live] | None:
            current = [m for m in models.get(key, []) if m["metadata"]["uid"] == uid]
            return (current[0], _live(key, kwargs)) if current else None

        outcome = await reconciler.reconcile_soon(uid, read)
        if outcome is not None:
            _post(owner, outcome)


def _register() -> None:
    for resource in (*CHILD_RESOURCES, PODS):
        group_version = resource.api_version
        index = index_pod if resource is PODS else index_child
        index_id = PODS_INDEX if resource is PODS else _index_id(resource)
        kopf.index(group_version, resource.plural, id=index_id, labels=MANAGED)(index)
        kopf.on.event(
            group_version, resource.plural, id=f"{resource.plural}_changed", labels=MANAGED
        )(child_changed)


_register()
