"""Conversation store on the Redis protocol (Redis or Valkey), shared by router replicas.

One hash per conversation (fields ``seq``, ``committed``, ``entry``, ``decode``); each
operation is one Lua script, so it is atomic across routers and costs one round trip. Each scope
(tenant) has an index, a sorted set of its conversations by last use: a turn that opens a
conversation past the scope's share (:class:`TenantShares`) deletes the scope's least recently
used conversations, never another scope's (beginning a turn of a conversation Redis does not
hold touches neither the hash nor the index); the router whose turn deleted them releases the leases
it held for them (another router's lapse at its idle timeout). A
conversation's hash lives at ``<prefix>{<scope tag>}.<digest>`` and its scope's index at
``<prefix>{<scope tag>}``: one hash slot per scope, should the Redis be a cluster. Each
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
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis

from disagg_router.conversation import Lookup, TenantShares, TurnEntry, TurnStart, split_key

_TOUCH = """
local function touch(keep, now, share, digest)
  redis.call('ZADD', KEYS[2], now, digest)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - keep)
  redis.call('EXPIRE', KEYS[2], keep)
  local over = redis.call('ZCARD', KEYS[2]) - tonumber(share)
  local evicted = {}
  if over > 0 then
    local oldest = redis.call('ZPOPMIN', KEYS[2], over)
    for i = 1, #oldest, 2 do
      redis.call('DEL', KEYS[2] .. '.' .. oldest[i])
      evicted[#evicted + 1] = oldest[i]
    end
  end
  return evicted
end
"""
"""Mark the conversation used now in its scope's index, forget the index's members whose hash
has expired, and delete the scope's least recently used conversations past its share; the
digests of those deleted."""

_BEGIN = (
    _TOUCH
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, false, false, {}, false} end
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
local entry = redis.call('HGET', KEYS[1], 'entry')
if entry then redis.call('HDEL', KEYS[1], 'entry') end
redis.call('EXPIRE', KEYS[1], ARGV[1])
local evicted = touch(ARGV[1], ARGV[2], ARGV[3], ARGV[4])
local previous = redis.call('HMGET', KEYS[1], 'decode', 'prefill')
return {seq, entry, previous[1], evicted, previous[2]}
"""
)

_OPEN = (
    _TOUCH
    + """
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('EXPIRE', KEYS[1], ARGV[1])
return {seq, touch(ARGV[1], ARGV[2], ARGV[3], ARGV[4])}
"""
)

_COMMIT = (
    _TOUCH
    + """
local committed = tonumber(redis.call('HGET', KEYS[1], 'committed') or '0')
if tonumber(ARGV[5]) <= committed then return {0, {}} end
redis.call('HSET', KEYS[1], 'committed', ARGV[5], 'decode', ARGV[7])
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'entry', ARGV[6])
else redis.call('HDEL', KEYS[1], 'entry') end
if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'prefill', ARGV[8])
else redis.call('HDEL', KEYS[1], 'prefill') end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return {1, touch(ARGV[1], ARGV[2], ARGV[3], ARGV[4])}
"""
)

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
redis.call('ZREM', KEYS[2], ARGV[1])
return {known, entry}
"""


def _ignore(key: str) -> None:
    pass


def _text(value: bytes | None) -> str | None:
    """A hash field a script returned (None: the field is not set)."""
    return value.decode() if value is not None else None


class RedisStore:
    """Store shared through Redis; conversation state lives twice the entry TTL. Each scope
    keeps at most its share of conversations (``shares``; ``on_evict`` gets the key of each one
    this router's turns evict)."""

    def __init__(
        self,
        url: str,
        prefix: str,
        ttl_s: float,
        timeout_s: float,
        max_connections: int,
        shares: TenantShares,
        on_evict: Callable[[str], None] | None = None,
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
        self._shares = shares
        self._on_evict = on_evict or _ignore
        self._begin = self._redis.register_script(_BEGIN)
        self._open = self._redis.register_script(_OPEN)
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

    def _keys(self, key: str) -> list[str]:
        """The Redis keys of conversation ``key``: its hash, and its scope's index."""
        tag, digest = split_key(key)
        index = f"{self._prefix}{{{tag}}}"
        return [f"{index}.{digest}", index]

    def _touch_args(self, key: str) -> list[str | int | float]:
        """What the scripts' ``touch`` needs: keep, now, the scope's share, the digest."""
        share = self._shares.of(key)[1]
        return [self._keep_s, time.time(), share, split_key(key)[1]]

    def _evicted(self, key: str, digests: list[bytes]) -> None:
        """Report the conversations of ``key``'s scope that a script deleted for room."""
        tag = split_key(key)[0]
        for digest in digests:
            self._on_evict(f"{tag}.{digest.decode()}")

    async def begin_turn(self, key: str) -> TurnStart:
        """Number a new turn and take the conversation's entry, if any; sequence 0 (nothing
        stored) for a conversation Redis does not hold."""
        async with self._deadline():
            reply = await self._begin(keys=self._keys(key), args=self._touch_args(key))
        seq, raw, decode, evicted, prefill = reply
        self._evicted(key, evicted)
        previous = (_text(decode), _text(prefill))
        if raw is None:
            return TurnStart(int(seq), None, Lookup.MISS, *previous)
        entry = TurnEntry.from_json(raw)
        if entry.expired():
            return TurnStart(int(seq), None, Lookup.EXPIRED, *previous)
        return TurnStart(int(seq), entry, Lookup.HIT, *previous)

    async def open_turn(self, key: str) -> int:
        """Number a turn that began with sequence 0, storing its conversation in its scope's
        index (which may delete the scope's least recently used ones past its share)."""
        async with self._deadline():
            seq, evicted = await self._open(keys=self._keys(key), args=self._touch_args(key))
        self._evicted(key, evicted)
        return int(seq)

    async def commit(self, key: str, entry: TurnEntry) -> bool:
        """Store ``entry`` unless a later-started turn already committed."""
        return await self._settle(
            key, entry.seq, entry.to_json(), entry.decode_url, entry.prefill_url
        )

    async def place(self, key: str, seq: int, decode_url: str, prefill_url: str | None) -> bool:
        """Record where turn ``seq`` ran, with no entry, unless a later-started turn already
        committed."""
        return await self._settle(key, seq, "", decode_url, prefill_url)

    async def _settle(
        self, key: str, seq: int, entry: str, decode_url: str, prefill_url: str | None
    ) -> bool:
        """Turn ``seq``'s commit: its entry (``""``: none) and replicas, if no newer turn won."""
        args = [*self._touch_args(key), seq, entry, decode_url, prefill_url or ""]
        async with self._deadline():
            stored, evicted = await self._commit(keys=self._keys(key), args=args)
        self._evicted(key, evicted)
        return bool(stored)

    async def restore(self, key: str, entry: TurnEntry) -> bool:
        """Put back an entry taken by a failed turn, if nothing newer was committed."""
        args: list[str | int] = [entry.seq, entry.to_json()]
        async with self._deadline():
            return bool(await self._restore(keys=self._keys(key)[:1], args=args))

    async def drop(self, key: str, seq: int) -> bool:
        """Remove the entry turn ``seq`` committed, if it is still there untaken."""
        async with self._deadline():
            return bool(await self._drop(keys=self._keys(key)[:1], args=[seq]))

    async def forget(self, key: str) -> tuple[bool, TurnEntry | None]:
        """Remove the conversation; whether it was known, and its entry."""
        async with self._deadline():
            known, raw = await self._forget(keys=self._keys(key), args=[split_key(key)[1]])
        return bool(known), TurnEntry.from_json(raw) if raw is not None else None

    async def check(self) -> None:
        """Raise if Redis does not answer a PING within the timeout."""
        async with self._deadline():
            await self._redis.ping()

    async def close(self) -> None:
        """Close the connection pool."""
        await self._redis.aclose()
