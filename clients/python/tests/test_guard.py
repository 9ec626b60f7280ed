"""`guard(*command)`: a command run in the server only while the lock is
held, under the holder's token (`LOCK.GUARD key owner TOKEN t CALL ...`).
Blocking and asyncio, on a server (REDIS_LOCK_PORT) and a 3-master cluster
(REDIS_LOCK_CLUSTER_PORT), every held kind, and the redis-py drop-in.

A lease is lost here without the package hearing of it first: with
`bind=False` (no watcher) the lock is released behind its back
(`LOCK.RELEASE key owner`, as its lease running out would) and taken by
another holder, so the refusal is the server's `NOTHELD`.
"""

import asyncio
import os
import threading
import time
import unittest
import uuid

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import LockError as RedisLockError
from redis.exceptions import LockNotOwnedError

import redis_native_lock.aio as aio
from redis_native_lock import (
    LeaseLost,
    Lock,
    LockError,
    MultiLock,
    NativeLock,
    ReadWriteLock,
    ReentrantLock,
    Semaphore,
)

PORT = int(os.environ.get("REDIS_LOCK_PORT", "0"))
CLUSTER_PORT = int(os.environ.get("REDIS_LOCK_CLUSTER_PORT", "0"))


def fresh(name):
    """A key per test, hash-tagged: a test's keys share a cluster slot."""
    return "{%s}:%s" % (uuid.uuid4().hex[:8], name)


def sibling(key, name):
    """Another key in `key`'s slot."""
    return key.split("}")[0] + "}:" + name


class SyncBase:
    cluster = False

    def client(self, **kw):
        raise NotImplementedError

    def setUp(self):
        self.r = self.client()

    def tearDown(self):
        self.r.close()

    def take_behind_its_back(self, lock, owner="other"):
        """The lease of `lock` ends without it knowing (as if it ran out),
        and `owner` takes the key."""
        key = lock.keys[0]
        self.assertEqual(self.r.execute_command("LOCK.RELEASE", key, lock.owner), 1)
        other = Lock(self.r, key, ttl=10, owner=owner)
        self.assertTrue(other.acquire())
        return other

    def test_guarded_write_runs_while_held_with_redis_pys_reply(self):
        key = fresh("job")
        data = sibling(key, "state")
        with Lock(self.r, key, ttl=10) as lock:
            args = lock.guard_command("SET", data, "x")
            self.assertEqual(args[:6], ["LOCK.GUARD", key, lock.owner, "TOKEN", lock.token, "CALL"])
            self.assertIs(lock.guard("SET", data, "done"), True)  # as r.execute_command("SET", ...)
            self.assertEqual(lock.guard("GET", data), b"done")
            self.assertEqual(lock.guard("INCR", sibling(key, "n")), 1)
            self.assertEqual(lock.guard("HSET", sibling(key, "h"), "a", "1"), 1)
            self.assertEqual(lock.guard("HGETALL", sibling(key, "h")), {b"a": b"1"})
            # The command's own error, as redis-py raises it; the lock is still held.
            with self.assertRaises(redis.ResponseError) as e:
                lock.guard("LPUSH", data, "x")
            self.assertIn("WRONGTYPE", str(e.exception))
            self.assertFalse(lock.lost)
            self.assertEqual(lock.guard("GET", data), b"done")
        self.assertEqual(self.r.get(data), b"done")
        decoded = self.client(decode_responses=True)
        try:
            with Lock(decoded, key, ttl=10) as lock:
                self.assertEqual(lock.guard("GET", data), "done")
        finally:
            decoded.close()

    def test_every_held_kind_guards_under_its_own_token(self):
        key = fresh("kinds")
        data = sibling(key, "v")
        rw = ReadWriteLock(self.r, sibling(key, "rw"), ttl=10)
        kinds = [
            Lock(self.r, sibling(key, "x"), ttl=10),
            ReentrantLock(self.r, sibling(key, "re"), ttl=10),
            rw.read(),
            rw.write(),
            Semaphore(self.r, sibling(key, "sem"), 2, ttl=10),
            MultiLock(self.r, [sibling(key, "m1"), sibling(key, "m2")], ttl=10),
        ]
        for i, kind in enumerate(kinds):
            with kind as held:
                self.assertIs(held, kind)
                self.assertEqual(held.guard_command("GET", data)[4], held.tokens[0])
                self.assertIs(held.guard("SET", data, str(i)), True)
                if isinstance(held, ReentrantLock):
                    with held:  # a second hold: same token, still guards
                        self.assertIs(held.guard("SET", data, "again"), True)
                    self.assertIs(held.guard("SET", data, str(i)), True)
            self.assertEqual(self.r.get(data), str(i).encode())
            with self.assertRaises(LockError):  # released: not held
                kind.guard("SET", data, "after")
        self.assertEqual(self.r.get(data), str(len(kinds) - 1).encode())

    def test_threads_sharing_a_lock_guard_with_their_own_tokens(self):
        key = fresh("sem")
        sem = Semaphore(self.r, key, 2, ttl=10)
        both = threading.Barrier(2)
        seen = {}

        def run(name):
            with sem:
                both.wait(5)  # both permits held at once
                seen[name] = (sem.token, sem.guard_command("GET", key)[4], sem.guard("INCR", sibling(key, "n")))
                both.wait(5)

        threads = [threading.Thread(target=run, args=(n,)) for n in "ab"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        self.assertEqual(seen["a"][0], seen["a"][1])
        self.assertEqual(seen["b"][0], seen["b"][1])
        self.assertNotEqual(seen["a"][0], seen["b"][0])
        self.assertEqual(sorted([seen["a"][2], seen["b"][2]]), [1, 2])
        self.assertEqual(self.r.get(sibling(key, "n")), b"2")

    def test_lost_lease_is_refused_and_changes_nothing(self):
        key = fresh("lost")
        data = sibling(key, "state")
        lock = Lock(self.r, key, ttl=10, bind=False)
        self.assertTrue(lock.acquire())
        self.assertIs(lock.guard("SET", data, "mine"), True)
        other = self.take_behind_its_back(lock)
        self.assertIs(other.guard("SET", data, "theirs"), True)
        self.assertFalse(lock.lost)  # the package has not heard yet: the server refuses
        with self.assertRaises(LeaseLost):
            lock.guard("SET", data, "late")
        self.assertEqual(self.r.get(data), b"theirs")
        self.assertTrue(lock.lost)  # and it stays so
        with self.assertRaises(LeaseLost):
            lock.guard("DEL", data)  # known lost: nothing is sent
        with self.assertRaises(LeaseLost):
            lock.release()
        self.assertEqual(self.r.get(data), b"theirs")
        other.release()

    def test_a_stale_token_is_refused_when_the_same_owner_holds_again(self):
        key = fresh("stale")
        data = sibling(key, "state")
        first = Lock(self.r, key, ttl=10, owner="worker-a", bind=False)
        self.assertTrue(first.acquire())
        again = self.take_behind_its_back(first, owner="worker-a")
        self.assertGreater(again.token, first.token)
        # The owner name alone would pass (the control): the token is what refuses.
        self.assertEqual(
            self.r.execute_command("LOCK.GUARD", key, "worker-a", "CALL", "SET", data, "by-name"),
            b"OK",
        )
        with self.assertRaises(LeaseLost):
            first.guard("SET", data, "stale")
        self.assertEqual(self.r.get(data), b"by-name")
        self.assertIs(again.guard("SET", data, "fresh"), True)
        self.assertEqual(self.r.get(data), b"fresh")
        again.release()

    def test_not_held_is_a_lock_error(self):
        lock = Lock(self.r, fresh("never"), ttl=10)
        with self.assertRaises(LockError):
            lock.guard("SET", fresh("x"), "1")
        with self.assertRaises(LockError):
            lock.guard_command("SET", fresh("x"), "1")


@unittest.skipUnless(PORT, "REDIS_LOCK_PORT not set")
class SyncServer(SyncBase, unittest.TestCase):
    def client(self, **kw):
        return redis.Redis(host="127.0.0.1", port=PORT, **kw)

    def test_guard_command_in_a_pipeline(self):
        key = fresh("pipe")
        data = sibling(key, "state")
        lock = Lock(self.r, key, ttl=10, bind=False)
        self.assertTrue(lock.acquire())
        pipe = self.r.pipeline()
        pipe.execute_command(*lock.guard_command("SET", data, "a"))
        pipe.execute_command(*lock.guard_command("INCR", sibling(key, "n")))
        pipe.get(data)
        self.assertEqual(pipe.execute(), [b"OK", 1, b"a"])  # raw replies in a pipeline
        self.take_behind_its_back(lock)
        pipe = self.r.pipeline()
        pipe.execute_command(*lock.guard_command("SET", data, "late"))
        pipe.get(data)
        refused, value = pipe.execute(raise_on_error=False)
        self.assertIsInstance(refused, redis.ResponseError)
        self.assertTrue(str(refused).startswith("NOTHELD"), refused)
        self.assertEqual(value, b"a")
        # execute() raises the first error, its text prefixed by redis-py
        # ("Command # 1 (...) of pipeline caused error: NOTHELD ..."), as the docs say.
        for transaction in (True, False):
            pipe = self.r.pipeline(transaction=transaction)
            pipe.execute_command(*lock.guard_command("SET", data, "late"))
            with self.assertRaises(redis.ResponseError) as raised:
                pipe.execute()
            text = str(raised.exception)
            self.assertRegex(text, r"^Command # 1 \(LOCK\.GUARD .*\) of pipeline caused error: NOTHELD ")
            self.assertEqual(text.split("caused error: ", 1)[1][:7], "NOTHELD")
        self.assertEqual(self.r.get(data), b"a")


@unittest.skipUnless(CLUSTER_PORT, "REDIS_LOCK_CLUSTER_PORT not set")
class SyncCluster(SyncBase, unittest.TestCase):
    def client(self, **kw):
        return RedisCluster(host="127.0.0.1", port=CLUSTER_PORT, **kw)

    def test_a_key_in_another_slot_is_crossslot(self):
        key = fresh("slot")
        elsewhere = fresh("elsewhere")
        with Lock(self.r, key, ttl=10) as lock:
            with self.assertRaises(redis.exceptions.ClusterCrossSlotError):  # the server's CROSSSLOT
                lock.guard("SET", elsewhere, "x")
            self.assertFalse(lock.lost)
            self.assertIs(lock.guard("SET", sibling(key, "here"), "x"), True)
        self.assertIsNone(self.r.get(elsewhere))


class AsyncBase:
    def client(self, **kw):
        raise NotImplementedError

    async def asyncSetUp(self):
        self.r = self.client()

    async def asyncTearDown(self):
        await self.r.aclose()

    async def take_behind_its_back(self, lock, owner="other"):
        key = lock.keys[0]
        self.assertEqual(await self.r.execute_command("LOCK.RELEASE", key, lock.owner), 1)
        other = aio.Lock(self.r, key, ttl=10, owner=owner)
        self.assertTrue(await other.acquire())
        return other

    async def test_guarded_write_runs_while_held(self):
        key = fresh("job")
        data = sibling(key, "state")
        async with aio.Lock(self.r, key, ttl=10) as lock:
            self.assertIs(await lock.guard("SET", data, "done"), True)
            self.assertEqual(await lock.guard("GET", data), b"done")
            self.assertEqual(await lock.guard("INCR", sibling(key, "n")), 1)
            with self.assertRaises(redis.ResponseError):
                await lock.guard("LPUSH", data, "x")
            self.assertFalse(lock.lost)
        self.assertEqual(await self.r.get(data), b"done")

    async def test_every_held_kind_and_each_task_its_own_token(self):
        key = fresh("kinds")
        data = sibling(key, "v")
        rw = aio.ReadWriteLock(self.r, sibling(key, "rw"), ttl=10)
        kinds = [
            aio.Lock(self.r, sibling(key, "x"), ttl=10),
            aio.ReentrantLock(self.r, sibling(key, "re"), ttl=10),
            rw.read(),
            rw.write(),
            aio.Semaphore(self.r, sibling(key, "sem"), 2, ttl=10),
            aio.MultiLock(self.r, [sibling(key, "m1"), sibling(key, "m2")], ttl=10),
        ]
        for i, kind in enumerate(kinds):
            async with kind as held:
                self.assertEqual(held.guard_command("GET", data)[4], held.tokens[0])
                self.assertIs(await held.guard("SET", data, str(i)), True)
            self.assertEqual(await self.r.get(data), str(i).encode())
            with self.assertRaises(aio.LockError):
                await kind.guard("SET", data, "after")
        sem = aio.Semaphore(self.r, sibling(key, "shared"), 2, ttl=10)
        both = asyncio.Event()
        tokens = []

        async def permit():
            async with sem:
                tokens.append((sem.token, sem.guard_command("GET", data)[4]))
                await sem.guard("INCR", sibling(key, "n"))
                if len(tokens) == 2:
                    both.set()
                await asyncio.wait_for(both.wait(), 5)

        await asyncio.gather(permit(), permit())
        self.assertEqual([a for a, _ in tokens], [b for _, b in tokens])
        self.assertNotEqual(tokens[0][0], tokens[1][0])
        self.assertEqual(await self.r.get(sibling(key, "n")), b"2")

    async def test_lost_lease_is_refused_and_changes_nothing(self):
        key = fresh("lost")
        data = sibling(key, "state")
        lock = aio.Lock(self.r, key, ttl=10, bind=False)
        self.assertTrue(await lock.acquire())
        other = await self.take_behind_its_back(lock)
        self.assertIs(await other.guard("SET", data, "theirs"), True)
        with self.assertRaises(aio.LeaseLost):
            await lock.guard("SET", data, "late")
        self.assertTrue(lock.lost)
        self.assertEqual(await self.r.get(data), b"theirs")
        await other.release()

    async def test_a_stale_token_is_refused_when_the_same_owner_holds_again(self):
        key = fresh("stale")
        data = sibling(key, "state")
        first = aio.Lock(self.r, key, ttl=10, owner="worker-a", bind=False)
        self.assertTrue(await first.acquire())
        again = await self.take_behind_its_back(first, owner="worker-a")
        self.assertEqual(
            await self.r.execute_command("LOCK.GUARD", key, "worker-a", "CALL", "SET", data, "by-name"),
            b"OK",
        )
        with self.assertRaises(aio.LeaseLost):
            await first.guard("SET", data, "stale")
        self.assertEqual(await self.r.get(data), b"by-name")
        self.assertIs(await again.guard("SET", data, "fresh"), True)
        await again.release()


@unittest.skipUnless(PORT, "REDIS_LOCK_PORT not set")
class AsyncServer(AsyncBase, unittest.IsolatedAsyncioTestCase):
    def client(self, **kw):
        return aredis.Redis(host="127.0.0.1", port=PORT, **kw)

    async def test_guard_command_in_a_pipeline(self):
        key = fresh("pipe")
        data = sibling(key, "state")
        async with aio.Lock(self.r, key, ttl=10) as lock:
            pipe = self.r.pipeline()
            pipe.execute_command(*lock.guard_command("SET", data, "a"))
            pipe.get(data)
            self.assertEqual(await pipe.execute(), [b"OK", b"a"])


@unittest.skipUnless(CLUSTER_PORT, "REDIS_LOCK_CLUSTER_PORT not set")
class AsyncCluster(AsyncBase, unittest.IsolatedAsyncioTestCase):
    def client(self, **kw):
        return AsyncRedisCluster(host="127.0.0.1", port=CLUSTER_PORT, **kw)


@unittest.skipUnless(PORT, "REDIS_LOCK_PORT not set")
class DropinSync(unittest.TestCase):
    def setUp(self):
        self.r = redis.Redis(port=PORT, socket_timeout=5)

    def tearDown(self):
        self.r.close()

    def lock(self, name, **kw):
        return self.r.lock(name, lock_class=NativeLock, **kw)

    def test_guard_while_held_and_not_after_the_timeout(self):
        name = fresh("dropin")
        data = sibling(name, "state")
        with self.lock(name, blocking_timeout=5) as lock:
            self.assertIs(lock.guard("SET", data, "done"), True)
            self.assertEqual(lock.guard("GET", data), b"done")
        with self.assertRaises(RedisLockError):  # released: not held
            lock.guard("SET", data, "after")
        short = self.lock(name, timeout=0.3)  # a lease of 0.3 s, not renewed (redis-py's timeout)
        self.assertTrue(short.acquire(blocking=False))
        time.sleep(0.5)
        other = self.lock(name)
        self.assertTrue(other.acquire(blocking=False))
        self.assertIs(other.guard("SET", data, "theirs"), True)
        with self.assertRaises(LockNotOwnedError):
            short.guard("SET", data, "late")
        self.assertEqual(self.r.get(data), b"theirs")
        other.release()

    def test_a_stale_token_is_refused_when_the_same_token_holds_again(self):
        name = fresh("dropin-stale")
        data = sibling(name, "state")
        first = self.lock(name)
        self.assertTrue(first.acquire(blocking=False, token="worker-a"))
        self.assertEqual(self.r.execute_command("LOCK.RELEASE", name, "worker-a"), 1)
        again = self.lock(name)
        self.assertTrue(again.acquire(blocking=False, token="worker-a"))
        with self.assertRaises(LockNotOwnedError):
            first.guard("SET", data, "stale")
        self.assertIsNone(self.r.get(data))
        self.assertIs(again.guard("SET", data, "fresh"), True)
        self.assertEqual(self.r.get(data), b"fresh")
        again.release()


@unittest.skipUnless(PORT, "REDIS_LOCK_PORT not set")
class DropinAsync(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self):
        self.r = aredis.Redis(port=PORT, socket_timeout=5)

    async def asyncTearDown(self):
        await self.r.aclose()

    def lock(self, name, **kw):
        return self.r.lock(name, lock_class=aio.NativeLock, **kw)

    async def test_guard_while_held_and_not_after_the_timeout(self):
        name = fresh("adropin")
        data = sibling(name, "state")
        async with self.lock(name, blocking_timeout=5) as lock:
            self.assertIs(await lock.guard("SET", data, "done"), True)
        with self.assertRaises(RedisLockError):
            await lock.guard("SET", data, "after")
        short = self.lock(name, timeout=0.3)
        self.assertTrue(await short.acquire(blocking=False))
        await asyncio.sleep(0.5)
        other = self.lock(name)
        self.assertTrue(await other.acquire(blocking=False))
        self.assertIs(await other.guard("SET", data, "theirs"), True)
        with self.assertRaises(LockNotOwnedError):
            await short.guard("SET", data, "late")
        self.assertEqual(await self.r.get(data), b"theirs")
        await other.release()

    async def test_a_stale_token_is_refused_when_the_same_token_holds_again(self):
        name = fresh("adropin-stale")
        data = sibling(name, "state")
        first = self.lock(name)
        self.assertTrue(await first.acquire(blocking=False, token="worker-a"))
        self.assertEqual(await self.r.execute_command("LOCK.RELEASE", name, "worker-a"), 1)
        again = self.lock(name)
        self.assertTrue(await again.acquire(blocking=False, token="worker-a"))
        with self.assertRaises(LockNotOwnedError):
            await first.guard("SET", data, "stale")
        self.assertIsNone(await self.r.get(data))
        await again.release()


if __name__ == "__main__":
    unittest.main()
