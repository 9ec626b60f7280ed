"""How long a hold lives, blocking and asyncio (issue 40): a lost bound lock
is told at once (a killed connection, a crashed and restarted server, a DEL
or SET over the key), long before the next keepalive; a hold outlives the
code that acquired it only as redis-py's lock does (the drop-in's
`timeout=`), and never forever (a thread or task that ended without
releasing: not renewed, ended within one lease, with a warning); a hold
taken in a task of its own (`asyncio.wait_for`, a `TaskGroup`) is released
by the code that awaited it; a stale holder never ends a newer grant to the
same owner name (`TOKEN`); `locked()`/`owned()` keep the package's
deadline on a stopped server.

REDIS_LOCK_PORT: a server; REDIS_LOCK_SERVER_BIN and REDIS_LOCK_MODULE: the
server binary and the module, for a server of this test's own that it kills
with SIGKILL and starts again on the same port; REDIS_LOCK_STALL_PORTS: three servers, the third stopped with SIGSTOP (and
resumed) by the test.

"Told at once" is asserted as "told before the next keepalive": the locks
here have a ttl of 60 s (a keepalive every 20 s) and must be told within
10 s, a bound no loaded machine misses; the time it took is printed.
"""

import asyncio
import gc
import os
import shutil
import signal
import socket
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

PORT = int(os.environ.get("REDIS_LOCK_PORT", "0"))
SERVER_BIN = os.environ.get("REDIS_LOCK_SERVER_BIN", "")
MODULE = os.environ.get("REDIS_LOCK_MODULE", "")
STALL_PORTS = [int(p) for p in os.environ.get("REDIS_LOCK_STALL_PORTS", "").split(",") if p]

LONG_TTL = 60  # a keepalive every 20 s: whatever is told sooner was told by the watcher
TOLD_WITHIN = 10.0


def fresh(name):
    return "{%s}:%s" % (uuid.uuid4().hex[:8], name)


def holders(r, key):
    """LOCK.INFO's holders of `key` as (owner, token, ttl_ms) ([] when free)."""
    info = r.execute_command("LOCK.INFO", key)
    if info is None:
        return []
    info = dict(zip(info[::2], info[1::2])) if isinstance(info, list) else info
    return [(h[0], h[3], h[2]) for h in info[b"holders"]]


def bound_connection_ids(r, name):
    """The ids of the package's bound connections of a client named `name`
    (made like the client's, name included); the watcher (`subscribe`) and
    this call's own connection are not among them."""
    return [c["id"] for c in r.client_list() if c.get("name") == name and c["cmd"] == "lock.info"]


def wait_until(pred, seconds):
    end = time.monotonic() + seconds
    while not pred() and time.monotonic() < end:
        time.sleep(0.005)
    return pred()


async def await_until(pred, seconds):
    end = time.monotonic() + seconds
    while not await pred() and time.monotonic() < end:
        await asyncio.sleep(0.005)
    return await pred()


class OwnServer:
    """A server with the module, of this test's own: killed with SIGKILL and
    started again on the same port (an empty one: nothing is saved)."""

    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.dir = tempfile.mkdtemp(prefix="rnl-own-")
        self.proc = None
        self.start()

    def start(self):
        binary = shutil.which(SERVER_BIN) or SERVER_BIN
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", self.dir, "--loadmodule", MODULE]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)
        if not wait_until(lambda: _pings(r), 20):
            raise RuntimeError(f"{binary} did not start on {self.port}")
        r.close()

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.kill9()
        shutil.rmtree(self.dir, ignore_errors=True)


def report(what, took):
    print(f"\n  {what}: told after {took * 1000:.1f} ms", file=sys.stderr)


@unittest.skipUnless(PORT and SERVER_BIN and MODULE, "REDIS_LOCK_PORT, REDIS_LOCK_SERVER_BIN and REDIS_LOCK_MODULE not set")
class Sync(unittest.TestCase):
    def setUp(self):
        self.name = "t-" + uuid.uuid4().hex[:8]
        self.r = redis.Redis(host="127.0.0.1", port=PORT, client_name=self.name, socket_timeout=5)

    def tearDown(self):
        self.r.close()

    def told(self, lock, what):
        start = time.monotonic()
        self.assertTrue(wait_until(lambda: lock.lost, TOLD_WITHIN), f"{what}: not told before the next keepalive")
        report(f"sync: {what}", time.monotonic() - start)

    # -- a lost bound lock is told at once ----------------------------------

    def test_a_killed_bound_connection_is_told_before_the_next_keepalive(self):
        key = fresh("kill")
        seen = []
        lock = rnl.Lock(self.r, key, ttl=LONG_TTL, on_lost=lambda h, why: seen.append(why))
        self.assertTrue(lock.acquire())
        ids = bound_connection_ids(self.r, self.name)
        self.assertEqual(len(ids), 1, self.r.client_list())
        self.r.execute_command("CLIENT", "KILL", "ID", ids[0])
        self.told(lock, "CLIENT KILL of the bound connection")
        # The lock is marked lost before its callback runs (on the keeper's
        # thread): the callback is waited for, then counted.
        self.assertTrue(wait_until(lambda: seen, TOLD_WITHIN), "on_lost called")
        self.assertEqual(len(seen), 1)
        self.assertIn("closed", seen[0])
        with self.assertRaises(LeaseLost):
            lock.check()
        with self.assertRaises(LeaseLost):
            lock.release()
        self.assertTrue(lock.acquire())  # acquire again: that is the re-binding
        lock.release()

    def test_a_killed_and_restarted_server_is_told_before_the_next_keepalive(self):
        server = OwnServer()
        try:
            r = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)
            lock, other = rnl.Lock(r, fresh("crash"), ttl=LONG_TTL), rnl.Lock(r, fresh("restart"), ttl=LONG_TTL)
            self.assertTrue(lock.acquire())
            server.kill9()
            self.told(lock, "kill -9 of the server")
            with self.assertRaises(LeaseLost):
                lock.release()
            server.start()
            self.assertTrue(other.acquire())
            server.kill9()
            server.start()  # back before anything was sent: its connections are dead all the same
            self.told(other, "a restart of the server")
            self.assertTrue(lock.acquire())
            lock.release()
            r.close()
        finally:
            server.stop()

    def test_a_set_over_the_key_is_told_before_the_next_keepalive(self):
        for overwrite in (lambda k: self.r.delete(k), lambda k: self.r.set(k, "x")):
            key = fresh("set")
            lock = rnl.Lock(self.r, key, ttl=LONG_TTL)
            self.assertTrue(lock.acquire())
            overwrite(key)
            self.told(lock, "DEL or SET over the key")
            with self.assertRaises(LeaseLost):
                lock.release()
            self.r.delete(key)

    # -- no hold outlives its holder ----------------------------------------

    def test_a_thread_that_ends_holding_is_not_renewed_and_warned_of(self):
        key, kept = fresh("ended"), fresh("kept")
        lock, control = rnl.Lock(self.r, key, ttl=3), rnl.Lock(self.r, kept, ttl=3)
        self.assertTrue(control.acquire())  # held by a living thread: renewed all along
        with self.assertLogs("redis_native_lock", level="WARNING") as logs:
            t = threading.Thread(target=lambda: self.assertTrue(lock.acquire()))
            t.start()
            t.join()
            self.assertTrue(lock.locked())
            self.assertTrue(wait_until(lambda: not lock.locked(), 30), "the abandoned hold ended")
        self.assertIn("ended without releasing", "\n".join(logs.output))
        self.assertTrue(control.owned(), "the living thread's lock, same ttl, is still held")
        control.release()

    def test_the_dropins_claim_outlives_its_object_and_thread_until_its_timeout(self):
        key = fresh("job")

        def worker(out):
            out.append(self.r.lock(key, timeout=60, lock_class=rnl.NativeLock).acquire(blocking=False))

        claims = []
        for _ in range(2):
            t = threading.Thread(target=worker, args=(claims,))
            t.start()
            t.join()
            gc.collect()
        self.assertEqual(claims, [True, False], "the second worker found the job claimed")
        (owner, token, ttl_ms), = holders(self.r, key)
        self.assertGreater(ttl_ms, 50_000, "held for its timeout, as redis-py's")
        self.r.delete(key)

    def test_the_dropins_timeout_ends_it_and_its_connection(self):
        # (Held after its object is gone: the claim test above, with 60 s.)
        key = fresh("short")
        lock = self.r.lock(key, timeout=1, lock_class=rnl.NativeLock)
        self.assertTrue(lock.acquire())
        self.assertEqual(len(bound_connection_ids(self.r, self.name)), 1)
        del lock
        gc.collect()
        self.assertTrue(wait_until(lambda: not holders(self.r, key), 30), "ended at its timeout")
        self.assertTrue(wait_until(lambda: not bound_connection_ids(self.r, self.name), 30), "its connection closed")
        again = self.r.lock(key, lock_class=rnl.NativeLock)
        self.assertTrue(again.acquire(blocking=False))
        again.release()

    def test_the_dropins_renewed_lock_whose_thread_ended_ends_with_its_lease(self):
        key = fresh("dropin-ended")
        lock = rnl.NativeLock(self.r, key, lease=1.5)  # timeout=None: renewed
        with self.assertLogs("redis_native_lock", level="WARNING"):
            t = threading.Thread(target=lambda: self.assertTrue(lock.acquire()))
            t.start()
            t.join()
            self.assertTrue(wait_until(lambda: not lock.locked(), 30), "not renewed forever")

    # -- a stale holder never ends a newer grant -----------------------------

    def test_a_stale_holder_cannot_release_or_renew_a_newer_grant_to_its_owner_name(self):
        kinds = {
            "Lock": lambda k, **kw: rnl.Lock(self.r, k, **kw),
            "ReentrantLock": lambda k, **kw: rnl.ReentrantLock(self.r, k, **kw),
            "ReadWriteLock.read": lambda k, **kw: rnl.ReadWriteLock(self.r, k, **kw).read(),
            "Semaphore": lambda k, **kw: rnl.Semaphore(self.r, k, 2, **kw),
            "MultiLock": lambda k, **kw: rnl.MultiLock(self.r, [k, k + ":2"], **kw),
        }
        for kind, make in kinds.items():
            for bind in (True, False):
                what = f"{kind}, bind={bind}"
                key = fresh("stale")
                a = make(key, ttl=LONG_TTL, owner="worker-1", bind=bind)
                self.assertTrue(a.acquire(), what)
                for k in a.keys:
                    self.r.execute_command("LOCK.RELEASE", k, "worker-1")  # behind A's back
                b = make(key, ttl=LONG_TTL, owner="worker-1", bind=bind)
                self.assertTrue(b.acquire(), what)
                if not bind:
                    with self.assertRaises(LeaseLost, msg=what):
                        a.extend(LONG_TTL)  # LOCK.RENEW ... TOKEN a's: 0, B's lease untouched
                with self.assertRaises(LeaseLost, msg=what):
                    a.release()
                for k, t in zip(b.keys, b.tokens):
                    self.assertEqual([(o, tk) for o, tk, _ in holders(self.r, k)], [(b"worker-1", t)], f"{what}: B keeps {k}")
                self.assertTrue(b.owned(), what)
                b.release()
                for k in b.keys:
                    self.assertEqual(holders(self.r, k), [], what)

    def test_a_stale_dropin_cannot_release_a_newer_grant_to_its_token(self):
        key = fresh("stale-dropin")
        a = self.r.lock(key, timeout=60, lock_class=rnl.NativeLock)
        self.assertTrue(a.acquire(token="worker-1"))
        self.r.execute_command("LOCK.RELEASE", key, "worker-1")
        b = self.r.lock(key, timeout=60, lock_class=rnl.NativeLock)
        self.assertTrue(b.acquire(token="worker-1"))
        with self.assertRaises(redis.exceptions.LockNotOwnedError):
            a.extend(600)  # B's lease is not A's to extend
        self.assertLessEqual(holders(self.r, key)[0][2], 60_000)
        with self.assertRaises(redis.exceptions.LockNotOwnedError):
            a.release()
        self.assertEqual([t for _, t, _ in holders(self.r, key)], [b.fencing_token])
        b.release()


@unittest.skipUnless(PORT and SERVER_BIN and MODULE, "REDIS_LOCK_PORT, REDIS_LOCK_SERVER_BIN and REDIS_LOCK_MODULE not set")
class Async(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.name = "t-" + uuid.uuid4().hex[:8]
        self.r = aredis.Redis(host="127.0.0.1", port=PORT, client_name=self.name, socket_timeout=5)
        self.sync = redis.Redis(host="127.0.0.1", port=PORT, socket_timeout=5)

    async def asyncTearDown(self):
        await self.r.aclose()
        self.sync.close()

    async def told(self, lock, what):
        start = time.monotonic()

        async def lost():
            return lock.lost

        self.assertTrue(await await_until(lost, TOLD_WITHIN), f"{what}: not told before the next keepalive")
        report(f"asyncio: {what}", time.monotonic() - start)

    async def test_a_killed_bound_connection_is_told_before_the_next_keepalive(self):
        key = fresh("kill")
        lock = arnl.Lock(self.r, key, ttl=LONG_TTL)
        self.assertTrue(await lock.acquire())
        ids = bound_connection_ids(self.sync, self.name)
        self.assertEqual(len(ids), 1, self.sync.client_list())
        self.sync.execute_command("CLIENT", "KILL", "ID", ids[0])
        await self.told(lock, "CLIENT KILL of the bound connection")
        with self.assertRaises(LeaseLost):
            await lock.release()
        self.assertTrue(await lock.acquire())
        await lock.release()

    async def test_a_killed_and_restarted_server_is_told_before_the_next_keepalive(self):
        server = OwnServer()
        try:
            r = aredis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)
            lock, other = arnl.Lock(r, fresh("crash"), ttl=LONG_TTL), arnl.Lock(r, fresh("restart"), ttl=LONG_TTL)
            self.assertTrue(await lock.acquire())
            server.kill9()
            await self.told(lock, "kill -9 of the server")
            with self.assertRaises(LeaseLost):
                await lock.release()
            server.start()
            self.assertTrue(await other.acquire())
            server.kill9()
            server.start()
            await self.told(other, "a restart of the server")
            self.assertTrue(await lock.acquire())
            await lock.release()
            await r.aclose()
        finally:
            server.stop()

    async def test_a_set_over_the_key_is_told_before_the_next_keepalive(self):
        for overwrite in (self.r.delete, lambda k: self.r.set(k, "x")):
            key = fresh("set")
            lock = arnl.Lock(self.r, key, ttl=LONG_TTL)
            self.assertTrue(await lock.acquire())
            await overwrite(key)
            await self.told(lock, "DEL or SET over the key")
            with self.assertRaises(LeaseLost):
                await lock.release()
            await self.r.delete(key)

    async def test_a_hold_taken_under_wait_for_timeout_or_a_taskgroup_is_released_by_its_awaiter(self):
        lock = arnl.Lock(self.r, fresh("awaited"), ttl=2)

        async def held():
            return await lock.owned()

        # asyncio.wait_for (a task of its own before Python 3.12)
        self.assertTrue(await asyncio.wait_for(lock.acquire(), 5))
        await asyncio.sleep(4)  # two ttls: renewed for the code that awaited it
        self.assertTrue(await held())
        await lock.release()
        self.assertFalse(await lock.locked())
        # asyncio.timeout (3.11+), in this task
        if hasattr(asyncio, "timeout"):
            async with asyncio.timeout(5):
                self.assertTrue(await lock.acquire())
            await lock.release()
        # a TaskGroup (3.11+), or gather elsewhere: the acquire ran in a task of its own
        if hasattr(asyncio, "TaskGroup"):
            async with asyncio.TaskGroup() as tg:
                task = tg.create_task(lock.acquire())
        else:  # pragma: no cover - Python < 3.11
            task = asyncio.ensure_future(lock.acquire())
            await task
        self.assertTrue(task.result())
        self.assertIsNotNone(lock.token)
        await asyncio.sleep(4)
        self.assertTrue(await held())
        await lock.release()
        self.assertFalse(await lock.locked())
        # the drop-in, through redis-py's asyncio lock calls
        d = self.r.lock(fresh("awaited-dropin"), lock_class=arnl.NativeLock)
        self.assertTrue(await asyncio.wait_for(d.acquire(), 5))
        self.assertTrue(await d.owned())
        await d.release()

    async def test_a_task_that_ends_holding_is_not_renewed_and_warned_of(self):
        lock, control = arnl.Lock(self.r, fresh("ended"), ttl=3), arnl.Lock(self.r, fresh("kept"), ttl=3)
        self.assertTrue(await control.acquire())

        async def work():
            self.assertTrue(await lock.acquire())  # and ends without releasing

        async def free():
            return not await lock.locked()

        with self.assertLogs("redis_native_lock", level="WARNING") as logs:
            await asyncio.create_task(work())
            self.assertTrue(await lock.locked())
            self.assertTrue(await await_until(free, 30), "the abandoned hold ended")
        self.assertIn("ended without releasing", "\n".join(logs.output))
        self.assertTrue(await control.owned(), "the living task's lock, same ttl, is still held")
        with self.assertRaises(LockError):
            await lock.release()  # not this task's
        await control.release()

    async def test_the_dropins_claim_outlives_its_object_and_task_until_its_timeout(self):
        key = fresh("job")

        async def worker():
            return await self.r.lock(key, timeout=60, lock_class=arnl.NativeLock).acquire(blocking=False)

        claims = [await asyncio.create_task(worker()) for _ in range(2)]
        gc.collect()
        self.assertEqual(claims, [True, False])
        (owner, token, ttl_ms), = holders(self.sync, key)
        self.assertGreater(ttl_ms, 50_000)
        await self.r.delete(key)

    async def test_a_stale_holder_cannot_release_a_newer_grant_to_its_owner_name(self):
        for bind in (True, False):
            key = fresh("stale")
            a = arnl.Lock(self.r, key, ttl=LONG_TTL, owner="worker-1", bind=bind)
            self.assertTrue(await a.acquire())
            await self.r.execute_command("LOCK.RELEASE", key, "worker-1")
            b = arnl.Lock(self.r, key, ttl=LONG_TTL, owner="worker-1", bind=bind)
            self.assertTrue(await b.acquire())
            with self.assertRaises(LeaseLost):
                await a.release()
            (owner, token, _), = holders(self.sync, key)
            self.assertEqual((owner, token), (b"worker-1", b.token), f"bind={bind}: B keeps the lock")
            await b.release()


def _pings(r):
    try:
        return r.ping()
    except redis.RedisError:
        return False


def _pid(port):
    return int(redis.Redis(host="127.0.0.1", port=port).info("server")["process_id"])


@unittest.skipUnless(len(STALL_PORTS) == 3, "REDIS_LOCK_STALL_PORTS (three servers) not set")
class StoppedServer(unittest.TestCase):
    """`locked()` and `owned()` on a server stopped with SIGSTOP keep the
    package's deadline (the client's socket_timeout, 1 s here, no retries):
    through the client's own retries they took 15 s. Bound: 5 s."""

    def test_locked_and_owned_keep_the_deadline(self):
        port = STALL_PORTS[2]
        r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
        ar = aredis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
        key = fresh("stopped")
        lock, alock = rnl.Lock(r, key + ":s", ttl=30), arnl.Lock(ar, key + ":a", ttl=30)

        async def async_calls():
            self.assertTrue(await alock.acquire())
            os.kill(_pid(port), signal.SIGSTOP)
            try:
                for call in (alock.locked, alock.owned):
                    t = time.monotonic()
                    with self.assertRaises((redis.TimeoutError, redis.ConnectionError, asyncio.TimeoutError)):
                        await call()
                    self.assertLess(time.monotonic() - t, 5, call.__name__)
            finally:
                os.kill(_pid_cached[0], signal.SIGCONT)

        _pid_cached = [_pid(port)]
        self.assertTrue(lock.acquire())
        dropin = r.lock(key + ":d", lock_class=rnl.NativeLock)
        self.assertTrue(dropin.acquire(blocking=False))
        os.kill(_pid_cached[0], signal.SIGSTOP)
        try:
            for call in (lock.locked, lock.owned, dropin.locked, dropin.owned):
                t = time.monotonic()
                with self.assertRaises((redis.TimeoutError, redis.ConnectionError)):
                    call()
                self.assertLess(time.monotonic() - t, 5, call.__name__)
        finally:
            os.kill(_pid_cached[0], signal.SIGCONT)
        lock.release()
        dropin.release()
        asyncio.run(async_calls())
        r.close()


if __name__ == "__main__":
    unittest.main()
