"""What the blocking API does differently from the asyncio one, in one
place: reads with a deadline, background threads, locks, the calling
thread. `_sync.py` (generated from `_async.py`) is written on these;
`_async_io.py` has the same names."""

from __future__ import annotations

import atexit
import select
import socket
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import redis
from redis.cluster import RedisCluster

from ._common import raise_first

IO_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)
#: what a best-effort command (a release in doubt) may fail with
QUIET_ERRORS = (redis.RedisError, OSError)

Lock = threading.RLock  # held across I/O; reentrant, as a thread may come back (on_lost)
Event = threading.Event


def shielded(fn: Callable[..., None], *args: Any) -> None:
    """`fn(*args)` (a thread is not cancelled midway)."""
    fn(*args)


def current() -> Any:
    """The calling thread."""
    return threading.current_thread()


def ended(thread: Any) -> bool:
    """Whether a hold's thread has exited (it can release nothing any more)."""
    return thread is not None and not thread.is_alive()


ACQUIRES: Set[Any] = set()  # (asyncio's helper tasks; a thread is never one)


def helper() -> bool:
    return False


def try_lock(lock: Any) -> bool:
    """Takes `lock` if it is free, without waiting."""
    return bool(lock.acquire(blocking=False))


def nap() -> None:
    """A connection the watcher saw readable is in use: its user reads the
    reply; the watcher looks again shortly, without spinning."""
    time.sleep(0.002)


def readable(conn: Any) -> bool:
    """Whether `conn`'s socket has something to read (the server closed it,
    or it failed) while no command is under way on it."""
    sock = getattr(conn, "_sock", None)
    if sock is None or sock.fileno() < 0:
        return True
    try:
        if hasattr(select, "poll"):  # select() refuses a descriptor above 1023 (many bound locks)
            p = select.poll()
            p.register(sock.fileno(), select.POLLIN)
            return bool(p.poll(0))
        return bool(select.select([sock], [], [], 0)[0])  # pragma: no cover - Windows
    except (OSError, ValueError):
        return True


def on_close(conn: Any, hold: Any) -> None:
    """(asyncio's hook; here the watcher polls the bound sockets: `listen`.)"""
    conn._rnl_hold = weakref.ref(hold)


class Poke:
    """Wakes the watcher's poll (a socket pair) when a bound hold comes, so
    that it polls that connection's socket too."""

    def __init__(self) -> None:
        self._pair: Optional[Tuple[socket.socket, socket.socket]] = None
        self._guard = threading.Lock()

    def fileno(self) -> int:
        with self._guard:
            if self._pair is None:
                a, b = socket.socketpair()
                a.setblocking(False)
                b.setblocking(False)
                self._pair = (a, b)
            return self._pair[0].fileno()

    def poke(self) -> None:
        pair = self._pair
        if pair is not None:
            try:
                pair[1].send(b"x")
            except OSError:
                pass  # full: a wake-up is pending already

    def drain(self) -> None:
        pair = self._pair
        if pair is not None:
            try:
                while pair[0].recv(4096):
                    pass
            except OSError:
                pass


def spawn(fn: Callable[..., None], *args: Any, name: str) -> threading.Thread:
    t = threading.Thread(target=fn, args=args, name=name, daemon=True)
    t.start()
    return t


def alive(thread: Optional[threading.Thread]) -> bool:
    return thread is not None and thread.is_alive()


def stop(thread: threading.Thread) -> None:
    """A listener thread sees it is no longer wanted at the top of its loop
    (within `listen`'s second)."""


def wait(event: threading.Event, seconds: float) -> bool:
    """Whether `event` was set within `seconds`."""
    return event.wait(seconds)


def _settimeout(conn: Any, seconds: Optional[float]) -> None:
    """The read timeout of the next replies on `conn` (redis-py's sync
    `Connection` has no per-call timeout, so the socket's own is set)."""
    if getattr(conn, "_sock", None) is None:
        conn.connect()
    conn._sock.settimeout(seconds)


def command(conn: Any, args: Sequence[Any], timeout: Optional[float]) -> Any:
    """One command on `conn`, its reply within `timeout`."""
    _settimeout(conn, timeout)
    conn.send_command(*args)
    return conn.read_response()


def pipeline(conn: Any, cmds: List[List[Any]], timeout: Optional[float]) -> List[Any]:
    """Commands in one round trip within `timeout`; every reply read (an
    error reply raised after the rest, so the connection stays in step)."""
    _settimeout(conn, timeout)
    conn.send_packed_command(conn.pack_commands(cmds))
    out: List[Any] = []
    for _ in cmds:
        try:
            out.append(conn.read_response())
        except redis.ResponseError as e:
            out.append(e)
    return raise_first(out)


def listen(w: Any, bound: Sequence[Any], poke: Poke) -> Tuple[Any, List[Any]]:
    """The next message on the watcher, or None after a second without one
    (so that the thread sees when it is no longer wanted); with it, the
    holds of `bound` whose connection became readable (the server closed
    it: checked by `hold.closed()`). One poll of every socket."""
    if w.can_read(timeout=0):
        return w.read_response(), []
    watcher = w._sock.fileno()
    waker = poke.fileno()
    fds: Dict[int, Any] = {}
    for h in bound:
        sock = getattr(h.conn, "_sock", None)
        fd = sock.fileno() if sock is not None else -1
        if fd >= 0:
            fds[fd] = h
    try:
        if hasattr(select, "poll"):
            p = select.poll()
            for fd in (watcher, waker, *fds):
                p.register(fd, select.POLLIN)
            ready = [fd for fd, _ in p.poll(1000)]
        else:  # pragma: no cover - Windows
            ready = [s for s in select.select([watcher, waker, *fds], [], [], 1.0)[0]]
    except (OSError, ValueError):
        return None, []  # a socket closed meanwhile: the next round sees it
    if waker in ready:
        poke.drain()
    closed = [fds[fd] for fd in ready if fd in fds]
    if watcher in ready:
        return w.read_response(), closed
    return None, closed


def open_connection(cls: Any, kwargs: Dict[str, Any], timeout: float) -> Any:
    """A connection of the package's own, with a read timeout of `timeout`
    (it connects at its first command)."""
    return cls(**dict(kwargs, socket_timeout=timeout))


def disconnect(conn: Any) -> None:
    conn.disconnect()  # the server frees whatever it still held


def source_of(client: Any, key: Any) -> Any:
    """What a `_Server` is per: the client's pool, or in a cluster the pool
    of the node that serves `key`."""
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        return client.get_redis_connection(node).connection_pool
    return client.connection_pool


def ref(source: Any) -> Callable[[], Any]:
    """A weak reference to a `_Server`'s source (a pool dropped by its
    client is not kept alive by the package)."""
    return weakref.ref(source)


def call_back(fn: Callable[..., Any], *args: Any) -> None:
    fn(*args)


_open_sessions: "weakref.WeakSet[Any]" = weakref.WeakSet()


def close_at_exit(session: Any) -> None:
    """A session still open at the interpreter's exit is closed then
    (`LOCK.SESSION CLOSE` on each server: its locks are released at once)."""
    _open_sessions.add(session)


@atexit.register
def _close_sessions() -> None:
    for s in list(_open_sessions):
        try:
            if not s.closed:
                s.close()
        except Exception:  # noqa: BLE001 - exiting: the session's ttl ends it anyway
            pass


class PerTask:
    """A value per thread."""

    def __init__(self) -> None:
        self._local = threading.local()

    def get(self) -> Any:
        return getattr(self._local, "value", None)

    def set(self, value: Any) -> None:
        self._local.value = value
