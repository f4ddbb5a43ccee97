"""Pace NIXL's progress thread instead of letting it spin a core.

NIXL's Python agent hard-codes a progress-thread delay of 0 us, so the thread busy-loops.
With ``DISAGG_NIXL_PROGRESS_DELAY_US`` set, the connector builds its NIXL agent with that
delay, long enough to stop the spin and short enough to keep transfers progressing (the
README's "Small machines" has the value the engine tests run with). The change is scoped to
the construction of our worker's agent; NIXL's module is restored right after.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from disagg_contract import NIXL_PROGRESS_DELAY_ENV


def progress_delay_from_env() -> int:
    """The requested progress-thread delay in microseconds (0: NIXL's default spin)."""
    raw = os.environ.get(NIXL_PROGRESS_DELAY_ENV, "").strip()
    if not raw:
        return 0
    try:
        delay = int(raw)
    except ValueError as exc:
        raise ValueError(
            f"{NIXL_PROGRESS_DELAY_ENV}={raw!r} is not an integer number of microseconds"
        ) from exc
    if delay < 0:
        raise ValueError(f"{NIXL_PROGRESS_DELAY_ENV}={delay} must be >= 0")
    return delay


class _PacedBindings:
    """NIXL's bindings module with ``nixlAgent`` creating agents with a progress delay."""

    def __init__(self, bindings: Any, delay_us: int) -> None:
        self._bindings = bindings
        self._delay_us = delay_us

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bindings, name)

    def nixlAgent(self, name: str, config: Any) -> Any:
        config.pthrDelay = self._delay_us
        return self._bindings.nixlAgent(name, config)


@contextmanager
def paced_progress_thread(agent_class: Any, delay_us: int) -> Iterator[None]:
    """Within the block, agents of ``agent_class`` get a ``delay_us`` progress-thread delay."""
    module = sys.modules.get(getattr(agent_class, "__module__", ""), None)
    if delay_us <= 0 or module is None or not hasattr(module, "nixlBind"):
        yield
        return
    original = module.nixlBind
    setattr(module, "nixlBind", _PacedBindings(original, delay_us))  # noqa: B010
    try:
        yield
    finally:
        setattr(module, "nixlBind", original)  # noqa: B010
