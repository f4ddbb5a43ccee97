"""The streamed-final-chunk plugin's stream rewriting, on real async generators."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from disagg_connector.stream_params import (
    FinalParams,
    add_params_to_chunk,
    needs_stream_params,
    tracked,
    with_final_params,
)

PARAMS = {"remote_engine_id": "decode-0", "remote_block_ids": [[1, 2]]}


@dataclass
class Output:
    """The two fields of vLLM's RequestOutput the plugin reads."""

    finished: bool
    kv_transfer_params: dict[str, Any] | None = None


def chunk(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body)}\n\n"


async def fake_server(results: AsyncIterator[Any], usage: bool) -> AsyncIterator[str]:
    """Streams one chunk per engine output, then usage and [DONE], like vLLM's generators."""
    index = 0
    async for output in results:
        if isinstance(output, tuple):
            output = output[1]
        yield chunk({"choices": [{"index": 0, "delta": {"content": f"t{index}"}}]})
        index += 1
        if output.finished:
            yield chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    if usage:
        yield chunk({"choices": [], "usage": {"completion_tokens": index}})
    yield "data: [DONE]\n\n"


async def engine(outputs: list[Any]) -> AsyncIterator[Any]:
    for output in outputs:
        await asyncio.sleep(0)
        yield output


def run_stream(outputs: list[Any], usage: bool) -> list[str]:
    async def collect() -> list[str]:
        final = FinalParams()
        stream = with_final_params(fake_server(tracked(engine(outputs), final), usage), final)
        return [event async for event in stream]

    return asyncio.run(collect())


def bodies(events: list[str]) -> list[dict[str, Any]]:
    return [json.loads(e[len("data: ") :]) for e in events if e.strip() != "data: [DONE]"]


@pytest.mark.parametrize("usage", [False, True])
def test_params_ride_on_the_last_chunk_only(usage: bool) -> None:
    events = run_stream([Output(False), Output(False), Output(True, PARAMS)], usage)
    assert events[-1].strip() == "data: [DONE]"
    parsed = bodies(events)
    assert parsed[-1]["kv_transfer_params"] == PARAMS
    assert all("kv_transfer_params" not in body for body in parsed[:-1])
    assert len(parsed) == 4 + usage


def test_completion_style_indexed_outputs() -> None:
    events = run_stream([(0, Output(False)), (0, Output(True, PARAMS))], usage=False)
    assert bodies(events)[-1]["kv_transfer_params"] == PARAMS


def test_stream_without_params_is_unchanged() -> None:
    outputs = [Output(False), Output(True, None)]
    events = run_stream(outputs, usage=True)

    async def plain() -> list[str]:
        return [e async for e in fake_server(engine(outputs), usage=True)]

    assert events == asyncio.run(plain())


def test_chunks_before_the_finish_are_not_held_back() -> None:
    async def scenario() -> list[str]:
        final = FinalParams()
        gate = asyncio.Event()

        async def slow_engine() -> AsyncIterator[Any]:
            yield Output(False)
            await gate.wait()
            yield Output(True, PARAMS)

        stream = with_final_params(fake_server(tracked(slow_engine(), final), False), final)
        first = await anext(stream)
        gate.set()
        return [first] + [e async for e in stream]

    events = asyncio.run(scenario())
    assert json.loads(events[0][6:])["choices"][0]["delta"]["content"] == "t0"


@pytest.mark.parametrize(
    "event",
    ["data: not json\n\n", 'data: {"error": {"message": "boom"}}\n\n', ": keepalive\n\n"],
)
def test_non_chunk_events_pass_through(event: str) -> None:
    assert add_params_to_chunk(event, PARAMS) == event


@pytest.mark.parametrize(
    ("version", "expected"),
    [("0.32.0", True), ("0.32.1+cpu", True), ("0.33.0", False), ("0.34.1rc1", False)],
)
def test_only_versions_without_native_support_are_patched(version: str, expected: bool) -> None:
    assert needs_stream_params(version) is expected
