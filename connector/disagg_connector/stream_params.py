"""vLLM general plugin: put ``kv_transfer_params`` on the final chunk of streamed responses.

vLLM >= 0.33 does this itself (a router caches decode's params from the stream for the next
turn). For older versions this plugin wraps the chat and completion stream generators in the
API server process: chunks produced after the engine reports the request finished are held
back by one, and the last JSON chunk before ``[DONE]`` gets ``kv_transfer_params``. Nothing
is buffered before that point, so streaming latency is unchanged. No vLLM file is modified.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import multiprocessing
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from disagg_connector.vllm_version import installed_vllm_version, parse_version
from disagg_contract import KV_TRANSFER_PARAMS

NATIVE_STREAM_PARAMS_VERSION = (0, 33)
"""First vLLM release that streams ``kv_transfer_params`` on the final chunk itself."""

_DONE = "data: [DONE]"
PATCHED_GENERATORS = (
    (
        "vllm.entrypoints.openai.chat_completion.serving",
        "OpenAIServingChat",
        "chat_completion_stream_generator",
    ),
    (
        "vllm.entrypoints.openai.completion.serving",
        "OpenAIServingCompletion",
        "completion_stream_generator",
    ),
)
"""(module, class, method) of the stream generators the plugin wraps on older vLLM."""
_PATCHED_MARK = "__disagg_stream_params__"


@dataclass
class FinalParams:
    """What the engine reported for a streamed request once it finished."""

    finished: bool = False
    params: dict[str, Any] | None = field(default=None)

    def observe(self, output: Any) -> None:
        """Record a ``RequestOutput`` (or ``(index, RequestOutput)`` pair)."""
        if isinstance(output, tuple):
            output = output[-1]
        if getattr(output, "finished", False):
            self.finished = True
            self.params = getattr(output, KV_TRANSFER_PARAMS, None) or self.params


def add_params_to_chunk(sse_event: str, params: dict[str, Any]) -> str:
    """Return the SSE ``data:`` event with ``kv_transfer_params`` added to its JSON body."""
    body = sse_event.strip()
    if not body.startswith("data: "):
        return sse_event
    try:
        payload = json.loads(body[len("data: ") :])
    except json.JSONDecodeError:
        return sse_event
    if not isinstance(payload, dict) or "error" in payload:
        return sse_event
    payload[KV_TRANSFER_PARAMS] = params
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def tracked(results: AsyncIterator[Any], final: FinalParams) -> AsyncIterator[Any]:
    """Pass engine outputs through, noting the final ``kv_transfer_params``."""
    async for output in results:
        final.observe(output)
        yield output


async def with_final_params(
    events: AsyncIterator[str], final: FinalParams
) -> AsyncGenerator[str, None]:
    """Re-emit SSE events, adding ``final.params`` to the last JSON event before ``[DONE]``."""
    held: str | None = None
    async for event in events:
        if not final.finished:
            yield event
            continue
        if event.strip() == _DONE:
            if held is not None:
                yield add_params_to_chunk(held, final.params) if final.params else held
                held = None
            yield event
            continue
        if held is not None:
            yield held
        held = event
    if held is not None:
        yield held


def _wrap(method: Callable[..., AsyncIterator[str]]) -> Callable[..., AsyncGenerator[str, None]]:
    signature = inspect.signature(method)

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> AsyncGenerator[str, None]:
        bound = signature.bind(*args, **kwargs)
        final = FinalParams()
        bound.arguments["result_generator"] = tracked(bound.arguments["result_generator"], final)
        return with_final_params(method(*bound.args, **bound.kwargs), final)

    setattr(wrapper, _PATCHED_MARK, True)
    return wrapper


def needs_stream_params(vllm_version: str) -> bool:
    """Whether this vLLM version lacks ``kv_transfer_params`` on streamed final chunks."""
    return parse_version(vllm_version)[:2] < NATIVE_STREAM_PARAMS_VERSION


def register() -> None:
    """Entry point of the ``vllm.general_plugins`` group; patches only the frontend process.

    vLLM loads general plugins in every process; engine cores and workers run in child
    processes, and only the main (API server) process serves HTTP.
    """
    version = installed_vllm_version()
    if version is None or not needs_stream_params(version):
        return
    if multiprocessing.current_process().name != "MainProcess":
        return

    for module_name, class_name, method_name in PATCHED_GENERATORS:
        owner = getattr(importlib.import_module(module_name), class_name)
        method = getattr(owner, method_name)
        if not getattr(method, _PATCHED_MARK, False):
            setattr(owner, method_name, _wrap(method))
