"""Let an idle engine that only holds retained KV blocks wait for input instead of spinning.

While a finished request's blocks are retained (decode keeping a turn for D->P reads, or
prefill waiting for decode's read), vLLM keeps stepping its engine and its worker busy-polls
the step queue, keeping a core busy while nothing happens (the README's "Small machines" has
the figures). With ``DISAGG_IDLE_STEP_WAIT_MS`` set, the scheduler-side connector makes such
an idle step wait up to that long on the engine's input queue, waking at once when a request
arrives. Freeing blocks (read notifications, TTL expiry) is then noticed up to that much later;
nothing else changes. Decode's leases cut the wait short: it ends at the next lease deadline,
and the lease service wakes it when the router releases a retention.
"""

from __future__ import annotations

import inspect
import os
import queue
from typing import Any

from disagg_contract import IDLE_STEP_WAIT_ENV


class EngineInputWaiter:
    """Waits until the engine's input queue is non-empty or a timeout passes."""

    def __init__(self, input_queue: queue.Queue[Any], timeout_s: float) -> None:
        self._queue = input_queue
        self.timeout_s = timeout_s

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until input arrives, :meth:`wake` is called or the timeout passes.

        ``timeout_s``: a shorter timeout for this wait (never a longer one).
        """
        limit = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        with self._queue.not_empty:
            if not self._queue.queue and limit > 0:
                self._queue.not_empty.wait(limit)

    def wake(self) -> None:
        """End a wait in progress (from another thread): something besides input needs a step."""
        with self._queue.not_empty:
            self._queue.not_empty.notify_all()

    @classmethod
    def from_env(cls) -> EngineInputWaiter | None:
        """Build a waiter on the calling engine's input queue when the env var asks for one.

        Must run while vLLM's engine core is constructing its scheduler: the engine core
        object is found on the call stack. Returns None when disabled or not found.
        """
        wait_ms = float(os.environ.get(IDLE_STEP_WAIT_ENV, "0") or 0)
        if wait_ms <= 0:
            return None
        core = find_engine_core()
        if core is None:
            return None
        return cls(core.input_queue, wait_ms / 1000.0)


def find_engine_core() -> Any | None:
    """The vLLM engine core (``EngineCoreProc``) constructing the caller, found on the call
    stack as the object whose ``input_queue`` is a queue; None outside an engine core."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            owner = frame.f_locals.get("self")
            if isinstance(getattr(owner, "input_queue", None), queue.Queue):
                return owner
            frame = frame.f_back
        return None
    finally:
        del frame
