"""Many conversations at once through one router: the workload, who goes next, what it costs.

An agent's conversation is a shared system prompt, then turn after turn a tool result (new user
text) and the model's answer, the whole history resent each turn. ``conversations`` of them run
with ``concurrency`` requests in flight: a worker takes the ready turn with the lowest turn
index (then conversation), so the conversations advance round by round and prefill's cache
sees every conversation in between two turns of one. A conversation's next turn is ready
``think_s`` after its previous answer ended.

Per turn the client measures TTFT and keeps the answer (outputs are compared across
deployments). With requests overlapping, the engines' counters are read once before and once
after the run: prompt tokens prefill computed, found in its own prefix cache or read back from
decode, the time split of prefill's requests (queue, read, compute), and the router's offer
and divergence counts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from disagg.bench import prometheus
from disagg.bench.client import (
    ENGINE_PREFILL_TIME,
    NIXL_XFER,
    PREFIX_CACHE_HITS,
    QUEUE_TIME,
    REUSED_TOKENS,
    ROUTER_PREFILL,
    ChatClient,
)
from disagg.bench.runner import SYSTEM_PROMPT, Calibration, Sweep, calibrate, chat_messages
from disagg.bench.workload import ConversationsWorkload, user_text
from disagg_contract import REUSE_SUMMARY_PATH

PROMPT_TOKENS = "vllm:prompt_tokens_total"
RETAINED_BLOCKS = "vllm:disagg_kv_retained_blocks"
_REUSE_KEYS = ("turns", "hits", "offered_tokens", "verified_tokens", "diverged_tokens")


@dataclass(frozen=True)
class Texts:
    """The shared system prompt and the words of one tool result (from one calibration)."""

    system: str
    tool_words: int

    def tool_result(self, seed: str, conversation: int, turn: int) -> str:
        return user_text(f"{seed}-{conversation}-{turn}", self.tool_words)


def warm_up(client: ChatClient, model: str, workload: ConversationsWorkload) -> Calibration:
    """Two short requests without a conversation id: tokens per word on this server."""
    return calibrate(client, model, Sweep([1], seed=workload.seed))


def make_texts(client: ChatClient, model: str, workload: ConversationsWorkload) -> Texts:
    """Calibrate tokens per word on the server (warming it up), then size the texts."""
    calibration = warm_up(client, model, workload)
    per_word = calibration.tokens_per_word
    extra = max(workload.system_tokens - calibration.base_tokens, 0)
    system = SYSTEM_PROMPT
    if extra:
        system += " " + user_text(f"{workload.seed}-system", max(round(extra / per_word), 1))
    return Texts(system, max(round(workload.tool_tokens / per_word), 1))


@dataclass(frozen=True)
class TurnOutcome:
    """What the client saw of one turn."""

    conversation: int
    turn: int
    started_s: float
    """Seconds from the run's start to the request."""
    prompt_tokens: int
    ttft_ms: float
    e2e_ms: float
    answer: str


class TurnQueue:
    """Hands out ready turns, lowest turn index first, one turn per conversation at a time."""

    def __init__(self, workload: ConversationsWorkload, clock: Callable[[], float]) -> None:
        self._turns = workload.turns
        self._think_s = workload.think_s
        self._clock = clock
        self._ready: list[tuple[float, int, int]] = [
            (0.0, 1, c) for c in range(workload.conversations)
        ]
        """(ready at, turn, conversation) of every conversation not in flight and not done."""
        self._in_flight = 0
        self._stopped = False
        self._changed = threading.Condition()

    def take(self) -> tuple[int, int] | None:
        """The next (conversation, turn) to send, waiting until one is ready; None when none is
        left (or the run stopped)."""
        with self._changed:
            while not self._stopped and (self._ready or self._in_flight):
                taken = self._pop_ready()
                if taken is not None:
                    return taken
                now = self._clock()
                soonest = min((entry[0] for entry in self._ready), default=None)
                self._changed.wait(None if soonest is None else max(soonest - now, 0.001))
            return None

    def poll(self) -> tuple[int, int] | None:
        """The next (conversation, turn) ready now, or None, without waiting."""
        with self._changed:
            return None if self._stopped else self._pop_ready()

    def _pop_ready(self) -> tuple[int, int] | None:
        now = self._clock()
        ready = [entry for entry in self._ready if entry[0] <= now]
        if not ready:
            return None
        chosen = min(ready, key=lambda entry: (entry[1], entry[2]))
        self._ready.remove(chosen)
        self._in_flight += 1
        return chosen[2], chosen[1]

    def done(self, conversation: int, turn: int) -> None:
        """The turn answered: the conversation's next turn is ready after the think time."""
        with self._changed:
            self._in_flight -= 1
            if turn < self._turns:
                self._ready.append((self._clock() + self._think_s, turn + 1, conversation))
            self._changed.notify_all()

    def stop(self) -> None:
        """Hand out nothing more (a turn failed)."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()


@dataclass
class Counters:
    """The deployment's counters at one instant: router metrics, reuse summary, engines'."""

    router: list[prometheus.Sample]
    reuse: dict[str, Any]
    prefill: list[prometheus.Sample]
    decode: list[prometheus.Sample]


@dataclass(frozen=True)
class Deployment:
    """Where a run goes: the router, and the engines whose ``/metrics`` it reads."""

    router_url: str
    prefill_urls: list[str] = field(default_factory=list)
    decode_urls: list[str] = field(default_factory=list)

    def counters(self, http: httpx.Client) -> Counters:
        def read(urls: list[str]) -> list[prometheus.Sample]:
            samples: list[prometheus.Sample] = []
            for url in urls:
                samples += prometheus.parse(http.get(url.rstrip("/") + "/metrics").text)
            return samples

        reuse = http.get(self.router_url.rstrip("/") + REUSE_SUMMARY_PATH)
        return Counters(
            read([self.router_url]),
            reuse.json() if reuse.status_code == 200 else {},
            read(self.prefill_urls),
            read(self.decode_urls),
        )


def usage(before: Counters, after: Counters) -> dict[str, float | None]:
    """What the run cost, from two counter reads: prefill's tokens by where they came from, its
    requests' mean queue, read and compute times, the router's offers and divergence."""

    def grew(side: str, name: str) -> float:
        old: list[prometheus.Sample] = getattr(before, side)
        new: list[prometheus.Sample] = getattr(after, side)
        return prometheus.total(new, name) - prometheus.total(old, name)

    def mean_ms(side: str, histogram: str) -> float | None:
        count = grew(side, histogram + "_count")
        return round(grew(side, histogram + "_sum") / count * 1000, 1) if count else None

    engines = bool(after.prefill)
    prompt = grew("prefill", PROMPT_TOKENS) if engines else None
    cached = grew("prefill", PREFIX_CACHE_HITS) if engines else None
    read = grew("prefill", REUSED_TOKENS) if engines else None
    figures: dict[str, float | None] = {
        "prefill_prompt_tokens": prompt,
        "prefill_cached_tokens": cached,
        "prefill_read_tokens": read,
        "prefill_computed_tokens": None
        if prompt is None or cached is None or read is None
        else prompt - cached - read,
        "reads": grew("prefill", NIXL_XFER + "_count") if engines else None,
        "read_mean_ms": mean_ms("prefill", NIXL_XFER),
        "prefill_queue_mean_ms": mean_ms("prefill", QUEUE_TIME),
        "prefill_compute_mean_ms": mean_ms("prefill", ENGINE_PREFILL_TIME),
        "router_prefill_mean_ms": mean_ms("router", ROUTER_PREFILL),
    }
    for key in _REUSE_KEYS:
        if key in after.reuse:
            figures[f"router_{key}"] = float(after.reuse[key] - before.reuse.get(key, 0))
    return figures


class RetentionSampler:
    """Decode's retained KV blocks, read every ``interval_s`` on a thread while a run goes on."""

    def __init__(self, decode_urls: list[str], interval_s: float = 1.0) -> None:
        self.urls = [url.rstrip("/") + "/metrics" for url in decode_urls]
        self.interval_s = interval_s
        self.blocks: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RetentionSampler:
        if self.urls:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as http:
            while not self._stop.is_set():
                try:
                    samples = [s for url in self.urls for s in prometheus.parse(http.get(url).text)]
                    self.blocks.append(prometheus.total(samples, RETAINED_BLOCKS))
                except httpx.HTTPError:
                    pass
                self._stop.wait(self.interval_s)


@dataclass
class RunResult:
    """One run of the workload: every turn as the client saw it and what it cost."""

    turns: list[TurnOutcome]
    usage: dict[str, float | None]
    wall_s: float
    decode_retained_blocks: list[float]


def run_conversations(
    deployment: Deployment,
    model: str,
    workload: ConversationsWorkload,
    texts: Texts,
    conversation_prefix: str,
    on_turn: Callable[[TurnOutcome], None] = lambda outcome: None,
) -> RunResult:
    """Every conversation of ``workload`` through ``deployment``'s router, ``concurrency`` turns
    at a time; conversation ids are ``conversation_prefix`` plus the index."""
    origin = time.monotonic()
    queue = TurnQueue(workload, lambda: time.monotonic() - origin)
    histories: list[list[tuple[str, str]]] = [[] for _ in range(workload.conversations)]
    outcomes: list[TurnOutcome] = []
    lock = threading.Lock()
    client = ChatClient(deployment.router_url)

    def send(conversation: int, turn: int) -> TurnOutcome:
        text = texts.tool_result(workload.seed, conversation, turn)
        messages = chat_messages(texts.system, histories[conversation], text)
        started = time.monotonic() - origin
        reply = client.turn(
            model, messages, workload.answer_tokens, f"{conversation_prefix}{conversation}"
        )
        histories[conversation].append((text, reply.text))
        return TurnOutcome(
            conversation,
            turn,
            round(started, 3),
            reply.prompt_tokens,
            round(reply.ttft_ms, 1),
            round(reply.e2e_ms, 1),
            reply.text,
        )

    def worker() -> None:
        try:
            while (taken := queue.take()) is not None:
                outcome = send(*taken)
                with lock:
                    outcomes.append(outcome)
                on_turn(outcome)
                queue.done(*taken)
        except BaseException:
            queue.stop()
            raise

    with httpx.Client(timeout=30) as http:
        before = deployment.counters(http)
        try:
            with (
                RetentionSampler(deployment.decode_urls) as sampler,
                ThreadPoolExecutor(workload.concurrency) as pool,
            ):
                for future in [pool.submit(worker) for _ in range(workload.concurrency)]:
                    future.result()
        finally:
            client.close()
        wall_s = time.monotonic() - origin
        after = deployment.counters(http)
    outcomes.sort(key=lambda o: (o.conversation, o.turn))
    return RunResult(outcomes, usage(before, after), round(wall_s, 1), sampler.blocks)
