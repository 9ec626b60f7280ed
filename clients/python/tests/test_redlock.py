"""RedLock over 5 independent servers, some stopped: REDLOCK_PORTS (five
ports), REDLOCK_DOWN (how many of them, the last ones, are stopped)."""

import asyncio
import os
import unittest
import uuid

import redis
import redis.asyncio as aredis
from redis.backoff import NoBackoff
from redis.retry import Retry

from redis_native_lock import LockNotAcquired
from redis_native_lock._common import parse_info
from redis_native_lock.redlock import AsyncRedLock, RedLock

PORTS = [int(p) for p in os.environ.get("REDLOCK_PORTS", "").split(",") if p]
DOWN = int(os.environ.get("REDLOCK_DOWN", "0"))
UP = PORTS[: len(PORTS) - DOWN]


def opts():
    return dict(host="127.0.0.1", socket_connect_timeout=0.2, socket_timeout=0.2, retry=Retry(NoBackoff(), 0))


@unittest.skipUnless(len(PORTS) == 5, "REDLOCK_PORTS must name five servers")
class Sync(unittest.TestCase):
    def setUp(self):
        self.servers = [redis.Redis(port=p, **opts()) for p in PORTS]
        self.up = [redis.Redis(port=p, host="127.0.0.1") for p in UP]

    def held_anywhere(self, key):
        return [s.execute_command("LOCK.INFO", key) is not None for s in self.up]

    def grants(self):
        return sum(int(s.info("lock")["lock_grants"]) for s in self.up)

    def test_quorum(self):
        key = "redlock:" + uuid.uuid4().hex
        rl = RedLock(self.servers, retries=2, retry_delay=0.05)
        if DOWN <= 2:
            with rl.lock(key, ttl=10) as lease:
                self.assertEqual(sorted(lease.tokens), list(range(len(UP))))
                for i, token in lease.tokens.items():
                    info = parse_info(self.up[i].execute_command("LOCK.INFO", key))
                    self.assertEqual(info["holders"][0]["token"], token, "LOCK.INFO shows that token")
                self.assertGreater(lease.remaining(), 5)
                self.assertIsNone(RedLock(self.servers, retries=1).acquire(key, ttl=10))
                self.assertTrue(rl.extend(lease, 20))
                self.assertGreater(self.up[0].pttl(key), 10_000)
            self.assertFalse(any(self.held_anywhere(key)))
            self.assertIsNotNone(RedLock(self.servers, retries=1).acquire(key + ":after", ttl=10))
        else:
            before = self.grants()
            with self.assertRaises(LockNotAcquired):
                with rl.lock(key, ttl=10):
                    pass
            self.assertGreater(self.grants(), before, "each live server granted it")
            self.assertFalse(any(self.held_anywhere(key)), "nothing is left held without a quorum")

    def test_a_key_held_elsewhere_leaves_too_few(self):
        key = "redlock:" + uuid.uuid4().hex
        # Someone else holds it on one live server.
        self.up[0].execute_command("LOCK.ACQUIRE", key, "someone-else", 10_000)
        granted = RedLock(self.servers, retries=1).acquire(key, ttl=10)
        if DOWN == 0:
            self.assertIsNotNone(granted, "4 of 5 is still a majority")
        else:
            self.assertIsNone(granted, "too few servers left to grant it")
        self.assertEqual(sum(self.held_anywhere(key)), 1 if granted is None else len(UP))

    def test_a_stale_lease_cannot_release_or_extend_a_newer_one_of_the_same_owner(self):
        if DOWN > 2:
            self.skipTest("no quorum with 3 of 5 servers stopped: test_quorum checks the refusal")
        key = "redlock:" + uuid.uuid4().hex
        rl = RedLock(self.servers, retries=1)
        old = rl.acquire(key, ttl=30, owner="worker-1")
        self.assertIsNotNone(old)
        for s in self.up:
            s.execute_command("LOCK.RELEASE", key, "worker-1")  # behind its back
        new = rl.acquire(key, ttl=30, owner="worker-1")
        self.assertIsNotNone(new)
        self.assertFalse(rl.extend(old, 60), "LOCK.RENEW ... TOKEN old: 0 everywhere")
        self.assertEqual(rl.release(old), 0, "LOCK.RELEASE ... TOKEN old: nil everywhere")
        self.assertTrue(all(self.held_anywhere(key)), "the newer lease is held on every live server")
        self.assertEqual(rl.release(new), len(UP))
        self.assertFalse(any(self.held_anywhere(key)))


@unittest.skipUnless(len(PORTS) == 5, "REDLOCK_PORTS must name five servers")
class Async(unittest.IsolatedAsyncioTestCase):
    async def test_quorum(self):
        servers = [aredis.Redis(port=p, **opts()) for p in PORTS]
        key = "redlock:" + uuid.uuid4().hex
        rl = AsyncRedLock(servers, retries=2, retry_delay=0.05)
        try:
            if DOWN <= 2:
                async with rl.lock(key, ttl=10) as lease:
                    self.assertEqual(len(lease.tokens), len(UP))
                    self.assertIsNone(await AsyncRedLock(servers, retries=1).acquire(key, ttl=10))
            else:
                with self.assertRaises(LockNotAcquired):
                    async with rl.lock(key, ttl=10):
                        pass
            for p in UP:
                r = aredis.Redis(port=p, host="127.0.0.1")
                self.assertIsNone(await r.execute_command("LOCK.INFO", key))
                await r.aclose()
        finally:
            for s in servers:
                await s.aclose()


if __name__ == "__main__":
    unittest.main()
