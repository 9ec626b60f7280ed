"""The blocking API against a real server with the module, and against a
3-master cluster: REDIS_LOCK_PORT (a server), REDIS_LOCK_CLUSTER_PORT (a
cluster node; the cluster tests are skipped without it).

    python -m unittest discover -s clients/python/tests
"""

import os
import threading
import time
import unittest
import uuid

import redis
from redis.cluster import RedisCluster

from redis_native_lock import (
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


def hold_for(lock, seconds):
    """Acquires `lock` in a thread of its own (holds are per thread) and
    releases it there after `seconds`; returns its token once it is held."""
    held = threading.Event()
    token = []

    def run():
        assert lock.acquire(wait=5)
        token.append(lock.token)
        held.set()
        time.sleep(seconds)
        lock.release()

    t = threading.Thread(target=run)
    t.start()
    assert held.wait(10)
    return token[0]


def fresh(name):
    """A key of its own per test, with a hash tag so that a test's keys
    share a slot in a cluster."""
    return "{%s}:%s" % (uuid.uuid4().hex[:8], name)


class Base:
    """The tests, run on each kind of client by the classes below."""

    def client(self):
        raise NotImplementedError

    def setUp(self):
        self.r = self.client()

    def tearDown(self):
        self.r.close()

    def pttl(self, key):
        return self.r.execute_command("PTTL", key)

    def test_with_block_gives_a_token_and_releases(self):
        key = fresh("k")
        with Lock(self.r, key, ttl=10) as lock:
            self.assertIsInstance(lock.token, int)
            self.assertTrue(lock.bound)
            self.assertTrue(lock.owned())
            self.assertFalse(Lock(self.r, key).acquire(wait=0))
        self.assertFalse(lock.locked())
        with Lock(self.r, key) as second:
            self.assertGreater(second.token, lock.token)

    def test_a_waiter_is_granted_when_the_holder_releases(self):
        key = fresh("k")
        holder = Lock(self.r, key, ttl=10)
        first = hold_for(holder, 0.3)
        start = time.monotonic()
        waiter = Lock(self.r, key, ttl=10)
        self.assertTrue(waiter.acquire(wait=5))
        self.assertLess(time.monotonic() - start, 3)
        self.assertGreater(waiter.token, first)
        waiter.release()

    def test_not_granted_within_the_wait(self):
        key = fresh("k")
        with Lock(self.r, key):
            with self.assertRaises(LockNotAcquired):
                with Lock(self.r, key, wait=0.2):
                    pass

    def test_reentrant_lock_counts_holds(self):
        key = fresh("k")
        lock = ReentrantLock(self.r, key, ttl=10)
        self.assertTrue(lock.acquire())
        first = lock.token
        self.assertTrue(lock.acquire())
        self.assertEqual(lock.token, first)
        lock.release()
        self.assertTrue(lock.owned())
        lock.release()
        self.assertFalse(lock.locked())
        with self.assertRaises(LockError):
            lock.release()

    def test_read_write_lock(self):
        key = fresh("rw")
        a, b = ReadWriteLock(self.r, key), ReadWriteLock(self.r, key)
        with a.read(), b.read():
            self.assertFalse(ReadWriteLock(self.r, key).write().acquire(wait=0))
        with a.write() as w:
            self.assertFalse(b.read().acquire(wait=0))
            with a.write():  # reentrant
                self.assertTrue(w.owned())
        self.assertTrue(b.read().acquire(wait=0))
        b.read().release()

    def test_semaphore_permits(self):
        key = fresh("sem")
        p1, p2, p3 = (Semaphore(self.r, key, 2, ttl=10) for _ in range(3))
        hold_for(p1, 0.2)
        self.assertTrue(p2.acquire(wait=0))
        self.assertFalse(p3.acquire(wait=0))
        self.assertTrue(p3.acquire(wait=5))
        self.assertNotEqual(p2.token, p3.token)
        p2.release()
        p3.release()
        with self.assertRaises(ValueError):
            Semaphore(self.r, key, 0)

    def test_multilock_all_or_none(self):
        tag = uuid.uuid4().hex[:8]
        a, b = "{%s}:a" % tag, "{%s}:b" % tag
        with MultiLock(self.r, [a, b], ttl=10) as m:
            self.assertFalse(Lock(self.r, b).acquire(wait=0))
            self.assertEqual(m.keys, [a, b])
        self.assertTrue(Lock(self.r, b).acquire(wait=0))

    def test_extend_sets_the_lease_from_now(self):
        key = fresh("k")
        with Lock(self.r, key, ttl=1) as lock:
            lock.extend(20)
            # The holder's ttl (LOCK.INFO): a bound lock's key has no Redis
            # TTL (it follows its connection's lease).
            info = self.r.execute_command("LOCK.INFO", key)
            holders = info.get(b"holders", info.get("holders")) if isinstance(info, dict) else info[3]
            self.assertGreater(holders[0][2], 10_000)

    def test_the_keeper_renews_bound_and_unbound_leases(self):
        for bind in (True, False):
            key = fresh("k")
            with Lock(self.r, key, ttl=4, bind=bind) as lock:
                self.assertEqual(lock.bound, bind)
                time.sleep(5)  # past its ttl: renewed by the keeper
                self.assertFalse(lock.lost)
                self.assertTrue(lock.owned())

    def test_a_deleted_lock_is_signalled_lost(self):
        for bind in (True, False):
            key = fresh("k")
            seen = []
            lock = Lock(self.r, key, ttl=0.6, bind=bind, on_lost=lambda h, why: seen.append(why))
            with self.assertRaises(LeaseLost):
                with lock:
                    self.r.delete(key)
                    deadline = time.monotonic() + 3
                    while not lock.lost and time.monotonic() < deadline:
                        time.sleep(0.05)
                    self.assertTrue(lock.lost)
                    with self.assertRaises(LeaseLost):
                        lock.check()
            self.assertEqual(len(seen), 1, seen)

    def test_a_bound_lock_is_freed_when_its_connection_closes(self):
        key = fresh("k")
        lock = Lock(self.r, key, ttl=30)
        self.assertTrue(lock.acquire())
        lock._hold().conn.disconnect()  # what a dead process does
        other = Lock(self.r, key)
        self.assertTrue(other.acquire(wait=5))
        other.release()

    def test_deadlock_is_its_own_error(self):
        k1, k2 = fresh("d1"), fresh("d2")
        if isinstance(self.r, RedisCluster):
            tag = uuid.uuid4().hex[:8]
            k1, k2 = "{%s}:d1" % tag, "{%s}:d2" % tag
        a1, b2 = Lock(self.r, k1, ttl=10, owner="A"), Lock(self.r, k2, ttl=10, owner="B")
        self.assertTrue(a1.acquire())
        self.assertTrue(b2.acquire())
        a_waits = Lock(self.r, k2, ttl=10, owner="A")
        result = {}
        def a_wait():
            result["a"] = a_waits.acquire(wait=3)
            a_waits.release()

        t = threading.Thread(target=a_wait)
        t.start()
        # A queued on k2 (LOCK.INFO's waiters), however slow the machine,
        # before B's request closes the cycle.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            info = self.r.execute_command("LOCK.INFO", k2)
            fields = dict(zip(info[::2], info[1::2])) if isinstance(info, list) else dict(info or {})
            if int(fields.get(b"waiters", fields.get("waiters", 0))) >= 1:
                break
            time.sleep(0.01)
        with self.assertRaises(DeadlockError):
            Lock(self.r, k1, ttl=10, owner="B").acquire(wait=3)
        b2.release()
        t.join()
        self.assertTrue(result["a"])
        a1.release()

    def test_a_client_socket_timeout_does_not_cut_a_wait(self):
        # The waiting acquire goes over a connection of the package's own,
        # without the client's socket timeout.
        r = self.client(socket_timeout=0.5)
        try:
            for bind in (True, False):
                key = fresh("k")
                holder = Lock(r, key, ttl=10)
                hold_for(holder, 1.0)
                waiter = Lock(r, key, ttl=10, bind=bind)
                self.assertTrue(waiter.acquire(wait=5))
                self.assertEqual(waiter.bound, bind)
                waiter.release()
        finally:
            r.close()


@unittest.skipUnless(PORT, "REDIS_LOCK_PORT not set")
class SingleServer(Base, unittest.TestCase):
    def client(self, **kw):
        return redis.Redis(host="127.0.0.1", port=PORT, **kw)


@unittest.skipUnless(CLUSTER_PORT, "REDIS_LOCK_CLUSTER_PORT not set")
class Cluster(Base, unittest.TestCase):
    def client(self, **kw):
        return RedisCluster(host="127.0.0.1", port=CLUSTER_PORT, **kw)


if __name__ == "__main__":
    unittest.main()
