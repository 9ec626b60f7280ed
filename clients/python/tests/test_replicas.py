"""`replicas=N`: each grant and renewal followed by `WAIT N ms` on its
connection. REDIS_LOCK_MASTER_PORT: a master with one replica, whose process
id is REDIS_LOCK_REPLICA_PID (paused here with SIGSTOP, resumed with
SIGCONT). The tests are skipped without them (tests/it/python_package.rs sets
them).
"""

import asyncio
import os
import signal
import time
import unittest
import uuid
import warnings

import redis
import redis.asyncio

from redis_native_lock import FewerReplicas, Lock, NativeLock, NotDurable, NotDurableLockError
from redis_native_lock import aio

PORT = int(os.environ.get("REDIS_LOCK_MASTER_PORT", "0"))
REPLICA_PID = int(os.environ.get("REDIS_LOCK_REPLICA_PID", "0"))


def key(name):
    return "replicas:%s:%s" % (uuid.uuid4().hex[:8], name)


class Paused:
    """The replica stopped (SIGSTOP) for the block, resumed after."""

    def __enter__(self):
        os.kill(REPLICA_PID, signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        os.kill(REPLICA_PID, signal.SIGCONT)


@unittest.skipUnless(PORT and REPLICA_PID, "needs REDIS_LOCK_MASTER_PORT and REDIS_LOCK_REPLICA_PID")
class Replicas(unittest.TestCase):
    def setUp(self):
        self.r = redis.Redis(port=PORT, socket_timeout=5)
        # The replica is in step before each test.
        self.assertEqual(self.r.execute_command("WAIT", 1, 5000), 1)

    def tearDown(self):
        self.r.close()

    def test_acknowledged_with_the_replica_up(self):
        name = key("up")
        lock = Lock(self.r, name, ttl=3, replicas=1, replicas_timeout=1)
        self.assertTrue(lock.acquire())
        self.assertEqual(lock._held().acked, 1)
        self.assertTrue(lock.owned())
        time.sleep(1.5)  # a renewal (at a third of the ttl), acknowledged too
        self.assertFalse(lock.lost)
        self.assertEqual(lock._held().acked, 1)
        lock.release()

    def test_refused_and_released_with_the_replica_paused(self):
        name = key("paused")
        lock = Lock(self.r, name, ttl=10, replicas=1, replicas_timeout=0.3)
        with Paused():
            t0 = time.monotonic()
            with self.assertRaises(NotDurable) as e:
                lock.acquire()
            self.assertGreaterEqual(time.monotonic() - t0, 0.29)
            self.assertEqual((e.exception.acked, e.exception.wanted), (0, 1))
            self.assertIsNone(self.r.execute_command("LOCK.INFO", name))  # released
            self.assertIsNone(lock.token)
        other = Lock(self.r, name, ttl=10)
        self.assertTrue(other.acquire())
        other.release()

    def test_warn_keeps_the_grant(self):
        name = key("warn")
        lock = Lock(self.r, name, ttl=10, replicas=1, replicas_timeout=0.2, on_fewer_replicas="warn")
        with Paused():
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                self.assertTrue(lock.acquire())
            self.assertTrue(any(issubclass(x.category, FewerReplicas) for x in w))
            self.assertIs(lock._held().durable, False)
            self.assertTrue(lock.owned())
        lock.release()

    def test_renewal_not_acknowledged_gives_the_lease_up(self):
        name = key("renew")
        lost = []
        lock = Lock(self.r, name, ttl=3, replicas=1, replicas_timeout=0.2, on_lost=lambda h, why: lost.append(why))
        self.assertTrue(lock.acquire())
        with Paused():
            # The renewal at 1 s waits 0.2 s for the paused replica (later
            # on a loaded machine, but before the lease's end at 3 s).
            deadline = time.monotonic() + 2.8
            while not lost and time.monotonic() < deadline:
                time.sleep(0.02)
            self.assertTrue(lock.lost)
            self.assertIn("replicas", lost[0])
            self.assertIsNone(self.r.execute_command("LOCK.INFO", name))  # given up on the master
        with self.assertRaises(Exception):
            lock.release()

    def test_a_long_wait_for_replicas_does_not_push_the_next_renewal_back(self):
        # With on_fewer_replicas="warn" each renewal's WAIT runs its 4.5 s
        # timeout while the replica is paused, on a 6 s lease: the next
        # renewal is due a third of the ttl after the last was sent (at
        # once, when its WAIT ends), so the lease is kept. Counted from the
        # WAIT's end, the first renewal's successor came at 8.5 s, past the
        # lease's end at 8 s.
        name = key("longwait")
        lost = []
        lock = Lock(
            self.r, name, ttl=6, replicas=1, replicas_timeout=4.5,
            on_fewer_replicas="warn", on_lost=lambda h, why: lost.append(why),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FewerReplicas)
            self.assertTrue(lock.acquire())
            with Paused():
                time.sleep(10)
                self.assertEqual(lost, [])
                self.assertTrue(lock.owned())
            lock.release()

    def test_extend_not_acknowledged(self):
        name = key("extend")
        lock = Lock(self.r, name, ttl=10, replicas=1, replicas_timeout=0.2)
        self.assertTrue(lock.acquire())
        with Paused():
            with self.assertRaises(NotDurable):
                lock.extend(20)
            self.assertTrue(lock.lost)

    def test_dropin_replicas(self):
        name = key("dropin")
        lock = self.r.lock(name, lock_class=NativeLock)
        self.assertEqual(lock.holder.replicas, 0)
        lock = NativeLock(self.r, name, timeout=10, replicas=1, replicas_timeout=0.2)
        self.assertTrue(lock.acquire())
        self.assertTrue(lock.extend(5))
        lock.release()
        with Paused():
            with self.assertRaises(NotDurableLockError) as e:
                lock.acquire()
            self.assertIsInstance(e.exception, redis.exceptions.LockError)
            self.assertIsInstance(e.exception, NotDurable)
            self.assertFalse(lock.locked())


@unittest.skipUnless(PORT and REPLICA_PID, "needs REDIS_LOCK_MASTER_PORT and REDIS_LOCK_REPLICA_PID")
class AsyncReplicas(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.r = redis.asyncio.Redis(port=PORT, socket_timeout=5)
        self.assertEqual(await self.r.execute_command("WAIT", 1, 5000), 1)

    async def asyncTearDown(self):
        await self.r.aclose()

    async def test_acknowledged_then_refused(self):
        name = key("async")
        lock = aio.Lock(self.r, name, ttl=3, replicas=1, replicas_timeout=0.3)
        self.assertTrue(await lock.acquire())
        self.assertEqual(lock._held().acked, 1)
        await lock.release()
        with Paused():
            with self.assertRaises(NotDurable):
                await lock.acquire()
            self.assertIsNone(await self.r.execute_command("LOCK.INFO", name))
        dropin = aio.NativeLock(self.r, name, replicas=1, replicas_timeout=0.3)
        self.assertTrue(await dropin.acquire())
        await dropin.release()
        with Paused():
            with self.assertRaises(NotDurableLockError):
                await dropin.acquire()
            await asyncio.sleep(0)
            self.assertFalse(await dropin.locked())


if __name__ == "__main__":
    unittest.main()
