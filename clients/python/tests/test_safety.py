"""What a user relies on without reading the fine print, blocking and
asyncio: one lock object shared by threads or tasks, a stalled server among
several, fork(), a lost lease told at once, and an API that says what it
does. REDIS_LOCK_PORT (a server), REDIS_LOCK_STALL_PORTS (three servers of
this test's own: one is stopped with SIGSTOP, and resumed, by the test).
"""

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid

import redis
import redis.asyncio as aredis

import redis_native_lock as rnl
import redis_native_lock.aio as arnl
from redis_native_lock import LeaseLost, LockError
from redis_native_lock.redlock import AsyncRedLock, RedLock

PORT = int(os.environ.get("REDIS_LOCK_PORT", "0"))
STALL_PORTS = [int(p) for p in os.environ.get("REDIS_LOCK_STALL_PORTS", "").split(",") if p]


def owners(info):
    """The holders' owners in a LOCK.INFO reply (RESP2 or RESP3)."""
    info = dict(zip(info[::2], info[1::2])) if isinstance(info, list) else info
    return [h[0] for h in info[b"holders"]]


def fresh(name):
    return "{%s}:%s" % (uuid.uuid4().hex[:8], name)


def kinds(mod, r, key):
    """One shared object of each exclusive kind, and the key that fences it."""
    return [
        ("Lock", mod.Lock(r, key + ":l", ttl=5), key + ":l"),
        ("ReentrantLock", mod.ReentrantLock(r, key + ":r", ttl=5), key + ":r"),
        ("ReadWriteLock.write", mod.ReadWriteLock(r, key + ":w", ttl=5).write(), key + ":w"),
        ("Semaphore(1)", mod.Semaphore(r, key + ":s", 1, ttl=5), key + ":s"),
        ("MultiLock", mod.MultiLock(r, [key + ":m1", key + ":m2"], ttl=5), key + ":m1"),
    ]


@unittest.skipUnless(PORT, "REDIS_LOCK_PORT not set")
class Sync(unittest.TestCase):
    def setUp(self):
        self.r = redis.Redis(host="127.0.0.1", port=PORT)

    def tearDown(self):
        self.r.close()

    def test_one_object_shared_by_threads_lets_one_in_at_a_time(self):
        N, ROUNDS = 4, 5
        for name, lock, fence in kinds(rnl, self.r, fresh("share")):
            counter = fence + ":counter"
            tokens, errors, inside = [], [], [0]
            guard = threading.Lock()

            def work():
                try:
                    for _ in range(ROUNDS):
                        self.assertTrue(lock.acquire(wait=30))
                        with guard:
                            inside[0] += 1
                            self.assertEqual(inside[0], 1, f"{name}: two threads inside")
                            tokens.append(lock.token)
                        n = int(self.r.get(counter) or 0)
                        time.sleep(0.01)
                        self.r.set(counter, n + 1)
                        with guard:
                            inside[0] -= 1
                        lock.release()
                except BaseException as e:  # noqa: BLE001
                    errors.append(e)

            threads = [threading.Thread(target=work) for _ in range(N)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            self.assertEqual(errors, [], name)
            self.assertEqual(int(self.r.get(counter)), N * ROUNDS, name)
            self.assertEqual(tokens, sorted(tokens), f"{name}: tokens increase with each holder")
            self.assertEqual(len(set(tokens)), N * ROUNDS, name)

    def test_an_explicit_owner_shared_by_threads_is_refused_at_the_second_acquire(self):
        lock = rnl.Lock(self.r, fresh("k"), owner=b"worker-1")
        self.assertTrue(lock.acquire())
        err = []
        t = threading.Thread(target=lambda: err.append(self.assertRaises(LockError, lock.acquire)))
        t.start()
        t.join()
        self.assertEqual(len(err), 1)
        lock.release()  # another thread may release an owner= lock: it is one holder
        t = threading.Thread(target=lambda: (lock.acquire(), lock.release()))
        t.start()
        t.join()

    def test_fork_children_use_connections_of_their_own(self):
        key = fresh("fork")
        lock = rnl.Lock(self.r, key, ttl=5)
        self.assertTrue(lock.acquire())  # leaves an idle connection in the parent
        lock.release()
        pids = []
        for _ in range(2):
            pid = os.fork()
            if pid == 0:  # the child: acquire and release in a loop, fenced
                code = 1
                try:
                    r = redis.Redis(host="127.0.0.1", port=PORT, socket_timeout=5)
                    last = 0
                    for _ in range(20):
                        assert lock.acquire(wait=10)
                        assert lock.token > last
                        last = lock.token
                        n = int(r.get(key + ":n") or 0)
                        r.set(key + ":n", n + 1)
                        lock.release()
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
        deadline = time.monotonic() + 60
        codes = {}
        while len(codes) < len(pids) and time.monotonic() < deadline:
            for pid in pids:
                if pid not in codes:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        codes[pid] = os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        for pid in pids:
            if pid not in codes:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        self.assertEqual(sorted(codes.values()), [0, 0], "both children finished, none hung")
        self.assertEqual(int(self.r.get(key + ":n")), 40)
        self.assertTrue(lock.acquire())  # the parent's connections still work
        lock.release()

    def test_a_deleted_bound_lock_is_told_within_100_ms_and_stays_lost(self):
        key = fresh("k")
        seen = []
        lock = rnl.Lock(self.r, key, ttl=60, on_lost=lambda h, why: seen.append(why))  # keepalive: every 20 s
        self.assertTrue(lock.acquire())
        time.sleep(0.05)
        start = time.monotonic()
        self.r.delete(key)
        while not lock.lost and time.monotonic() - start < 10:
            time.sleep(0.002)
        took = time.monotonic() - start
        self.assertTrue(lock.lost, "told by the watcher, before the next keepalive")
        print(f"\n  sync: DEL told after {took * 1000:.1f} ms", file=sys.stderr)
        with self.assertRaises(LeaseLost):
            lock.release()
        self.assertTrue(lock.lost, "lost stays true after the release")
        # The lock is marked lost before its callback runs (on the watcher's
        # thread): the callback is waited for, then counted.
        start = time.monotonic()
        while not seen and time.monotonic() - start < 10:
            time.sleep(0.002)
        self.assertEqual(len(seen), 1)

    def test_an_overwritten_lock_is_lease_lost_at_release(self):
        for bind in (True, False):
            key = fresh("k")
            lock = rnl.Lock(self.r, key, ttl=10, bind=bind)
            self.assertTrue(lock.acquire())
            self.r.set(key, "x")
            with self.assertRaises(LeaseLost):
                lock.release()
            self.assertTrue(lock.lost)
            key = fresh("k")
            lock = rnl.Lock(self.r, key, ttl=10, bind=bind)
            self.assertTrue(lock.acquire())
            self.r.set(key, "x")
            with self.assertRaises(LeaseLost):
                lock.extend(5)

    def test_acquire_without_argument_does_not_wait(self):
        key = fresh("k")
        holder = rnl.Lock(self.r, key, wait=10)
        self.assertTrue(holder.acquire())
        other = rnl.Lock(self.r, key, wait=10)
        start = time.monotonic()
        self.assertFalse(other.acquire())
        self.assertLess(time.monotonic() - start, 3)  # not the wait of 10 s
        holder.release()

    def test_read_write_lock_honours_owner_and_refuses_a_mode_change_at_once(self):
        key = fresh("rw")
        rw = rnl.ReadWriteLock(self.r, key, owner=b"me\x00\xff")
        with rw.write():
            self.assertEqual(owners(self.r.execute_command("LOCK.INFO", key)), [b"me\x00\xff"])
        rw = rnl.ReadWriteLock(self.r, key)
        self.assertTrue(rw.read().acquire())
        start = time.monotonic()
        with self.assertRaisesRegex(LockError, "shared"):
            rw.write().acquire(wait=5)
        self.assertLess(time.monotonic() - start, 3)
        rw.read().release()

    def test_bad_arguments_are_clear_errors(self):
        with self.assertRaisesRegex(TypeError, "list of keys"):
            rnl.MultiLock(self.r, "abc")
        with self.assertRaisesRegex(TypeError, "redis_native_lock.Lock"):
            arnl.Lock(self.r, "k")
        with self.assertRaises(TypeError):
            rnl.Lock(self.r, "k", timeout=30)
        with self.assertRaisesRegex(TypeError, "redis_native_lock.aio.Lock"):
            rnl.Lock(aredis.Redis(port=PORT), "k")
        with self.assertRaisesRegex(TypeError, "AsyncRedLock"):
            AsyncRedLock([self.r])

    def test_redlock_and_async_redlock_offer_the_same_methods(self):
        def public(cls):
            return {m for m in dir(cls) if not m.startswith("_")}

        self.assertEqual(public(RedLock), public(AsyncRedLock))
        self.assertIn("extend", public(AsyncRedLock))

    def test_mypy_catches_a_misspelt_keyword(self):
        src = (
            "import redis\nfrom redis_native_lock import Lock\n"
            "Lock(redis.Redis(), 'k', timeout=30)\n"
            "Lock(redis.Redis(), 'k', ttl=30, wait=None, owner=b'me', bind=False)\n"
        )
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "user.py")
            with open(path, "w") as f:
                f.write(src)
            out = subprocess.run(
                [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", os.path.join(d, "c"), path],
                capture_output=True,
                text=True,
                timeout=300,
            )
        self.assertNotIn("No module named mypy", out.stderr, "mypy must be installed in the test venv")
        self.assertIn('Unexpected keyword argument "timeout"', out.stdout, out.stdout + out.stderr)
        self.assertIn("Found 1 error", out.stdout, out.stdout)


@unittest.skipUnless(PORT, "REDIS_LOCK_PORT not set")
class Async(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.r = aredis.Redis(host="127.0.0.1", port=PORT)

    async def asyncTearDown(self):
        await self.r.aclose()

    async def test_one_object_shared_by_tasks_lets_one_in_at_a_time(self):
        N, ROUNDS = 4, 5
        for name, lock, fence in kinds(arnl, self.r, fresh("share")):
            counter = fence + ":counter"
            tokens, inside = [], [0]

            async def work():
                for _ in range(ROUNDS):
                    self.assertTrue(await lock.acquire(wait=30))
                    inside[0] += 1
                    self.assertEqual(inside[0], 1, f"{name}: two tasks inside")
                    tokens.append(lock.token)
                    n = int(await self.r.get(counter) or 0)
                    await asyncio.sleep(0.01)
                    await self.r.set(counter, n + 1)
                    inside[0] -= 1
                    await lock.release()

            await asyncio.wait_for(asyncio.gather(*(work() for _ in range(N))), 60)
            self.assertEqual(int(await self.r.get(counter)), N * ROUNDS, name)
            self.assertEqual(tokens, sorted(tokens), name)
            self.assertEqual(len(set(tokens)), N * ROUNDS, name)

    async def test_an_explicit_owner_shared_by_tasks_is_refused_at_the_second_acquire(self):
        lock = arnl.Lock(self.r, fresh("k"), owner="worker-1")
        self.assertTrue(await lock.acquire())
        with self.assertRaises(LockError):
            await asyncio.create_task(lock.acquire())
        await lock.release()

    async def test_a_deleted_bound_lock_is_told_within_100_ms_and_stays_lost(self):
        key = fresh("k")
        lock = arnl.Lock(self.r, key, ttl=60)  # keepalive: every 20 s
        self.assertTrue(await lock.acquire())
        await asyncio.sleep(0.05)
        start = time.monotonic()
        await self.r.delete(key)
        while not lock.lost and time.monotonic() - start < 10:
            await asyncio.sleep(0.002)
        took = time.monotonic() - start
        self.assertTrue(lock.lost, "told by the watcher, before the next keepalive")
        print(f"\n  asyncio: DEL told after {took * 1000:.1f} ms", file=sys.stderr)
        with self.assertRaises(LeaseLost):
            await lock.release()
        self.assertTrue(lock.lost)

    async def test_an_overwritten_lock_is_lease_lost_at_release(self):
        for bind in (True, False):
            key = fresh("k")
            lock = arnl.Lock(self.r, key, ttl=10, bind=bind)
            self.assertTrue(await lock.acquire())
            await self.r.set(key, "x")
            with self.assertRaises(LeaseLost):
                await lock.release()
            self.assertTrue(lock.lost)

    async def test_acquire_without_argument_does_not_wait(self):
        key = fresh("k")
        holder = arnl.Lock(self.r, key)
        self.assertTrue(await holder.acquire())
        start = time.monotonic()
        self.assertFalse(await arnl.Lock(self.r, key).acquire())
        self.assertLess(time.monotonic() - start, 3)
        await holder.release()

    async def test_read_write_lock_honours_owner_and_refuses_a_mode_change_at_once(self):
        key = fresh("rw")
        async with arnl.ReadWriteLock(self.r, key, owner=b"me").write():
            self.assertEqual(owners(await self.r.execute_command("LOCK.INFO", key)), [b"me"])
        rw = arnl.ReadWriteLock(self.r, key)
        self.assertTrue(await rw.read().acquire())
        start = time.monotonic()
        with self.assertRaisesRegex(LockError, "shared"):
            await rw.write().acquire(wait=5)
        self.assertLess(time.monotonic() - start, 3)
        await rw.read().release()
        with self.assertRaisesRegex(TypeError, "list of keys"):
            arnl.MultiLock(self.r, b"abc")


def pid_of(port):
    return int(redis.Redis(host="127.0.0.1", port=port).info("server")["process_id"])


@unittest.skipUnless(len(STALL_PORTS) == 3, "REDIS_LOCK_STALL_PORTS (three servers) not set")
class StalledServer(unittest.TestCase):
    """Locks on three servers; the third is stopped (SIGSTOP). TTL 3 s (the
    healthy servers' locks must outlive a keeper that also waits out the
    stalled one's timeouts, on a loaded machine too), the clients'
    socket_timeout 0.5 s."""

    TTL, TIMEOUT = 3.0, 0.5

    def stalled(self, body):
        pid = pid_of(STALL_PORTS[2])
        os.kill(pid, signal.SIGSTOP)
        try:
            return body()
        finally:
            os.kill(pid, signal.SIGCONT)

    def test_sync(self):
        clients = [
            redis.Redis(host="127.0.0.1", port=p, socket_timeout=self.TIMEOUT, socket_connect_timeout=self.TIMEOUT)
            for p in STALL_PORTS
        ]
        key = fresh("stall")
        locks = [rnl.Lock(c, f"{key}:{b}", ttl=self.TTL, bind=b) for c in clients for b in (True, False)]
        for lock in locks:
            self.assertTrue(lock.acquire())

        def body():
            start = time.monotonic()
            slowest = 0.0
            while time.monotonic() - start < 3 * self.TTL:
                for lock in locks[:4]:
                    self.assertFalse(lock.lost, "a lock on a healthy server was lost")
                time.sleep(0.05)
            for lock in locks[4:]:
                self.assertTrue(lock.lost, "the stalled server's lock is reported lost")
            for call in (
                lambda: locks[4].release(),
                lambda: rnl.Lock(clients[2], fresh("k"), ttl=self.TTL).acquire(wait=1),
                lambda: rnl.Lock(clients[2], fresh("k"), ttl=self.TTL, bind=False).acquire(),
            ):
                t = time.monotonic()
                with self.assertRaises((LeaseLost, redis.TimeoutError, redis.ConnectionError)):
                    call()
                slowest = max(slowest, time.monotonic() - t)
            self.assertLess(slowest, 1 + self.TIMEOUT + 2)
            print(f"\n  sync: slowest call on the stalled server {slowest:.2f} s", file=sys.stderr)

        self.stalled(body)
        for lock in locks[:4]:
            self.assertTrue(lock.owned())
            lock.release()

    def test_asyncio(self):
        async def main():
            clients = [
                aredis.Redis(host="127.0.0.1", port=p, socket_timeout=self.TIMEOUT, socket_connect_timeout=self.TIMEOUT)
                for p in STALL_PORTS
            ]
            key = fresh("stall")
            locks = [arnl.Lock(c, f"{key}:{b}", ttl=self.TTL, bind=b) for c in clients for b in (True, False)]
            for lock in locks:
                self.assertTrue(await lock.acquire())
            pid = pid_of(STALL_PORTS[2])
            os.kill(pid, signal.SIGSTOP)
            try:
                start = time.monotonic()
                while time.monotonic() - start < 3 * self.TTL:
                    for lock in locks[:4]:
                        self.assertFalse(lock.lost, "a lock on a healthy server was lost")
                    await asyncio.sleep(0.05)
                for lock in locks[4:]:
                    self.assertTrue(lock.lost, "the stalled server's lock is reported lost")
                slowest = 0.0
                for make in (
                    lambda: locks[4].release(),
                    lambda: arnl.Lock(clients[2], fresh("k"), ttl=self.TTL).acquire(wait=1),
                ):
                    t = time.monotonic()
                    with self.assertRaises((LeaseLost, redis.TimeoutError, redis.ConnectionError, asyncio.TimeoutError)):
                        await make()
                    slowest = max(slowest, time.monotonic() - t)
                self.assertLess(slowest, 1 + self.TIMEOUT + 2)
                print(f"\n  asyncio: slowest call on the stalled server {slowest:.2f} s", file=sys.stderr)
            finally:
                os.kill(pid, signal.SIGCONT)
            for lock in locks[:4]:
                self.assertTrue(await lock.owned())
                await lock.release()

        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
