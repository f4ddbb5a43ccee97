"""Run the ON and OFF legs: the same conversations, turn by turn, one request at a time.

Requests are sequential so that each one's share of the router's and engines' counters (prefill
duration, D->P transfer time, reused tokens) is the difference of two ``/metrics`` reads.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator
from dataclasses import dataclass, field

from disagg.bench.client import ChatClient, MetricsProbe
from disagg.bench.progress import Progress
from disagg.bench.records import Leg, TurnRecord
from disagg.bench.workload import TurnPlan, plan_turns, user_text

SYSTEM_PROMPT = "You are a helpful assistant. Answer the last message briefly."
_PROBE_WORDS = 400


@dataclass(frozen=True)
class LegTarget:
    """Where one leg runs and whether its requests carry a conversation id."""

    leg: Leg
    router_url: str
    send_conversation_id: bool
    prefill_metrics_urls: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """How the leg was run, for the JSON and the figures."""
        if self.leg is Leg.ON:
            return f"router {self.router_url} with conversation_id (bidirectional KV reuse)"
        if self.leg is Leg.FLOOR:
            return (
                f"router {self.router_url} without conversation_id, prefill with prefix caching "
                "on: each turn finds the previous prompt in prefill's own cache (the floor)"
            )
        if self.send_conversation_id:
            return f"router {self.router_url} of a deployment with bidirectional transfer off"
        return (
            f"router {self.router_url} without conversation_id: no D->P offer, prefill "
            "recomputes every prompt"
        )


@dataclass(frozen=True)
class Sweep:
    """The conversations to run: target lengths, how many, answer length, text seed."""

    lengths: list[int]
    conversations: int = 1
    answer_tokens: int = 32
    seed: str = "disagg-bench"
    system_prompt: str = SYSTEM_PROMPT


@dataclass(frozen=True)
class Calibration:
    """Prompt tokens of the system prompt alone and per word of user text (one model)."""

    base_tokens: int
    tokens_per_word: float


def calibrate(client: ChatClient, model: str, sweep: Sweep) -> Calibration:
    """Two short probes (no conversation id): one word, then ``_PROBE_WORDS`` words.

    They also warm the servers up before anything is measured.
    """
    short = chat_messages(sweep.system_prompt, [], user_text(sweep.seed + "-probe", 1))
    long = chat_messages(sweep.system_prompt, [], user_text(sweep.seed + "-probe", _PROBE_WORDS))
    base = client.turn(model, short, 1, None).prompt_tokens
    full = client.turn(model, long, 1, None).prompt_tokens
    if full <= base:
        raise RuntimeError("the server reported no prompt_tokens in its streamed usage")
    return Calibration(base, (full - base) / (_PROBE_WORDS - 1))


def chat_messages(
    system: str, history: list[tuple[str, str]], new_user: str
) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}]
    for user, assistant in history:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    messages.append({"role": "user", "content": new_user})
    return messages


def leg_turns(
    target: LegTarget,
    model: str,
    sweep: Sweep,
    plans: list[TurnPlan],
    progress: Progress,
    run_id: str | None = None,
) -> Generator[TurnRecord, None, None]:
    """Every conversation of ``sweep`` through ``target``, one record per turn as it is taken.

    The FLOOR leg's system prompt names the run, so that its prefill's cache holds no earlier
    run's or leg's turns: each turn finds only this conversation's previous prompt there.
    """
    run_id = run_id or uuid.uuid4().hex[:8]
    system = sweep.system_prompt
    if target.leg is Leg.FLOOR:
        system = f"{system} Run {run_id}."
    client = ChatClient(target.router_url)
    probe = MetricsProbe(target.router_url, target.prefill_metrics_urls)
    try:
        for index in range(sweep.conversations):
            conversation = f"bench-{run_id}-{target.leg.value}-{index}"
            history: list[tuple[str, str]] = []
            for plan in plans:
                text = user_text(f"{sweep.seed}-{index}-{plan.turn}", plan.new_words)
                messages = chat_messages(system, history, text)
                before = probe.snapshot()
                conversation_id = conversation if target.send_conversation_id else None
                reply = client.turn(model, messages, sweep.answer_tokens, conversation_id)
                deltas = probe.deltas(before, probe.settle(before))
                history.append((text, reply.text))
                record = TurnRecord(
                    leg=target.leg,
                    conversation=conversation,
                    turn=plan.turn,
                    prompt_tokens=reply.prompt_tokens,
                    ttft_ms=reply.ttft_ms,
                    e2e_ms=reply.e2e_ms,
                    output_tokens=reply.completion_tokens,
                    prefill_ms=deltas.prefill_ms,
                    kv_transfer_ms=deltas.kv_transfer_ms,
                    kv_bytes=deltas.kv_bytes,
                    reused_tokens=deltas.reused_tokens,
                    cached_tokens=deltas.cached_tokens,
                    queue_ms=deltas.queue_ms,
                    engine_prefill_ms=deltas.engine_prefill_ms,
                    lookup=deltas.lookup,
                )
                progress.step(
                    f"{target.leg.value.upper()} conv {index + 1} turn {plan.turn}: "
                    f"{reply.prompt_tokens} tokens, TTFT {reply.ttft_ms / 1000:.2f} s"
                    + (f" ({deltas.lookup})" if deltas.lookup else "")
                )
                yield record
    finally:
        client.close()
        probe.close()


def run_leg(
    target: LegTarget,
    model: str,
    sweep: Sweep,
    plans: list[TurnPlan],
    progress: Progress,
    run_id: str | None = None,
) -> list[TurnRecord]:
    """Every conversation of ``sweep`` through ``target``, returning one record per turn."""
    return list(leg_turns(target, model, sweep, plans, progress, run_id))


def run_interleaved(
    targets: list[LegTarget],
    model: str,
    sweep: Sweep,
    plans: list[TurnPlan],
    progress: Progress,
    run_id: str | None = None,
) -> list[TurnRecord]:
    """The legs of ``targets`` (each its own deployment) turn by turn, so that load drift on a
    shared machine hits the legs alike and their TTFTs at one length are taken moments apart.

    Which leg goes first alternates from turn to turn and, at each turn, from conversation to
    conversation: a leg that goes first follows its own previous turn, one that goes second
    follows the other leg's, and each length gets both positions.
    """
    turns = [leg_turns(t, model, sweep, plans, progress, run_id) for t in targets]
    records: list[TurnRecord] = []
    rounds = 0
    try:
        while True:
            conversation, turn = divmod(rounds, max(len(plans), 1))
            order = turns if (conversation + turn) % 2 == 0 else turns[::-1]
            taken = [record for record in (next(leg, None) for leg in order) if record]
            if not taken:
                return records
            records += taken
            rounds += 1
    finally:
        for leg in turns:
            leg.close()


def plan_sweep(client: ChatClient, model: str, sweep: Sweep) -> tuple[Calibration, list[TurnPlan]]:
    """Calibrate on ``client``'s server and plan the turns that reach ``sweep.lengths``."""
    calibration = calibrate(client, model, sweep)
    plans = plan_turns(
        sweep.lengths, sweep.answer_tokens, calibration.tokens_per_word, calibration.base_tokens
    )
    return calibration, plans
