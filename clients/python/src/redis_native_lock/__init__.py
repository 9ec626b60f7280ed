"""Locks for the redis-lock Redis module, on redis-py.

    import redis
    from redis_native_lock import Lock

    r = redis.Redis()
    with Lock(r, "orders:42", ttl=30, wait=10) as lock:
        storage.write(data, fencing_token=lock.token)

Five kinds, one shape: `Lock`, `ReentrantLock`, `ReadWriteLock` (`.read()`,
`.write()`), `Semaphore`, `MultiLock`; `acquire(wait=...)`, `release()`,
`extend(ttl)`, `locked()`, `owned()`, `token`, `lost`, `check()`, `with`.
The asyncio twins, on `redis.asyncio`, are in `redis_native_lock.aio`.
RedLock over independent servers: `redis_native_lock.redlock`.
redis-py's own lock, on the module: `r.lock(name, lock_class=NativeLock)`.
`replicas=N`: each grant and renewal waits for N replicas (`NotDurable`).

Each holder (one per thread or asyncio task sharing the object) acquires
with `BIND` on a connection of its own, so the server
frees the lock the moment this process dies; one keeper per server (a
thread, or a task in asyncio) sends one `LOCK.KEEPALIVE` per connection at
a third of the ttl, every command within a deadline. `bind=False`, or a server without `BIND`: a lease
renewed with `LOCK.RENEW` instead. A lost lease is signalled: `lost`
becomes True, `on_lost(holder, why)` is called, `check()` and leaving the
`with` block raise `LeaseLost`.

Many locks, one lease: `Session(r, ttl=30)` and `session=` on any kind
(`SESSION id`, no `BIND`): one `LOCK.SESSION KEEPALIVE` per server renews
them all, and a reconnect loses none; `close()` (or `with`) ends them.
"""

from ._common import DeadlockError, FewerReplicas, LeaseLost, LockError, LockNotAcquired, NotDurable
from ._dropin import NativeLock, NotDurableLockError
from ._sync import Holder, Lock, MultiLock, ReadWriteLock, ReentrantLock, Semaphore, Session

__version__ = "0.3.0"

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
    "NotDurable",
    "FewerReplicas",
    "NativeLock",
    "NotDurableLockError",
]
