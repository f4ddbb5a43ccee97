"""A deadline on each request's head (request line and headers), which uvicorn lacks.

uvicorn bounds the idle time between requests (its keep-alive timeout, restarted by every byte
received) but not the time a client takes to send a request's head, and the app only runs once
the head is complete: a client that opens connections and trickles headers, or sends none,
would hold each connection, its buffers and a file descriptor for as long as it likes. This
protocol (uvicorn's httptools one, which ``uvicorn[standard]`` installs) starts a timer when a
connection opens and when the first bytes of a later request on it arrive, stops it once the
head is parsed, and when it fires answers 408 and closes the connection. The body has its own
deadline (``--body-timeout``, ``openai_request.read_body``), counted from the end of the head.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
"""What a client whose request head came too late reads before the connection closes."""


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol with a deadline of ``timeout_s`` on every request head; calls
    ``timed_out`` for each connection it closes for it. Made by :func:`header_deadline`."""

    timeout_s: ClassVar[float]
    timed_out: ClassVar[Callable[[], None]]
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Accept the connection and start the deadline on its first request's head."""
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        """Start the deadline when a new request begins on a kept-alive connection."""
        if self._head_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()
        super().data_received(data)

    def on_headers_complete(self) -> None:
        """The head is in: stop the deadline (the body deadline takes over)."""
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the deadline of a connection that is gone."""
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._head_timer = self.loop.call_later(self.timeout_s, self._too_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _too_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        type(self).timed_out()
        self.transport.write(TIMED_OUT)
        self.transport.close()


def header_deadline(
    timeout_s: float, timed_out: Callable[[], None]
) -> type[HeaderDeadlineProtocol]:
    """The protocol class to give uvicorn (``http=``): request heads must arrive within
    ``timeout_s`` seconds, and ``timed_out`` is called for each connection closed for it."""
    return type(
        "HeaderDeadlineProtocol",
        (HeaderDeadlineProtocol,),
        {"timeout_s": timeout_s, "timed_out": staticmethod(timed_out)},
    )
