"""How the engines fit two cores: decode's idle CPU while it retains a finished turn's KV,
against bidirectional off, and each engine computing on the core it was given.

Figures go to ``$DISAGG_CACHE/engine-idle-cpu.json`` and the test output.
"""

from __future__ import annotations

import json

import psutil
import pytest

from conftest import DECODE_CORE, MODEL_DIR, PREFILL_CORE, Rig
from conversations import ANSWER_TOKENS, tokenizer, user_text
from disagg.rig.engine import CACHE
from driver import Conversation, PDDriver
from probes import idle_cpu_percent

IDLE_SECONDS = 10.0
RETAINED_TURNS = 3

pytestmark = pytest.mark.engine


def retain_turns(driver: PDDriver) -> None:
    """Leave decode holding a few finished turns' KV (bidirectional on) or none (off)."""
    tok = tokenizer(MODEL_DIR)
    for seed in range(RETAINED_TURNS):
        driver.token_turn(Conversation(), tok.encode(user_text(90 + seed, 200)), ANSWER_TOKENS)


def test_decode_idle_cpu_with_retained_blocks(rig: Rig) -> None:
    figures: dict[str, float] = {}
    for name, driver, server in (
        ("decode_bidir_on", rig.on.driver(), rig.on.decode),
        ("decode_bidir_off", rig.off.driver(), rig.off.decode),
    ):
        retain_turns(driver)
        figures[name] = round(idle_cpu_percent(server, IDLE_SECONDS), 1)
    figures["prefill_bidir_on_idle"] = round(idle_cpu_percent(rig.on.prefill, IDLE_SECONDS), 1)
    (CACHE / "engine-idle-cpu.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(f"idle CPU (% of one core over {IDLE_SECONDS:.0f} s): {figures}")
    assert figures["decode_bidir_on"] <= figures["decode_bidir_off"] + 15.0
    assert figures["prefill_bidir_on_idle"] <= 30.0


def test_each_engine_computes_on_the_core_it_was_given(rig: Rig) -> None:
    """Every server's model thread (its worker's main thread) keeps the one core the rig gave
    it, as VLLM_CPU_OMP_THREADS_BIND asks, after vLLM's NIXL worker pinned it to the node's last
    core: prefill and decode compute on cores of their own."""
    placed: dict[str, set[int]] = {}
    for server in (rig.on.prefill, rig.on.decode, rig.off.prefill, rig.off.decode):
        assert server.process is not None
        workers = [
            child
            for child in psutil.Process(server.process.pid).children(recursive=True)
            if child.name() == "VLLM::Worker"
        ]
        assert len(workers) == 1, f"{server.spec.name}: workers {workers}"
        placed[server.spec.name] = set(workers[0].cpu_affinity())
    assert placed == {
        name: {core}
        for name, core in (
            ("prefill-on", PREFILL_CORE),
            ("decode-on", DECODE_CORE),
            ("prefill-off", PREFILL_CORE),
            ("decode-off", DECODE_CORE),
        )
    }, placed
