"""The asyncio API, on redis-py's `redis.asyncio.Redis` and
`redis.asyncio.RedisCluster`: the blocking API's classes and methods, with
`await` and `async with`.

One source for both APIs: `_sync.py` is generated from this file by
`clients/python/unasync.py` (run it after any change here; the package's
test fails while `_sync.py` is stale). What differs beyond `async`/`await`
lives in `_async_io.py` and `_sync_io.py`; nothing here calls asyncio itself.

Layout:
- `_Hold`: one acquisition's state (owner, tokens, holds, lease, bound
  connection). A holder object keeps one `_Hold` per task.
- `_Server`: per process, per client pool (in a cluster: per node): the
  package's connections to that server, its keeper task (renewals) and its
  watcher (invalidations of held keys). A stalled server stalls only its own.
- `_Lease`: a `Session` on one server (in a cluster: one node): its id,
  its deadline, the holds that follow it; renewed by that server's keeper.
- `Holder` and the five kinds: what a user calls; `Session`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
import weakref
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from . import _async_io as _io

from ._common import (
    DeadlockError,
    KeyT,
    Kind,
    LeaseLost,
    LockError,
    LockNotAcquired,
    FewerReplicas,
    NotDurable,
    acquire_timeout,
    check_replicas,
    wait_replicas,
    check_client,
    check_key,
    check_keys,
    check_wait,
    guard_args,
    guard_route,
    guarded_reply,
    holds,
    ms,
    new_owner,
    op_timeout,
    owner_bytes,
    parse_info,
    server_error,
)

OnLost = Callable[["Holder", str], Union[None, Awaitable[None]]]
AsyncClient = Union["redis.asyncio.Redis", "redis.asyncio.RedisCluster"]

_IO_ERRORS = _io.IO_ERRORS
_log = logging.getLogger("redis_native_lock")


class _Hold:
    """One acquisition by one task: what the keeper renews."""

    def __init__(self, holder: "Holder", owner: bytes, server: "_Server", ttl_ms: int) -> None:
        self.holder_ref = weakref.ref(holder)
        self.on_lost = holder._on_lost
        self.kind = holder._kind
        self.owner = owner
        self.server = server
        self.ttl_ms = ttl_ms
        self.pid = os.getpid()
        self.thread: Any = _io.current()  # the task that holds it (a Task)
        #: per task (not `owner=`, not the drop-in's thread_local=False): the
        #: task's end is the holder's end
        self.per_task = holder._owner is None and isinstance(holder._holds, _io.PerTask)
        #: granted in a task that ran only acquire() (asyncio.wait_for before
        #: Python 3.12, a TaskGroup's create_task): the task that uses the
        #: object next takes it over (`Holder._adopt`)
        self.handed = False
        self.renews = holder._renews  # False: held to its lease's end (the drop-in's timeout=)
        self.session: Optional[Session] = holder._session
        self.lease: Optional[_Lease] = None  # the session's, on this server, once granted in it
        self.granted_in: Optional[_Lease] = None  # the lease the last grant named
        self.abandoned_why: Optional[str] = None
        self.own_owner = False
        self.token: Optional[int] = None
        self.tokens: List[int] = []
        self.holds = 0
        self.conn: Any = None
        self.replicas: int = holder.replicas
        self.replicas_timeout: float = holder.replicas_timeout
        self.on_fewer: str = holder.on_fewer_replicas
        #: replicas=N: how many replicas acknowledged the last grant or renewal (None: not asked)
        self.acked: Optional[int] = None
        self.valid_until = 0.0
        self.lost = False
        self.why: Optional[str] = None
        self.pending = False  # an acquire under way (claims an owner= object)
        self.previous: Optional[_Hold] = None
        self.io = _io.Lock()

    def renewals(self, ttl_ms: int) -> List[List[Any]]:
        """`LOCK.RENEW key owner ttl TOKEN token` for each key: only this
        grant is renewed, never a later one to the same owner name."""
        return [["LOCK.RENEW", k, self.owner, ttl_ms, "TOKEN", t] for k, t in zip(self.kind.keys, self.tokens)]

    def releases(self, tokens: Optional[List[int]] = None) -> List[List[Any]]:
        """`LOCK.RELEASE key owner TOKEN token` for each key: only this grant
        is released (a stale holder's release answers nil and changes nothing)."""
        return [["LOCK.RELEASE", k, self.owner, "TOKEN", t] for k, t in zip(self.kind.keys, tokens or self.tokens)]

    def holds_all(self, infos: List[Any]) -> bool:
        """Whether LOCK.INFO of each key lists this hold: its owner under its
        own token (a newer grant to the same owner name is not this one)."""
        return len(infos) == len(self.tokens) and all(holds(i, self.owner, t) for i, t in zip(infos, self.tokens))

    def expired(self) -> bool:
        if self.lease is not None:  # a session's: its lease is the session's
            return self.holds > 0 and (self.lease.over or time.monotonic() >= self.lease.deadline)
        return self.holds > 0 and time.monotonic() >= self.valid_until

    def keeps(self) -> bool:
        """Whether the keeper keeps it after a renewal."""
        return self.holds > 0 and not self.lost

    async def call(self, args: Sequence[Any], timeout: Optional[float]) -> Any:
        """One command over the bound connection, or a connection of the
        server's, within `timeout`."""
        if self.conn is not None:
            return await _io.command(self.conn, args, timeout)
        return await self.server.call(args, timeout)

    async def lose(self, why: str) -> None:
        first = not self.lost
        self.lost = True
        if self.why is None:
            self.why = why
        self.server.forget(self)
        if self.conn is not None:
            conn, self.conn = self.conn, None
            await self.server.put(conn, clean=False)  # closing it frees the bound grant
        holder = self.holder_ref()
        session_lost = self.session.on_lost if self.session is not None and self.lease is not None else None
        for fn in (self.on_lost, session_lost):
            if first and fn is not None and holder is not None:
                try:
                    await _io.call_back(fn, holder, self.why)
                except Exception:  # noqa: BLE001 - a callback must not kill the keeper
                    pass

    async def write(self, cmds: List[List[Any]], timeout: Optional[float], what: str) -> List[Any]:
        """Commands that write (a renewal), then with replicas=N `WAIT N ms`,
        in one round trip on one connection: the bound one, else one of the
        server's. Fewer acknowledgements: `durable_check`."""
        if not self.replicas:
            return [await self.call(c, timeout) for c in cmds]
        t = None if timeout is None else timeout + self.replicas_timeout
        cmds = cmds + [wait_replicas(self.replicas, self.replicas_timeout)]
        if self.conn is not None:
            conn = self.conn
            replies = await _io.pipeline(conn, cmds, t)
        else:
            conn = await self.server.connection(self.ttl_ms)
            try:
                replies = await _io.pipeline(conn, cmds, t)
            except BaseException:
                await self.server.put(conn, False)
                raise
            await self.server.put(conn, True)
        self.durable_check(int(replies[-1]), what)
        return list(replies[:-1])

    async def wait_acks(self, conn: Any, what: str) -> None:
        """replicas=N, after a write on `conn`: `WAIT N ms` there."""
        if not self.replicas:
            return
        t = self.server.timeout(self.ttl_ms) + self.replicas_timeout
        cmd = wait_replicas(self.replicas, self.replicas_timeout)
        acked = await _io.command(conn, cmd, t)
        self.durable_check(int(acked), what)

    def durable_check(self, acked: int, what: str) -> None:
        """Fewer than `replicas` acknowledgements: NotDurable (the caller
        gives the grant back), or with on_fewer_replicas="warn" a warning."""
        self.acked = acked
        if acked >= self.replicas:
            return
        msg = (
            f"{what} of {self.kind.keys!r} acknowledged by {acked} of {self.replicas} replicas "
            f"within {self.replicas_timeout}s"
        )
        if self.on_fewer == "warn":
            warnings.warn(msg, FewerReplicas, stacklevel=3)
            return
        raise NotDurable(msg, acked, self.replicas)

    @property
    def durable(self) -> Optional[bool]:
        return None if self.acked is None else self.acked >= self.replicas

    def message(self) -> str:
        why = self.why or "its ttl ran out without a successful renewal"
        return f"lease on {self.kind.keys!r} (token {self.token}) lost: {why}"

    def abandoned(self) -> Optional[str]:
        """Why nobody can release this hold any more (None: somebody can):
        its lock object is gone, or (a hold per task) its task ended."""
        if self.holder_ref() is None:
            return "its lock object was garbage-collected while it held the lock"
        if self.per_task and not self.handed and _io.ended(self.thread):
            return "the task that acquired it ended without releasing it"
        return None

    async def closed(self) -> None:
        """The watcher saw the bound connection readable while no command
        of ours was under way on it: the server closed it (CLIENT KILL, its
        idle timeout, a shutdown or crash), which freed the lock."""
        if not await _io.try_lock(self.io):
            await _io.nap()  # a command under way: it reads its reply (or the failure) itself
            return
        try:
            if self.conn is not None and self.holds > 0 and not self.lost and _io.readable(self.conn):
                await self.lose("the server closed the bound connection (CLIENT KILL, its timeout, a restart): it freed the lock")
        finally:
            self.io.release()

    async def track(self) -> None:
        """After a command of our own on a bound hold's key (which, with
        NOLOOP, drops the key from the server's tracking table), has the
        server tell the watcher again when the key changes."""
        async with self.io:
            if self.conn is None or self.holds == 0 or self.lost:
                return
            try:
                await self.server.track(self, self.server.timeout(self.ttl_ms))
            except _IO_ERRORS as e:
                await self.lose(f"the bound connection failed ({type(e).__name__}: {e})")

    # -- the keeper's and the watcher's work -------------------------------

    async def renew(self) -> Optional[float]:
        """Renews the lease within the time it has left; returns when to
        renew next (None: stop)."""
        async with self.io:
            if self.holds == 0 or self.lost:
                return None
            sent = time.monotonic()
            left = self.valid_until - sent
            if left <= 0:
                await self.lose("the lease ran out before it could be renewed" if self.renews else "its timeout ran out (not renewed)")
                return None
            if not self.renews:
                return self.valid_until  # held to its end (its connection kept), then given up
            gone = self.abandoned()
            if gone is not None:
                if self.abandoned_why is None:
                    self.abandoned_why = self.why = f"not renewed: {gone}"
                    _log.warning(
                        "a hold of %r (token %s) is no longer renewed: %s; it ends with its lease, within %.1f s",
                        self.kind.keys,
                        self.token,
                        gone,
                        left,
                    )
                return self.valid_until
            timeout = min(self.server.timeout(self.ttl_ms), left)
            try:
                if self.conn is not None:
                    n, infos = await self.server.keepalive(self.conn, self.ttl_ms, self.kind.keys, timeout)
                    ok = n >= len(self.kind.keys) and self.holds_all(infos)
                    if ok:
                        await self.wait_acks(self.conn, "renewal")
                    why = "LOCK.KEEPALIVE found it gone: released, expired, deleted or overwritten"
                else:
                    replies = await self.write(self.renewals(self.ttl_ms), timeout, "renewal")
                    ok = all(r == 1 for r in replies)
                    why = "LOCK.RENEW answered 0: the lease expired, the key was deleted, or the owner holds it under a newer grant"
            except _IO_ERRORS as e:
                if self.conn is not None:
                    await self.lose(f"the bound connection failed or stalled ({type(e).__name__}: {e})")
                    return None
                if time.monotonic() + 0.01 >= self.valid_until:
                    await self.lose(f"renewals failed until the lease ran out ({type(e).__name__}: {e})")
                    return None
                return time.monotonic() + min(0.2, self.ttl_ms / 3000)
            except NotDurable as e:
                await self.lose(str(e))
                return None
            except redis.ResponseError as e:
                await self.lose(f"the key was replaced by another type or the renewal was refused ({e})")
                return None
            if not ok:
                await self.lose(why)
                return None
            self.valid_until = sent + self.ttl_ms / 1000
            # A third of the ttl after the renewal was sent, not after its
            # WAIT for replicas: one that ran its timeout (a replica down,
            # on_fewer_replicas="warn") would push the next renewal back by
            # it, past the lease's end for a timeout above two thirds of it.
            return sent + self.ttl_ms / 3000

    async def verify(self) -> None:
        """The watcher heard that a held key changed: is it still ours?
        (Reading the key again also keeps it tracked.)"""
        if self.lease is not None:
            await self.lease.verify(self)
            return
        async with self.io:
            if self.holds == 0 or self.lost or self.conn is None:
                return
            try:
                infos = await self.server.infos(self.conn, self.kind.keys, self.server.timeout(self.ttl_ms))
            except _IO_ERRORS as e:
                await self.lose(f"the bound connection failed or stalled ({type(e).__name__}: {e})")
                return
            except redis.ResponseError as e:
                await self.lose(f"the key was replaced by another type ({e})")
                return
            if not self.holds_all(infos):
                await self.lose("the key was deleted, overwritten or freed (told by the server at once)")


class _Server:
    """The package's connections to one server for one client pool (in a
    cluster: one node), in one process: connections made like the client's
    (class, host, credentials, database, protocol), every command on them
    within a deadline (the client's socket_timeout, else the lease's length;
    a renewal's never past the lease); idle ones kept for the next holder
    after a clean release; a keeper task renewing this server's leases, and
    a watcher connection told by the server (client tracking, `CLIENT
    TRACKING ... REDIRECT`) when a held key changes."""

    _all: Dict[Any, "_Server"] = {}
    _guard = threading.Lock()

    def __init__(self, source: Any) -> None:
        self.pid = os.getpid()
        self._source_ref = _io.ref(source)
        self._cls = source.connection_class
        kwargs = dict(source.connection_kwargs)
        self._timeout: Optional[float] = kwargs.get("socket_timeout")
        self._connect_timeout: Optional[float] = kwargs.get("socket_connect_timeout") or self._timeout
        kwargs["decode_responses"] = False  # keys and owners are bytes
        kwargs["retry"] = Retry(NoBackoff(), 0)  # a retry would double a timeout
        for k in ("maint_notifications_pool_handler", "maint_notifications_config"):
            kwargs.pop(k, None)  # the client pool's, not for connections of ours
        self._kwargs = kwargs
        self._lock = threading.Lock()  # the state below; never held across I/O
        self._idle: List[Any] = []
        self._due: Dict[Any, float] = {}  # holds and leases (`_Lease`): when to renew each
        self._bound: Set[_Hold] = set()
        self._wake = _io.Event()
        self._keeper: Any = None
        self._watcher: Any = None
        self._watcher_id: Optional[int] = None
        self._watch_task: Any = None
        self._making_watcher = _io.Lock()
        self._poke = _io.Poke()  # wakes the watcher when a bound hold comes
        self._watched: Dict[bytes, Set[_Hold]] = {}  # session holds by key (told by the watcher too)
        self._tracker: Any = None  # reads the session holds' keys for the watcher (`read_tracked`)
        self._tracking = _io.Lock()

    @classmethod
    async def of(cls, client: Any, key: KeyT) -> "_Server":
        """This process's `_Server` for the pool (or cluster node) that
        serves `key`. One made in a parent process before `fork()` is never
        used by the child (its sockets are the parent's)."""
        source = await _io.source_of(client, key)
        pid = os.getpid()
        with cls._guard:
            if any(s.pid != pid for s in cls._all.values()):
                # Forked: forget the parent's (without closing its sockets).
                cls._all = {k: s for k, s in cls._all.items() if s.pid == pid}
            s = cls._all.get(id(source))
            if s is None or s._source_ref() is not source:
                s = cls._all[id(source)] = cls(source)
            return s

    def timeout(self, ttl_ms: int) -> float:
        return op_timeout(self._timeout, ttl_ms)

    async def connection(self, ttl_ms: int, fresh: bool = False, limit: Optional[float] = None) -> Any:
        while not fresh:
            with self._lock:
                idle = self._idle.pop() if self._idle else None
            if idle is None:
                break
            if not _io.readable(idle):
                return idle
            await _io.disconnect(idle)  # closed by the server while idle (CLIENT KILL, its timeout)
        t = self.timeout(ttl_ms) if limit is None else min(self.timeout(ttl_ms), limit)  # a new one's handshake too
        kwargs = dict(self._kwargs)
        kwargs["socket_connect_timeout"] = min(self._connect_timeout or t, t)
        conn = await _io.open_connection(self._cls, kwargs, t)
        conn._rnl_tracking = None  # the watcher id this connection redirects to
        conn._rnl_hold = None  # the hold bound to it (`_io.on_close`)
        return conn

    async def put(self, conn: Any, clean: bool) -> None:
        conn._rnl_hold = None  # no hold's any more (`_io.on_close`)
        if clean and os.getpid() == self.pid:
            with self._lock:
                if len(self._idle) < 16:
                    self._idle.append(conn)
                    return
        await _io.disconnect(conn)

    async def drop_idle(self) -> None:
        """Closes the idle connections (one failed: the others may have too,
        e.g. after a `CLIENT KILL` of them all); the next command opens one."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            await _io.disconnect(conn)

    async def call(self, args: Sequence[Any], timeout: Optional[float]) -> Any:
        """One command over an idle connection of the package's own (a new
        one, handshake included, within `timeout` too)."""
        conn = await self.connection(int((timeout or 1) * 1000), limit=timeout)
        try:
            reply = await _io.command(conn, args, timeout)
        except redis.ResponseError:
            await self.put(conn, True)
            raise
        except BaseException:
            await self.put(conn, False)
            raise
        await self.put(conn, True)
        return reply

    # -- keeper -----------------------------------------------------------

    def keep(self, hold: Any, due: float) -> None:
        """Renews `hold` from `due` on (a hold that is not renewed: gives it
        up then); keeps it, and its bound connection, until it ends, whether
        or not its lock object or task still exists."""
        new_bound = False
        with self._lock:
            self._due[hold] = due
            if hold.conn is not None and hold not in self._bound:
                self._bound.add(hold)
                new_bound = True
            if not _io.alive(self._keeper):
                self._keeper = _io.spawn(self._run, name="redis-native-lock-keeper")
        self._wake.set()
        if new_bound:
            _io.on_close(hold.conn, hold)  # asyncio: told when the server closes it
            self._poke.poke()  # blocking: the watcher polls its socket too

    def forget(self, hold: Any) -> None:
        lease = getattr(hold, "lease", None)
        if lease is not None:
            lease.holds.discard(hold)
        with self._lock:
            for k in hold.kind.keys if lease is not None else ():
                held = self._watched.get(_b(k))
                if held is not None:
                    held.discard(hold)
                    if not held:
                        del self._watched[_b(k)]
            self._due.pop(hold, None)
            self._bound.discard(hold)
            watch = self._watch_task
            if self._bound or self._due or self._watched or watch is None:
                return
            # Nothing held here: the watcher goes.
            self._watch_task, self._watcher = None, None
        _io.stop(watch)

    async def _run(self) -> None:
        while True:
            self._wake.clear()  # before reading the state: a keep() after it wakes the wait
            with self._lock:
                now = time.monotonic()
                first = min(self._due.values(), default=None)
                ready = [h for h, d in self._due.items() if d <= now]
                for h in ready:
                    del self._due[h]
            if first is None:
                if not await _io.wait(self._wake, 30):
                    with self._lock:
                        if not self._due:
                            self._keeper = None
                            return
                continue
            if not ready:
                await _io.wait(self._wake, first - now)
                continue
            for h in ready:
                next_due = await h.renew()
                if next_due is not None:
                    with self._lock:
                        if h.keeps():
                            self._due[h] = next_due

    async def keepalive(self, conn: Any, ttl_ms: int, keys: Sequence[KeyT], timeout: float) -> Any:
        """`LOCK.KEEPALIVE` and `LOCK.INFO` of each key, in one round trip
        (reading the keys again keeps them tracked)."""
        replies = await _io.pipeline(conn, [["LOCK.KEEPALIVE", ttl_ms]] + [["LOCK.INFO", k] for k in keys], timeout)
        return replies[0], [parse_info(r) for r in replies[1:]]

    async def infos(self, conn: Any, keys: Sequence[KeyT], timeout: float) -> List[Any]:
        replies = await _io.pipeline(conn, [["LOCK.INFO", k] for k in keys], timeout)
        return [parse_info(r) for r in replies]

    # -- watcher ----------------------------------------------------------

    async def track(self, hold: _Hold, timeout: float) -> None:
        """Has the server tell the watcher when a key of `hold` changes:
        client tracking on its bound connection, redirected to the watcher,
        and a read of each key (what tracking remembers). Without a watcher
        (an old server, no permission), the renewals still notice."""
        try:
            wid = await self._watcher_ready(timeout)
            conn = hold.conn
            if conn._rnl_tracking != wid:
                await _io.command(conn, ["CLIENT", "TRACKING", "ON", "REDIRECT", wid, "NOLOOP"], timeout)
                conn._rnl_tracking = wid
            infos = await self.infos(conn, hold.kind.keys, timeout)
        except redis.ResponseError:
            return
        if not hold.holds_all(infos):
            await hold.lose("the key was deleted or freed right after the grant")

    def watch(self, hold: _Hold) -> None:
        """A session hold: the watcher checks it when one of its keys changes."""
        with self._lock:
            for k in hold.kind.keys:
                self._watched.setdefault(_b(k), set()).add(hold)

    def _session_holds(self, changed: Any) -> List[_Hold]:
        with self._lock:
            if changed is None:
                return [h for held in self._watched.values() for h in held]
            return [h for k in changed for h in self._watched.get(k, ())]

    def watcher_id(self) -> Optional[int]:
        """The live watcher's client id (None: none now)."""
        with self._lock:
            return self._watcher_id if self._watcher is not None and _io.alive(self._watch_task) else None

    async def read_tracked(self, keys: Sequence[KeyT], timeout: float) -> Optional[List[Any]]:
        """LOCK.INFO of `keys` on the tracker: a connection of the package's
        (never pooled: a tracking connection whose watcher goes is told so)
        with client tracking redirected to the watcher, so that the server
        tells the watcher when one changes (a session's holds: a CLOSE from
        elsewhere is known at once). None when the server has no tracking."""
        try:
            wid = await self._watcher_ready(timeout)
        except redis.ResponseError:
            return None
        async with self._tracking:
            conn = self._tracker
            if conn is not None and (conn._rnl_tracking != wid or _io.readable(conn)):
                self._tracker = None
                await _io.disconnect(conn)  # its watcher is gone, or the server closed it
                conn = None
            try:
                if conn is None:
                    conn = await self.connection(max(1, int(timeout * 1000)), fresh=True, limit=timeout)
                    await _io.command(conn, ["CLIENT", "TRACKING", "ON", "REDIRECT", wid, "NOLOOP"], timeout)
                    conn._rnl_tracking = wid
                    self._tracker = conn
                return await self.infos(conn, keys, timeout)
            except redis.ResponseError:
                return None
            except BaseException:
                self._tracker = None
                if conn is not None:
                    await _io.disconnect(conn)
                raise

    async def _watcher_ready(self, timeout: float) -> int:
        async with self._making_watcher:
            if self._watcher is not None and _io.alive(self._watch_task):
                assert self._watcher_id is not None
                return self._watcher_id
            kwargs = dict(self._kwargs)
            kwargs["protocol"] = 2  # invalidations as plain pub/sub messages
            kwargs["socket_connect_timeout"] = min(self._connect_timeout or timeout, timeout)
            w = await _io.open_connection(self._cls, kwargs, timeout)
            try:
                wid = int(await _io.command(w, ["CLIENT", "ID"], timeout))
                await _io.command(w, ["SUBSCRIBE", "__redis__:invalidate"], timeout)
            except BaseException:
                await _io.disconnect(w)
                raise
            with self._lock:
                self._watcher, self._watcher_id = w, wid
                self._watch_task = _io.spawn(self._watch, w, name="redis-native-lock-watcher")
            return wid

    async def _watch(self, w: Any) -> None:
        """Reads invalidations (a listener: it waits for news, never for a
        reply); a held key that changed is checked at once."""
        while True:
            with self._lock:
                done = self._watcher is not w or (not self._bound and not self._due and not self._watched)
                if done and self._watcher is w:
                    self._watcher = None
                bound = list(self._bound)
            if done:
                await _io.disconnect(w)
                return
            try:
                msg, closed = await _io.listen(w, bound, self._poke)
            except Exception:  # noqa: BLE001 - the watcher is gone: recheck every bound hold
                with self._lock:
                    if self._watcher is w:
                        self._watcher = None
                    bound = list(self._bound)
                for h in bound:
                    if h.conn is not None:
                        h.conn._rnl_tracking = None
                    await h.verify()
                await _io.disconnect(w)
                return
            for h in closed:
                await h.closed()
            if not (isinstance(msg, list) and len(msg) == 3 and msg[0] == b"message"):
                continue
            changed = msg[2]
            for h in bound:
                if changed is None or any(_b(k) in changed for k in h.kind.keys):
                    await h.verify()
            await self._verify_session_holds(changed)

    async def _verify_session_holds(self, changed: Any) -> None:
        """Checks the session holds of the keys that `changed` (None: all).
        (A method: the last hold checked is not left in the watcher's frame,
        where it would keep its lock's Session alive while the watcher waits,
        and a Session collected is closed by its keeper.)"""
        for h in self._session_holds(changed):
            await h.verify()


class _Lease:
    """A `Session` on one server (in a cluster: one node): the id
    `LOCK.SESSION OPEN` gave, its deadline (the send time of the last
    acknowledged keepalive, or of the OPEN, plus the ttl: the server's is
    later), and the holds granted in it (`SESSION id`, no `BIND`). The
    server's keeper sends `LOCK.SESSION KEEPALIVE id ttl` at a third of the
    ttl over the package's ordinary connections, retrying a failed one (a
    new connection each time) until the deadline; it ends the lease, and
    marks its holds lost, at the first of: a keepalive answered 0, a grant
    answered `NOSESSION`, the deadline passed with no acknowledged
    keepalive (the keeper wakes at the deadline itself)."""

    conn = None  # (never bound: the keeper's `keep` looks)

    def __init__(self, session: "Session", server: _Server, sid: int, sent: float) -> None:
        self.session_ref = weakref.ref(session)  # its holds keep it alive; nothing else here
        self.server = server
        self.id = sid
        self.ttl_ms = session._ttl_ms
        self.deadline = sent + self.ttl_ms / 1000
        self.holds: Set[_Hold] = set()
        self.over = False  # ended (or ending): no new grant names it
        self.ended = False  # its holds were told
        self.why: Optional[str] = None
        self.tracked_by: Optional[int] = None  # the watcher its holds' keys were last read for

    def keeps(self) -> bool:
        return not self.over

    def _timeout(self) -> float:
        return max(0.001, min(self.server.timeout(self.ttl_ms), self.deadline - time.monotonic()))

    async def track(self, holds: List[_Hold]) -> None:
        """Has the server tell the watcher when a key of `holds` changes
        (their keys read, in one round trip, on a tracking connection); a
        hold found gone is checked at once. Best effort: the keepalives
        decide in the end."""
        keys = [k for h in holds for k in h.kind.keys]
        try:
            infos = await self.server.read_tracked(keys, min(self._timeout(), self.ttl_ms / 3000)) if keys else None
        except _IO_ERRORS:
            return
        if infos is None:
            return
        self.tracked_by = self.server.watcher_id()
        at = 0
        for h in holds:
            n = len(h.kind.keys)
            if not h.holds_all(infos[at : at + n]):
                await self.verify(h)
            at += n

    async def verify(self, h: _Hold) -> None:
        """The watcher heard that a key of `h` changed: still held? If not,
        is the session still live? (Closed from elsewhere, or over on the
        server: every hold lost at once.)"""
        if self.over or h.holds == 0 or h.lost:
            return
        try:
            infos = await self.server.read_tracked(h.kind.keys, self._timeout())
            if infos is None or h.holds_all(infos):
                return
            live = await self.server.call(["LOCK.SESSION", "INFO", self.id], self._timeout())
        except (*_IO_ERRORS, redis.ResponseError):
            return  # the keepalives decide
        if live is None:
            self.end_soon("the server ended it (LOCK.SESSION CLOSE from elsewhere, or its deadline there): told by the server at once")
            return
        async with h.io:
            if h.holds > 0 and not h.lost and h.lease is self:
                await h.lose("the key was deleted, overwritten or freed (told by the server at once)")

    def end_soon(self, why: str) -> None:
        """Ends it from any task or thread: its holds are told by the keeper,
        at once (never under a hold's own lock, which the caller may hold)."""
        if not self.over:
            self.over, self.why = True, why
        self.server.keep(self, time.monotonic())

    async def end(self, why: str) -> None:
        self.over = True
        if self.why is None:
            self.why = why
        self.ended = True
        self.server.forget(self)
        for h in list(self.holds):
            async with h.io:
                if h.holds > 0 and not h.lost:
                    await h.lose(f"its session {self.id} ended: {self.why}")
                else:
                    self.server.forget(h)

    async def add(self, h: _Hold) -> None:
        """A hold granted in this lease (a lease that ended meanwhile: lost)."""
        if h.lease is not None and h.lease is not self:
            h.lease.holds.discard(h)
        h.lease = self
        self.holds.add(h)
        if self.ended:
            async with h.io:
                await h.lose(f"its session {self.id} ended: {self.why}")
            return
        self.server.watch(h)
        await self.track([h])

    async def renew(self) -> Optional[float]:
        """The keeper's turn: one keepalive (or two, the first on a
        connection found dead); returns when to send the next (None: over)."""
        if self.over:
            await self.end(self.why or "it ended")
            return None
        if self.session_ref() is None:  # no lock on it, and nobody can use or close it any more
            self.over = self.ended = True
            self.why = "its Session object was garbage-collected"
            self.server.forget(self)
            try:
                await self.server.call(["LOCK.SESSION", "CLOSE", self.id], self._timeout())
            except _io.QUIET_ERRORS:
                pass  # its deadline ends it
            return None
        now = time.monotonic()
        if now >= self.deadline:
            await self.end("its deadline passed with no acknowledged LOCK.SESSION KEEPALIVE")
            return None
        await self._release_abandoned()
        for attempt in range(2):
            sent = time.monotonic()
            left = self.deadline - sent
            if left <= 0:
                break
            try:
                reply = await self.server.call(["LOCK.SESSION", "KEEPALIVE", self.id, self.ttl_ms], min(self.server.timeout(self.ttl_ms), left))
            except _IO_ERRORS:
                await self.server.drop_idle()  # killed together, most likely: a fresh one next
                continue
            except redis.ResponseError as e:
                await self.end(f"LOCK.SESSION KEEPALIVE was refused ({e})")
                return None
            if reply != 1:
                await self.end("LOCK.SESSION KEEPALIVE answered 0: the session ended on the server (closed, or its deadline passed there)")
                return None
            self.deadline = sent + self.ttl_ms / 1000
            if self.tracked_by is None or self.tracked_by != self.server.watcher_id():
                await self.track(list(self.holds))  # a new watcher (the last one failed): tell it
            return time.monotonic() + self.ttl_ms / 3000
        # Not acknowledged: again shortly (a new connection), and at the deadline at the latest.
        return min(time.monotonic() + min(0.05, self.ttl_ms / 6000), self.deadline)

    async def _release_abandoned(self) -> None:
        """Holds nobody can release any more (their object collected, their
        task ended) are released (the session would keep them forever)."""
        for h in list(self.holds):
            gone = h.abandoned()
            if gone is None or h.holds == 0 or h.lost:
                continue
            _log.warning("a hold of %r (token %s) on session %s is released: %s", h.kind.keys, h.token, self.id, gone)
            async with h.io:
                h.holds = 0
                h.why = f"released by the package: {gone}"
                self.server.forget(h)
                for c in h.releases():
                    try:
                        await self.server.call(c, self.server.timeout(self.ttl_ms))
                    except _io.QUIET_ERRORS:
                        pass  # it ends with the session


class Session:
    """One lease for many locks (`LOCK.SESSION`): the locks given
    `session=` follow it instead of a lease each, and a `CLIENT KILL` or a
    reconnect of any connection loses none of them. Opened lazily on each
    server (in a cluster: each node) the first time a lock there is granted
    in it; kept alive by that server's keeper (one per server for every
    lock and session of the package on it) with `LOCK.SESSION KEEPALIVE id
    ttl` at a third of `ttl` (seconds, default 30), over the package's
    ordinary connections, retried on new ones until its deadline. When it
    ends (a keepalive answered 0, a grant answered NOSESSION, its deadline
    passed unacknowledged) every lock on it is lost at once: `lost`, the
    lock's `on_lost` and this `on_lost(holder, why)`, once per lock. A lock
    granted after that opens a new session id. `close()` (and leaving the
    `with` block; the blocking API also at the interpreter's exit) ends it
    on every server at once: its locks are released, not lost."""

    def __init__(self, client: AsyncClient, *, ttl: float = 30.0, on_lost: Optional[OnLost] = None) -> None:
        check_client(client, want_async=True, cls="Session")
        self._client: Any = client
        self._ttl_ms = ms(ttl, "ttl")
        self.ttl = self._ttl_ms / 1000
        if on_lost is not None and not callable(on_lost):
            raise TypeError("on_lost must be callable")
        self.on_lost = on_lost
        self._leases: Dict[_Server, _Lease] = {}
        self._opening = _io.Lock()
        self.closed = False
        _io.close_at_exit(self)

    @property
    def ids(self) -> List[int]:
        """The ids of this session on the servers (nodes) it is open on."""
        return [x.id for x in list(self._leases.values()) if not x.over]

    async def _lease(self, server: _Server) -> _Lease:
        """This session on `server`: opened (`LOCK.SESSION OPEN ttl`) the
        first time, and again after it ended."""
        async with self._opening:
            if self.closed:
                raise LockError("this Session was closed: make a new one")
            lease = self._leases.get(server)
            if lease is not None and not lease.over and time.monotonic() < lease.deadline:
                return lease
            sent = time.monotonic()
            try:
                sid = await server.call(["LOCK.SESSION", "OPEN", self._ttl_ms], server.timeout(self._ttl_ms))
            except redis.ResponseError as e:
                raise LockError(f"LOCK.SESSION OPEN was refused: {e}") from e
            lease = self._leases[server] = _Lease(self, server, int(sid), sent)
            server.keep(lease, time.monotonic() + self._ttl_ms / 3000)
            return lease

    async def close(self) -> None:
        """Ends the session on every server it is open on
        (`LOCK.SESSION CLOSE id`): its locks are released there at once and
        here (not held, not lost). The Session cannot be used again."""
        async with self._opening:
            self.closed = True
            leases = list(self._leases.values())
            self._leases.clear()
        for lease in leases:
            if lease.over:
                continue
            lease.over = lease.ended = True
            lease.why = "closed"
            lease.server.forget(lease)
            try:
                await lease.server.call(["LOCK.SESSION", "CLOSE", lease.id], lease.server.timeout(lease.ttl_ms))
            except _io.QUIET_ERRORS:
                pass  # its deadline ends it on the server
            for h in list(lease.holds):
                async with h.io:
                    h.holds = 0
                    lease.server.forget(h)

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<Session ttl={self.ttl} ids={self.ids} closed={self.closed}>"


def _after_fork_in_child() -> None:
    # The parent's servers, their locks, tasks and threads are not the child's.
    _Server._all = {}
    _Server._guard = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _b(key: KeyT) -> bytes:
    return key.encode() if isinstance(key, str) else key


_DEFAULT: Any = object()


def _dur(replicas: int, replicas_timeout: float, on_fewer_replicas: str) -> Dict[str, Any]:
    return {"replicas": replicas, "replicas_timeout": replicas_timeout, "on_fewer_replicas": on_fewer_replicas}


class Holder:
    """One lock of one kind, safe to share: each task has its own hold
    (its own owner, token and lease), as redis-py's `thread_local=True`, so
    tasks sharing one object exclude one another like tasks with one
    object each. With an explicit `owner=` the object is one holder: another
    task's acquire while it is held raises LockError (the server would let
    it in as the same owner)."""

    def __init__(
        self,
        client: AsyncClient,
        kind: Kind,
        *,
        ttl: float = 30.0,
        wait: Optional[float] = 10.0,
        owner: Optional[KeyT] = None,
        bind: bool = True,
        on_lost: Optional[OnLost] = None,
        replicas: int = 0,
        replicas_timeout: float = 1.0,
        on_fewer_replicas: str = "raise",
        session: Optional["Session"] = None,
    ) -> None:
        check_client(client, want_async=True, cls=type(self).__name__)
        if session is not None and not isinstance(session, Session):
            raise TypeError(f"session must be a {Session.__module__}.Session of this API, not {type(session).__name__}")
        #: the Session the lock's holds follow (`SESSION id`, no `BIND`, not renewed one by one)
        self._session = session
        self._client: Any = client  # (redis-py types its sync and asyncio clients unlike)
        self._kind = kind
        self._ttl_ms = ms(ttl, "ttl")
        self.ttl = self._ttl_ms / 1000
        #: The wait of the `with` block (seconds; None: do not wait; inf: no limit).
        self.wait = check_wait(wait)
        self._owner = owner_bytes(owner) if owner is not None else None
        if not isinstance(bind, bool):
            raise TypeError(f"bind must be True or False, not {bind!r}")
        self.bind = bind and session is None  # a session's lock survives its connections
        if on_lost is not None and not callable(on_lost):
            raise TypeError("on_lost must be callable")
        self._on_lost = on_lost
        check_replicas(replicas, replicas_timeout, on_fewer_replicas)
        #: replicas=N: each grant and renewal waits (`WAIT N ms`) for N replicas' acknowledgement
        self.replicas = replicas
        self.replicas_timeout = float(replicas_timeout)
        self.on_fewer_replicas = on_fewer_replicas
        self._holds: Any = _io.PerTask()  # the drop-in's thread_local=False: one for every task
        self._shared: Optional[_Hold] = None  # with owner=: one hold for the object
        self._guard = threading.Lock()  # claims of an owner= object; never held across I/O
        self._sibling: Optional[Holder] = None  # the other side of a ReadWriteLock
        self._renews = True  # False: the keeper leaves this lock's leases to run out (the drop-in's timeout=)
        self._handed: List[_Hold] = []  # granted in tasks that ran only acquire(): for the next task

    # -- this task's hold -------------------------------------------------

    def _hold(self) -> Optional[_Hold]:
        """This thread's hold (with `owner=`: the object's), held or last held."""
        h: Optional[_Hold] = self._shared if self._owner is not None else self._holds.get()
        if self._handed and (h is None or h.holds == 0):
            h = self._adopt() or h
        if h is not None and h.pid != os.getpid():
            return None  # the parent's, before fork()
        return h

    def _adopt(self) -> Optional[_Hold]:
        """A hold granted in a task that ran only `acquire()` (the task
        `asyncio.wait_for` makes before Python 3.12, `TaskGroup.create_task(
        lock.acquire())`), once that task is done: this task, which uses the
        object next, takes it over (the code that awaited the acquire)."""
        me = _io.current()
        with self._guard:
            self._handed = [h for h in self._handed if h.holds > 0 and not h.lost]
            for h in reversed(self._handed):
                if h.thread is not me and _io.ended(h.thread):
                    self._handed.remove(h)
                    h.handed, h.thread = False, me
                    break
            else:
                return None
        self._set_hold(h)
        return h

    def _set_hold(self, h: _Hold) -> None:
        self._holds.set(h)

    async def _drop(self, h: _Hold) -> None:
        """Forgets a hold this task replaced by a new one (the drop-in's
        repeat acquire, granted once the old one was gone)."""
        async with h.io:
            h.holds = 0
            h.server.forget(h)
            if h.conn is not None:
                conn, h.conn = h.conn, None
                await h.server.put(conn, clean=False)

    def _held(self) -> Optional[_Hold]:
        h = self._hold()
        return h if h is not None and h.holds > 0 else None

    @property
    def owner(self) -> Optional[bytes]:
        """The owner this task holds (or last held) the lock as; the
        explicit `owner=` when given; None before this task's first acquire."""
        h = self._hold()
        return h.owner if h is not None else self._owner

    @property
    def token(self) -> Optional[int]:
        """This thread's fencing token (MultiLock: the highest of `tokens`)."""
        h = self._hold()
        return h.token if h is not None else None

    @property
    def tokens(self) -> List[int]:
        """This thread's tokens per key, in key order."""
        h = self._hold()
        return list(h.tokens) if h is not None else []

    @property
    def keys(self) -> List[KeyT]:
        return list(self._kind.keys)

    @property
    def bound(self) -> bool:
        """This thread's hold is bound (`BIND`) to a connection of its own."""
        h = self._held()
        return h is not None and h.conn is not None

    @property
    def lost(self) -> bool:
        """True once this task's lease is known gone or may have run out;
        stays True (after the release too) until this task acquires again."""
        h = self._hold()
        return h is not None and (h.lost or h.expired())

    def check(self) -> None:
        """Raises LeaseLost if this task's lease is gone: call it before a protected write."""
        h = self._hold()
        if h is not None and (h.lost or h.expired()):
            raise LeaseLost(h.message())

    async def locked(self) -> bool:
        """Whether anyone holds the (first) key."""
        return (await self._info()) is not None

    async def owned(self) -> bool:
        """Whether this task holds the (first) key, under its token, as the server says."""
        h = self._held()
        return h is not None and holds(await self._info(), h.owner, h.tokens[0] if h.tokens else None)

    async def _info(self) -> Optional[Dict[str, Any]]:
        """LOCK.INFO of the first key over a connection of the package's, within
        its deadline (the client's socket_timeout, else the ttl; no retries)."""
        key = self._kind.keys[0]
        server = await _Server.of(self._client, key)
        return parse_info(await server.call(["LOCK.INFO", key], server.timeout(self._ttl_ms)))

    # -- acquire ----------------------------------------------------------

    async def _new_hold(self, given: Optional[bytes] = None) -> _Hold:
        with self._guard:
            if self._owner is not None:
                self._not_another_threads()
            owner = given or self._owner
            if owner is None and self._sibling is not None:
                sib = self._sibling._held()
                owner = sib.owner if sib is not None else None  # one owner per task on a read-write lock
            h = _Hold(self, owner or new_owner(), None, self._ttl_ms)  # type: ignore[arg-type]
            h.own_owner = owner is None  # a UUID of the package's: no other grant carries it
            if self._owner is not None:
                h.pending = True  # claimed before the first await: another task's acquire is refused
                h.previous = self._shared
                self._shared = h
        try:
            h.server = await _Server.of(self._client, self._kind.keys[0])
        except BaseException:
            with self._guard:
                h.pending = False
                if self._shared is h:
                    self._shared, h.previous = h.previous, None
            raise
        return h

    def _not_another_threads(self) -> None:
        """With `owner=`, the object is one holder: another task's acquire
        while it is held would enter too (the server sees one owner)."""
        pid, me = os.getpid(), _io.current()
        for side in (self, self._sibling):
            h = side._shared if side is not None else None
            if h is not None and (h.holds > 0 or h.pending) and h.pid == pid and h.thread != me:
                raise LockError(
                    f"{self._kind.keys!r} is held by another task under the same owner="
                    f"{self._owner!r}: one owner is one holder, and a second task would enter "
                    "too. Leave owner= unset (each task then holds the lock as its own owner) "
                    "or give each task its own lock object"
                )

    async def acquire(self, wait: Optional[float] = None) -> bool:
        """Asks for the lock for this task, waiting in the server up to
        `wait` seconds (None or 0, the default: do not wait; inf: without
        limit). True when granted (the token is `self.token`), False when
        the wait ran out. Raises DeadlockError when waiting would close a
        cycle of waits, LockError for any other refusal (a key of another
        type; a read-write lock's mode change while held)."""
        return await self._acquire(wait)

    async def _acquire(self, wait: Optional[float], given: Optional[bytes] = None, fresh: bool = False) -> bool:
        """acquire(); `given`: the owner of a new hold; `fresh`: a new hold even
        when this thread holds one (the drop-in: not reentrant, as redis-py)."""
        wait = check_wait(wait)
        h = self._held()
        if h is not None and self._owner is not None:
            self._not_another_threads()
        before = h
        fresh = fresh or h is None
        if fresh or h is None:
            h = await self._new_hold(given)
        try:
            granted = await self._grant(h, wait)
        finally:
            if h.pending:
                h.pending = False
                if h.holds == 0:
                    self._shared = h.previous  # not granted: as before
                h.previous = None
        if not granted:
            return False
        if fresh and self._owner is None:
            self._set_hold(h)
            if h.per_task and _io.helper():
                with self._guard:
                    h.handed = True
                    self._handed.append(h)
        if before is not None and before is not h:
            await self._drop(before)
        if h.granted_in is not None:
            await h.granted_in.add(h)  # renewed by its session's keepalives, never on its own
            return True
        h.server.keep(h, time.monotonic() + h.ttl_ms / 3000 if self._renews else h.valid_until)
        await h.track()
        return True

    async def _grant(self, h: _Hold, wait: Optional[float]) -> bool:
        async with h.io:
            sent = time.monotonic()
            reply = await self._send_acquire(h, wait)
            if reply is None:
                return False
            h.tokens = [int(t) for t in reply] if isinstance(reply, list) else [int(reply)]
            h.token = max(h.tokens)
            h.holds = h.holds + 1 if self._kind.reentrant else 1
            if wait:  # a waiter's lease starts at its grant, which its reply follows at once
                sent = time.monotonic()
            h.valid_until = sent + h.ttl_ms / 1000
            h.lost, h.why = False, None
            h.abandoned_why = None
            return True

    async def _send_acquire(self, h: _Hold, wait: Optional[float]) -> Any:
        """The grant, over a connection of the package's own with a read
        timeout of the wait plus one command's time: the hold's bound
        connection if it has one, else one that stays bound to it (`BIND`)
        or goes back at once."""
        timeout = acquire_timeout(wait, h.server.timeout(h.ttl_ms))
        if h.conn is not None:  # a bound holder asks again
            try:
                reply = await h.call(self._kind.acquire(h.owner, h.ttl_ms, wait, True), timeout)
                if reply is not None:
                    await self._durable_grant(h, h.conn, reply)
                return reply
            except redis.ResponseError as e:
                raise server_error(e, self._kind.keys) from e
            except _IO_ERRORS as e:
                await h.lose(f"the bound connection failed ({type(e).__name__}: {e})")
                raise
        moved = False
        renamed = False
        while True:
            lease = await self._session._lease(h.server) if self._session is not None else None
            conn = await h.server.connection(h.ttl_ms)
            args = self._kind.acquire(h.owner, h.ttl_ms, wait, self.bind)
            if lease is not None:
                args += ["SESSION", lease.id]
            try:
                reply = await _io.command(conn, args, timeout)
            except redis.exceptions.MovedError:
                # The slot moved: learn the new map, then ask its node.
                await h.server.put(conn, True)
                if moved:
                    raise
                moved = True
                await self._client.nodes_manager.initialize()
                h.server = await _Server.of(self._client, self._kind.keys[0])
                continue
            except redis.ResponseError as e:
                await h.server.put(conn, True)
                if self.bind and "syntax" in str(e).lower():
                    self.bind = False  # a server without BIND: lease watchdog
                    continue
                if lease is not None and str(e).startswith("NOSESSION"):
                    # The session ended on the server: its locks are lost; once, a new one.
                    lease.end_soon(f"a grant naming it was answered {e}")
                    if not renamed:
                        renamed = True
                        continue
                raise server_error(e, self._kind.keys) from e
            except BaseException:
                # It may have been granted as we stopped listening (or the
                # task was cancelled): closing the connection frees a bound
                # grant; an unbound one is released.
                await h.server.put(conn, False)
                if not self.bind and h.holds == 0:
                    await _io.shielded(self._release_quietly, h)
                raise
            if reply is not None:
                try:
                    await self._durable_grant(h, conn, reply)
                except BaseException:
                    await h.server.put(conn, False)
                    raise
            h.granted_in = lease if reply is not None else None
            if self.bind and reply is not None:
                h.conn = conn
            else:
                await h.server.put(conn, True)
            return reply

    async def _durable_grant(self, h: _Hold, conn: Any, reply: Any) -> None:
        """replicas=N: `WAIT N ms` right after a grant, on its connection;
        too few acknowledgements give the grant back there (one hold of a
        reentrant repeat) and raise NotDurable (unless "warn")."""
        try:
            await h.wait_acks(conn, "grant")
        except NotDurable:
            t = h.server.timeout(h.ttl_ms)
            try:
                tokens = [int(x) for x in reply] if isinstance(reply, list) else [int(reply)]
                await _io.pipeline(conn, h.releases(tokens), t)
            except _io.QUIET_ERRORS:
                pass  # the connection closes: a bound grant goes with it, else its lease ends
            if h.holds > 0 and not self._kind.reentrant:
                await h.lose("a repeat grant was not acknowledged by enough replicas and was released")
            raise

    # -- while held -------------------------------------------------------

    async def extend(self, ttl: Optional[float] = None) -> None:
        """Sets this task's lease to `ttl` seconds from now (default: the
        lock's ttl); later renewals use it too. Raises LeaseLost if it was
        no longer held."""
        ttl_ms = ms(ttl, "ttl") if ttl is not None else self._ttl_ms
        h = self._held()
        if h is None:
            raise LockError(f"extend() of {self._kind.keys!r}, which this task does not hold")
        if h.lease is not None:
            raise LockError(
                f"extend() of {self._kind.keys!r}, held in a Session: its lease is the session's, "
                "renewed by the session's keepalives (LOCK.RENEW would change nothing)"
            )
        async with h.io:
            if h.lost:
                raise LeaseLost(h.message())
            sent = time.monotonic()
            timeout = h.server.timeout(h.ttl_ms)
            try:
                replies = await h.write(h.renewals(ttl_ms), timeout, "renewal")
            except NotDurable:
                await h.lose("a renewal was not acknowledged by enough replicas")
                raise
            except redis.ResponseError as e:
                await h.lose(f"the key was replaced by another type ({e})")
                raise LeaseLost(h.message()) from e
            if not all(r == 1 for r in replies):
                await h.lose("LOCK.RENEW answered 0: the lease expired, the key was deleted, or the owner holds it under a newer grant")
                raise LeaseLost(h.message())
            h.ttl_ms = ttl_ms
            h.valid_until = sent + ttl_ms / 1000
        h.server.keep(h, time.monotonic() + ttl_ms / 3000)
        await h.track()

    # -- guarded commands -------------------------------------------------

    def guard_command(self, *command: Any) -> List[Any]:
        """`LOCK.GUARD key owner TOKEN token CALL command...` for this task's
        hold, to queue on a redis-py pipeline or transaction
        (`pipe.execute_command(*lock.guard_command("SET", k, v))`): there the
        reply is the raw one, and a lost hold's is a `redis.ResponseError`
        beginning `NOTHELD`. MultiLock: the guard checks its first key.
        Raises LeaseLost if this task's lease is known lost, LockError if it
        holds nothing."""
        return guard_args(self._kind.keys[0], *self._guard_hold(), command)

    def _guard_hold(self) -> Tuple[bytes, int]:
        h = self._held()
        if h is None:
            raise LockError(f"guard() with {self._kind.keys!r}, which this task does not hold")
        if h.lost or h.expired():
            raise LeaseLost(h.message())
        return h.owner, h.tokens[0]

    async def guard(self, *command: Any) -> Any:
        """Runs `command` (e.g. `"SET", "job:1", "done"`) in the server if
        and only if this task still holds the lock under its token, as one
        atomic step (`LOCK.GUARD`), and returns its reply as
        `client.execute_command(*command)` would (the command's own errors
        raised as redis-py raises them). Raises LeaseLost, nothing run, when
        the lease is gone (the server answered `NOTHELD`, or the loss was
        already known: nothing is sent), and marks the hold lost.
        MultiLock: the guard checks its first key. In a cluster the
        command's keys must share the lock key's slot (a hash tag)."""
        h = self._held()
        if h is not None and not h.lost and h.expired():
            async with h.io:  # known to have run out: given up (its connection closed), nothing sent
                await h.lose("its ttl ran out without a successful renewal")
        args = self.guard_command(*command)
        key = self._kind.keys[0]
        try:
            reply = await self._client.execute_command(*args, **guard_route(self._client, key))
        except redis.ResponseError as e:
            if not str(e).startswith("NOTHELD") or h is None:
                raise
            async with h.io:
                await h.lose(f"LOCK.GUARD answered NOTHELD: released, expired, deleted or taken since ({e})")
            raise LeaseLost(h.message()) from e
        return guarded_reply(self._client, command, reply)

    # -- release ----------------------------------------------------------

    async def release(self) -> None:
        """Gives back one hold of this task (all of a non-reentrant lock).
        Raises LeaseLost if the server no longer counted it as ours (released
        by its lease, deleted, overwritten)."""
        h = self._held()
        if h is None:
            raise LockError(f"release() of {self._kind.keys!r}, which this task does not hold")
        async with h.io:
            if h.lost:
                h.holds = 0
                h.server.forget(h)
                if h.conn is not None:
                    conn, h.conn = h.conn, None
                    await h.server.put(conn, clean=False)
                else:
                    await self._release_quietly(h)
                raise LeaseLost(h.message())
            timeout = h.server.timeout(h.ttl_ms)
            gone = False
            try:
                replies = [await h.call(c, timeout) for c in h.releases()]
            except redis.ResponseError as e:
                if not str(e).startswith("WRONGTYPE"):
                    raise
                replies, gone = [], True
                why = f"the key was overwritten with another type ({e})"
            except BaseException:  # a failure or a cancel: in doubt, the connection closes
                h.holds = 0
                h.server.forget(h)
                if h.conn is not None:
                    conn, h.conn = h.conn, None
                    await h.server.put(conn, clean=False)
                raise
            if not gone:
                gone = any(r is None for r in replies)
                why = "LOCK.RELEASE answered nil: the lock was no longer this grant's (released, expired, deleted, or a newer grant to the same owner)"
            h.holds = 0 if gone or not self._kind.reentrant else h.holds - 1
            if any(r == 1 for r in replies):
                h.holds = 0
            if h.holds == 0:
                h.server.forget(h)
                if h.conn is not None:
                    conn, h.conn = h.conn, None
                    await h.server.put(conn, clean=not gone)
            if gone:
                await h.lose(why)
                raise LeaseLost(h.message())
        if h.holds > 0:
            await h.track()

    async def _release_quietly(self, h: _Hold) -> None:
        """Best effort: this grant released (by its token), or, granted in
        doubt (no reply, so no token), its owner's hold when the owner is a
        UUID of the package's; else its lease ends it."""
        cmds = h.releases() if h.tokens else [["LOCK.RELEASE", k, h.owner] for k in self._kind.keys] if h.own_owner else []
        for c in cmds:
            try:
                await h.server.call(c, h.server.timeout(h.ttl_ms))
            except _io.QUIET_ERRORS:
                pass  # the lease ends by itself

    # -- with -------------------------------------------------------------

    async def __aenter__(self) -> "Holder":
        if not await self.acquire(self.wait):
            raise LockNotAcquired(f"{self._kind.keys!r} not acquired within {self.wait}s")
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            try:
                await self.release()
            except (LockError, *_io.QUIET_ERRORS):
                pass  # the work's own exception goes through
            return
        await self.release()

    def __repr__(self) -> str:
        h = self._hold()
        return (
            f"<{type(self).__name__} keys={self._kind.keys!r} owner={self.owner!r} "
            f"token={self.token} holds={h.holds if h else 0} bound={self.bound}>"
        )


class Lock(Holder):
    """An exclusive lock (`LOCK.ACQUIRE`): one holder; a repeat acquire by
    the same thread renews it (same token)."""

    def __init__(
        self,
        client: AsyncClient,
        key: KeyT,
        *,
        ttl: float = 30.0,
        wait: Optional[float] = 10.0,
        owner: Optional[KeyT] = None,
        bind: bool = True,
        on_lost: Optional[OnLost] = None,
        replicas: int = 0,
        replicas_timeout: float = 1.0,
        on_fewer_replicas: str = "raise",
        session: Optional["Session"] = None,
    ) -> None:
        super().__init__(
            client, Kind("LOCK.ACQUIRE", [check_key(key)]), ttl=ttl, wait=wait, owner=owner, bind=bind, on_lost=on_lost, **_dur(replicas, replicas_timeout, on_fewer_replicas), session=session
        )


class ReentrantLock(Holder):
    """A reentrant exclusive lock (`LOCK.RACQUIRE`): each acquire by a
    thread adds a hold, each release removes one (Redisson's RLock)."""

    def __init__(
        self,
        client: AsyncClient,
        key: KeyT,
        *,
        ttl: float = 30.0,
        wait: Optional[float] = 10.0,
        owner: Optional[KeyT] = None,
        bind: bool = True,
        on_lost: Optional[OnLost] = None,
        replicas: int = 0,
        replicas_timeout: float = 1.0,
        on_fewer_replicas: str = "raise",
        session: Optional["Session"] = None,
    ) -> None:
        super().__init__(
            client, Kind("LOCK.RACQUIRE", [check_key(key)]), ttl=ttl, wait=wait, owner=owner, bind=bind, on_lost=on_lost, **_dur(replicas, replicas_timeout, on_fewer_replicas), session=session
        )


class ReadWriteLock:
    """A read-write lock on one key (Redisson's RReadWriteLock): `.read()`
    shared (`LOCK.READ`), `.write()` exclusive and reentrant
    (`LOCK.RACQUIRE`), with writer preference. Both sides use one owner per
    task (or `owner=`), so a mode change while holding the other side is
    the server's error at once, never a wait on itself."""

    def __init__(
        self,
        client: AsyncClient,
        key: KeyT,
        *,
        ttl: float = 30.0,
        wait: Optional[float] = 10.0,
        owner: Optional[KeyT] = None,
        bind: bool = True,
        on_lost: Optional[OnLost] = None,
        replicas: int = 0,
        replicas_timeout: float = 1.0,
        on_fewer_replicas: str = "raise",
        session: Optional["Session"] = None,
    ) -> None:
        check_client(client, want_async=True, cls="ReadWriteLock")
        key = check_key(key)
        self._read = Holder(client, Kind("LOCK.READ", [key]), ttl=ttl, wait=wait, owner=owner, bind=bind, on_lost=on_lost, **_dur(replicas, replicas_timeout, on_fewer_replicas), session=session)
        self._write = Holder(
            client, Kind("LOCK.RACQUIRE", [key]), ttl=ttl, wait=wait, owner=owner, bind=bind, on_lost=on_lost, **_dur(replicas, replicas_timeout, on_fewer_replicas), session=session
        )
        self._read._sibling, self._write._sibling = self._write, self._read

    def read(self) -> Holder:
        return self._read

    def write(self) -> Holder:
        return self._write


class Semaphore(Holder):
    """One permit of a semaphore of `limit` permits (`LOCK.SEMAPHORE`): each
    permit (one per thread sharing the object) has its owner, lease and
    token, and cannot leak."""

    def __init__(
        self,
        client: AsyncClient,
        key: KeyT,
        limit: int,
        *,
        ttl: float = 30.0,
        wait: Optional[float] = 10.0,
        owner: Optional[KeyT] = None,
        bind: bool = True,
        on_lost: Optional[OnLost] = None,
        replicas: int = 0,
        replicas_timeout: float = 1.0,
        on_fewer_replicas: str = "raise",
        session: Optional["Session"] = None,
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an integer >= 1, not {limit!r}")
        super().__init__(
            client,
            Kind("LOCK.SEMAPHORE", [check_key(key)], limit),
            ttl=ttl,
            wait=wait,
            owner=owner,
            bind=bind,
            on_lost=on_lost,
            **_dur(replicas, replicas_timeout, on_fewer_replicas),
            session=session,
        )


class MultiLock(Holder):
    """Exclusive holds on several keys at once, all or none
    (`LOCK.MACQUIRE`). In a cluster the keys must share a hash slot. A
    plain str or bytes is refused (it is not a list of keys)."""

    def __init__(
        self,
        client: AsyncClient,
        keys: Sequence[KeyT],
        *,
        ttl: float = 30.0,
        wait: Optional[float] = 10.0,
        owner: Optional[KeyT] = None,
        bind: bool = True,
        on_lost: Optional[OnLost] = None,
        replicas: int = 0,
        replicas_timeout: float = 1.0,
        on_fewer_replicas: str = "raise",
        session: Optional["Session"] = None,
    ) -> None:
        super().__init__(
            client, Kind("LOCK.MACQUIRE", check_keys(keys)), ttl=ttl, wait=wait, owner=owner, bind=bind, on_lost=on_lost, **_dur(replicas, replicas_timeout, on_fewer_replicas), session=session
        )


_io.ACQUIRES.add(Holder.acquire.__code__)  # a task running only this acquires for its awaiter

__all__ = [
    "Holder",
    "Lock",
    "ReentrantLock",
    "ReadWriteLock",
    "Semaphore",
    "MultiLock",
    "Session",
    "LockError",
    "LockNotAcquired",
    "LeaseLost",
    "DeadlockError",
]
