"""A router process told to stop (SIGTERM, as the kubelet sends it after the preStop wait):
it takes no new connection, finishes the streams in flight within ``--shutdown-timeout`` and
cuts those that run past it."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from engine_standin import MODEL
from router_harness import RouterRig, router_process, start_engine

STREAM_TOKENS = 30
TOKEN_DELAY_S = 0.1
"""Decode's pace: the stream lasts about 3 s, through the SIGTERM."""
STOPPED = -signal.SIGTERM
"""The router's exit status after its drain: uvicorn re-raises the signal it caught."""
REFUSAL_POLL_S = 2.0
"""How long the test looks for the router refusing new connections after SIGTERM."""


@pytest.fixture
def rig() -> Iterator[RouterRig]:
    running = RouterRig([start_engine("prefill", "p0")], [start_engine("decode", "d0")])
    running.decode[0].state.token_delay_s = TOKEN_DELAY_S
    try:
        yield running
    finally:
        running.stop()


@dataclass(eq=False)
class _Stream(threading.Thread):
    """One streamed chat turn read event by event, keeping what arrived and how it ended."""

    url: str
    events: list[str] = field(default_factory=list)
    error: str | None = None
    started: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        super().__init__(daemon=True)

    def run(self) -> None:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "count"}],
            "max_tokens": STREAM_TOKENS,
            "stream": True,
        }
        try:
            with httpx.stream(
                "POST", f"{self.url}/v1/chat/completions", json=body, timeout=30
            ) as r:
                if r.status_code != 200:
                    self.error = f"HTTP {r.status_code}: {r.read()!r}"
                    return
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line.removeprefix("data: "))
                        self.started.set()
        except httpx.HTTPError as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.started.set()


def _refuses_new_connections(url: str, stream: _Stream) -> bool:
    """Whether a new connection is refused while the stream is still running."""
    deadline = time.monotonic() + REFUSAL_POLL_S
    while time.monotonic() < deadline and stream.is_alive():
        try:
            httpx.get(f"{url}/health", timeout=1)
        except httpx.ConnectError:
            return stream.is_alive()
        except (httpx.RemoteProtocolError, httpx.ReadError):
            pass  # queued just before the router closed its socket: closed or reset unanswered
        time.sleep(0.05)
    return False


def _stream_through_sigterm(rig: RouterRig, shutdown_timeout_s: int) -> tuple[_Stream, bool, int]:
    prefill, decode = [e.url for e in rig.prefill], [e.url for e in rig.decode]
    with router_process(prefill, decode, "--shutdown-timeout", str(shutdown_timeout_s)) as router:
        stream = _Stream(router.url)
        stream.start()
        assert stream.started.wait(10) and not stream.error, stream.error
        router.process.send_signal(signal.SIGTERM)
        refused = _refuses_new_connections(router.url, stream)
        stream.join(timeout=30)
        status = router.process.wait(timeout=30)
    return stream, refused, status


def test_sigterm_lets_a_stream_in_flight_finish_and_refuses_new_connections(
    rig: RouterRig,
) -> None:
    stream, refused, status = _stream_through_sigterm(rig, shutdown_timeout_s=30)
    assert stream.error is None, stream.error
    assert stream.events[-1] == "[DONE]"
    assert len(stream.events) == 1 + STREAM_TOKENS + 1, "role delta, the tokens, [DONE]"
    assert refused, "the stopping router still took a new connection"
    assert status == STOPPED


def test_a_stream_longer_than_the_shutdown_timeout_is_cut(rig: RouterRig) -> None:
    stream, _, status = _stream_through_sigterm(rig, shutdown_timeout_s=1)
    assert "[DONE]" not in stream.events
    assert len(stream.events) < 1 + STREAM_TOKENS + 1
    assert status == STOPPED
