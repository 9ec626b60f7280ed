"""The asyncio API, against the same servers as test_sync.py."""

import asyncio
import os
import time
import unittest
import uuid

import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster

from redis_native_lock.aio import (
    DeadlockError,
    LeaseLost,
    Lock,
    LockError,
    LockNotAcquired,
    MultiLock,
    ReadWriteLock,
    ReentrantLock,
    Semaphore,
)

PORT = int(os.environ.get("REDIS_LOCK_PORT", "0"))
CLUSTER_PORT = int(os.environ.get("REDIS_LOCK_CLUSTER_PORT", "0"))


def fresh(name):
    return "{%s}:%s" % (uuid.uuid4().hex[:8], name)


class Base:
    def client(self, **kw):
        raise NotImplementedError

    async def asyncSetUp(self):
        self.r = self.client()

    async def asyncTearDown(self):
        await self.r.aclose()

    async def test_with_block_gives_a_token_and_releases(self):
        key = fresh("k")
        async with Lock(self.r, key, ttl=10) as lock:
            self.assertIsInstance(lock.token, int)
            self.assertTrue(lock.bound)
            self.assertTrue(await lock.owned())
            self.assertFalse(await Lock(self.r, key).acquire(wait=0))
        self.assertFalse(await lock.locked())
        async with Lock(self.r, key) as second:
            self.assertGreater(second.token, lock.token)

    async def test_a_waiter_is_granted_when_the_holder_releases(self):
        key = fresh("k")
        holder = Lock(self.r, key, ttl=10)
        held = asyncio.Event()

        async def hold():  # holds are per task: acquired and released here
            self.assertTrue(await holder.acquire())
            held.set()
            await asyncio.sleep(0.3)
            token = holder.token
            await holder.release()
            return token

        task = asyncio.create_task(hold())
        await held.wait()
        start = time.monotonic()
        waiter = Lock(self.r, key, ttl=10)
        self.assertTrue(await waiter.acquire(wait=5))
        self.assertLess(time.monotonic() - start, 3)
        self.assertGreater(waiter.token, await task)
        await waiter.release()

    async def test_not_granted_within_the_wait(self):
        key = fresh("k")
        async with Lock(self.r, key):
            with self.assertRaises(LockNotAcquired):
                async with Lock(self.r, key, wait=0.2):
                    pass

    async def test_reentrant_lock_counts_holds(self):
        key = fresh("k")
        lock = ReentrantLock(self.r, key, ttl=10)
        self.assertTrue(await lock.acquire())
        first = lock.token
        self.assertTrue(await lock.acquire())
        self.assertEqual(lock.token, first)
        await lock.release()
        self.assertTrue(await lock.owned())
        await lock.release()
        self.assertFalse(await lock.locked())
        with self.assertRaises(LockError):
            await lock.release()

    async def test_read_write_lock(self):
        key = fresh("rw")
        a, b = ReadWriteLock(self.r, key), ReadWriteLock(self.r, key)
        async with a.read(), b.read():
            self.assertFalse(await ReadWriteLock(self.r, key).write().acquire(wait=0))
        async with a.write():
            self.assertFalse(await b.read().acquire(wait=0))
        self.assertTrue(await b.read().acquire(wait=0))
        await b.read().release()

    async def test_semaphore_permits(self):
        key = fresh("sem")
        p1, p2, p3 = (Semaphore(self.r, key, 2, ttl=10) for _ in range(3))
        self.assertTrue(await p1.acquire(wait=0))
        self.assertTrue(await p2.acquire(wait=0))
        self.assertFalse(await p3.acquire(wait=0))
        async def wait_for_a_permit():
            granted = await p3.acquire(wait=5)
            await p3.release()
            return granted

        waiting = asyncio.create_task(wait_for_a_permit())
        await asyncio.sleep(0.2)
        await p1.release()
        self.assertTrue(await waiting)
        await p2.release()

    async def test_multilock_all_or_none(self):
        tag = uuid.uuid4().hex[:8]
        a, b = "{%s}:a" % tag, "{%s}:b" % tag
        async with MultiLock(self.r, [a, b], ttl=10) as m:
            self.assertEqual(len(m.tokens), 2)
            self.assertFalse(await Lock(self.r, b).acquire(wait=0))
        self.assertTrue(await Lock(self.r, b).acquire(wait=0))

    async def test_the_keeper_renews_bound_and_unbound_leases(self):
        for bind in (True, False):
            key = fresh("k")
            async with Lock(self.r, key, ttl=2, bind=bind) as lock:
                self.assertEqual(lock.bound, bind)
                await asyncio.sleep(2.5)
                self.assertFalse(lock.lost)
                self.assertTrue(await lock.owned())

    async def test_a_deleted_lock_is_signalled_lost(self):
        for bind in (True, False):
            key = fresh("k")
            seen = []

            async def on_lost(holder, why):
                seen.append(why)

            lock = Lock(self.r, key, ttl=0.6, bind=bind, on_lost=on_lost)
            with self.assertRaises(LeaseLost):
                async with lock:
                    await self.r.delete(key)
                    deadline = time.monotonic() + 3
                    while not lock.lost and time.monotonic() < deadline:
                        await asyncio.sleep(0.05)
                    self.assertTrue(lock.lost)
            self.assertEqual(len(seen), 1, seen)

    async def test_extend_sets_the_lease_from_now(self):
        key = fresh("k")
        async with Lock(self.r, key, ttl=1) as lock:
            await lock.extend(20)
            # The holder's ttl (LOCK.INFO): a bound lock's key has no Redis
            # TTL (it follows its connection's lease).
            info = await self.r.execute_command("LOCK.INFO", key)
            holders = info.get(b"holders", info.get("holders")) if isinstance(info, dict) else info[3]
            self.assertGreater(holders[0][2], 10_000)

    async def test_cancelling_a_waiting_acquire_leaves_no_lock_behind(self):
        key = fresh("k")
        holder = Lock(self.r, key, ttl=10)
        self.assertTrue(await holder.acquire())
        waiting = asyncio.create_task(Lock(self.r, key, ttl=10).acquire(wait=5))
        await asyncio.sleep(0.2)
        waiting.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await waiting
        await holder.release()
        await asyncio.sleep(0.2)
        self.assertFalse(await holder.locked(), "the cancelled waiter was not granted")

    async def test_deadlock_is_its_own_error(self):
        tag = uuid.uuid4().hex[:8]
        k1, k2 = "{%s}:d1" % tag, "{%s}:d2" % tag
        a1, b2 = Lock(self.r, k1, ttl=10, owner="A"), Lock(self.r, k2, ttl=10, owner="B")
        self.assertTrue(await a1.acquire())
        self.assertTrue(await b2.acquire())
        a_waits = Lock(self.r, k2, ttl=10, owner="A")
        task = asyncio.create_task(a_waits.acquire(wait=3))
        # A queued on k2 (LOCK.INFO's waiters), however slow the machine,
        # before B's request closes the cycle.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while loop.time() < deadline:
            info = await self.r.execute_command("LOCK.INFO", k2)
            fields = dict(zip(info[::2], info[1::2])) if isinstance(info, list) else dict(info or {})
            if int(fields.get(b"waiters", fields.get("waiters", 0))) >= 1:
                break
            await asyncio.sleep(0.01)
        with self.assertRaises(DeadlockError):
            await Lock(self.r, k1, ttl=10, owner="B").acquire(wait=3)
        await b2.release()
        self.assertTrue(await task)
        await a_waits.release()
        await a1.release()


@unittest.skipUnless(PORT, "REDIS_LOCK_PORT not set")
class SingleServer(Base, unittest.IsolatedAsyncioTestCase):
    def client(self, **kw):
        return aredis.Redis(host="127.0.0.1", port=PORT, **kw)


@unittest.skipUnless(CLUSTER_PORT, "REDIS_LOCK_CLUSTER_PORT not set")
class Cluster(Base, unittest.IsolatedAsyncioTestCase):
    def client(self, **kw):
        return RedisCluster(host="127.0.0.1", port=CLUSTER_PORT, **kw)


if __name__ == "__main__":
    unittest.main()
