"""kopf handlers: thin wiring from cluster events to the reconciler.

- `reconcile` (resume, create, spec update of a DisaggregatedModel) converges the model and
  retries with `kopf.TemporaryError` while it cannot be realized; it returns nothing, so kopf
  writes no handler result into status (status is the reconciler's).
- Three kopf indexes hold every model, every managed child (one index over all child kinds)
  and every managed pod's state, so child events re-check a model without any API read. As in
  kopf's `examples/16-indexing`, each index is named after its function and handlers take the
  ones they read as named arguments (kopf's handler protocols list only kopf's own arguments,
  hence the `type: ignore[arg-type]` where such a handler is registered, as in the example).
- Child and pod events (drift, deletions by hand, rollout progress) re-run the same reconcile,
  and so does the pass that writes a status the reconciler held back (`_checker`).
- One background task started at startup (not a kopf timer, which would put a finalizer on
  every model) reads the routers' reuse summaries of every model in the index at an interval
  and has the reconciler write `status.reuse` when it changed (:mod:`disagg_operator.reuse`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Mapping
from typing import Any, cast

import kopf

from disagg_operator.children import key
from disagg_operator.conditions import PodState, pod_state
from disagg_operator.kubeapi import KubeApi, new_api_client
from disagg_operator.metrics import OperatorMetrics
from disagg_operator.models import GROUP, PLURAL, VERSION
from disagg_operator.names import COMPONENT_LABEL, LABEL_PREFIX, MANAGED_BY
from disagg_operator.options import OperatorOptions
from disagg_operator.peering import PeeringMissing, ensure_peering
from disagg_operator.reconcile import PROGRESS_INTERVAL_S, Again, Live, Outcome, Reconciler
from disagg_operator.resources import CHILD_RESOURCES, PODS
from disagg_operator.reuse import (
    Model,
    Reading,
    Report,
    ReusePoller,
    UrlSource,
    pod_urls,
    template_urls,
)
from disagg_operator.settings import configure

INSTANCE_LABEL = f"{LABEL_PREFIX}instance"
MANAGED = {f"{LABEL_PREFIX}managed-by": MANAGED_BY}
OwnerKey = tuple[str, str]
"""A model's (namespace, name): the key of every index."""
Snapshots = kopf.Index[OwnerKey, dict[str, Any]]
PodStates = kopf.Index[OwnerKey, PodState]


def _snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """A plain copy of a watched object without its managedFields."""
    snapshot = copy.deepcopy(dict(body))
    snapshot["metadata"] = {
        k: v for k, v in snapshot.get("metadata", {}).items() if k != "managedFields"
    }
    return snapshot


@kopf.on.startup()  # type: ignore[arg-type]
async def startup(
    settings: kopf.OperatorSettings,
    memo: kopf.Memo,
    models_index: Snapshots,
    pods_index: PodStates,
    **_: Any,
) -> None:
    """Apply the operator-wide settings, connect, make sure the peering object exists, and
    start reading the routers' reuse summaries (unless `--reuse-interval 0`)."""
    options: OperatorOptions = memo.options
    metrics: OperatorMetrics = memo.metrics
    configure(settings, options)
    api = KubeApi(new_api_client(), metrics)
    try:
        ensure_peering(api, options)
    except PeeringMissing as exc:
        raise kopf.PermanentError(str(exc)) from None
    reconciler = memo.reconciler = Reconciler(api, metrics, progress_interval_s=PROGRESS_INTERVAL_S)
    memo.reuse_task = None
    if options.reuse_interval_s > 0:
        urls: UrlSource = template_urls(options.reuse_url) if options.reuse_url else pod_urls
        report = _reuse_writer(reconciler, models_index)
        poller = ReusePoller(report, options.reuse_interval_s, urls)
        memo.reuse_task = asyncio.create_task(
            poller.run(lambda: _models(models_index, pods_index)), name="reuse poller"
        )


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop reading reuse summaries, cancel the passes pending and start no more."""
    task: asyncio.Task[None] | None = memo.get("reuse_task")
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    reconciler: Reconciler | None = memo.get("reconciler")
    if reconciler is not None:
        reconciler.close()


def _models(models_index: Snapshots, pods_index: PodStates) -> list[tuple[Model, list[PodState]]]:
    """Every indexed model with its pods' states."""
    return [
        (model, list(pods_index.get(owner_key, [])))
        for owner_key, models in list(models_index.items())
        for model in list(models)
    ]


def _reuse_writer(reconciler: Reconciler, models_index: Snapshots) -> Report:
    """The poller's report: the reconciler writes the reading into the model's status, reading
    the model from the index again in the model's turn."""

    async def report(model: Model, reading: Reading, failures: int) -> None:
        meta = model["metadata"]
        owner_key, uid = (meta["namespace"], meta["name"]), meta["uid"]

        def read() -> Mapping[str, Any] | None:
            current = [m for m in models_index.get(owner_key, []) if m["metadata"]["uid"] == uid]
            return current[0] if current else None

        await reconciler.report_reuse(uid, read, reading, failures)

    return report


@kopf.index(GROUP, VERSION, PLURAL)
def models_index(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """Every DisaggregatedModel by (namespace, name)."""
    return {(namespace, name): _snapshot(body)}


def children_index(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Any, Any]:
    """Every managed child, of every child kind, by its model's (namespace, name)."""
    return {(namespace, labels[INSTANCE_LABEL]): _snapshot(body)}


def pods_index(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[Any, Any]:
    """A managed pod's state by its model's (namespace, name)."""
    return {(namespace, labels[INSTANCE_LABEL]): pod_state(body, labels.get(COMPONENT_LABEL, ""))}


def _live(owner_key: OwnerKey, children_index: Snapshots, pods_index: PodStates) -> Live:
    children = {key(child): child for child in children_index.get(owner_key, [])}
    return Live(children=children, pods=sorted(pods_index.get(owner_key, []), key=str))


def _checker(
    reconciler: Reconciler,
    owner: Mapping[str, Any],
    models_index: Snapshots,
    children_index: Snapshots,
    pods_index: PodStates,
) -> Again:
    """A pass of `owner` soon, on the indexes as they are then, posting its Events."""
    meta = owner["metadata"]
    owner_key, uid = (meta["namespace"], meta["name"]), meta["uid"]

    def read() -> tuple[Mapping[str, Any], Live] | None:
        current = [m for m in models_index.get(owner_key, []) if m["metadata"]["uid"] == uid]
        if not current:
            return None
        return current[0], _live(owner_key, children_index, pods_index)

    async def check() -> None:
        outcome = await reconciler.reconcile_soon(uid, read, check)
        if outcome is not None:
            _post(owner, outcome)

    return check


def _post(owner: Mapping[str, Any], outcome: Outcome) -> None:
    for event in outcome.events:
        kopf.event(
            kopf.Body(cast(kopf.RawBody, dict(owner))),
            type=event.type,
            reason=event.reason,
            message=event.message[:1024],
        )


@kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile")
@kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile")
@kopf.on.update(GROUP, VERSION, PLURAL, id="reconcile", field="spec")  # type: ignore[arg-type]
async def reconcile(
    body: kopf.Body,
    memo: kopf.Memo,
    models_index: Snapshots,
    children_index: Snapshots,
    pods_index: PodStates,
    **_: Any,
) -> None:
    """Converge a model; retry later while it cannot be realized (it ends Degraded meanwhile)."""
    owner = _snapshot(body)
    owner_key = (owner["metadata"]["namespace"], owner["metadata"]["name"])
    reconciler: Reconciler = memo.reconciler
    again = _checker(reconciler, owner, models_index, children_index, pods_index)
    outcome = await reconciler.reconcile(owner, _live(owner_key, children_index, pods_index), again)
    _post(owner, outcome)
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
    models_index: Snapshots,
    children_index: Snapshots,
    pods_index: PodStates,
    **_: Any,
) -> None:
    """A child or pod changed (or vanished): re-check its model soon (bursts coalesce)."""
    owner_key = (namespace or "", labels.get(INSTANCE_LABEL, ""))
    reconciler: Reconciler = memo.reconciler
    for owner in list(models_index.get(owner_key, [])):
        if type == "DELETED":
            reconciler.forget_child(owner["metadata"]["uid"], key(body))
        await _checker(reconciler, owner, models_index, children_index, pods_index)()


def _register() -> None:
    """Index and watch every child kind and the pods, all under the operator's label."""
    for resource in (*CHILD_RESOURCES, PODS):
        group_version, plural = resource.api_version, resource.plural
        index = pods_index if resource is PODS else children_index
        kopf.index(group_version, plural, labels=MANAGED)(index)
        watch = kopf.on.event(group_version, plural, id=f"{plural}_changed", labels=MANAGED)
        watch(child_changed)  # type: ignore[arg-type]


_register()
