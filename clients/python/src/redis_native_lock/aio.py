"""The asyncio API: the same classes as `redis_native_lock`, on
`redis.asyncio.Redis` and `redis.asyncio.RedisCluster`, with `await` and
`async with`.

    import redis.asyncio as redis
    from redis_native_lock.aio import Lock

    r = redis.Redis()
    async with Lock(r, "orders:42", ttl=30, wait=10) as lock:
        await storage.write(data, fencing_token=lock.token)
"""

from ._async import Holder, Lock, MultiLock, ReadWriteLock, ReentrantLock, Semaphore, Session
from ._common import DeadlockError, FewerReplicas, LeaseLost, LockError, LockNotAcquired, NotDurable
from ._dropin import NotDurableLockError
from ._dropin_async import NativeLock

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
