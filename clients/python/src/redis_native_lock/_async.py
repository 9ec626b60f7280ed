"""The asyncio API, on redis-py's `redis.asyncio.Redis` and
`redis.asyncio.RedisCluster`: the same classes and methods as the blocking
API, with `await` and `async with`."""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Union

import redis
from redis.asyncio.cluster import RedisCluster

from ._common import (
    DeadlockError,
    KeyT,
    Kind,
    LeaseLost,
    LockError,
    LockNotAcquired,
    as_str,
    ms,
    new_owner,
    parse_info,
    translate,
)

_DEFAULT: Any = object()

OnLost = Callable[["Holder", str], Union[None, Awaitable[None]]]


class _Keeper:
    """One task per event loop for every holder on it: renews each one at a
    third of its ttl (`LOCK.KEEPALIVE` on its bound connection, one per
    connection; else `LOCK.RENEW`). Not a task per lock."""

    def __init__(self) -> None:
        self._due: Dict["Holder", float] = {}
        self._wake = asyncio.Event()
        self._task: Optional["asyncio.Task[None]"] = None

    def add(self, holder: "Holder", due: float) -> None:
        self._due[holder] = due
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._wake.set()

    def remove(self, holder: "Holder") -> None:
        self._due.pop(holder, None)

    async def _run(self) -> None:
        while True:
            if not self._due:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=30)
                except asyncio.TimeoutError:
                    if not self._due:
                        self._task = None
                        return
                continue
            now = time.monotonic()
            first = min(self._due.values())
            if first > now:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=first - now)
                except asyncio.TimeoutError:
                    pass
                continue
            ready = [h for h, d in self._due.items() if d <= now]
            for h in ready:
                del self._due[h]
            for h in ready:
                next_due = await h._renew()
                if next_due is not None and h._holds > 0 and not h._lost:
                    self._due[h] = next_due


_keepers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Keeper]" = weakref.WeakKeyDictionary()


def _keeper() -> _Keeper:
    loop = asyncio.get_running_loop()
    k = _keepers.get(loop)
    if k is None:
        k = _keepers[loop] = _Keeper()
    return k


class _Pool:
    """Connections for bound holders, made like the client's own (same
    class, host, credentials, database, protocol) but without a socket
    timeout, so that a reply that comes when the lock frees is never cut;
    one per holder while it holds, kept for the next holder after a clean
    release. One per client pool (in a cluster: per node)."""

    # Per client pool, forgotten with it (its idle connections then close);
    # cluster nodes take no weak references: by id, checked.
    _by_pool: "weakref.WeakKeyDictionary[Any, _Pool]" = weakref.WeakKeyDictionary()
    _by_node: "Dict[int, _Pool]" = {}

    def __init__(self, source: Any) -> None:
        self._source = source
        self._cls = source.connection_class
        kwargs = dict(source.connection_kwargs)
        kwargs["socket_timeout"] = None
        self._kwargs = kwargs
        self._idle: List[Any] = []

    @classmethod
    async def of(cls, client: Any, key: KeyT) -> "_Pool":
        if isinstance(client, RedisCluster):
            # The slot map is learnt at the first command: ask for it now.
            await client.initialize()
            node = client.get_node_from_key(key)
            p = cls._by_node.get(id(node))
            if p is None or p._source is not node:
                p = cls._by_node[id(node)] = cls(node)
            return p
        pool = client.connection_pool
        p = cls._by_pool.get(pool)
        if p is None:
            p = cls._by_pool[pool] = cls(pool)
        return p

    async def get(self) -> Any:
        if self._idle:
            return self._idle.pop()
        return self._cls(**self._kwargs)

    async def put(self, conn: Any, clean: bool) -> None:
        if clean and len(self._idle) < 16:
            self._idle.append(conn)
            return
        await conn.disconnect()  # the server frees whatever it still held


class Holder:
    """One holder of one lock kind: its owner, token, lease and connection.

    Not for sharing between threads for acquire/release (the keeper thread
    renews it safely in the background)."""

    def __init__(
        self,
        client: Any,
        kind: Kind,
        *,
        ttl: float = 30.0,
        wait: Optional[float] = 10.0,
        owner: Optional[KeyT] = None,
        bind: bool = True,
        on_lost: Optional[OnLost] = None,
    ) -> None:
        self._client = client
        self._kind = kind
        self.ttl = ttl
        self._ttl_ms = ms(ttl, "ttl")
        self.wait = wait
        self.owner: str = as_str(owner) if owner else new_owner()
        self.bind = bind
        self._on_lost = on_lost
        #: The fencing token of the grant (MultiLock: the highest of `tokens`).
        self.token: Optional[int] = None
        #: The tokens per key, in key order (one for single-key kinds).
        self.tokens: List[int] = []
        self._holds = 0
        self._conn: Any = None
        self._pool: Any = None
        self._io = asyncio.Lock()
        self._valid_until = 0.0
        self._lost = False
        self._lost_why: Optional[str] = None

    # -- what a user reads ------------------------------------------------

    @property
    def keys(self) -> List[KeyT]:
        return list(self._kind.keys)

    @property
    def bound(self) -> bool:
        """Held with `BIND` on a connection of its own."""
        return self._conn is not None

    @property
    def lost(self) -> bool:
        """True once the lease is known gone, or may have run out."""
        return self._holds > 0 and (self._lost or time.monotonic() >= self._valid_until)

    def check(self) -> None:
        """Raises LeaseLost if the lease is gone: call it before a protected write."""
        if self.lost:
            raise LeaseLost(self._message())

    async def locked(self) -> bool:
        """Whether anyone holds the (first) key."""
        return (await self._info()) is not None

    async def owned(self) -> bool:
        """Whether this holder holds the (first) key, as the server says."""
        info = await self._info()
        return info is not None and any(h["owner"] == self.owner for h in info["holders"])

    async def _info(self) -> Optional[Dict[str, Any]]:
        key = self._kind.keys[0]
        return parse_info(await self._client.execute_command("LOCK.INFO", key))

    # -- acquire ----------------------------------------------------------

    async def acquire(self, wait: Optional[float] = _DEFAULT) -> bool:
        """Asks for the lock, waiting in the server up to `wait` seconds
        (None or 0: do not wait; inf: without limit). True when granted (the
        token is `self.token`), False when the wait ran out. Raises
        DeadlockError when waiting would close a cycle of waits."""
        if wait is _DEFAULT:
            wait = self.wait
        async with self._io:
            sent = time.monotonic()
            reply = await self._send_acquire(wait)
            if reply is None:
                if self._holds == 0:
                    await self._give_back(clean=True)
                return False
            self.tokens = [int(t) for t in reply] if isinstance(reply, list) else [int(reply)]
            self.token = max(self.tokens)
            self._holds = self._holds + 1 if self._kind.reentrant else 1
            self._valid_until = sent + self._ttl_ms / 1000
            self._lost = False
            self._lost_why = None
        _keeper().add(self, time.monotonic() + self._ttl_ms / 3000)
        return True

    async def _send_acquire(self, wait: Optional[float]) -> Any:
        """Sends the acquire on a connection of the package's own, without a
        socket timeout (a waiting reply comes only when the lock frees): the
        holder's bound connection if it has one, else one that stays bound
        to it (`BIND`) or goes back at once."""
        if self._conn is not None:  # a bound holder asks again
            try:
                return await self._call(self._kind.acquire(self.owner, self._ttl_ms, wait, True))
            except redis.ResponseError as e:
                raise translate(e) from e
        key = self._kind.keys[0]
        moved = False
        while True:
            pool = await _Pool.of(self._client, key)
            conn = await pool.get()
            args = self._kind.acquire(self.owner, self._ttl_ms, wait, self.bind)
            try:
                await conn.send_command(*args)
                reply = await conn.read_response()
            except redis.exceptions.MovedError:
                # The slot moved: learn the new map, then ask its node.
                await pool.put(conn, True)
                if moved:
                    raise
                moved = True
                await self._client.nodes_manager.initialize()
                continue
            except redis.ResponseError as e:
                await pool.put(conn, True)
                if self.bind and "syntax" in str(e).lower():
                    self.bind = False  # a server without BIND: lease watchdog
                    continue
                raise translate(e) from e
            except BaseException:
                # It may have been granted as we stopped listening (or the
                # task was cancelled): closing the connection frees a bound
                # grant; an unbound one is released.
                await pool.put(conn, False)
                if not self.bind:
                    await self._release_quietly()
                raise
            if self.bind and reply is not None:
                self._pool, self._conn = pool, conn
            else:
                await pool.put(conn, True)
            return reply

    # -- while held -------------------------------------------------------

    async def _call(self, args: Sequence[Any]) -> Any:
        """One command, on the bound connection if any (callers hold _io)."""
        if self._conn is None:
            return await self._client.execute_command(*args)
        await self._conn.send_command(*args)
        return await self._conn.read_response()

    async def _renew(self) -> Optional[float]:
        """The keeper's tick: renew, or find the lease lost. Returns when to
        renew next (None: stop)."""
        async with self._io:
            if self._holds == 0 or self._lost:
                return None
            sent = time.monotonic()
            try:
                if self._conn is not None:
                    renewed = await self._call(["LOCK.KEEPALIVE", self._ttl_ms])
                    ok = isinstance(renewed, int) and renewed >= len(self._kind.keys)
                    why = "LOCK.KEEPALIVE renewed fewer locks than held: released, expired or deleted"
                else:
                    replies = [
                        await self._call(["LOCK.RENEW", k, self.owner, self._ttl_ms])
                        for k in self._kind.keys
                    ]
                    ok = all(r == 1 for r in replies)
                    why = "LOCK.RENEW answered 0: the lease expired or the key was deleted"
            except (redis.ConnectionError, redis.TimeoutError) as e:
                if self._conn is not None:
                    await self._lose(f"the connection the lock was bound to failed ({e})")
                    await self._give_back(clean=False)
                    return None
                if time.monotonic() >= self._valid_until:
                    await self._lose(f"renewals failed until the lease ran out ({e})")
                    return None
                return time.monotonic() + min(1.0, self._ttl_ms / 3000)
            except redis.RedisError as e:
                await self._lose(f"renewal refused ({e})")
                return None
            if not ok:
                await self._lose(why)
                return None
            self._valid_until = sent + self._ttl_ms / 1000
            return time.monotonic() + self._ttl_ms / 3000

    async def extend(self, ttl: Optional[float] = None) -> None:
        """Sets the lease to `ttl` seconds from now (default: the lock's ttl);
        later renewals use it too. Raises LeaseLost if it was no longer held."""
        ttl_ms = ms(ttl, "ttl") if ttl is not None else self._ttl_ms
        async with self._io:
            if self._holds == 0:
                raise LockError("extend() of a lock not held")
            sent = time.monotonic()
            replies = [await self._call(["LOCK.RENEW", k, self.owner, ttl_ms]) for k in self._kind.keys]
            if not all(r == 1 for r in replies):
                await self._lose("LOCK.RENEW answered 0: the lease expired or the key was deleted")
                raise LeaseLost(self._message())
            self._ttl_ms = ttl_ms
            self.ttl = ttl_ms / 1000
            self._valid_until = sent + ttl_ms / 1000

    # -- release ----------------------------------------------------------

    async def release(self) -> None:
        """Gives back one hold (all of a non-reentrant lock). Raises LeaseLost
        if the server no longer counted it as ours."""
        async with self._io:
            if self._holds == 0:
                raise LockError("release() of a lock not held")
            try:
                replies = [await self._call(["LOCK.RELEASE", k, self.owner]) for k in self._kind.keys]
            except (redis.RedisError, asyncio.CancelledError):
                self._holds = 0
                _keeper().remove(self)
                await self._give_back(clean=False)
                raise
            gone = any(r is None for r in replies)
            self._holds = 0 if gone or not self._kind.reentrant else self._holds - 1
            if any(r == 1 for r in replies):
                self._holds = 0
            if self._holds == 0:
                _keeper().remove(self)
                await self._give_back(clean=not gone)
            if gone:
                await self._lose("LOCK.RELEASE answered nil: the lock was no longer ours")
                raise LeaseLost(self._message())

    async def _release_quietly(self) -> None:
        for k in self._kind.keys:
            try:
                await self._client.execute_command("LOCK.RELEASE", k, self.owner)
            except redis.RedisError:
                pass  # the lease ends by itself

    async def _give_back(self, clean: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        await self._pool.put(conn, clean)

    async def _lose(self, why: str) -> None:
        first = not self._lost
        self._lost = True
        if self._lost_why is None:
            self._lost_why = why
        _keeper().remove(self)
        if first and self._on_lost is not None:
            try:
                result = self._on_lost(self, why)
                if asyncio.iscoroutine(result):
                    await result
            except Exception:  # noqa: BLE001 - a callback must not kill the keeper
                pass

    def _message(self) -> str:
        why = self._lost_why or "its ttl ran out without a successful renewal"
        return f"lease on {self._kind.keys!r} (token {self.token}) lost: {why}"

    # -- with -------------------------------------------------------------

    async def __aenter__(self) -> "Holder":
        if not await self.acquire():
            raise LockNotAcquired(f"{self._kind.keys!r} not acquired within {self.wait}s")
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            try:
                await self.release()
            except (LockError, redis.RedisError):
                pass  # the work's own exception goes through
            return
        await self.release()

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} keys={self._kind.keys!r} owner={self.owner!r} "
            f"token={self.token} holds={self._holds} bound={self.bound}>"
        )


class Lock(Holder):
    """An exclusive lock (`LOCK.ACQUIRE`): one holder; a repeat acquire by
    the same holder renews it (same token)."""

    def __init__(self, client: Any, key: KeyT, **kw: Any) -> None:
        super().__init__(client, Kind("LOCK.ACQUIRE", [key]), **kw)


class ReentrantLock(Holder):
    """A reentrant exclusive lock (`LOCK.RACQUIRE`): each acquire adds a
    hold, each release removes one (Redisson's RLock)."""

    def __init__(self, client: Any, key: KeyT, **kw: Any) -> None:
        super().__init__(client, Kind("LOCK.RACQUIRE", [key]), **kw)


class ReadWriteLock:
    """A read-write lock on one key (Redisson's RReadWriteLock): `.read()`
    shared (`LOCK.READ`), `.write()` exclusive and reentrant
    (`LOCK.RACQUIRE`), with writer preference. Each is its own holder."""

    def __init__(self, client: Any, key: KeyT, **kw: Any) -> None:
        self._read = Holder(client, Kind("LOCK.READ", [key]), **kw)
        write_kw = dict(kw)
        write_kw.pop("owner", None)
        self._write = Holder(client, Kind("LOCK.RACQUIRE", [key]), **write_kw)

    def read(self) -> Holder:
        return self._read

    def write(self) -> Holder:
        return self._write


class Semaphore(Holder):
    """One permit of a semaphore of `limit` permits (`LOCK.SEMAPHORE`): each
    permit has its owner, lease and token, and cannot leak."""

    def __init__(self, client: Any, key: KeyT, limit: int, **kw: Any) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an integer >= 1, not {limit!r}")
        super().__init__(client, Kind("LOCK.SEMAPHORE", [key], limit), **kw)


class MultiLock(Holder):
    """Exclusive holds on several keys at once, all or none
    (`LOCK.MACQUIRE`). In a cluster the keys must share a hash slot."""

    def __init__(self, client: Any, keys: Sequence[KeyT], **kw: Any) -> None:
        if not keys:
            raise ValueError("MultiLock needs at least one key")
        super().__init__(client, Kind("LOCK.MACQUIRE", list(keys)), **kw)


__all__ = [
    "Holder",
    "Lock",
    "ReentrantLock",
    "ReadWriteLock",
    "Semaphore",
    "MultiLock",
    "LockError",
    "LockNotAcquired",
    "LeaseLost",
    "DeadlockError",
]
