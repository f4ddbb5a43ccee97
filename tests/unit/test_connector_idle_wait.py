"""Idle-step waiting on the engine's input queue, NIXL progress pacing settings, and the
worker thread's cores kept while vLLM builds its NIXL worker."""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import types

import pytest

from disagg_connector.cpu_affinity import kept_cpu_affinity
from disagg_connector.idle_wait import EngineInputWaiter, find_engine_core
from disagg_connector.nixl_pacing import paced_progress_thread, progress_delay_from_env
from disagg_contract import IDLE_STEP_WAIT_ENV, NIXL_PROGRESS_DELAY_ENV


class FakeEngineCore:
    """Holds an input queue and builds its scheduler inside ``__init__``, like vLLM's."""

    def __init__(self) -> None:
        self.input_queue: queue.Queue[object] = queue.Queue()
        self.waiter = EngineInputWaiter.from_env()
        self.found = find_engine_core()


def test_waiter_times_out_without_input() -> None:
    waiter = EngineInputWaiter(queue.Queue(), 0.2)
    started = time.monotonic()
    waiter.wait()
    assert 0.15 <= time.monotonic() - started < 2


def test_waiter_wakes_as_soon_as_input_arrives() -> None:
    inputs: queue.Queue[object] = queue.Queue()
    waiter = EngineInputWaiter(inputs, 30)
    threading.Timer(0.1, inputs.put, args=("request",)).start()
    started = time.monotonic()
    waiter.wait()
    assert time.monotonic() - started < 5


def test_waiter_wakes_when_woken_and_waits_no_longer_than_asked() -> None:
    waiter = EngineInputWaiter(queue.Queue(), 30)
    threading.Timer(0.1, waiter.wake).start()
    started = time.monotonic()
    waiter.wait()
    assert time.monotonic() - started < 5
    started = time.monotonic()
    waiter.wait(0.1)
    assert time.monotonic() - started < 5


def test_waiter_does_not_wait_when_input_is_queued() -> None:
    inputs: queue.Queue[object] = queue.Queue()
    inputs.put("request")
    started = time.monotonic()
    EngineInputWaiter(inputs, 30).wait()
    assert time.monotonic() - started < 1


def test_from_env_finds_the_engine_queue_on_the_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(IDLE_STEP_WAIT_ENV, "250")
    engine = FakeEngineCore()
    assert engine.waiter is not None
    assert engine.waiter.timeout_s == 0.25


def test_the_engine_core_constructing_the_caller_is_found_on_the_stack() -> None:
    engine = FakeEngineCore()
    assert engine.found is engine, "the connector reads its shutdown state from it"
    assert find_engine_core() is None


def test_from_env_is_off_by_default_and_without_an_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(IDLE_STEP_WAIT_ENV, raising=False)
    assert FakeEngineCore().waiter is None
    monkeypatch.setenv(IDLE_STEP_WAIT_ENV, "250")
    assert EngineInputWaiter.from_env() is None


@pytest.mark.parametrize(("raw", "expected"), [(None, 0), ("", 0), ("1000", 1000), (" 0 ", 0)])
def test_progress_delay_from_env(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, expected: int
) -> None:
    if raw is None:
        monkeypatch.delenv(NIXL_PROGRESS_DELAY_ENV, raising=False)
    else:
        monkeypatch.setenv(NIXL_PROGRESS_DELAY_ENV, raw)
    assert progress_delay_from_env() == expected


@pytest.mark.parametrize("raw", ["fast", "-5"])
def test_bad_progress_delay_names_the_variable(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(NIXL_PROGRESS_DELAY_ENV, raw)
    with pytest.raises(ValueError, match=NIXL_PROGRESS_DELAY_ENV):
        progress_delay_from_env()


class AgentConfig:
    pthrDelay = 0


def test_pacing_sets_the_delay_only_inside_the_block(monkeypatch: pytest.MonkeyPatch) -> None:
    bindings = types.SimpleNamespace(
        nixlAgent=lambda name, config: (name, config.pthrDelay), nixlAgentConfig=AgentConfig
    )
    module = types.ModuleType("fake_nixl_api")
    module.nixlBind = bindings  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_nixl_api", module)
    agent_class = type("nixl_agent", (), {"__module__": "fake_nixl_api"})

    with paced_progress_thread(agent_class, 1000):
        assert module.nixlBind.nixlAgent("a", AgentConfig()) == ("a", 1000)
        assert module.nixlBind.nixlAgentConfig is AgentConfig
    assert module.nixlBind is bindings
    with paced_progress_thread(agent_class, 0):
        assert module.nixlBind is bindings


def _affinity_after_block(fail: bool) -> tuple[set[int], set[int], set[int]]:
    """On a thread of its own: its cores before, inside (pinned to one, as vLLM's NIXL worker
    does) and after a kept_cpu_affinity block, which raises when ``fail``."""
    seen: list[set[int]] = []

    def run() -> None:
        seen.append(os.sched_getaffinity(0))
        try:
            with kept_cpu_affinity():
                os.sched_setaffinity(0, {max(seen[0])})
                seen.append(os.sched_getaffinity(0))
                if fail:
                    raise RuntimeError("the worker failed to build")
        except RuntimeError:
            pass
        seen.append(os.sched_getaffinity(0))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    return seen[0], seen[1], seen[2]


@pytest.mark.parametrize("fail", [False, True])
def test_the_thread_keeps_its_cores_after_the_worker_is_built(fail: bool) -> None:
    before, inside, after = _affinity_after_block(fail)
    assert len(before) >= 2, f"needs two cores to see the pin: {before}"
    assert inside == {max(before)}
    assert after == before
