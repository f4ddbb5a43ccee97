"""Engine calls over one pooled aiohttp session, with failures reduced to three kinds.

aiohttp rather than httpx because its HTTP parser is compiled: the router's CPU per turn was
mostly httpx's pure-Python stack (benchmarks/README.md, router section). Idle engine
connections expire before vLLM's (uvicorn's) 5 s keep-alive timeout, so a request never races
the engine closing its connection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import aiohttp

from disagg_router.errors import REQUEST_ID_HEADER

ENGINE_KEEPALIVE_S = 4.0


class UpstreamFailure(Exception):
    """An engine call failed before a status arrived or while its body was read.

    ``kind`` is ``connect`` (refused or not accepted within the connect timeout: the replica
    is unreachable), ``timeout`` (no data within the read timeout) or ``transport`` (the
    connection broke, or the engine did not speak HTTP).
    """

    def __init__(self, kind: str, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.kind = kind


def _failure(exc: BaseException) -> UpstreamFailure:
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
        return UpstreamFailure("connect", exc)
    if isinstance(exc, TimeoutError):
        return UpstreamFailure("timeout", exc)
    return UpstreamFailure("transport", exc)


def _nothing() -> None:
    pass


class EngineResponse:
    """An engine's response whose status arrived; read its body whole or in chunks, then
    ``release`` it (the connection is reused only when the body was read to its end)."""

    __slots__ = ("_on_release", "_response", "status")

    def __init__(self, response: aiohttp.ClientResponse, on_release: Callable[[], None]) -> None:
        self._response = response
        self._on_release = on_release
        self.status = response.status

    async def read(self) -> bytes:
        """The whole body; the response is released."""
        try:
            return await self._response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _failure(exc) from None
        finally:
            self.release()

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (chunked transfer decoded)."""
        content = self._response.content
        while True:
            try:
                chunk = await content.readany()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise _failure(exc) from None
            if not chunk:
                return
            yield chunk

    def release(self) -> None:
        """Give the connection back, or close it if the body was not read to its end (which
        tells the engine to abort the request); the first release runs ``on_release``."""
        self._response.release()
        on_release, self._on_release = self._on_release, _nothing
        on_release()


class EngineClient:
    """Pooled HTTP/1.1 connections to every engine replica."""

    def __init__(self, connect_timeout_s: float, api_key: str | None = None) -> None:
        """``api_key``, when set, goes to every engine as ``Authorization: Bearer`` (vLLM's
        ``--api-key`` guards /v1/*, model listing included; /health stays open)."""
        self._connect_timeout_s = connect_timeout_s
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=ENGINE_KEEPALIVE_S),
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent",),
            headers={"Authorization": f"Bearer {api_key}"} if api_key is not None else None,
        )

    def _timeout(self, read_timeout_s: float) -> aiohttp.ClientTimeout:
        """No total limit: ``read_timeout_s`` bounds each wait for data, as long answers
        stream for minutes."""
        timeout = self._timeouts.get(read_timeout_s)
        if timeout is None:
            timeout = aiohttp.ClientTimeout(
                connect=self._connect_timeout_s, sock_read=read_timeout_s
            )
            self._timeouts[read_timeout_s] = timeout
        return timeout

    async def post(
        self,
        url: str,
        content: bytes,
        request_id: str,
        read_timeout_s: float,
        on_release: Callable[[], None],
    ) -> EngineResponse:
        """POST a JSON body; return once the response's status and headers arrived.

        ``on_release`` runs when the response returned is released (not if none arrives).
        """
        headers = {REQUEST_ID_HEADER: request_id, "Content-Type": "application/json"}
        try:
            response = await self._session.post(
                url, data=content, headers=headers, timeout=self._timeout(read_timeout_s)
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _failure(exc) from None
        return EngineResponse(response, on_release)

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """GET ``url`` within ``timeout_s`` overall; return its status and body."""
        try:
            async with self._session.get(
                url, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as response:
                return response.status, await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _failure(exc) from None

    async def call(self, url: str, content: bytes, timeout_s: float) -> tuple[int, bytes]:
        """POST a JSON body and read the reply within ``timeout_s`` overall (decode's lease
        service); return its status and body."""
        headers = {"Content-Type": "application/json"}
        try:
            async with self._session.post(
                url, data=content, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as response:
                return response.status, await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _failure(exc) from None

    async def close(self) -> None:
        """Close every pooled connection."""
        await self._session.close()
