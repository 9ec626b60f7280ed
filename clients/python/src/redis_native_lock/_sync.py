"""The blocking API, on redis-py's `Redis` and `RedisCluster`."""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence

import redis
from redis.cluster import RedisCluster

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

OnLost = Callable[["Holder", str], None]


class _Keeper:
    """One thread for every holder of the process: renews each one at a
    third of its ttl (`LOCK.KEEPALIVE` on its bound connection, one per
    connection; else `LOCK.RENEW`). Not a thread per lock."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._due: Dict["Holder", float] = {}
        self._thread: Optional[threading.Thread] = None

    def add(self, holder: "Holder", due: float) -> None:
        with self._cv:
            self._due[holder] = due
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="redis-native-lock-keeper", daemon=True
                )
                self._thread.start()
            self._cv.notify()

    def remove(self, holder: "Holder") -> None:
        with self._cv:
            self._due.pop(holder, None)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._due:
                    if not self._cv.wait(timeout=30):
                        if not self._due:
                            self._thread = None
                            return
                now = time.monotonic()
                first = min(self._due.values())
                if first > now:
                    self._cv.wait(timeout=first - now)
                    continue
                ready = [h for h, d in self._due.items() if d <= now]
                for h in ready:
                    del self._due[h]
            for h in ready:
                next_due = h._renew()
                if next_due is not None:
                    with self._cv:
                        if h._holds > 0 and not h._lost:
                            self._due[h] = next_due


_keeper = _Keeper()


def _source(client: Any, key: KeyT) -> Any:
    """The client's pool that serves `key` (in a cluster: its node's)."""
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(key)
        return client.get_redis_connection(node).connection_pool
    return client.connection_pool


class _Dedicated:
    """Connections for bound holders, made like the client's own (same
    class, host, credentials, database, protocol) but without a socket
    timeout, so that a reply that comes when the lock frees is never cut;
    one per holder while it holds, kept for the next holder after a clean
    release. One per client pool."""

    # Per client pool, forgotten with it (its idle connections then close).
    _all: "weakref.WeakKeyDictionary[Any, _Dedicated]" = weakref.WeakKeyDictionary()
    _guard = threading.Lock()

    def __init__(self, source: Any) -> None:
        self._cls = source.connection_class
        kwargs = dict(source.connection_kwargs)
        kwargs["socket_timeout"] = None
        self._kwargs = kwargs
        self._idle: List[Any] = []
        self._lock = threading.Lock()

    @classmethod
    def of(cls, client: Any, key: KeyT) -> "_Dedicated":
        source = _source(client, key)
        with cls._guard:
            d = cls._all.get(source)
            if d is None:
                d = cls._all[source] = cls(source)
            return d

    def get(self) -> Any:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._cls(**self._kwargs)

    def put(self, conn: Any, clean: bool) -> None:
        if clean:
            with self._lock:
                if len(self._idle) < 16:
                    self._idle.append(conn)
                    return
        conn.disconnect()  # the server frees whatever it still held


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
        self._io = threading.RLock()
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

    def locked(self) -> bool:
        """Whether anyone holds the (first) key."""
        return self._info() is not None

    def owned(self) -> bool:
        """Whether this holder holds the (first) key, as the server says."""
        info = self._info()
        return info is not None and any(h["owner"] == self.owner for h in info["holders"])

    def _info(self) -> Optional[Dict[str, Any]]:
        key = self._kind.keys[0]
        return parse_info(self._client.execute_command("LOCK.INFO", key))

    # -- acquire ----------------------------------------------------------

    def acquire(self, wait: Optional[float] = _DEFAULT) -> bool:
        """Asks for the lock, waiting in the server up to `wait` seconds
        (None or 0: do not wait; inf: without limit). True when granted (the
        token is `self.token`), False when the wait ran out. Raises
        DeadlockError when waiting would close a cycle of waits."""
        if wait is _DEFAULT:
            wait = self.wait
        with self._io:
            sent = time.monotonic()
            reply = self._send_acquire(wait)
            if reply is None:
                if self._holds == 0:
                    self._give_back(clean=True)
                return False
            self.tokens = [int(t) for t in reply] if isinstance(reply, list) else [int(reply)]
            self.token = max(self.tokens)
            self._holds = self._holds + 1 if self._kind.reentrant else 1
            self._valid_until = sent + self._ttl_ms / 1000
            self._lost = False
            self._lost_why = None
        _keeper.add(self, time.monotonic() + self._ttl_ms / 3000)
        return True

    def _send_acquire(self, wait: Optional[float]) -> Any:
        """Sends the acquire on a connection of the package's own, without a
        socket timeout (a waiting reply comes only when the lock frees): the
        holder's bound connection if it has one, else one that stays bound
        to it (`BIND`) or goes back at once."""
        if self._conn is not None:  # a bound holder asks again
            try:
                return self._call(self._kind.acquire(self.owner, self._ttl_ms, wait, True))
            except redis.ResponseError as e:
                raise translate(e) from e
        key = self._kind.keys[0]
        moved = False
        while True:
            pool = _Dedicated.of(self._client, key)
            conn = pool.get()
            args = self._kind.acquire(self.owner, self._ttl_ms, wait, self.bind)
            try:
                conn.send_command(*args)
                reply = conn.read_response()
            except redis.exceptions.MovedError:
                # The slot moved: learn the new map, then ask its node.
                pool.put(conn, True)
                if moved:
                    raise
                moved = True
                self._client.nodes_manager.initialize()
                continue
            except redis.ResponseError as e:
                pool.put(conn, True)
                if self.bind and "syntax" in str(e).lower():
                    self.bind = False  # a server without BIND: lease watchdog
                    continue
                raise translate(e) from e
            except BaseException:
                # It may have been granted as we stopped listening: closing
                # the connection frees a bound grant; an unbound one is
                # released.
                pool.put(conn, False)
                if not self.bind:
                    self._release_quietly()
                raise
            if self.bind and reply is not None:
                self._pool, self._conn = pool, conn
            else:
                pool.put(conn, True)
            return reply

    # -- while held -------------------------------------------------------

    def _call(self, args: Sequence[Any]) -> Any:
        if self._conn is None:
            return self._client.execute_command(*args)
        with self._io:
            self._conn.send_command(*args)
            return self._conn.read_response()

    def _renew(self) -> Optional[float]:
        """The keeper's tick: renew, or find the lease lost. Returns when to
        renew next (None: stop)."""
        with self._io:
            if self._holds == 0 or self._lost:
                return None
            sent = time.monotonic()
            try:
                if self._conn is not None:
                    renewed = self._call(["LOCK.KEEPALIVE", self._ttl_ms])
                    ok = isinstance(renewed, int) and renewed >= len(self._kind.keys)
                    why = "LOCK.KEEPALIVE renewed fewer locks than held: released, expired or deleted"
                else:
                    replies = [
                        self._call(["LOCK.RENEW", k, self.owner, self._ttl_ms]) for k in self._kind.keys
                    ]
                    ok = all(r == 1 for r in replies)
                    why = "LOCK.RENEW answered 0: the lease expired or the key was deleted"
            except (redis.ConnectionError, redis.TimeoutError) as e:
                if self._conn is not None:
                    self._lose(f"the connection the lock was bound to failed ({e})")
                    self._give_back(clean=False)
                    return None
                if time.monotonic() >= self._valid_until:
                    self._lose(f"renewals failed until the lease ran out ({e})")
                    return None
                return time.monotonic() + min(1.0, self._ttl_ms / 3000)
            except redis.RedisError as e:
                self._lose(f"renewal refused ({e})")
                return None
            if not ok:
                self._lose(why)
                return None
            self._valid_until = sent + self._ttl_ms / 1000
            return time.monotonic() + self._ttl_ms / 3000

    def extend(self, ttl: Optional[float] = None) -> None:
        """Sets the lease to `ttl` seconds from now (default: the lock's ttl);
        later renewals use it too. Raises LeaseLost if it was no longer held."""
        ttl_ms = ms(ttl, "ttl") if ttl is not None else self._ttl_ms
        with self._io:
            if self._holds == 0:
                raise LockError("extend() of a lock not held")
            sent = time.monotonic()
            replies = [self._call(["LOCK.RENEW", k, self.owner, ttl_ms]) for k in self._kind.keys]
            if not all(r == 1 for r in replies):
                self._lose("LOCK.RENEW answered 0: the lease expired or the key was deleted")
                raise LeaseLost(self._message())
            self._ttl_ms = ttl_ms
            self.ttl = ttl_ms / 1000
            self._valid_until = sent + ttl_ms / 1000

    # -- release ----------------------------------------------------------

    def release(self) -> None:
        """Gives back one hold (all of a non-reentrant lock). Raises LeaseLost
        if the server no longer counted it as ours."""
        with self._io:
            if self._holds == 0:
                raise LockError("release() of a lock not held")
            try:
                replies = [self._call(["LOCK.RELEASE", k, self.owner]) for k in self._kind.keys]
            except redis.RedisError:
                self._holds = 0
                _keeper.remove(self)
                self._give_back(clean=False)
                raise
            gone = any(r is None for r in replies)
            self._holds = 0 if gone or not self._kind.reentrant else self._holds - 1
            if any(r == 1 for r in replies):
                self._holds = 0
            if self._holds == 0:
                _keeper.remove(self)
                self._give_back(clean=not gone)
            if gone:
                self._lose("LOCK.RELEASE answered nil: the lock was no longer ours")
                raise LeaseLost(self._message())

    def _release_quietly(self) -> None:
        for k in self._kind.keys:
            try:
                self._client.execute_command("LOCK.RELEASE", k, self.owner)
            except redis.RedisError:
                pass  # the lease ends by itself

    def _give_back(self, clean: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._pool.put(conn, clean)

    def _lose(self, why: str) -> None:
        first = not self._lost
        self._lost = True
        if self._lost_why is None:
            self._lost_why = why
        _keeper.remove(self)
        if first and self._on_lost is not None:
            try:
                self._on_lost(self, why)
            except Exception:  # noqa: BLE001 - a callback must not kill the keeper
                pass

    def _message(self) -> str:
        why = self._lost_why or "its ttl ran out without a successful renewal"
        return f"lease on {self._kind.keys!r} (token {self.token}) lost: {why}"

    # -- with -------------------------------------------------------------

    def __enter__(self) -> "Holder":
        if not self.acquire():
            raise LockNotAcquired(f"{self._kind.keys!r} not acquired within {self.wait}s")
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            try:
                self.release()
            except (LockError, redis.RedisError):
                pass  # the work's own exception goes through
            return
        self.release()

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
