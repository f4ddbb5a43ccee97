"""Keep the worker's compute thread on the cores it was given while vLLM builds its NIXL worker.

On vLLM's CPU platform the NIXL worker's constructor pins the calling thread to the last core
of each NUMA node (meant to keep KV transfers off the compute cores). The calling thread is the
worker's main thread, the one that runs the model, so every engine on a node computes on that
same core, whatever ``VLLM_CPU_OMP_THREADS_BIND`` (or the node's CPU manager) gave it: on a
two-core node a prefill bound to core 0 and a decode bound to core 1 both compute on core 1,
and a decode streaming a long answer holds up the prefill of every other turn. The connector
builds the worker inside :func:`kept_cpu_affinity`, which puts the thread's affinity back as it
was; threads NIXL starts meanwhile keep the core vLLM chose for transfers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def kept_cpu_affinity() -> Iterator[None]:
    """Within the block the calling thread's CPU affinity may change; afterwards it is
    restored (a no-op where the platform has no affinity calls)."""
    if not hasattr(os, "sched_getaffinity"):
        yield
        return
    cores = os.sched_getaffinity(0)
    try:
        yield
    finally:
        os.sched_setaffinity(0, cores)
