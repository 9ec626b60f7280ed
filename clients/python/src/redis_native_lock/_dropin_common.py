"""What the redis-py drop-in's two flavours (`_dropin_async.py` and the
`_dropin.py` generated from it) share: redis-py's arguments as the
package's, the drop-in's error and `lock.local`. No I/O here."""

from __future__ import annotations

import math
from typing import Any, Optional, Union

from redis.exceptions import LockError

from ._common import NotDurable

Number = Union[int, float]

#: The lease of a `timeout=None` lock, renewed at a third of it while held.
DEFAULT_LEASE = 30.0


def wait_of(blocking: bool, blocking_timeout: Optional[Number]) -> Optional[float]:
    """redis-py's blocking/blocking_timeout as the package's wait: not
    blocking: no WAIT; no timeout: WAIT 0 (no limit); else WAIT ms."""
    if not blocking:
        return None
    if blocking_timeout is None:
        return math.inf
    if blocking_timeout <= 0:
        return None  # redis-py tries once
    return float(blocking_timeout)


def owner_of(client: Any, token: Any) -> bytes:
    """A token as redis-py encodes it (its client's encoder): the owner."""
    if isinstance(token, bytes):
        return token
    try:
        encoder = client.get_encoder()
    except AttributeError:  # asyncio Redis: the pool's
        encoder = client.connection_pool.get_encoder()
    out: bytes = encoder.encode(token)
    return out


class NotDurableLockError(LockError, NotDurable):
    """`replicas=N` on the drop-in: a grant or renewal that fewer than N
    replicas acknowledged (released); both redis-py's `LockError` and the
    package's `NotDurable`."""

    def __init__(self, err: NotDurable, lock_name: str) -> None:
        LockError.__init__(self, str(err), lock_name=lock_name)
        self.acked = err.acked
        self.wanted = err.wanted


class _Local:
    """`lock.local`: `local.token` is this thread's token (its owner, bytes)
    while it holds the lock, else None. Read-only: the token is the owner the
    server knows, it cannot be swapped in place."""

    def __init__(self, holder: Any) -> None:
        self._holder = holder

    @property
    def token(self) -> Optional[bytes]:
        h = self._holder._held()
        return h.owner if h is not None else None


class OneHold:
    """`thread_local=False`: one hold for every thread (task) of the object,
    in the place of the holder's per-thread (per-task) one."""

    def __init__(self) -> None:
        self._value: Any = None

    def get(self) -> Any:
        return self._value

    def set(self, value: Any) -> None:
        self._value = value
