"""The DisaggregatedModel's status from what the cluster shows (pure; no API calls).

Conditions follow the Kubernetes conventions: `Ready`, `Progressing`, `Degraded` and one per
role (`PrefillReady`, `DecodeReady`, `RouterReady`); each reason is one CamelCase word and each
message says what is wrong and, where the operator knows, what to do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from disagg_contract import WEIGHTS_UNAVAILABLE
from disagg_operator.models import (
    AutoscalingSpec,
    Condition,
    ConditionType,
    DisaggregatedModelSpec,
    DisaggregatedModelStatus,
)
from disagg_operator.names import Component

ROLE_CONDITIONS: dict[Component, ConditionType] = {
    Component.PREFILL: "PrefillReady",
    Component.DECODE: "DecodeReady",
    Component.ROUTER: "RouterReady",
}
FAILING_WAIT_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "RunContainerError",
    }
)
"""Container waiting reasons that need a person (the pod will not get better by itself)."""
POD_FAILING = "PodFailing"
WEIGHTS_MESSAGE_PREFIX = f"{WEIGHTS_UNAVAILABLE}: "
"""How a server's termination message starts when it could not read its weights' source
(``disagg serve``'s check): the rest names the spec field to fix."""


@dataclass(frozen=True)
class Problem:
    """Something that keeps the model from being realized; `reason` is the condition reason."""

    reason: str
    message: str


@dataclass(frozen=True)
class PodState:
    """What status needs from one pod."""

    name: str
    component: str
    ready: bool
    detail: str = ""
    failing: bool = False
    ip: str = ""
    """The pod's IP (`status.podIP`), where the operator reads a router's reuse summary."""
    reason: str = POD_FAILING
    """The condition reason when the pod is failing."""


def _weights_message(container: Mapping[str, Any]) -> str | None:
    """The field-naming reason a server gave for not reading its weights, from its current or
    last termination (a crash-looping server is waiting between the two)."""
    for state in ("state", "lastState"):
        terminated = (container.get(state) or {}).get("terminated") or {}
        message = str(terminated.get("message") or "").strip()
        if message.startswith(WEIGHTS_MESSAGE_PREFIX):
            return message.removeprefix(WEIGHTS_MESSAGE_PREFIX)
    return None


def pod_state(pod: Mapping[str, Any], component: str) -> PodState:
    """Summarise a pod: ready or not, and the most useful reason when not."""
    name = pod["metadata"]["name"]
    status = pod.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return PodState(name, component, ready=False, detail="terminating")
    ready = conditions.get("Ready", {}).get("status") == "True"
    ip = str(status.get("podIP") or "")
    scheduled = conditions.get("PodScheduled", {})
    if scheduled.get("status") == "False":
        message = scheduled.get("message") or scheduled.get("reason") or "not scheduled"
        return PodState(name, component, ready, f"unschedulable: {message}", ip=ip)
    for container in status.get("containerStatuses") or []:
        weights = _weights_message(container)
        if weights is not None and not ready:
            return PodState(name, component, ready, weights, True, ip, WEIGHTS_UNAVAILABLE)
        waiting = (container.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            reason = waiting["reason"]
            detail = f"{reason}: {waiting.get('message', '')}".rstrip(": ")
            return PodState(name, component, ready, detail, reason in FAILING_WAIT_REASONS, ip)
    detail = "" if ready else f"phase {status.get('phase')}"
    return PodState(name, component, ready, detail, ip=ip)


@dataclass(frozen=True)
class Observed:
    """Everything status is built from."""

    spec: DisaggregatedModelSpec
    name: str
    namespace: str
    generation: int
    workloads: Mapping[Component, Mapping[str, Any] | None]
    pods: Sequence[PodState] = ()
    problems: Sequence[Problem] = ()
    in_sync: bool = False
    """Every child was applied as the current generation wants."""
    config_hash: str | None = None
    previous: DisaggregatedModelStatus = field(default_factory=DisaggregatedModelStatus)


@dataclass(frozen=True)
class _RoleView:
    desired: int
    ready: int
    ok: bool
    reason: str
    message: str


def _autoscaling(spec: DisaggregatedModelSpec, component: Component) -> AutoscalingSpec | None:
    if component is Component.ROUTER:
        return None
    return (spec.prefill if component is Component.PREFILL else spec.decode).autoscaling


def _desired_replicas(
    spec: DisaggregatedModelSpec, component: Component, workload: Mapping[str, Any] | None
) -> int:
    """The replicas a component should have: the spec's, or for an autoscaled role what its
    autoscaler last set on the workload (its minReplicas before the workload exists)."""
    if component is Component.ROUTER:
        return spec.router.replicas
    role = spec.prefill if component is Component.PREFILL else spec.decode
    if role.fixed_replicas is not None:
        return role.fixed_replicas
    assert role.autoscaling is not None
    live = (workload or {}).get("spec", {}).get("replicas")
    return int(live) if live is not None else role.autoscaling.min_replicas


def _role_view(observed: Observed, component: Component) -> _RoleView:
    workload = observed.workloads.get(component)
    desired = _desired_replicas(observed.spec, component, workload)
    if workload is None:
        return _RoleView(desired, 0, False, "NotCreated", f"{component}: workload not created yet")
    kind = workload.get("kind", "workload")
    status = workload.get("status") or {}
    ready = int(status.get("readyReplicas") or 0)
    updated = int(status.get("updatedReplicas") or 0)
    seen = int(status.get("observedGeneration") or 0)
    generation = int(workload.get("metadata", {}).get("generation") or 0)
    if seen < generation:
        return _RoleView(
            desired, ready, False, "RolloutPending", f"{kind} change not yet seen by its controller"
        )
    autoscaling = _autoscaling(observed.spec, component)
    if autoscaling is not None:
        # Serving while its autoscaler adds or removes servers: every server at the current
        # template, and at least as many ready as the autoscaler may go down to.
        floor = min(autoscaling.min_replicas, desired)
        if ready >= floor and updated >= desired:
            message = f"{ready}/{desired} ready (autoscaled, {floor} needed)"
            return _RoleView(desired, ready, True, "AutoscaledReplicasReady", message)
    elif ready >= desired and updated >= desired and int(status.get("replicas") or 0) == desired:
        return _RoleView(desired, ready, True, "AllReplicasReady", f"{ready}/{desired} ready")
    waiting = [p for p in observed.pods if p.component == component and not p.ready]
    why = f"; pod {waiting[0].name}: {waiting[0].detail}" if waiting else ""
    return _RoleView(
        desired,
        ready,
        False,
        "ReplicasNotReady",
        f"{ready}/{desired} ready, {updated}/{desired} updated{why}",
    )


def _condition(
    previous: DisaggregatedModelStatus,
    type_: ConditionType,
    ok: bool,
    reason: str,
    message: str,
    generation: int,
    now: str,
) -> Condition:
    status: Literal["True", "False"] = "True" if ok else "False"
    before = next((c for c in previous.conditions if c.type == type_), None)
    changed = before is None or before.status != status
    since = now if changed or before is None else before.last_transition_time
    return Condition.model_validate(
        {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message[:32768],
            "lastTransitionTime": since,
            "observedGeneration": generation,
        }
    )


def router_endpoint(spec: DisaggregatedModelSpec, name: str, namespace: str) -> str:
    """The in-cluster URL clients call."""
    return f"http://{name}-{Component.ROUTER}.{namespace}.svc:{spec.router.port}"


def _problems(observed: Observed) -> list[Problem]:
    failing = [p for p in observed.pods if p.failing]
    return [
        *observed.problems,
        *(Problem(p.reason, f"pod {p.name}: {p.detail}") for p in failing[:3]),
    ]


def _join(parts: Iterable[str]) -> str:
    return "; ".join(parts)


def build_status(observed: Observed, now: str) -> DisaggregatedModelStatus:
    """The status the operator writes for `observed` (`now`: RFC 3339 time of this pass).

    `reuse` is the reuse poll's (:mod:`disagg_operator.reuse`): kept as it was, and dropped
    once bidirectional is off (nothing is retained, so there is no reuse to report).
    """
    gen = observed.generation
    prev = observed.previous
    views = {component: _role_view(observed, component) for component in ROLE_CONDITIONS}
    problems = _problems(observed)
    generation_done = observed.in_sync and not observed.problems
    observed_generation = gen if generation_done else prev.observed_generation
    roles_ok = all(view.ok for view in views.values())
    ready = roles_ok and not problems and observed_generation == gen
    not_ready = [f"{component}: {view.message}" for component, view in views.items() if not view.ok]
    conditions = [
        _condition(prev, ROLE_CONDITIONS[c], v.ok, v.reason, v.message, gen, now)
        for c, v in views.items()
    ]
    if problems:
        degraded = _condition(
            prev, "Degraded", True, problems[0].reason, _join(p.message for p in problems), gen, now
        )
    else:
        degraded = _condition(prev, "Degraded", False, "AsExpected", "", gen, now)
    if ready:
        summary = ", ".join(f"{c} {v.ready}/{v.desired}" for c, v in views.items())
        endpoint = router_endpoint(observed.spec, observed.name, observed.namespace)
        ready_condition = _condition(
            prev,
            "Ready",
            True,
            "AllRolesReady",
            f"{summary} ready; serving at {endpoint}",
            gen,
            now,
        )
        progressing = _condition(
            prev, "Progressing", False, "Complete", f"generation {gen} rolled out", gen, now
        )
    elif observed.problems:
        blocked = _join(p.message for p in observed.problems)
        ready_condition = _condition(
            prev, "Ready", False, observed.problems[0].reason, blocked, gen, now
        )
        progressing = _condition(
            prev, "Progressing", False, "Blocked", f"retrying until fixed: {blocked}", gen, now
        )
    else:
        reason = problems[0].reason if problems else "RolloutInProgress"
        message = _join([*(p.message for p in problems), *not_ready]) or "applying children"
        ready_condition = _condition(prev, "Ready", False, reason, message, gen, now)
        progressing = _condition(prev, "Progressing", True, "RollingOut", message, gen, now)
    status = {
        "observedGeneration": observed_generation,
        "conditions": [ready_condition, progressing, degraded, *conditions],
        **{
            str(component): {"desiredReplicas": view.desired, "readyReplicas": view.ready}
            for component, view in views.items()
        },
        "routerEndpoint": router_endpoint(observed.spec, observed.name, observed.namespace),
        "connectorConfigHash": observed.config_hash or prev.connector_config_hash,
        "reuse": prev.reuse if observed.spec.kv_transfer.bidirectional else None,
    }
    return DisaggregatedModelStatus.model_validate(
        {k: v for k, v in status.items() if v is not None}
    )


def rejected_status(
    previous: DisaggregatedModelStatus, problem: Problem, generation: int, now: str
) -> DisaggregatedModelStatus:
    """Status for a spec the operator cannot even render (the CRD should have refused it)."""
    conditions = [
        _condition(previous, "Ready", False, problem.reason, problem.message, generation, now),
        _condition(previous, "Progressing", False, "Blocked", problem.message, generation, now),
        _condition(previous, "Degraded", True, problem.reason, problem.message, generation, now),
    ]
    kept = [c for c in previous.conditions if c.type in ROLE_CONDITIONS.values()]
    return previous.model_copy(update={"conditions": [*conditions, *kept]})
