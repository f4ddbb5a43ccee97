"""Conversation store on the Redis protocol (Redis or Valkey), shared by router replicas.

One hash per conversation (fields ``seq``, ``committed``, ``entry``, ``decode``); each
operation is one Lua script, so it is atomic across routers and costs one round trip. Each
operation, connecting and the client's own retries included, ends within ``timeout_s``: a Redis
that accepts connections and never answers turns a turn into a miss, not a hang.

The connection pool holds up to ``max_connections`` (``build_store`` sizes it from the router's
request slots, so that every turn in flight can hold one) and a call that finds none free waits
for one within the same deadline, instead of failing at once as redis-py's default pool (100
connections) does under load.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis

from disagg_router.conversation import Lookup, TurnEntry, TurnStart

_BEGIN = """
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
local entry = redis.call('HGET', KEYS[1], 'entry')
if entry then redis.call('HDEL', KEYS[1], 'entry') end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return {seq, entry, redis.call('HGET', KEYS[1], 'decode')}
"""

_COMMIT = """
local committed = tonumber(redis.call('HGET', KEYS[1], 'committed') or '0')
if tonumber(ARGV[1]) <= committed then return 0 end
redis.call('HSET', KEYS[1], 'committed', ARGV[1], 'entry', ARGV[2], 'decode', ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""

_RESTORE = """
if redis.call('HEXISTS', KEYS[1], 'entry') == 1 then return 0 end
local committed = tonumber(redis.call('HGET', KEYS[1], 'committed') or '0')
if committed ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'entry', ARGV[2])
return 1
"""

_DROP = """
local committed = redis.call('HGET', KEYS[1], 'committed')
if committed and tonumber(committed) == tonumber(ARGV[1]) then
  return redis.call('HDEL', KEYS[1], 'entry')
end
return 0
"""

_FORGET = """
local known = redis.call('EXISTS', KEYS[1])
local entry = redis.call('HGET', KEYS[1], 'entry')
redis.call('DEL', KEYS[1])
return {known, entry}
"""


class RedisStore:
    """Store shared through Redis; conversation state lives twice the entry TTL."""

    def __init__(
        self, url: str, prefix: str, ttl_s: float, timeout_s: float, max_connections: int
    ) -> None:
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout_s,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
        )
        self._redis: Any = aioredis.Redis.from_pool(pool)
        self._timeout_s = timeout_s
        self._prefix = prefix
        self._keep_s = max(1, math.ceil(2 * ttl_s))
        self._begin = self._redis.register_script(_BEGIN)
        self._commit = self._redis.register_script(_COMMIT)
        self._restore = self._redis.register_script(_RESTORE)
        self._drop = self._redis.register_script(_DROP)
        self._forget = self._redis.register_script(_FORGET)

    @asynccontextmanager
    async def _deadline(self) -> AsyncIterator[None]:
        """End the block within the timeout, with an error that says so."""
        try:
            async with asyncio.timeout(self._timeout_s):
                yield
        except TimeoutError:
            raise TimeoutError(
                f"Redis did not answer within {self._timeout_s:g} s (--redis-timeout)"
            ) from None

    async def begin_turn(self, key: str) -> TurnStart:
        """Number a new turn and take the conversation's entry, if any."""
        async with self._deadline():
            reply = await self._begin(keys=[self._prefix + key], args=[self._keep_s])
        seq = int(reply[0])
        raw = reply[1] if len(reply) > 1 else None
        decode = reply[2].decode() if len(reply) > 2 and reply[2] is not None else None
        if raw is None:
            return TurnStart(seq, None, Lookup.MISS, decode)
        entry = TurnEntry.from_json(raw)
        if entry.expired():
            return TurnStart(seq, None, Lookup.EXPIRED, decode)
        return TurnStart(seq, entry, Lookup.HIT, decode)

    async def commit(self, key: str, entry: TurnEntry) -> bool:
        """Store ``entry`` unless a later-started turn already committed."""
        args: list[str | int] = [entry.seq, entry.to_json(), self._keep_s, entry.decode_url]
        async with self._deadline():
            return bool(await self._commit(keys=[self._prefix + key], args=args))

    async def restore(self, key: str, entry: TurnEntry) -> bool:
        """Put back an entry taken by a failed turn, if nothing newer was committed."""
        args: list[str | int] = [entry.seq, entry.to_json()]
        async with self._deadline():
            return bool(await self._restore(keys=[self._prefix + key], args=args))

    async def drop(self, key: str, seq: int) -> bool:
        """Remove the entry turn ``seq`` committed, if it is still there untaken."""
        async with self._deadline():
            return bool(await self._drop(keys=[self._prefix + key], args=[seq]))

    async def forget(self, key: str) -> tuple[bool, TurnEntry | None]:
        """Remove the conversation; whether it was known, and its entry."""
        async with self._deadline():
            reply = await self._forget(keys=[self._prefix + key], args=[])
        raw = reply[1] if len(reply) > 1 else None
        return bool(reply[0]), TurnEntry.from_json(raw) if raw is not None else None

    async def check(self) -> None:
        """Raise if Redis does not answer a PING within the timeout."""
        async with self._deadline():
            await self._redis.ping()

    async def close(self) -> None:
        """Close the connection pool."""
        await self._redis.aclose()
