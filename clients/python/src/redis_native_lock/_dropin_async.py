"""`NativeLock` for `redis.asyncio`: redis-py's asyncio `Lock` (redis/asyncio/lock.py) on the module's commands,
for `Redis.lock(name, ..., lock_class=NativeLock)`.

`_dropin.py`, the blocking one, is generated from this file by
`clients/python/unasync.py` (as `_sync.py` from `_async.py`).

redis-py's meanings, mapped onto the module's (docs/clients.md lists every
difference):
- `timeout=None` (redis-py: a key that never expires) is a lock bound to a
  connection of its own (`BIND`), renewed by the package's keeper
  (`LOCK.KEEPALIVE`): it lives while this process holds it and ends the
  moment the process or its connection dies. `timeout=T` is a lease of T
  seconds, not renewed (as redis-py's), also bound.
- `blocking_timeout` is `WAIT ms`: the server queues the request and answers
  when it is granted; `sleep` is accepted and unused (no polling).
- The token (redis-py's value of the key) is the lock's owner; the server's
  fencing token is `fencing_token`.
- `session=` (a keyword of the constructor, not of `Redis.lock()`, which
  passes none): the lock follows the `Session` (`SESSION id`, no `BIND`),
  survives a reconnect, and is renewed by the session's keepalives only;
  no `timeout` then, so `extend()` and `reacquire()` raise `LockError`.
"""

from __future__ import annotations

import logging
import time
from types import TracebackType
from typing import Any, Awaitable, Literal, Optional, Type, Union

import redis
from redis.exceptions import LockError, LockNotOwnedError

from . import _async_io as _io
from . import _common
from ._common import Kind, LeaseLost, NotDurable, check_key, holds, ms, parse_info
from ._async import Holder, Session, _Hold
from ._dropin_common import DEFAULT_LEASE, Number, NotDurableLockError, OneHold, _Local, owner_of, wait_of

logger = logging.getLogger(__name__)


class _DropinHolder(Holder):
    _KIND = "NativeLock"


class NativeLock:
    """redis-py's `Lock`, on the module's `LOCK.ACQUIRE`:
    `r.lock("name", lock_class=NativeLock)`. See the module docstring."""

    def __init__(
        self,
        redis: Any,
        name: Union[str, bytes],
        timeout: Optional[Number] = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Optional[Number] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        lease: float = DEFAULT_LEASE,
        replicas: int = 0,
        replicas_timeout: float = 1.0,
        on_fewer_replicas: str = "raise",
        session: Optional[Session] = None,
    ) -> None:
        if session is not None and timeout:
            raise ValueError("a NativeLock in a session has no timeout: it holds while the session lives")
        self.redis = redis
        self.name = name
        self.timeout = timeout if timeout else None  # redis-py: a falsy timeout is none
        self.sleep = sleep  # accepted, unused: the server waits (WAIT), nothing polls
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        ttl = float(self.timeout) if self.timeout is not None else lease
        self._holder = _DropinHolder(
            redis,
            Kind("LOCK.ACQUIRE", [check_key(name)]),
            ttl=ttl,
            wait=None,
            bind=True,
            replicas=replicas,
            replicas_timeout=replicas_timeout,
            on_fewer_replicas=on_fewer_replicas,
            session=session,
        )
        self._holder._renews = self.timeout is None
        if not self.thread_local:
            self._holder._holds = OneHold()  # one token for every task
        self.local = _Local(self._holder)

    # -- what redis-py's Lock has ----------------------------------------

    async def __aenter__(self) -> "NativeLock":
        if await self.acquire():
            return self
        raise LockError("Unable to acquire lock within the time specified", lock_name=self._lname())

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            await self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Union[str, bytes]] = None,
    ) -> bool:
        """Waits in the server (`WAIT`) for the lock, as redis-py's
        `acquire`: True once held, False when not blocking or when
        `blocking_timeout` ran out."""
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        owner = owner_of(self.redis, token) if token is not None else None
        try:
            return await self._holder._acquire(wait_of(blocking, blocking_timeout), owner, fresh=True)
        except NotDurable as e:
            raise NotDurableLockError(e, self._lname()) from e
        except _common.LockError as e:
            raise LockError(str(e), lock_name=self._lname()) from e

    async def locked(self) -> bool:
        """Whether anyone holds the lock."""
        return await self._holder.locked()

    async def owned(self) -> bool:
        """Whether this task (with thread_local=False: this object) holds it."""
        return await self._holder.owned()

    async def release(self) -> None:
        """Releases this task's hold: LockError when it holds none,
        LockNotOwnedError when the server no longer counted it as ours.
        Interrupted midway, the hold is dropped and its connection closed
        (which frees a bound grant)."""
        if self._holder._held() is None:
            raise LockError("Cannot release a lock that's not owned or is already unlocked.", lock_name=self._lname())
        try:
            await self._holder.release()
        except LeaseLost as e:
            raise LockNotOwnedError("Cannot release a lock that's no longer owned", lock_name=self._lname()) from e
        except _common.LockError as e:
            raise LockError(str(e), lock_name=self._lname()) from e

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> Awaitable[Literal[True]]:
        """Adds `additional_time` seconds to the lease left (or, with
        `replace_ttl`, sets it to that): a lock with a timeout only."""
        h = self._holder._held()
        if h is None:
            raise LockError("Cannot extend an unlocked lock", lock_name=self._lname())
        if self.timeout is None:
            raise LockError("Cannot extend a lock with no timeout", lock_name=self._lname())
        return self._renew(h, int(additional_time * 1000), not replace_ttl, "extend")

    def reacquire(self) -> Awaitable[Literal[True]]:
        """Sets the lease back to `timeout` seconds from now."""
        h = self._holder._held()
        if h is None:
            raise LockError("Cannot reacquire an unlocked lock", lock_name=self._lname())
        if self.timeout is None:
            raise LockError("Cannot reacquire a lock with no timeout", lock_name=self._lname())
        return self._renew(h, int(self.timeout * 1000), False, "reacquire")

    # -- extras ----------------------------------------------------------

    async def guard(self, *command: Any) -> Any:
        """Runs `command` (e.g. `"SET", "job:1", "done"`) if and only if
        this task still holds the lock under its grant, as one atomic step in
        the server (`LOCK.GUARD ... TOKEN`), and returns its reply as
        `redis.execute_command(*command)` would. LockNotOwnedError, nothing
        run, when the lock is no longer ours; LockError when not held."""
        if self._holder._held() is None:
            raise LockError("Cannot guard a command with a lock that's not owned", lock_name=self._lname())
        try:
            return await self._holder.guard(*command)
        except LeaseLost as e:
            raise LockNotOwnedError("Cannot guard a command with a lock that's no longer owned", lock_name=self._lname()) from e
        except _common.LockError as e:
            raise LockError(str(e), lock_name=self._lname()) from e

    @property
    def fencing_token(self) -> Optional[int]:
        """This thread's fencing token from the server (strictly increasing
        per server), None when it holds nothing."""
        h = self._holder._held()
        return h.token if h is not None else None

    @property
    def holder(self) -> Holder:
        """The package's lock underneath (`lost`, `check()`, `token`)."""
        return self._holder

    def _lname(self) -> str:
        return self.name.decode(errors="replace") if isinstance(self.name, bytes) else str(self.name)

    async def _renew(self, h: _Hold, add_ms: int, add: bool, what: str) -> Literal[True]:
        key = self._holder._kind.keys[0]
        not_owned = LockNotOwnedError(f"Cannot {what} a lock that's no longer owned", lock_name=self._lname())
        async with h.io:
            if h.lost or h.expired():
                raise not_owned
            timeout = h.server.timeout(h.ttl_ms)
            sent = time.monotonic()
            try:
                new_ms = add_ms
                if add:
                    info = parse_info(await h.call(["LOCK.INFO", key], timeout))
                    mine = [x for x in (info or {}).get("holders", []) if x["owner"] == h.owner and x["token"] == h.token]
                    if not mine:
                        await h.lose("LOCK.INFO no longer lists this owner under its token")
                        raise not_owned
                    new_ms = int(mine[0]["ttl_ms"]) + add_ms
                if new_ms <= 0:
                    raise ValueError(f"the lease would end now or before ({new_ms} ms)")
                reply = (await h.write(h.renewals(new_ms), timeout, "renewal"))[0]
            except NotDurable as e:
                await h.lose("a renewal was not acknowledged by enough replicas")
                raise NotDurableLockError(e, self._lname()) from e
            except redis.ResponseError as e:
                await h.lose(f"the key was replaced by another type ({e})")
                raise not_owned from e
            if reply != 1:
                await h.lose("LOCK.RENEW answered 0: the lease expired, the key was deleted, or the owner holds it under a newer grant")
                raise not_owned
            h.valid_until = sent + new_ms / 1000
        h.server.keep(h, h.valid_until)  # held (its connection kept) to the new end
        await h.track()
        return True

    def __repr__(self) -> str:
        return f"<NativeLock name={self.name!r} timeout={self.timeout} token={self.local.token!r}>"


_io.ACQUIRES.add(NativeLock.acquire.__code__)  # a task running only this acquires for its awaiter

__all__ = ["NativeLock", "NotDurableLockError", "DEFAULT_LEASE", "holds", "ms"]
