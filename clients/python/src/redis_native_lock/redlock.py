"""RedLock over N independent redis-lock servers (sync and asyncio).

    from redis_native_lock.redlock import RedLock

    servers = [redis.Redis(port=p, socket_connect_timeout=0.1, socket_timeout=0.1,
                           retry=Retry(NoBackoff(), 0)) for p in five_ports]
    with RedLock(servers).lock("orders:42", ttl=10) as lease:
        ...  # finish well within lease.remaining()

Ask every server with `LOCK.ACQUIRE key owner ttl` (no WAIT: one slow server
must not eat the lease), one owner for all; held if a majority granted it
and the time spent asking left some validity (ttl - elapsed - drift).
Otherwise release everywhere (also where the reply was lost) and retry
after a random delay. Each server issues its own fencing token
(`lease.tokens`: server index -> token); they are not comparable across
servers. See the project's docs/redlock.md for what RedLock cannot promise.
"""

from __future__ import annotations

import asyncio
import random
import time
from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Dict, Iterator, List, Mapping, Optional, Sequence

import redis

from ._common import KeyT, LockNotAcquired, check_client, ms, new_owner, owner_bytes

__all__ = ["RedLock", "AsyncRedLock", "RedLease", "LockNotAcquired"]


class RedLease:
    """A quorum's grant: owner, per-server tokens, validity."""

    def __init__(self, key: KeyT, owner: bytes, ttl_ms: int, tokens: Dict[int, int], validity_ms: float, started: float):
        self.key = key
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.tokens = tokens
        self.validity_ms = validity_ms
        self._valid_until = started + validity_ms / 1000

    def remaining(self) -> float:
        """Seconds of validity left on this process's monotonic clock."""
        return max(0.0, self._valid_until - time.monotonic())


def _with_token(args: Sequence[Any], tokens: Optional[Mapping[int, Optional[int]]], i: int) -> Optional[List[Any]]:
    """The command for server `i`: `args` (no `tokens`), `args TOKEN t` where
    this lease's grant there has token t, `args` alone where `tokens` says
    None (a grant in doubt of an owner of the package's), else nothing."""
    if tokens is None:
        return list(args)
    if i not in tokens:
        return None
    t = tokens[i]
    return list(args) if t is None else [*args, "TOKEN", t]


def _tokens_or_owner(me: bytes, owner: Optional[KeyT], replies: List[Any]) -> Dict[int, Optional[int]]:
    """After a failed attempt: each grant released by its token; where no
    token came back (a refusal, or a reply lost), by owner alone when the
    owner is a fresh UUID of the package's (no other grant carries it)."""
    out: Dict[int, Optional[int]] = {}
    for i, r in enumerate(replies):
        if isinstance(r, int) and not isinstance(r, bool):
            out[i] = r
        elif owner is None:
            out[i] = None
    return out


class _Base:
    def __init__(self, servers: Sequence[Any], retries: int = 3, retry_delay: float = 0.2, drift_factor: float = 0.01):
        if not servers:
            raise ValueError("RedLock needs at least one server")
        for s in servers:
            check_client(s, want_async=self._ASYNC, cls=type(self).__name__)
        self.servers = list(servers)
        self.quorum = len(self.servers) // 2 + 1
        self.retries = retries
        self.retry_delay = retry_delay
        self.drift_factor = drift_factor

    _ASYNC = False

    def _outcome(self, key: KeyT, owner: bytes, ttl_ms: int, replies: List[Any], started: float) -> Optional[RedLease]:
        tokens = {i: t for i, t in enumerate(replies) if isinstance(t, int) and not isinstance(t, bool)}
        elapsed_ms = (time.monotonic() - started) * 1000
        validity_ms = ttl_ms - elapsed_ms - (ttl_ms * self.drift_factor + 2)
        if len(tokens) >= self.quorum and validity_ms > 0:
            return RedLease(key, owner, ttl_ms, tokens, validity_ms, started)
        return None

    def _extended(self, lease: RedLease, ttl_ms: int, renewed: int, started: float) -> bool:
        """Held again if a quorum renewed it with validity left."""
        validity_ms = ttl_ms - (time.monotonic() - started) * 1000 - (ttl_ms * self.drift_factor + 2)
        if renewed >= self.quorum and validity_ms > 0:
            lease.ttl_ms, lease.validity_ms = ttl_ms, validity_ms
            lease._valid_until = started + validity_ms / 1000
            return True
        return False

    def _not_acquired(self, key: KeyT) -> LockNotAcquired:
        return LockNotAcquired(f"{key!r}: no quorum of {self.quorum}/{len(self.servers)} servers granted it")


class RedLock(_Base):
    """RedLock with blocking redis-py clients of independent masters (short
    socket timeouts, no retries: a dead server must cost little)."""

    def _each(self, *args: Any, tokens: Optional[Mapping[int, Optional[int]]] = None) -> List[Any]:
        """`args` on every server; with `tokens`, `... TOKEN t` on each server
        that granted this lease (its token), nothing on the others."""
        out = []
        for i, s in enumerate(self.servers):
            cmd = _with_token(args, tokens, i)
            try:
                out.append(s.execute_command(*cmd) if cmd is not None else None)
            except redis.RedisError:
                out.append(None)
        return out

    def acquire(self, key: KeyT, ttl: float, owner: Optional[KeyT] = None) -> Optional[RedLease]:
        ttl_ms = ms(ttl, "ttl")
        me = owner_bytes(owner) if owner is not None else new_owner()
        for attempt in range(self.retries):
            if attempt:
                time.sleep(random.uniform(0, self.retry_delay))
            started = time.monotonic()
            replies = self._each("LOCK.ACQUIRE", key, me, ttl_ms)
            lease = self._outcome(key, me, ttl_ms, replies, started)
            if lease is not None:
                return lease
            self._each("LOCK.RELEASE", key, me, tokens=_tokens_or_owner(me, owner, replies))
        return None

    def extend(self, lease: RedLease, ttl: Optional[float] = None) -> bool:
        ttl_ms = ms(ttl, "ttl") if ttl is not None else lease.ttl_ms
        started = time.monotonic()
        renewed = sum(r == 1 for r in self._each("LOCK.RENEW", lease.key, lease.owner, ttl_ms, tokens=lease.tokens))
        return self._extended(lease, ttl_ms, renewed, started)

    def release(self, lease: RedLease) -> int:
        return sum(r is not None for r in self._each("LOCK.RELEASE", lease.key, lease.owner, tokens=lease.tokens))

    @contextmanager
    def lock(self, key: KeyT, ttl: float) -> Iterator[RedLease]:
        lease = self.acquire(key, ttl)
        if lease is None:
            raise self._not_acquired(key)
        try:
            yield lease
        finally:
            self.release(lease)


class AsyncRedLock(_Base):
    """RedLock with `redis.asyncio` clients; the servers are asked at once.
    The same methods as `RedLock`, awaited."""

    _ASYNC = True

    async def _each(self, *args: Any, tokens: Optional[Mapping[int, Optional[int]]] = None) -> List[Any]:
        async def one(i: int, s: Any) -> Any:
            cmd = _with_token(args, tokens, i)
            try:
                return await s.execute_command(*cmd) if cmd is not None else None
            except redis.RedisError:
                return None

        return list(await asyncio.gather(*(one(i, s) for i, s in enumerate(self.servers))))

    async def acquire(self, key: KeyT, ttl: float, owner: Optional[KeyT] = None) -> Optional[RedLease]:
        ttl_ms = ms(ttl, "ttl")
        me = owner_bytes(owner) if owner is not None else new_owner()
        for attempt in range(self.retries):
            if attempt:
                await asyncio.sleep(random.uniform(0, self.retry_delay))
            started = time.monotonic()
            replies = await self._each("LOCK.ACQUIRE", key, me, ttl_ms)
            lease = self._outcome(key, me, ttl_ms, replies, started)
            if lease is not None:
                return lease
            await self._each("LOCK.RELEASE", key, me, tokens=_tokens_or_owner(me, owner, replies))
        return None

    async def extend(self, lease: RedLease, ttl: Optional[float] = None) -> bool:
        ttl_ms = ms(ttl, "ttl") if ttl is not None else lease.ttl_ms
        started = time.monotonic()
        renewed = sum(r == 1 for r in await self._each("LOCK.RENEW", lease.key, lease.owner, ttl_ms, tokens=lease.tokens))
        return self._extended(lease, ttl_ms, renewed, started)

    async def release(self, lease: RedLease) -> int:
        return sum(r is not None for r in await self._each("LOCK.RELEASE", lease.key, lease.owner, tokens=lease.tokens))

    @asynccontextmanager
    async def lock(self, key: KeyT, ttl: float) -> AsyncIterator[RedLease]:
        lease = await self.acquire(key, ttl)
        if lease is None:
            raise self._not_acquired(key)
        try:
            yield lease
        finally:
            await self.release(lease)
