"""Decode's idle CPU while it retains a finished turn's KV, against bidirectional off.

Figures go to ``$DISAGG_CACHE/engine-idle-cpu.json`` and the test output. ``decode-stock``
runs without our 2-core settings (NIXL's spinning progress thread, 1 ms idle engine steps)
to show what they save; it is measured, not asserted on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from conftest import DECODE_CORE, MODEL_DIR, Rig
from conversations import ANSWER_TOKENS, tokenizer, user_text
from disagg.rig.engine import CACHE, EngineServer, ServerSpec, start_all
from disagg_contract import Role
from driver import Conversation, PDDriver
from probes import idle_cpu_percent

IDLE_SECONDS = 10.0
RETAINED_TURNS = 3

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def stock_decode(rig: Rig) -> Iterator[EngineServer]:
    spec = ServerSpec("decode-stock", Role.DECODE, 18203, 15605, DECODE_CORE, hooks=False)
    server = rig.decode_server(spec)
    start_all([server])
    yield server
    server.stop()


def retain_turns(driver: PDDriver) -> None:
    """Leave decode holding a few finished turns' KV (bidirectional on) or none (off)."""
    tok = tokenizer(MODEL_DIR)
    for seed in range(RETAINED_TURNS):
        driver.token_turn(Conversation(), tok.encode(user_text(90 + seed, 200)), ANSWER_TOKENS)


def test_decode_idle_cpu_with_retained_blocks(rig: Rig, stock_decode: EngineServer) -> None:
    figures: dict[str, float] = {}
    for name, driver, server in (
        ("decode_bidir_on", rig.on.driver(), rig.on.decode),
        ("decode_bidir_off", rig.off.driver(), rig.off.decode),
        (
            "decode_bidir_on_stock_settings",
            PDDriver(rig.on.prefill.url, stock_decode.url),
            stock_decode,
        ),
    ):
        retain_turns(driver)
        figures[name] = round(idle_cpu_percent(server, IDLE_SECONDS), 1)
    figures["prefill_bidir_on_idle"] = round(idle_cpu_percent(rig.on.prefill, IDLE_SECONDS), 1)
    (CACHE / "engine-idle-cpu.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(f"idle CPU (% of one core over {IDLE_SECONDS:.0f} s): {figures}")
    assert figures["decode_bidir_on"] <= figures["decode_bidir_off"] + 15.0
    assert figures["prefill_bidir_on_idle"] <= 30.0
