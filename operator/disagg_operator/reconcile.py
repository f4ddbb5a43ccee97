"""One reconcile pass of a DisaggregatedModel: render, compare, apply what differs, report.

The pass knows nothing of kopf: the handlers hand it the owner and the live children (from
kopf's indexes) and post the events it returns. In steady state it issues no write at all:
children are applied only when their applied hash changed or a field they set drifted, and
status only when it changed. What the reconciler keeps between passes is all in `Memory`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import json
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from disagg_contract import S3_CREDENTIALS_FIELD
from disagg_operator.children import (
    Action,
    Decision,
    adopt,
    controller_uid,
    decide,
    key,
    owns_replicas,
)
from disagg_operator.conditions import (
    Observed,
    PodState,
    Problem,
    build_status,
    rejected_status,
)
from disagg_operator.connector_config import config_hash, config_map_data
from disagg_operator.errors import SpecError
from disagg_operator.kubeapi import (
    FIELD_MANAGER,
    HANDOVER_MANAGER,
    PASS_THREADS,
    ApiException,
    KubeApi,
)
from disagg_operator.loading import load_spec
from disagg_operator.metrics import OperatorMetrics
from disagg_operator.model_keys import ensure_model_keys
from disagg_operator.models import (
    DisaggregatedModelSpec,
    DisaggregatedModelStatus,
    SecretKeyRef,
    SecretRef,
)
from disagg_operator.names import ROLES, Component, child_name
from disagg_operator.render import render
from disagg_operator.resources import (
    DISAGGREGATED_MODELS,
    ON_REQUEST,
    ROLE_WORKLOADS,
    SECRETS,
    ApiResource,
    resource_of,
)
from disagg_operator.reuse import Reading, next_reuse

Manifest = dict[str, Any]
ChildKey = tuple[str, str]
_T = TypeVar("_T")
Again = Callable[[], Awaitable[None]]
"""Runs one more pass of a model the way its handler does (posting the pass's Events)."""

PROGRESS_INTERVAL_S = 10.0
"""While a model comes up, a status that only reports how far its rollout has come is written
at most this often (see `Memory`); the operator's setting."""

COALESCE_DELAY_S = 0.5
"""Child events arriving this close together share one pass (a rollout is a burst of events)."""

REFUSED_STATUSES = frozenset({400, 403, 404, 409, 422})
"""Apply errors a retry will not fix by itself: reported as Degraded (ApplyFailed)."""

WITHOUT_KIND = {
    "ScaledObject": "or set the role's autoscaling.engine to hpa",
    "PodMonitor": "or set spec.monitoring.podMonitors to false",
    "LeaderWorkerSet": "or set the role's nodesPerReplica to 1",
    "HTTPRoute": "or remove spec.router.httpRoute",
}
"""For each kind a CRD the cluster may lack defines: the spec change that does without it."""


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the DisaggregatedModel."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Live:
    """The live children of one model, as kopf's indexes hold them."""

    children: Mapping[ChildKey, Mapping[str, Any]]
    pods: Sequence[PodState] = ()


@dataclass
class Outcome:
    """What one pass did and found."""

    status: DisaggregatedModelStatus | None = None
    problems: list[Problem] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    applied: int = 0
    status_held_s: float = 0.0
    """The status found only reports progress and was held back: write it this much later."""

    @property
    def blocked(self) -> bool:
        """The model cannot be realized now: retry later."""
        return bool(self.problems)

    @property
    def result(self) -> str:
        """The pass's result for metrics: blocked, applied (a child at least) or noop."""
        if self.blocked:
            return "blocked"
        return "applied" if self.applied else "noop"


def desired_children(owner: Mapping[str, Any]) -> list[Manifest]:
    """The adopted child manifests of `owner` (SpecError when its spec does not load)."""
    meta = owner["metadata"]
    spec = load_spec(owner["spec"])
    return [adopt(m, owner) for m in render(meta["name"], meta["namespace"], spec)]


class Memory:
    """Everything the reconciler keeps between passes, per model uid, and why.

    kopf's indexes are the operator's view of the cluster and the pass is a function of that
    view. Each piece here makes up for something the view alone does not give. The first is
    needed for correctness; the other four only save work, and each is kept because
    `benchmarks/operator_scale.py` shows what it saves (runs without each one are in
    benchmarks/README.md):

    - turns: one pass of a model at a time (an asyncio lock per model, gone once no pass
      holds or awaits it). Child events come from other watch streams than the model's own
      handler, and two passes at once would apply and patch the same objects twice;
    - coalescing: a child-event pass starts `COALESCE_DELAY_S` late, and the events arriving
      while it waits join it (it reads the state after them): a rollout is a burst of pod
      and workload events, and one pass each is more status writes and more CPU;
    - own writes: the API server's answer to each apply and status patch, read instead of
      the watched copy until the watch shows one at least as new (by resourceVersion). The
      next pass often starts, after waiting for its turn, before the watch has delivered
      the last writes of the pass before: from the older copies it would apply the same
      children and write the same status again, with their Events;
    - rendered children: the adopted manifests by the model's identity and spec, so that
      the many child-event passes of a model do not render it again (rendering is the
      costliest step of a pass);
    - held progress: while a model comes up (neither Ready nor Degraded, before or after,
      and no newer generation observed), a status that changed only in how far the rollout
      has come is written at most once per progress interval, by one pass started when the
      interval ends (the pending pass, one per model). Each pod, workload and child event
      of a rollout otherwise writes one more intermediate status; a change that says more
      (Ready, Degraded, a new generation) is written at once.
    """

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._waiting: set[str] = set()
        self._written: dict[str, dict[ChildKey, Mapping[str, Any]]] = {}
        self._rendered: dict[str, tuple[str, tuple[Manifest, ...]]] = {}
        self._held: dict[str, float] = {}
        self._pending: dict[str, asyncio.Task[None]] = {}

    async def one_at_a_time(self, uid: str, run: Callable[[], Awaitable[_T]]) -> _T:
        """`run()` in the model's turn."""
        lock = self._locks.get(uid)
        if lock is None:
            lock = self._locks[uid] = asyncio.Lock()
        async with lock:
            return await run()

    async def soon(self, uid: str, run: Callable[[], Awaitable[_T]]) -> _T | None:
        """`run()` after `COALESCE_DELAY_S`, in the model's turn; None when joined to a waiting one.

        While a call waits to start, further calls return None at once: the waiting one runs
        after them, so it covers them.
        """
        if uid in self._waiting:
            return None
        self._waiting.add(uid)

        async def started() -> _T:
            self._waiting.discard(uid)
            return await run()

        try:
            await asyncio.sleep(COALESCE_DELAY_S)
            return await self.one_at_a_time(uid, started)
        finally:
            self._waiting.discard(uid)

    def wrote(self, uid: str, answer: Mapping[str, Any]) -> None:
        """Remember the API server's answer to a write of the model or one of its children."""
        self._written.setdefault(uid, {})[key(answer)] = answer

    def newest(
        self, uid: str, watched: Mapping[ChildKey, Mapping[str, Any]]
    ) -> dict[ChildKey, Mapping[str, Any]]:
        """The watched objects (by kind and name), with own writes where the watch lags."""
        current = dict(watched)
        written = self._written.get(uid, {})
        for child, answer in list(written.items()):
            seen = watched.get(child)
            if seen is not None and _resource_version(seen) >= _resource_version(answer):
                written.pop(child, None)
            else:
                current[child] = answer
        return current

    def rendered(self, owner: Mapping[str, Any]) -> list[Manifest]:
        """`desired_children(owner)`, rendered again only when its identity or spec changed."""
        meta = owner["metadata"]
        identity = json.dumps(
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "metadata": {k: meta[k] for k in ("name", "namespace", "uid")},
                "spec": owner["spec"],
            },
            sort_keys=True,
        )
        cached = self._rendered.get(meta["uid"])
        if cached is None or cached[0] != identity:
            cached = self._rendered[meta["uid"]] = (identity, tuple(desired_children(owner)))
        return list(cached[1])

    def hold(self, uid: str, now: float, interval_s: float) -> float:
        """Seconds a progress status of the model is still held back (0: write it now); the
        interval starts with the first one held."""
        since = self._held.setdefault(uid, now)
        return max(0.0, since + interval_s - now)

    def release(self, uid: str) -> None:
        """The model's status was written: the next progress status starts a new interval."""
        self._held.pop(uid, None)

    def later(self, uid: str, delay_s: float, run: Again) -> None:
        """`run()` in `delay_s`, unless a run of the model is pending already."""
        if uid in self._pending:
            return

        async def pending() -> None:
            await asyncio.sleep(delay_s)
            self._pending.pop(uid, None)
            await run()

        self._pending[uid] = asyncio.create_task(pending(), name=f"held status {uid}")

    def not_later(self, uid: str) -> None:
        """Cancel the model's pending run: a pass since held nothing back, so it would find no
        status to write."""
        pending = self._pending.pop(uid, None)
        if pending is not None:
            pending.cancel()

    def close(self) -> None:
        """Cancel every pending run (the operator is stopping)."""
        for task in self._pending.values():
            task.cancel()
        self._pending.clear()

    def forget_child(self, uid: str, child: ChildKey) -> None:
        """A child was deleted: the answer to its last apply no longer stands for it."""
        self._written.get(uid, {}).pop(child, None)

    def forget(self, uid: str) -> None:
        """Drop what is kept of a deleted model."""
        self._written.pop(uid, None)
        self._rendered.pop(uid, None)
        self._held.pop(uid, None)
        pending = self._pending.pop(uid, None)
        if pending is not None:
            pending.cancel()


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _api_reason(exc: ApiException) -> str:
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (TypeError, ValueError):
        message = None
    return str(message or exc.reason or exc.status)


def _status_dict(status: DisaggregatedModelStatus) -> dict[str, Any]:
    dumped: dict[str, Any] = status.model_dump(exclude_none=True)
    return dumped


_CHANGE_EVENTS = {
    Action.CREATE: ("Created", "created"),
    Action.UPDATE: ("Updated", "updated"),
    Action.REPAIR: ("DriftRepaired", "restored"),
}


class Reconciler:
    """Reconciles models one pass at a time per model, any number of models in parallel.

    Passes block on the API server, so they run in worker threads, in two pools of
    `kubeapi.PASS_THREADS` each: one for the passes of the spec handler (a new model's first
    pass applies all its children, the longest pass there is) and one for the passes of child
    events and reuse readings (mostly a status write). When many models arrive at once, a
    model's pod turning ready then does not wait behind the first passes of every model that
    arrived after it, which would hold each model's Ready until nearly all had been created.
    `progress_interval_s` holds back progress statuses (`Memory`); 0 writes each at once.
    """

    def __init__(
        self,
        api: KubeApi,
        metrics: OperatorMetrics | None = None,
        logger: logging.Logger | None = None,
        progress_interval_s: float = 0.0,
    ) -> None:
        self._api = api
        self._metrics = metrics or OperatorMetrics()
        self._log = logger or logging.getLogger(__name__)
        self._memory = Memory()
        self._progress_interval_s = progress_interval_s
        self._spec_threads = concurrent.futures.ThreadPoolExecutor(
            PASS_THREADS, thread_name_prefix="spec-pass"
        )
        self._event_threads = concurrent.futures.ThreadPoolExecutor(
            PASS_THREADS, thread_name_prefix="event-pass"
        )

    def close(self) -> None:
        """Cancel the pending passes and start no more (the operator is stopping); those
        running finish."""
        self._memory.close()
        for threads in (self._spec_threads, self._event_threads):
            threads.shutdown(wait=False, cancel_futures=True)

    async def _run_pass(
        self,
        threads: concurrent.futures.Executor,
        owner: Mapping[str, Any],
        live: Live,
        again: Again | None,
    ) -> Outcome:
        """One pass in one of `threads`; when it held a status back, `again()` once it is due,
        and when it held none, no pending `again()`."""
        outcome = await _in(threads, self._pass, owner, live)
        uid = owner["metadata"]["uid"]
        if outcome.status_held_s == 0:
            self._memory.not_later(uid)
        elif again is not None:
            self._memory.later(uid, outcome.status_held_s, lambda: self._again(uid, again))
        return outcome

    async def _again(self, uid: str, again: Again) -> None:
        try:
            await again()
        except Exception:
            self._log.exception("the pass writing the held status of model %s failed", uid)

    def forget(self, uid: str) -> None:
        """Drop what is remembered about a deleted model."""
        self._memory.forget(uid)
        self._metrics.forget_model(uid)

    def forget_child(self, uid: str, child: ChildKey) -> None:
        """A child was deleted: stop trusting the copy this process applied."""
        self._memory.forget_child(uid, child)

    async def reconcile(
        self, owner: Mapping[str, Any], live: Live, again: Again | None = None
    ) -> Outcome:
        """Converge one model's children and status now (in the model's turn); `again` runs
        the pass that writes a status held back."""
        return await self._memory.one_at_a_time(
            owner["metadata"]["uid"],
            lambda: self._run_pass(self._spec_threads, owner, live, again),
        )

    async def reconcile_soon(
        self,
        uid: str,
        read: Callable[[], tuple[Mapping[str, Any], Live] | None],
        again: Again | None = None,
    ) -> Outcome | None:
        """Run one pass shortly, on the state `read` returns then; None when coalesced."""

        async def run() -> Outcome | None:
            state = read()
            if state is None:
                return None
            return await self._run_pass(self._event_threads, *state, again)

        return await self._memory.soon(uid, run)

    async def report_reuse(
        self,
        uid: str,
        read: Callable[[], Mapping[str, Any] | None],
        reading: Reading,
        failures: int,
    ) -> None:
        """Write `status.reuse` after a reading of the model's routers, in the model's turn and
        only when it changed (`read`: the model as the operator sees it then, None once gone)."""

        async def write() -> None:
            watched = read()
            if watched is not None:
                await _in(self._event_threads, self._write_reuse, watched, reading, failures)

        await self._memory.one_at_a_time(uid, write)

    def _write_reuse(self, watched: Mapping[str, Any], reading: Reading, failures: int) -> None:
        meta = watched["metadata"]
        owner = self._memory.newest(meta["uid"], {key(watched): watched})[key(watched)]
        bidirectional = (owner.get("spec") or {}).get("kvTransfer", {}).get("bidirectional")
        if owner["metadata"].get("deletionTimestamp") or bidirectional is False:
            return  # a reading from before bidirectional was turned off must not bring it back
        status = DisaggregatedModelStatus.model_validate(owner.get("status") or {}, strict=False)
        reuse = next_reuse(status.reuse, reading, failures, _now())
        if reuse is None or reuse == status.reuse:
            return
        old = status.reuse.model_dump(exclude_none=True) if status.reuse is not None else {}
        self._patch_status(meta, {"reuse": _merge_patch(old, reuse.model_dump(exclude_none=True))})

    def _patch_status(self, meta: Mapping[str, Any], patch: dict[str, Any]) -> None:
        """Patch the model's status and remember what came back; a model deleted meanwhile is
        no error."""
        try:
            answer = self._api.patch_status(
                DISAGGREGATED_MODELS, meta["namespace"], meta["name"], patch
            )
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        self._memory.wrote(meta["uid"], answer)

    def _pass(self, owner: Mapping[str, Any], live: Live) -> Outcome:
        """One pass, counted and timed in the metrics."""
        started = time.monotonic()
        try:
            outcome = self._converge(owner, live)
        except Exception:
            self._metrics.pass_finished("error", time.monotonic() - started)
            raise
        self._metrics.pass_finished(outcome.result, time.monotonic() - started)
        conditions = outcome.status.conditions if outcome.status else []
        for condition in conditions:
            if condition.type == "Ready":
                self._metrics.model_ready(owner["metadata"]["uid"], condition.status)
        return outcome

    def _converge(self, watched: Mapping[str, Any], live: Live) -> Outcome:
        uid = watched["metadata"]["uid"]
        current = self._memory.newest(uid, {key(watched): watched, **live.children})
        owner = current.pop(key(watched))
        meta = owner["metadata"]
        if meta.get("deletionTimestamp"):
            return Outcome()
        previous_dict: dict[str, Any] = dict(owner.get("status") or {})
        previous = DisaggregatedModelStatus.model_validate(previous_dict, strict=False)
        generation = int(meta.get("generation") or 1)
        try:
            spec = load_spec(owner["spec"])
            desired = self._memory.rendered(owner)
        except SpecError as exc:
            problem = Problem("InvalidSpec", f"{exc}: fix the spec (the CRD is out of date?)")
            outcome = Outcome(problems=[problem])
            outcome.status = rejected_status(previous, problem, generation, _now())
            self._write_status(owner, previous_dict, outcome)
            return outcome
        keys = ensure_model_keys(self._api, owner, self._log)
        outcome = Outcome(problems=[*keys, *self._prerequisites(spec, meta["namespace"])])
        if not outcome.problems:
            replaced = self._delete_replaced(desired, current, uid, outcome)
            self._delete_unrequested(desired, current, uid, outcome)
            self._apply_all([m for m in desired if key(m) not in replaced], current, uid, outcome)
        name = meta["name"]
        # A role's workload by its name (its autoscaler shares that name).
        workload_kinds = {resource.kind for resource in ROLE_WORKLOADS}
        kinds = {key(m)[1]: key(m)[0] for m in desired if m["kind"] in workload_kinds}
        workloads = {
            role: current.get((kinds[child_name(name, role)], child_name(name, role)))
            for role in ROLES
        }
        workloads[Component.ROUTER] = current.get(
            ("Deployment", child_name(name, Component.ROUTER))
        )
        observed = Observed(
            spec=spec,
            name=name,
            namespace=meta["namespace"],
            generation=generation,
            workloads=workloads,
            pods=live.pods,
            problems=outcome.problems,
            in_sync=not outcome.problems,
            config_hash=config_hash(config_map_data(spec)) if not outcome.problems else None,
            previous=previous,
        )
        outcome.status = build_status(observed, _now())
        self._write_status(owner, previous_dict, outcome)
        return outcome

    def _prerequisites(self, spec: DisaggregatedModelSpec, namespace: str) -> list[Problem]:
        """Objects the spec names that must exist before pods can start: its Secrets."""
        problems = []
        for field_path, ref in secret_refs(spec):
            problem = self._check_secret(field_path, ref, namespace)
            if problem is not None:
                problems.append(problem)
        return problems

    def _check_secret(
        self, field_path: str, ref: SecretKeyRef | SecretRef, namespace: str
    ) -> Problem | None:
        """A problem when the Secret `field_path` names, or its key, is missing or empty."""
        try:
            secret = self._api.get(SECRETS, namespace, ref.name)
        except ApiException as exc:
            if exc.status == 403:
                self._log.warning("cannot check Secret %s/%s: %s", namespace, ref.name, exc.reason)
                return None
            raise
        return secret_problem(field_path, ref, namespace, secret)

    def _delete_replaced(
        self,
        desired: list[Manifest],
        current: dict[ChildKey, Mapping[str, Any]],
        uid: str,
        outcome: Outcome,
    ) -> set[ChildKey]:
        """Delete a role's workload of the kind it no longer takes (nodesPerReplica switched
        between 1 and more); return the workloads that must wait for it to be gone.

        The new workload takes the old one's name (and its pods' names), so it is applied
        only once the old one and its pods are gone: their deletion events start the pass
        that applies it.
        """
        waiting: set[ChildKey] = set()
        for manifest in desired:
            kind, name = key(manifest)
            for resource in _other_workloads(kind):
                old = current.get((resource.kind, name))
                if old is None or controller_uid(old) != uid:
                    continue
                waiting.add((kind, name))
                if old.get("metadata", {}).get("deletionTimestamp"):
                    continue
                namespace = manifest["metadata"]["namespace"]
                self._api.delete(resource, namespace, name, old["metadata"]["uid"])
                self._log.info("deleted %s %s (replaced by a %s)", resource.kind, name, kind)
                outcome.events.append(
                    Event(
                        "Normal",
                        "Replaced",
                        f"deleted {resource.kind} {name}: the role now runs as a {kind}",
                    )
                )
        return waiting

    def _delete_unrequested(
        self,
        desired: list[Manifest],
        current: dict[ChildKey, Mapping[str, Any]],
        uid: str,
        outcome: Outcome,
    ) -> None:
        """Delete this model's children of the kinds rendered on request (autoscalers,
        PodMonitors, the router's HTTPRoute) that the spec no longer asks for: a role's
        autoscaler left behind would fight the operator over a replica count the spec fixed
        again, or the other engine; a route left behind would keep exposing the router."""
        wanted = {key(manifest) for manifest in desired}
        kinds = {resource.kind: resource for resource in ON_REQUEST}
        for child, live in list(current.items()):
            resource = kinds.get(child[0])
            meta = live.get("metadata", {})
            if resource is None or child in wanted or controller_uid(live) != uid:
                continue
            if meta.get("deletionTimestamp"):
                continue
            self._api.delete(resource, meta["namespace"], child[1], meta["uid"])
            self._memory.forget_child(uid, child)
            current.pop(child)
            self._log.info("deleted %s %s (no longer in the spec)", *child)
            message = f"deleted {child[0]} {child[1]}: the spec no longer asks for it"
            outcome.events.append(Event("Normal", "Deleted", message))

    def _hand_over_replicas(self, resource: ApiResource, manifest: Manifest) -> None:
        """Before a role's workload is first applied without replicas (the role became
        autoscaled), move the live count to a field manager of its own while the operator's
        still owns it.

        Server-side apply resets a field its only manager stops applying: the role would
        drop to one server until its autoscaler scaled it up again. Held by the handover
        manager, the count stays; the autoscaler's first change of it takes it over.
        """
        meta = manifest["metadata"]
        live = self._api.get(resource, meta["namespace"], meta["name"])
        if live is None or not owns_replicas(live, FIELD_MANAGER):
            return
        replicas = live.get("spec", {}).get("replicas")
        handover = {
            "apiVersion": manifest["apiVersion"],
            "kind": manifest["kind"],
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "spec": {"replicas": replicas},
        }
        self._api.apply(resource, handover, field_manager=HANDOVER_MANAGER, force=False)
        self._log.info(
            "handed %s %s's replicas (%s) over", manifest["kind"], meta["name"], replicas
        )

    def _apply_all(
        self,
        desired: list[Manifest],
        current: dict[ChildKey, Mapping[str, Any]],
        uid: str,
        outcome: Outcome,
    ) -> None:
        """Apply every child that needs it; `current` and the memory get the server's answers."""
        changes: dict[Action, list[str]] = {}
        for manifest in desired:
            decision = decide(manifest, current.get(key(manifest)), uid)
            if decision.action is Action.NONE:
                continue
            if decision.action is Action.CONFLICT:
                outcome.problems.append(Problem("ChildConflict", decision.detail))
                continue
            label = f"{manifest['kind']} {manifest['metadata']['name']}"
            resource = resource_of(manifest)
            try:
                if decision.action is Action.UPDATE and _autoscaled_workload(manifest):
                    self._hand_over_replicas(resource, manifest)
                answer = self._api.apply(resource, manifest)
            except ApiException as exc:
                if exc.status not in REFUSED_STATUSES:
                    raise
                outcome.problems.append(_apply_problem(resource, label, exc))
                continue
            current[key(manifest)] = answer
            self._memory.wrote(uid, answer)
            outcome.applied += 1
            self._metrics.child_applied(manifest["kind"], decision.action)
            self._log.info("applied %s (%s)", label, decision.action)
            changes.setdefault(decision.action, []).append(_describe(label, decision))
        for action, labels in changes.items():
            reason, verb = _CHANGE_EVENTS[action]
            outcome.events.append(Event("Normal", reason, f"{verb} {', '.join(labels)}"))

    def _write_status(
        self, owner: Mapping[str, Any], previous: dict[str, Any], outcome: Outcome
    ) -> None:
        assert outcome.status is not None
        new = _status_dict(outcome.status)
        outcome.events.extend(_transition_events(previous, new))
        if new == previous:
            return
        meta = owner["metadata"]
        if self._progress_interval_s > 0 and _only_progress(previous, new):
            held_s = self._memory.hold(meta["uid"], time.monotonic(), self._progress_interval_s)
            if held_s > 0:
                outcome.status_held_s = held_s
                return
        self._memory.release(meta["uid"])
        self._log.debug("status of %s/%s: %s -> %s", meta["namespace"], meta["name"], previous, new)
        self._patch_status(meta, _merge_patch(previous, new))


async def _in(threads: concurrent.futures.Executor, call: Callable[..., _T], *args: Any) -> _T:
    """`call(*args)` in one of `threads`."""
    return await asyncio.get_running_loop().run_in_executor(threads, call, *args)


def _merge_patch(old: Mapping[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A merge patch from ``old`` to ``new``: the keys ``new`` lacks set to null."""
    return {**{k: None for k in old if k not in new}, **new}


def secret_problem(
    field_path: str,
    ref: SecretKeyRef | SecretRef,
    namespace: str,
    secret: Mapping[str, Any] | None,
) -> Problem | None:
    """What keeps pods from reading ``ref`` from ``secret`` (None: the Secret is missing).

    A ``SecretRef`` names a whole Secret (every key one client key): it needs a non-empty key.
    """
    literal = f"{ref.key}=<value>" if isinstance(ref, SecretKeyRef) else "<tenant>=<key>"
    if secret is None:
        return Problem(
            "SecretNotFound",
            f"Secret {ref.name} named by {field_path} does not exist in namespace "
            f"{namespace}: create it (kubectl -n {namespace} create secret generic "
            f"{ref.name} --from-literal={literal})",
        )
    data = secret.get("data") or {}
    if isinstance(ref, SecretRef):
        if any(data.values()):
            return None
        return Problem(
            "SecretKeyNotFound",
            f"Secret {ref.name} named by {field_path} holds no key: add one per tenant ({literal})",
        )
    if ref.key not in data:
        return Problem(
            "SecretKeyNotFound",
            f"Secret {ref.name} has no key {ref.key!r} ({field_path}.key): "
            "add it or change the key",
        )
    if not data[ref.key]:
        return Problem(
            "SecretKeyEmpty",
            f"Secret {ref.name} key {ref.key!r} ({field_path}.key) is empty: put the value in it",
        )
    return None


def secret_refs(spec: DisaggregatedModelSpec) -> list[tuple[str, SecretKeyRef | SecretRef]]:
    """The Secrets (or Secret keys) pods read, by the spec field that names them."""
    refs: list[tuple[str, SecretKeyRef | SecretRef | None]] = [
        ("spec.model.tokenSecret", spec.model.token_secret)
    ]
    if spec.model.s3 is not None and spec.model.s3.credentials_secret is not None:
        refs += [(S3_CREDENTIALS_FIELD, ref) for ref in spec.model.s3.credentials_secret.key_refs]
    if spec.auth is not None:
        refs.append(("spec.auth.apiKeySecret", spec.auth.api_key_secret))
        refs.append(("spec.auth.clientKeysSecret", spec.auth.client_keys_secret))
    return [(field_path, ref) for field_path, ref in refs if ref is not None]


def _autoscaled_workload(manifest: Manifest) -> bool:
    """A role's workload rendered without replicas: its autoscaler owns them."""
    kinds = {resource.kind for resource in ROLE_WORKLOADS}
    return manifest["kind"] in kinds and "replicas" not in manifest["spec"]


def _apply_problem(resource: ApiResource, label: str, exc: ApiException) -> Problem:
    """Why applying a child failed; a kind the cluster does not serve says what installs it."""
    if exc.status == 404 and resource.provided_by:
        crd = f"{resource.plural}.{resource.group}"
        return Problem(
            "KindNotInstalled",
            f"cannot apply {label}: the cluster has no {resource.kind} (CRD {crd}): install "
            f"{resource.provided_by}, {WITHOUT_KIND.get(resource.kind, 'or change the spec')}",
        )
    return Problem("ApplyFailed", f"applying {label} failed: {_api_reason(exc)}")


def _other_workloads(kind: str) -> list[ApiResource]:
    """The other kinds a role's workload of `kind` replaces (none for other children)."""
    kinds = [resource.kind for resource in ROLE_WORKLOADS]
    return [resource for resource in ROLE_WORKLOADS if kind in kinds and resource.kind != kind]


def _resource_version(obj: Mapping[str, Any]) -> int:
    """An object's resourceVersion as a number (etcd revisions grow), 0 when not numeric."""
    value = str(obj.get("metadata", {}).get("resourceVersion", ""))
    return int(value) if value.isdigit() else 0


def _describe(label: str, decision: Decision) -> str:
    return f"{label} ({decision.detail})" if decision.detail else label


def _condition_map(status: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


def _only_progress(previous: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether a model's new status only says how far its rollout has come: neither Ready nor
    Degraded in either, and no other generation observed than before (if any was)."""
    before, after = _condition_map(previous), _condition_map(new)
    flagged = any(
        conditions.get(type_, {}).get("status") == "True"
        for conditions in (before, after)
        for type_ in ("Ready", "Degraded")
    )
    seen = previous.get("observedGeneration")
    return not flagged and seen in (None, new.get("observedGeneration"))


def _transition_events(previous: Mapping[str, Any], new: Mapping[str, Any]) -> list[Event]:
    """Events for Ready turning true and Degraded turning true (or changing its reason)."""
    before, after = _condition_map(previous), _condition_map(new)
    events = []
    degraded = after.get("Degraded", {})
    was = before.get("Degraded", {})
    if degraded.get("status") == "True" and (
        was.get("status") != "True" or was.get("reason") != degraded.get("reason")
    ):
        events.append(Event("Warning", str(degraded["reason"]), str(degraded.get("message"))))
    ready = after.get("Ready", {})
    if ready.get("status") == "True" and before.get("Ready", {}).get("status") != "True":
        events.append(Event("Normal", "Ready", str(ready.get("message"))))
    return events
