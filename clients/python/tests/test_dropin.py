"""`NativeLock`, redis-py's lock on the module, through redis-py's own call
patterns (those of redis-py's tests/test_lock.py): the constructor forms,
`r.lock(..., lock_class=NativeLock)`, `with`, blocking=False,
blocking_timeout, extend (and replace_ttl), reacquire, two threads through
one object, the errors of releasing an unowned lock,
raise_on_release_error=False; asyncio the same. REDIS_LOCK_PORT: a server
with the module.
"""

import asyncio
import gc
import inspect
import os
import threading
import time
import unittest
import uuid

import redis
import redis.asyncio
from redis.exceptions import LockError, LockNotOwnedError
from redis.lock import Lock as RedisPyLock
from redis.asyncio.lock import Lock as RedisPyAsyncLock

from redis_native_lock import NativeLock
from redis_native_lock._common import parse_info
from redis_native_lock.aio import NativeLock as AsyncNativeLock

PORT = int(os.environ.get("REDIS_LOCK_PORT", "0"))


def key(name):
    return "dropin:%s:%s" % (uuid.uuid4().hex[:8], name)


def ttl_ms(r, name, owner):
    """The server's lease left for `owner` (LOCK.INFO), in ms."""
    info = parse_info(r.execute_command("LOCK.INFO", name)) or {"holders": []}
    for h in info["holders"]:
        if h["owner"] == owner:
            return h["ttl_ms"]
    return None


class Sync(unittest.TestCase):
    def setUp(self):
        self.r = redis.Redis(port=PORT, socket_timeout=5)

    def tearDown(self):
        self.r.close()

    def lock(self, name, **kw):
        return self.r.lock(name, lock_class=NativeLock, **kw)

    def test_constructor_forms_and_lock_class(self):
        name = key("ctor")
        a = self.r.lock(name, lock_class=NativeLock)
        b = NativeLock(self.r, name, 5, 0.1, True, None, True, True)
        c = NativeLock(self.r, name, timeout=5, sleep=0.2, blocking=False, blocking_timeout=1, thread_local=False)
        for lock in (a, b, c):
            self.assertIsInstance(lock, NativeLock)
            self.assertEqual(lock.name, name)
        self.assertIsNone(a.timeout)
        self.assertEqual(b.timeout, 5)
        self.assertEqual(c.sleep, 0.2)
        self.assertFalse(c.blocking)
        self.assertFalse(c.thread_local)

    def test_positional_arguments_in_redis_pys_order(self):
        # The signatures, parameter by parameter, as redis-py's (blocking and asyncio).
        for ours, theirs in ((NativeLock, RedisPyLock), (AsyncNativeLock, RedisPyAsyncLock)):
            for method in ("__init__", "acquire", "release", "extend", "reacquire", "locked", "owned"):
                mine = [p.name for p in inspect.signature(getattr(ours, method)).parameters.values() if p.kind is not p.KEYWORD_ONLY]
                want = [p.name for p in inspect.signature(getattr(theirs, method)).parameters.values()]
                self.assertEqual(mine, want, f"{ours.__module__}.{method}")
        # acquire(sleep, blocking): blocking=True waits (redis-py's order: sleep first).
        name = key("positional")
        holder = self.lock(name, timeout=0.3)
        self.assertTrue(holder.acquire())
        waiter = self.lock(name, blocking_timeout=5)
        self.assertTrue(waiter.acquire(0.1, True))  # waits until the 0.3 s lease ends
        self.assertGreater(waiter.fencing_token, holder.fencing_token)
        waiter.release()

    def test_lock_and_the_key_is_a_lock(self):
        name = key("basic")
        lock = self.lock(name)
        self.assertTrue(lock.acquire(blocking=False))
        self.assertIsNotNone(lock.local.token)
        self.assertTrue(lock.locked())
        self.assertTrue(lock.owned())
        self.assertEqual(self.r.type(name), b"redislock")
        with self.assertRaises(redis.ResponseError):
            self.r.get(name)  # WRONGTYPE: the key is a lock, not a string
        self.assertTrue(lock.fencing_token > 0)
        lock.release()
        self.assertFalse(lock.locked())
        self.assertFalse(lock.owned())
        self.assertIsNone(lock.local.token)
        self.assertEqual(self.r.exists(name), 0)

    def test_timeout_none_is_bound_to_the_connection(self):
        name = key("bound")
        lock = self.lock(name)
        self.assertTrue(lock.acquire())
        self.assertTrue(lock.holder.bound)
        self.assertLessEqual(ttl_ms(self.r, name, lock.local.token), 30000)
        # Its connection dies: the lock goes at once (redis-py's would stay forever).
        self.r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        other = self.lock(name)
        t0 = time.monotonic()
        self.assertTrue(other.acquire(blocking_timeout=5))
        self.assertLess(time.monotonic() - t0, 2)
        other.release()

    def test_token_is_the_owner(self):
        name = key("token")
        lock = self.lock(name)
        self.assertTrue(lock.acquire(token="abc"))
        self.assertEqual(lock.local.token, b"abc")
        self.assertEqual(ttl_ms(self.r, name, b"abc") is not None, True)
        lock.release()
        self.assertTrue(lock.acquire(token=b"\xffbin"))
        self.assertEqual(lock.local.token, b"\xffbin")
        self.assertIsNotNone(ttl_ms(self.r, name, b"\xffbin"))
        lock.release()

    def test_competing_locks(self):
        name = key("compete")
        a, b = self.lock(name), self.lock(name)
        self.assertTrue(a.acquire(blocking=False))
        self.assertFalse(b.acquire(blocking=False))
        a.release()
        self.assertTrue(b.acquire(blocking=False))
        b.release()

    def test_blocking_timeout_waits_in_the_server(self):
        name = key("bt")
        a, b = self.lock(name), self.lock(name, blocking_timeout=0.3)
        held, go = threading.Event(), threading.Event()

        def holder():  # the token is per thread: the holder releases in its own
            a.acquire()
            held.set()
            go.wait(10)
            time.sleep(0.2)
            a.release()

        threading.Thread(target=holder).start()
        self.assertTrue(held.wait(10))
        t0 = time.monotonic()
        self.assertFalse(b.acquire())
        elapsed = time.monotonic() - t0
        self.assertGreaterEqual(elapsed, 0.28)
        self.assertLess(elapsed, 1.5)
        # Released while b waits: b is granted at once, no sleep step.
        go.set()
        t0 = time.monotonic()
        self.assertTrue(b.acquire(blocking_timeout=5))
        self.assertLess(time.monotonic() - t0, 3)
        b.release()

    def test_blocking_false_in_constructor_and_zero_timeout(self):
        name = key("nb")
        a = self.lock(name)
        self.assertTrue(a.acquire())
        self.assertFalse(self.lock(name, blocking=False).acquire())
        self.assertFalse(self.lock(name).acquire(blocking_timeout=0))
        a.release()

    def test_context_manager(self):
        name = key("cm")
        with self.lock(name) as lock:
            self.assertTrue(lock.owned())
            self.assertTrue(lock.locked())
        self.assertFalse(self.lock(name).locked())

    def test_context_manager_raises_when_locked_not_acquired(self):
        name = key("cm2")
        a = self.lock(name)
        a.acquire()
        with self.assertRaises(LockError):
            with self.lock(name, blocking_timeout=0.1):
                pass
        a.release()

    def test_context_manager_not_owned_at_exit(self):
        name = key("cm3")
        with self.assertRaises(LockNotOwnedError):
            with self.lock(name, timeout=5):
                self.r.delete(name)
        with self.assertLogs("redis_native_lock._dropin", level="WARNING"):
            with self.lock(name, timeout=5, raise_on_release_error=False):
                self.r.delete(name)

    def test_release_errors(self):
        name = key("rel")
        lock = self.lock(name)
        with self.assertRaises(LockError) as e:
            lock.release()
        self.assertNotIsInstance(e.exception, LockNotOwnedError)
        lock.acquire()
        lock.release()
        with self.assertRaises(LockError):
            lock.release()  # released already
        lock = self.lock(name, timeout=0.1)
        lock.acquire()
        time.sleep(0.25)
        with self.assertRaises(LockNotOwnedError):
            lock.release()  # expired
        lock = self.lock(name, timeout=5)
        lock.acquire()
        self.r.delete(name)
        with self.assertRaises(LockNotOwnedError):
            lock.release()

    def test_timeout_expires_and_is_not_renewed(self):
        name = key("exp")
        lock = self.lock(name, timeout=0.3)
        lock.acquire()
        time.sleep(0.6)
        self.assertFalse(lock.locked())
        self.assertTrue(self.lock(name).acquire(blocking=False))

    def test_extend_adds_or_replaces(self):
        name = key("ext")
        lock = self.lock(name, timeout=10)
        lock.acquire()
        owner = lock.local.token
        self.assertTrue(lock.extend(10))
        self.assertGreater(ttl_ms(self.r, name, owner), 15000)
        self.assertLessEqual(ttl_ms(self.r, name, owner), 20000)
        self.assertTrue(lock.extend(5, replace_ttl=True))
        self.assertLessEqual(ttl_ms(self.r, name, owner), 5000)
        self.assertGreater(ttl_ms(self.r, name, owner), 4000)
        lock.release()

    def test_extend_errors(self):
        name = key("exterr")
        with self.assertRaises(LockError):
            self.lock(name, timeout=10).extend(10)  # not held
        lock = self.lock(name)
        lock.acquire()
        with self.assertRaises(LockError):
            lock.extend(10)  # no timeout
        lock.release()
        lock = self.lock(name, timeout=10)
        lock.acquire()
        self.r.delete(name)
        with self.assertRaises(LockNotOwnedError):
            lock.extend(10)

    def test_reacquire(self):
        name = key("reacq")
        lock = self.lock(name, timeout=10)
        lock.acquire()
        owner = lock.local.token
        lock.extend(20)
        self.assertGreater(ttl_ms(self.r, name, owner), 20000)
        self.assertTrue(lock.reacquire())
        self.assertLessEqual(ttl_ms(self.r, name, owner), 10000)
        self.assertGreater(ttl_ms(self.r, name, owner), 9000)
        lock.release()
        with self.assertRaises(LockError):
            lock.reacquire()
        lock = self.lock(name)
        lock.acquire()
        with self.assertRaises(LockError):
            lock.reacquire()  # no timeout
        lock.release()
        lock = self.lock(name, timeout=10)
        lock.acquire()
        self.r.delete(name)
        with self.assertRaises(LockNotOwnedError):
            lock.reacquire()

    def test_two_threads_one_object(self):
        name = key("threads")
        lock = self.lock(name, timeout=10)
        self.assertTrue(lock.acquire())
        seen = {}

        def other():
            seen["token"] = lock.local.token
            seen["owned"] = lock.owned()
            seen["nb"] = lock.acquire(blocking=False)
            try:
                lock.release()
            except LockError as e:
                seen["release"] = type(e)
            t0 = time.monotonic()
            seen["got"] = lock.acquire(blocking_timeout=5)
            seen["waited"] = time.monotonic() - t0
            seen["token2"] = lock.local.token
            lock.release()

        t = threading.Thread(target=other)
        t.start()
        time.sleep(0.3)
        self.assertTrue(lock.owned())  # the other thread did not release ours
        lock.release()
        t.join(10)
        self.assertIsNone(seen["token"])
        self.assertFalse(seen["owned"])
        self.assertFalse(seen["nb"])
        self.assertIs(seen["release"], LockError)
        self.assertTrue(seen["got"])
        self.assertGreater(seen["waited"], 0.1)
        self.assertIsNotNone(seen["token2"])

    def test_thread_local_false_release_from_another_thread(self):
        name = key("nolocal")
        lock = self.lock(name, timeout=10, thread_local=False)
        lock.acquire()
        token = lock.local.token
        seen = {}

        def other():
            seen["token"] = lock.local.token
            lock.release()

        t = threading.Thread(target=other)
        t.start()
        t.join(10)
        self.assertEqual(seen["token"], token)
        self.assertFalse(lock.locked())

    def test_same_thread_acquires_twice_waits_like_redis_py(self):
        name = key("twice")
        lock = self.lock(name, timeout=0.5)
        self.assertTrue(lock.acquire())
        first = lock.fencing_token
        self.assertFalse(lock.acquire(blocking=False))  # not reentrant
        self.assertTrue(lock.acquire(blocking_timeout=3))  # granted when the first lease ends
        self.assertGreater(lock.fencing_token, first)
        lock.release()


class Async(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.r = redis.asyncio.Redis(port=PORT, socket_timeout=5)
        self.sync = redis.Redis(port=PORT, socket_timeout=5)

    async def asyncTearDown(self):
        await self.r.aclose()
        self.sync.close()

    def lock(self, name, **kw):
        return self.r.lock(name, lock_class=AsyncNativeLock, **kw)

    async def test_lock_and_context_manager(self):
        name = key("alock")
        lock = self.lock(name)
        self.assertIsInstance(lock, AsyncNativeLock)
        self.assertTrue(await lock.acquire(blocking=False))
        self.assertTrue(await lock.locked())
        self.assertTrue(await lock.owned())
        self.assertFalse(await self.lock(name).acquire(blocking=False))
        await lock.release()
        async with self.lock(name) as held:
            self.assertTrue(await held.owned())
        self.assertFalse(await lock.locked())

    async def test_blocking_timeout_and_token(self):
        name = key("abt")
        a, b = self.lock(name), self.lock(name, blocking_timeout=0.3)
        held = asyncio.Event()

        async def holder():  # the token is per task: the holder releases in its own
            self.assertTrue(await a.acquire(token="me"))
            self.assertEqual(a.local.token, b"me")
            held.set()
            await asyncio.sleep(0.6)
            await a.release()

        task = asyncio.ensure_future(holder())
        await held.wait()
        t0 = time.monotonic()
        self.assertFalse(await b.acquire())
        self.assertGreaterEqual(time.monotonic() - t0, 0.28)
        self.assertTrue(await b.acquire(blocking_timeout=5))
        await task
        await b.release()

    async def test_extend_reacquire_and_errors(self):
        name = key("aext")
        lock = self.lock(name, timeout=10)
        with self.assertRaises(LockError):
            lock.extend(5)  # raised at the call, as redis-py's
        await lock.acquire()
        owner = lock.local.token
        self.assertTrue(await lock.extend(10))
        self.assertGreater(ttl_ms(self.sync, name, owner), 15000)
        self.assertTrue(await lock.extend(3, replace_ttl=True))
        self.assertLessEqual(ttl_ms(self.sync, name, owner), 3000)
        self.assertTrue(await lock.reacquire())
        self.assertGreater(ttl_ms(self.sync, name, owner), 9000)
        await self.r.delete(name)
        with self.assertRaises(LockNotOwnedError):
            await lock.extend(1)
        with self.assertRaises(LockError):
            await lock.release()
        nt = self.lock(name)
        await nt.acquire()
        with self.assertRaises(LockError):
            nt.reacquire()
        await nt.release()

    async def test_release_errors_and_raise_on_release_error(self):
        name = key("arel")
        with self.assertRaises(LockError):
            await self.lock(name).release()
        with self.assertRaises(LockNotOwnedError):
            async with self.lock(name, timeout=5):
                await self.r.delete(name)
        async with self.lock(name, timeout=5, raise_on_release_error=False):
            await self.r.delete(name)

    async def test_two_tasks_one_object(self):
        name = key("atasks")
        lock = self.lock(name, timeout=10)
        await lock.acquire()

        async def other():
            got = await lock.acquire(blocking=False)
            return got, lock.local.token

        got, token = await asyncio.ensure_future(other())
        self.assertFalse(got)
        self.assertIsNone(token)
        await lock.release()


if __name__ == "__main__":
    unittest.main()
