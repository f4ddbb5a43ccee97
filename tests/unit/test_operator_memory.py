"""What the reconciler keeps between passes (`reconcile.Memory`), and the kopf indexes the
handlers take as named arguments."""

from __future__ import annotations

import asyncio
import copy
import inspect
import threading
from collections.abc import Mapping
from typing import Any, cast

import kopf
import pytest

from api_standin import StoreStandIn
from disagg_operator import handlers, reconcile
from disagg_operator.children import key
from disagg_operator.kubeapi import KubeApi
from disagg_operator.models import PLURAL
from disagg_operator.reconcile import Live, Memory, Reconciler
from disagg_operator.resources import CHILD_RESOURCES, ApiResource
from dmodel_samples import minimal_spec

OWNER = {
    "apiVersion": "disagg.dev/v1alpha1",
    "kind": "DisaggregatedModel",
    "metadata": {"name": "m", "namespace": "ml", "uid": "u-1", "resourceVersion": "1"},
    "spec": minimal_spec(),
}


class FakeApi(StoreStandIn):
    """An API server that stores what it is sent, numbering versions as etcd does."""

    def __init__(self, owner: Mapping[str, Any]) -> None:
        super().__init__()
        self.objects[key(owner)] = copy.deepcopy(dict(owner))
        self.writes: list[tuple[str, str]] = []

    def apply(self, resource: ApiResource, manifest: dict[str, Any]) -> dict[str, Any]:
        self.writes.append(("apply", f"{manifest['kind']}/{manifest['metadata']['name']}"))
        return self._store(copy.deepcopy(manifest))

    def patch_status(
        self, resource: ApiResource, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        self.writes.append(("status", name))
        owner = copy.deepcopy(self.objects[("DisaggregatedModel", name)])
        merged = {**owner.get("status", {}), **status}
        owner["status"] = {k: v for k, v in merged.items() if v is not None}
        return self._store(owner)

    def get(self, resource: ApiResource, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.objects.get((resource.kind, name))
        return copy.deepcopy(found) if found is not None else None

    def request(self, method: str, path: str, *, body: dict[str, Any]) -> dict[str, Any]:
        """A create (the generated keys are POSTed when absent)."""
        assert method == "POST", method
        self.writes.append(("create", f"{body['kind']}/{body['metadata']['name']}"))
        return self._store(copy.deepcopy(body))

    def stored(self) -> dict[tuple[str, str], dict[str, Any]]:
        """A copy of every object, as a watch that has caught up shows them."""
        return copy.deepcopy(self.objects)


def _reconciler(api: FakeApi) -> Reconciler:
    return Reconciler(cast(KubeApi, api))


def test_a_pass_before_the_watch_shows_its_writes_writes_nothing_again() -> None:
    api = FakeApi(OWNER)
    reconciler = _reconciler(api)
    first = asyncio.run(reconciler.reconcile(OWNER, Live(children={})))
    assert first.applied == len(reconcile.desired_children(OWNER))
    assert api.writes.count(("status", "m")) == 1

    # The same view again: the watch has delivered none of those writes yet.
    api.writes.clear()
    again = asyncio.run(reconciler.reconcile(OWNER, Live(children={})))
    assert api.writes == [] and again.applied == 0 and again.events == []

    # The watch shows the children, not yet the status: still nothing to write.
    stored = api.stored()
    owner = stored.pop(key(OWNER))
    asyncio.run(reconciler.reconcile(OWNER, Live(children=stored)))
    assert api.writes == []

    # The watch has caught up: its copies replace the answers kept, and nothing is written.
    caught_up = asyncio.run(reconciler.reconcile(owner, Live(children=stored)))
    assert api.writes == [] and caught_up.applied == 0


def test_a_child_deleted_before_the_watch_showed_it_is_created_again() -> None:
    api = FakeApi(OWNER)
    reconciler = _reconciler(api)
    asyncio.run(reconciler.reconcile(OWNER, Live(children={})))
    api.writes.clear()
    reconciler.forget_child("u-1", ("Service", "m-decode"))
    asyncio.run(reconciler.reconcile(OWNER, Live(children={})))
    assert api.writes == [("apply", "Service/m-decode")]


def test_a_watched_copy_as_new_as_the_answer_replaces_it() -> None:
    memory = Memory()
    child = ("ConfigMap", "m-connector")

    def config_map(version: str) -> dict[str, Any]:
        return {
            "kind": "ConfigMap",
            "metadata": {"name": "m-connector", "resourceVersion": version},
        }

    answer = config_map("5")
    memory.wrote("u-1", answer)
    assert memory.newest("u-1", {child: config_map("4")})[child] is answer
    assert memory.newest("u-1", {})[child] is answer
    same = config_map("5")
    assert memory.newest("u-1", {child: same})[child] is same
    assert memory.newest("u-1", {}) == {}  # the answer was dropped once the watch caught up


def test_children_are_rendered_again_only_when_the_spec_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    renders: list[str] = []

    def counting(owner: Mapping[str, Any]) -> list[dict[str, Any]]:
        renders.append(owner["spec"]["model"]["name"])
        return [{"kind": "ConfigMap", "metadata": {"name": "x"}}]

    monkeypatch.setattr(reconcile, "desired_children", counting)
    memory = Memory()
    owner = copy.deepcopy(OWNER)
    memory.rendered(owner)
    owner["metadata"]["resourceVersion"] = "2"  # status writes change the version, not the spec
    memory.rendered(owner)
    assert renders == ["Qwen/Qwen3-0.6B"]
    owner["spec"]["model"]["name"] = "Qwen/Qwen3-8B"
    memory.rendered(owner)
    memory.forget("u-1")
    memory.rendered(owner)
    assert renders == ["Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B", "Qwen/Qwen3-8B"]


def test_calls_while_one_waits_share_its_run_and_later_ones_get_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reconcile, "COALESCE_DELAY_S", 0.05)
    memory = Memory()
    runs: list[int] = []
    later: list[asyncio.Future[int | None]] = []

    async def run() -> int:
        runs.append(len(runs))
        if len(runs) == 1:  # an event while the run is under way: it must not be lost
            later.append(asyncio.ensure_future(memory.soon("u-1", run)))
        await asyncio.sleep(0.01)
        return len(runs)

    async def scenario() -> tuple[list[int | None], int | None]:
        burst = await asyncio.gather(*(memory.soon("u-1", run) for _ in range(5)))
        return burst, await later[0]

    burst, second = asyncio.run(scenario())
    assert sorted(burst, key=str) == [1, None, None, None, None]
    assert second == 2 and runs == [0, 1]


def test_passes_of_one_model_never_overlap_and_of_two_models_do() -> None:
    memory = Memory()
    running: dict[str, int] = {"a": 0, "b": 0}
    most: dict[str, int] = {"a": 0, "b": 0}
    both = asyncio.Event()

    async def run(uid: str) -> None:
        running[uid] += 1
        most[uid] = max(most[uid], running[uid])
        if running["a"] and running["b"]:
            both.set()
        await asyncio.sleep(0.02)
        running[uid] -= 1

    async def scenario() -> None:
        await asyncio.gather(
            *(memory.one_at_a_time(uid, lambda uid=uid: run(uid)) for uid in "aabb")
        )

    asyncio.run(scenario())
    assert most == {"a": 1, "b": 1} and both.is_set()


class HeldApi(FakeApi):
    """A FakeApi whose applies to one model's children wait until `release` is set."""

    def __init__(self, owners: list[Mapping[str, Any]], held: str) -> None:
        super().__init__(owners[0])
        for owner in owners[1:]:
            self.objects[key(owner)] = copy.deepcopy(dict(owner))
        self.held = held
        self.release = threading.Event()

    def apply(self, resource: ApiResource, manifest: dict[str, Any]) -> dict[str, Any]:
        if manifest["metadata"]["labels"].get("app.kubernetes.io/instance") == self.held:
            assert self.release.wait(timeout=10)
        return super().apply(resource, manifest)


def test_event_passes_do_not_wait_behind_spec_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every spec-pass thread busy on a first pass, a child event's pass of another model
    still runs: it has threads of its own."""
    monkeypatch.setattr(reconcile, "PASS_THREADS", 1)
    other = copy.deepcopy(OWNER)
    other["metadata"].update(name="n", uid="u-2")
    api = HeldApi([OWNER, other], held="m")
    reconciler = _reconciler(api)

    async def scenario() -> tuple[reconcile.Outcome | None, bool]:
        first = asyncio.create_task(reconciler.reconcile(OWNER, Live(children={})))
        await asyncio.sleep(0.1)
        event = reconciler.reconcile_soon("u-2", lambda: (other, Live(children={})))
        outcome = await asyncio.wait_for(event, timeout=5)
        held = not first.done()
        api.release.set()
        await first
        return outcome, held

    try:
        outcome, held = asyncio.run(scenario())
    finally:
        api.release.set()
        reconciler.close()
    assert held and outcome is not None and outcome.applied


def test_a_pass_that_holds_nothing_back_cancels_the_pending_one() -> None:
    """A held status's pending pass is not run once a later pass wrote the status (Ready)."""
    api = FakeApi(OWNER)
    reconciler = Reconciler(cast(KubeApi, api), progress_interval_s=0.2)
    again_runs: list[int] = []

    async def again() -> None:
        again_runs.append(1)

    async def scenario() -> reconcile.Outcome:
        first = await reconciler.reconcile(OWNER, Live(children={}), again)
        assert first.status_held_s > 0
        stored = api.stored()
        owner = stored.pop(key(OWNER))
        _rolled_out(stored)
        ready = await reconciler.reconcile(owner, Live(children=stored), again)
        await asyncio.sleep(0.3)
        return ready

    ready = asyncio.run(scenario())
    assert ready.status_held_s == 0 and api.writes.count(("status", "m")) == 1
    assert again_runs == []


def _index_plurals() -> dict[str, set[str]]:
    plurals: dict[str, set[str]] = {}
    for handler in kopf.get_default_registry()._indexing.get_all_handlers():
        assert handler.selector is not None
        plurals.setdefault(handler.id, set()).add(str(handler.selector.any_name))
    return plurals


def test_three_indexes_one_over_every_child_kind() -> None:
    assert _index_plurals() == {
        "models_index": {PLURAL},
        "children_index": {r.plural for r in CHILD_RESOURCES},
        "pods_index": {"pods"},
    }


@pytest.mark.parametrize(
    ("handler", "indexes"),
    [
        (handlers.reconcile, {"models_index", "children_index", "pods_index"}),
        (handlers.child_changed, {"models_index", "children_index", "pods_index"}),
    ],
)
def test_handlers_take_the_indexes_they_read_as_named_arguments(
    handler: Any, indexes: set[str]
) -> None:
    parameters = inspect.signature(handler).parameters
    assert {name for name in parameters if name.endswith("_index")} == indexes
    assert indexes <= set(_index_plurals())


def _rolled_out(children: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Every workload of `children` with all its replicas ready at its generation."""
    for (kind, _), child in children.items():
        if kind in ("StatefulSet", "Deployment"):
            replicas = child["spec"].get("replicas", 1)
            child["metadata"]["generation"] = 1
            child["status"] = {
                "observedGeneration": 1,
                "replicas": replicas,
                "readyReplicas": replicas,
                "updatedReplicas": replicas,
            }


def test_progress_is_held_back_for_one_interval_and_ready_is_written_at_once() -> None:
    api = FakeApi(OWNER)
    reconciler = Reconciler(cast(KubeApi, api), progress_interval_s=0.2)
    statuses: list[dict[str, Any]] = []

    def view() -> tuple[dict[str, Any], Live]:
        stored = api.stored()
        return stored.pop(key(OWNER)), Live(children=stored)

    async def again() -> None:
        outcome = await reconciler.reconcile(*view())
        statuses.append(api.objects[key(OWNER)].get("status", {}))
        assert outcome.status_held_s == 0

    async def scenario() -> None:
        first = await reconciler.reconcile(OWNER, Live(children={}), again)
        assert first.applied and first.status_held_s == pytest.approx(0.2)
        assert ("status", "m") not in api.writes  # coming up: nothing but progress to say
        held = await reconciler.reconcile(*view(), again)
        assert 0 < held.status_held_s < first.status_held_s  # the same interval runs on
        await asyncio.sleep(0.3)

    asyncio.run(scenario())
    assert api.writes.count(("status", "m")) == 1 and len(statuses) == 1  # one pending pass
    assert statuses[0]["observedGeneration"] == 1

    owner, live = view()
    _rolled_out(cast(dict[tuple[str, str], dict[str, Any]], live.children))
    ready = asyncio.run(reconciler.reconcile(owner, live))
    assert ready.status_held_s == 0 and api.writes.count(("status", "m")) == 2
    assert [e.reason for e in ready.events] == ["Ready"]
