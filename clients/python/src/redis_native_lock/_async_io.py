"""What the asyncio API does differently from the blocking one, in one
place: reads with a deadline, background tasks, locks, the calling task.
`_async.py` is written on these; `_sync.py`, generated from it by
`clients/python/unasync.py`, uses `_sync_io.py`, which has the same names."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Awaitable, Callable, Coroutine, Dict, List, Optional, Sequence, Set, Tuple

import redis
from redis.asyncio.cluster import RedisCluster

from ._common import raise_first

IO_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError, asyncio.TimeoutError)
#: what a best-effort command (a release in doubt) may fail with
QUIET_ERRORS = (redis.RedisError, asyncio.TimeoutError)

Lock = asyncio.Lock  # held across awaits; a task holds it once
Event = asyncio.Event


async def shielded(fn: Callable[..., Awaitable[None]], *args: Any) -> None:
    """`fn(*args)`, run to its end even if the caller is cancelled."""
    await asyncio.shield(fn(*args))


def current() -> Any:
    """The calling task (None outside one)."""
    return asyncio.current_task()


def ended(task: Any) -> bool:
    """Whether a hold's task is done (it can release nothing any more)."""
    return task is not None and task.done()


#: The code of the package's acquire() coroutines (`Holder.acquire`,
#: `NativeLock.acquire`): a task that runs one of them and nothing else was
#: made to wait for the grant on its awaiter's behalf.
ACQUIRES: Set[Any] = set()


def helper() -> bool:
    """Whether the calling task runs only an acquire() (`asyncio.wait_for`
    before Python 3.12, `TaskGroup.create_task(lock.acquire())`,
    `asyncio.gather`): its grant is for the task that awaits it."""
    task = asyncio.current_task()
    return task is not None and getattr(task.get_coro(), "cr_code", None) in ACQUIRES


async def try_lock(lock: asyncio.Lock) -> bool:
    """Takes `lock` if it is free, without waiting."""
    if lock.locked():
        return False
    await lock.acquire()
    return True


async def nap() -> None:
    """(The blocking watcher's pause when a connection it saw readable is in use.)"""


def readable(conn: Any) -> bool:
    """Whether the server closed `conn` (or it failed) while no command was under way."""
    reader = getattr(conn, "_reader", None)
    writer = getattr(conn, "_writer", None)
    if reader is None or writer is None:
        return True
    return reader.at_eof() or reader.exception() is not None or writer.transport.is_closing()


_closing: Set["asyncio.Task[None]"] = set()  # the checks under way (a task needs a reference)


def on_close(conn: Any, hold: Any) -> None:
    """Has the event loop tell `hold` (`hold.closed()`) the moment the server
    closes `conn` (its transport's EOF or loss), with no command under way.
    Without redis-py's stream internals: nothing (the renewals notice)."""
    conn._rnl_hold = weakref.ref(hold)
    if getattr(conn, "_rnl_hooked", False):
        return
    transport = getattr(getattr(conn, "_writer", None), "transport", None)
    protocol = transport.get_protocol() if transport is not None else None
    if protocol is None:
        return
    conn._rnl_hooked = True

    def tell() -> None:
        ref = getattr(conn, "_rnl_hold", None)
        h = ref() if ref is not None else None
        if h is not None:
            task = asyncio.get_running_loop().create_task(h.closed())
            _closing.add(task)
            task.add_done_callback(_closing.discard)

    def hook(name: str) -> None:
        original = getattr(protocol, name)

        def hooked(*args: Any) -> Any:
            out = original(*args)
            try:
                tell()
            except Exception:  # noqa: BLE001 - the transport's callback must not fail
                pass
            return out

        setattr(protocol, name, hooked)

    hook("eof_received")
    hook("connection_lost")


class Poke:
    """(The blocking watcher's wake-up; asyncio's is told by `on_close`.)"""

    def poke(self) -> None:
        pass


def spawn(fn: Callable[..., Coroutine[Any, Any, None]], *args: Any, name: str) -> "asyncio.Task[None]":
    return asyncio.get_running_loop().create_task(fn(*args), name=name)


def alive(task: Optional["asyncio.Task[None]"]) -> bool:
    return task is not None and not task.done()


def stop(task: "asyncio.Task[None]") -> None:
    """Ends a listener now (cancelling its read closes its connection);
    from inside, it leaves at the top of its loop."""
    if task is not asyncio.current_task():
        task.cancel()


async def wait(event: asyncio.Event, seconds: float) -> bool:
    """Whether `event` was set within `seconds`."""
    try:
        await asyncio.wait_for(event.wait(), seconds)
        return True
    except asyncio.TimeoutError:
        return False


async def _within(seconds: Optional[float], aw: Awaitable[Any]) -> Any:
    """`aw` within `seconds` (None: no limit). A read cut short closes its
    connection (redis-py disconnects on any error in a read)."""
    if seconds is None:
        return await aw
    return await asyncio.wait_for(aw, seconds)


async def _command(conn: Any, args: Sequence[Any]) -> Any:
    await conn.send_command(*args)
    return await conn.read_response()


async def command(conn: Any, args: Sequence[Any], timeout: Optional[float]) -> Any:
    """One command on `conn`, its reply within `timeout`."""
    return await _within(timeout, _command(conn, args))


async def _pipeline(conn: Any, cmds: List[List[Any]]) -> List[Any]:
    await conn.send_packed_command(conn.pack_commands(cmds))
    out: List[Any] = []
    for _ in cmds:
        try:
            out.append(await conn.read_response())
        except redis.ResponseError as e:
            out.append(e)
    return raise_first(out)


async def pipeline(conn: Any, cmds: List[List[Any]], timeout: Optional[float]) -> List[Any]:
    """Commands in one round trip within `timeout`; every reply read (an
    error reply raised after the rest, so the connection stays in step)."""
    out: List[Any] = await _within(timeout, _pipeline(conn, cmds))
    return out


async def listen(w: Any, bound: Sequence[Any], poke: Poke) -> Tuple[Any, List[Any]]:
    """The next message on the watcher (it waits for news, never for a
    reply), and no holds (closed bound connections come by `on_close`)."""
    return await w.read_response(), []


async def open_connection(cls: Any, kwargs: Dict[str, Any], timeout: float) -> Any:
    """A connection of the package's own, connected within `timeout` (every
    read has a deadline of its own: `command`, `pipeline`)."""
    conn = cls(**dict(kwargs, socket_timeout=None))
    try:
        await _within(timeout, conn.connect())
    except BaseException:
        await disconnect(conn)
        raise
    return conn


async def disconnect(conn: Any) -> None:
    try:
        await conn.disconnect()  # the server frees whatever it still held
    except Exception:  # noqa: BLE001 - closing what failed
        pass


async def source_of(client: Any, key: Any) -> Any:
    """What a `_Server` is per: the client's pool, or in a cluster the node
    that serves `key` (the slot map is learnt at the first command)."""
    if isinstance(client, RedisCluster):
        await client.initialize()
        return client.get_node_from_key(key)
    return client.connection_pool


def ref(source: Any) -> Callable[[], Any]:
    """A reference to a `_Server`'s source: a strong one (asyncio cluster
    nodes take no weak references)."""
    return lambda: source


async def call_back(fn: Callable[..., Any], *args: Any) -> None:
    """Calls `fn`, awaiting it when it returns a coroutine (only this
    server's renewals wait for it)."""
    result = fn(*args)
    if asyncio.iscoroutine(result):
        await result


def close_at_exit(session: Any) -> None:
    """(The blocking API closes its sessions at the interpreter's exit; an
    asyncio one is closed by `async with` or `await session.close()`: at
    exit its event loop is gone. Unclosed, it ends with its ttl.)"""


class PerTask:
    """A value per asyncio task (None outside one)."""

    def __init__(self) -> None:
        self._by_task: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()

    def get(self) -> Any:
        task = asyncio.current_task()
        return self._by_task.get(task) if task is not None else None

    def set(self, value: Any) -> None:
        self._by_task[asyncio.current_task()] = value
