"""Sessions (`Session`, `session=`): one lease for many locks, renewed by one
`LOCK.SESSION KEEPALIVE`, that survives the client's reconnects.

REDIS_LOCK_SESSION_PORT: a server of these tests' own (they count its
commands, kill its connections and pause it); REDIS_LOCK_CLUSTER_PORT: a
cluster node (one session per node). The fault test holds
REDIS_LOCK_FAULT_LOCKS locks (default 1,000) while every connection of the
holder is killed every 100 ms for REDIS_LOCK_FAULT_SECONDS, and for two of
its session's 5 s leases at least (10 s, the issue's; tests/it/python_package.rs
asks for 10 s).
"""

import asyncio
import os
import subprocess
import sys
import threading
import time
import unittest
import uuid

import redis
import redis.asyncio
from redis.cluster import RedisCluster

from redis_native_lock import LeaseLost, Lock, LockError, MultiLock, NativeLock, ReentrantLock, Session
from redis_native_lock import aio

PORT = int(os.environ.get("REDIS_LOCK_SESSION_PORT", os.environ.get("REDIS_LOCK_PORT", "0")))
CLUSTER_PORT = int(os.environ.get("REDIS_LOCK_CLUSTER_PORT", "0"))
FAULT_LOCKS = int(os.environ.get("REDIS_LOCK_FAULT_LOCKS", "1000"))
FAULT_SECONDS = float(os.environ.get("REDIS_LOCK_FAULT_SECONDS", "3"))


def fresh(name):
    return "{%s}:%s" % (uuid.uuid4().hex[:8], name)


def until(cond, seconds=10.0):
    """Whether `cond()` became true within `seconds` (a generous bound)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def calls(r, name):
    """How many times the server ran `name` since the last RESETSTAT."""
    stats = r.info("commandstats")
    return stats.get("cmdstat_" + name, {}).get("calls", 0)


class Killer:
    """Another connection that kills, every `period` s, every connection
    named `name` (`CLIENT LIST`, then `CLIENT KILL ID`): the holder's own
    and every one its package made (they carry the client's name)."""

    def __init__(self, port, name, period=0.1):
        self.r = redis.Redis(port=port, client_name="killer")
        self.name = name
        self.period = period
        self.rounds = 0
        self.killed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def kill_once(self):
        for c in self.r.client_list():
            if c.get("name") == self.name:
                self.killed += self.r.execute_command("CLIENT", "KILL", "ID", c["id"], "SKIPME", "yes")
        self.rounds += 1

    def _run(self):
        while not self._stop.wait(self.period):
            self.kill_once()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.r.close()


class SessionTest(unittest.TestCase):
    def setUp(self):
        self.name = "holder-" + uuid.uuid4().hex[:8]
        self.r = redis.Redis(port=PORT, client_name=self.name)
        self.admin = redis.Redis(port=PORT)

    def tearDown(self):
        self.r.close()
        self.admin.close()

    def held(self, lock):
        """Whether the server lists `lock`'s owner under its token."""
        info = self.admin.execute_command("LOCK.INFO", lock.keys[0])
        if info is None:
            return False
        holders = info[b"holders"] if isinstance(info, dict) else dict(zip(info[::2], info[1::2]))[b"holders"]
        return any(h[0] == lock.owner and h[3] == lock.token for h in holders)

    def test_many_locks_renewed_by_one_keepalive_and_no_renew(self):
        with Session(self.r, ttl=2) as s:
            locks = [Lock(self.r, fresh("many"), session=s) for _ in range(200)]
            for lock in locks:
                self.assertTrue(lock.acquire())
                self.assertFalse(lock.bound)  # SESSION id, no BIND
            self.assertEqual(len(s.ids), 1)
            self.admin.config_resetstat()
            time.sleep(4.5)  # past two ttls: only the session's keepalives keep them
            self.assertGreaterEqual(calls(self.admin, "lock.session|keepalive"), 3)
            self.assertEqual(calls(self.admin, "lock.renew"), 0)
            self.assertEqual(calls(self.admin, "lock.keepalive"), 0)
            self.assertTrue(all(self.held(lock) and not lock.lost for lock in locks))
            info = self.admin.execute_command("LOCK.SESSION", "INFO", s.ids[0])
            self.assertIn(200, list(info.values()) if isinstance(info, dict) else info)
            with self.assertRaises(LockError):  # the session is the one renewal
                locks[0].extend(10)
            for lock in locks:
                lock.release()  # LOCK.RELEASE key owner TOKEN t, as any lock
            self.assertFalse(any(self.held(lock) for lock in locks))

    def fault_run(self, n, session):
        """n locks held (on `session`, or bound without one) while every
        connection of the holder is killed every 100 ms; returns the locks,
        the losses reported and the killer."""
        lost = []
        locks = [Lock(self.r, fresh("fault"), session=session, on_lost=lambda h, why: lost.append(h)) for _ in range(n)]
        for lock in locks:
            self.assertTrue(lock.acquire())
        return locks, lost

    def test_fault_session_keeps_every_lock_bind_loses_all_at_the_first_kill(self):
        n = FAULT_LOCKS
        session_lost = []
        # A lease a loaded machine keeps while every connection is killed (at
        # 2 s, a starved process's keepalives missed it and the session
        # ended), and kills for two leases at least: the session lives on
        # only by keepalives that got through on new connections meanwhile.
        ttl = 5.0
        with Session(self.r, ttl=ttl, on_lost=lambda h, why: session_lost.append(h)) as s:
            locks, lost = self.fault_run(n, s)
            tokens = [lock.token for lock in locks]
            with Killer(PORT, self.name) as killer:
                # FAULT_SECONDS (two ttls) at least, and as many kill rounds as
                # those seconds hold at one every 100 ms: a loaded machine runs
                # the killer late, so its rounds are waited for (a generous bound).
                start = time.monotonic()
                end = start + max(FAULT_SECONDS, 2 * ttl)
                bound = end + max(60.0, 10 * FAULT_SECONDS)
                i = 0
                while time.monotonic() < end or (killer.rounds < (end - start) * 5 and time.monotonic() < bound):
                    # the holder works meanwhile: its client reconnects
                    try:
                        self.r.ping()
                        i += 1
                        locks[i % n].check()
                        self.assertTrue(locks[(7 * i) % n].owned())
                    except redis.ConnectionError:
                        pass  # killed under it (redis-py retried, and was killed again)
                    time.sleep(0.02)
            self.assertGreaterEqual(killer.rounds, (end - start) * 5)  # (waited for above)
            session_run = (killer.rounds, killer.killed, time.monotonic() - start)
            self.assertGreater(killer.killed, killer.rounds / 2)  # the holder's connections were there to kill
            # None lost: all held, under the tokens they were granted with.
            self.assertEqual(lost, [])
            self.assertEqual(session_lost, [])
            self.assertEqual([lock.token for lock in locks], tokens)
            self.assertEqual(sum(1 for lock in locks if lock.lost), 0)
            self.assertEqual(sum(1 for lock in locks if self.held(lock)), n)
            for lock in locks:
                lock.release()
        # The same run with BIND and no session: the first kill loses them all.
        locks, lost = self.fault_run(n, None)
        unbound = [(lock.lost, lock._hold().why) for lock in locks if not lock.bound]
        self.assertEqual(unbound, [])
        killer = Killer(PORT, self.name)
        killer.kill_once()
        killer.r.close()
        self.assertTrue(until(lambda: len(lost) == n, 30), f"{len(lost)} of {n} told")
        self.assertTrue(all(lock.lost for lock in locks))
        self.assertEqual(sum(1 for lock in locks if self.held(lock)), 0)
        print(
            f"\nfault test, {n} locks: on a session, {session_run[0]} kill rounds in {session_run[2]:.1f} s "
            f"({session_run[1]} connections killed), 0 lost; with BIND, 1 kill round, {len(lost)} lost",
            file=sys.stderr,
        )

    def test_a_bound_lock_on_a_descriptor_above_1023_is_not_taken_for_closed(self):
        # The BIND run above holds 1,000 connections: a process with that many
        # sockets has descriptors that select() refuses (the watcher polls).
        import socket

        spare = [socket.socket() for _ in range(1100)]
        try:
            lock = Lock(self.r, fresh("fd"))
            self.assertTrue(lock.acquire())
            self.assertGreater(lock._hold().conn._sock.fileno(), 1023)
            time.sleep(1.5)  # the watcher polled its socket meanwhile
            self.assertFalse(lock.lost)
            self.assertTrue(self.held(lock))
            lock.release()
        finally:
            for sock in spare:
                sock.close()

    def test_closed_from_elsewhere_every_lock_lost_once_promptly(self):
        told = []
        own = []
        s = Session(self.r, ttl=30, on_lost=lambda h, why: told.append((h.keys[0], why)))
        locks = [Lock(self.r, fresh("ext"), session=s, on_lost=lambda h, why: own.append(h)) for _ in range(50)]
        for lock in locks:
            self.assertTrue(lock.acquire())
        self.admin.execute_command("LOCK.SESSION", "CLOSE", s.ids[0])
        # The next keepalive is 10 s away: the server's invalidations tell it.
        self.assertTrue(until(lambda: len(told) == 50, 5), told)
        self.assertTrue(all(lock.lost for lock in locks))
        self.assertEqual(sorted(k for k, _ in told), sorted(lock.keys[0] for lock in locks))
        self.assertIn("session", told[0][1])
        self.assertEqual(len(own), 50)
        time.sleep(0.3)
        self.assertEqual(len(told), 50)  # once per lock
        with self.assertRaises(LeaseLost):
            locks[0].release()
        # A lock granted later opens a new session id.
        old = s.ids
        again = Lock(self.r, fresh("ext"), session=s)
        self.assertTrue(again.acquire())
        self.assertNotEqual(s.ids, old)
        s.close()

    def test_deadline_passed_unanswered_every_lock_lost_at_the_deadline(self):
        told = []
        s = Session(self.r, ttl=1, on_lost=lambda h, why: told.append(why))
        locks = [Lock(self.r, fresh("pause"), session=s) for _ in range(20)]
        for lock in locks:
            self.assertTrue(lock.acquire())
        paused_until = time.monotonic() + 6
        self.admin.execute_command("CLIENT", "PAUSE", 6000, "ALL")  # no keepalive is answered
        try:
            # Lost at the deadline (at most 1 s away), by the local timer:
            # long before the server answers anything again.
            self.assertTrue(until(lambda: len(told) == 20, 4), told)
            self.assertLess(time.monotonic(), paused_until)
            self.assertTrue(all(lock.lost for lock in locks))
            self.assertIn("deadline", told[0])
        finally:
            self.admin.execute_command("CLIENT", "UNPAUSE")
        s.close()

    def test_nosession_on_a_grant_ends_it_and_a_new_id_is_opened(self):
        s = Session(self.r, ttl=30)
        a = Lock(self.r, fresh("nos"), session=s)
        self.assertTrue(a.acquire())
        old = s.ids[0]
        self.admin.execute_command("LOCK.SESSION", "CLOSE", old)
        b = Lock(self.r, fresh("nos"), session=s)
        self.assertTrue(b.acquire())  # NOSESSION (or told before): a new id
        self.assertNotIn(old, s.ids)
        self.assertTrue(until(lambda: a.lost, 5))
        self.assertTrue(self.held(b))
        s.close()

    def test_close_releases_its_locks_and_a_waiter_is_granted(self):
        key = fresh("close")
        granted = []
        with Session(self.r, ttl=30) as s:
            lock = ReentrantLock(self.r, key, session=s)
            self.assertTrue(lock.acquire())
            self.assertTrue(lock.acquire())  # a repeat keeps its session
            def wait_for_it():
                other = Lock(self.admin, key)
                granted.append(other.acquire(wait=10))
                other.release()

            waiter = threading.Thread(target=wait_for_it)
            waiter.start()
            time.sleep(0.2)
            self.assertEqual(granted, [])
            sid = s.ids[0]
            self.assertEqual(self.admin.execute_command("LOCK.SESSION", "INFO", sid) is not None, True)
        waiter.join()
        self.assertEqual(granted, [True])
        self.assertIsNone(self.admin.execute_command("LOCK.SESSION", "INFO", sid))
        self.assertFalse(lock.lost)  # released, not lost
        with self.assertRaises(LockError):
            Lock(self.r, fresh("close"), session=s).acquire()  # closed for good

    def test_clean_exit_closes_the_session(self):
        key = fresh("exit")
        script = (
            "import redis, sys\n"
            "from redis_native_lock import Lock, Session\n"
            f"r = redis.Redis(port={PORT})\n"
            "s = Session(r, ttl=60)\n"
            f"l = Lock(r, {key!r}, session=s)\n"
            "assert l.acquire()\n"
            "print(s.ids[0])\n"
        )
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
        sid = int(out.stdout.strip())
        self.assertIsNone(self.admin.execute_command("LOCK.SESSION", "INFO", sid))
        self.assertIsNone(self.admin.execute_command("LOCK.INFO", key))  # freed at exit, not in 60 s

    def test_a_session_object_collected_is_closed_by_the_keeper(self):
        import gc

        s = Session(self.r, ttl=0.6)
        lock = Lock(self.r, fresh("gc"), session=s)
        self.assertTrue(lock.acquire())
        lock.release()
        sid = s.ids[0]
        del s, lock
        gc.collect()
        self.assertTrue(until(lambda: self.admin.execute_command("LOCK.SESSION", "INFO", sid) is None, 5))

    def test_multilock_and_native_lock_in_a_session_survive_a_kill(self):
        with Session(self.r, ttl=5) as s:
            m = MultiLock(self.r, [fresh("m"), fresh("m")], session=s)
            self.assertTrue(m.acquire())
            n = NativeLock(self.r, fresh("native"), session=s)
            self.assertTrue(n.acquire(blocking=False))
            with self.assertRaises(ValueError):
                NativeLock(self.r, fresh("native"), timeout=5, session=s)
            Killer(PORT, self.name).kill_once()
            time.sleep(0.3)
            self.assertFalse(m.lost)
            self.assertTrue(n.owned())
            with self.assertRaises(redis.exceptions.LockError):
                n.extend(5)
            n.release()
            m.release()

    @unittest.skipUnless(CLUSTER_PORT, "REDIS_LOCK_CLUSTER_PORT not set")
    def test_cluster_one_session_per_node(self):
        rc = RedisCluster(host="127.0.0.1", port=CLUSTER_PORT)
        try:
            keys, nodes = [], set()
            while len(nodes) < 2:
                k = fresh("node")
                node = rc.get_node_from_key(k).name
                if node not in nodes:
                    nodes.add(node)
                    keys.append(k)
            with Session(rc, ttl=5) as s:
                locks = [Lock(rc, k, session=s) for k in keys]
                for lock in locks:
                    self.assertTrue(lock.acquire())
                self.assertEqual(len(set(s.ids)), 2)
                for lock in locks:
                    self.assertTrue(lock.owned())
                    lock.release()
        finally:
            rc.close()


class AsyncSessionTest(unittest.IsolatedAsyncioTestCase):
    async def test_asyncio_session(self):
        name = "aholder-" + uuid.uuid4().hex[:8]
        r = redis.asyncio.Redis(port=PORT, client_name=name)
        admin = redis.asyncio.Redis(port=PORT)
        told = []

        async def on_lost(h, why):
            told.append(h)

        try:
            s = aio.Session(r, ttl=3, on_lost=on_lost)
            locks = [aio.Lock(r, fresh("a"), session=s) for _ in range(100)]
            for lock in locks:
                self.assertTrue(await lock.acquire())
            await admin.config_resetstat()
            await asyncio.sleep(0.3)
            Killer(PORT, name).kill_once()  # every connection of the holder
            # Past its ttl (a keepalive a third of it): waited for rather
            # than slept, so a loaded machine's late keeper only slows it.
            started = asyncio.get_running_loop().time()
            while True:
                stats = await admin.info("commandstats")
                if stats.get("cmdstat_lock.session|keepalive", {}).get("calls", 0) >= 4:
                    break
                self.assertLess(asyncio.get_running_loop().time() - started, 60, "no keepalives")
                await asyncio.sleep(0.05)
            self.assertNotIn("cmdstat_lock.renew", stats)
            self.assertFalse(any(lock.lost for lock in locks))
            self.assertTrue(all([await lock.owned() for lock in locks]))
            # Closed from elsewhere: every lock lost, the callback once each.
            await admin.execute_command("LOCK.SESSION", "CLOSE", s.ids[0])
            for _ in range(500):
                if len(told) == 100:
                    break
                await asyncio.sleep(0.01)
            self.assertEqual(len(told), 100)
            self.assertTrue(all(lock.lost for lock in locks))
            # async with: close() ends the session's locks on the server.
            key = fresh("a")
            async with aio.Session(r, ttl=30) as s2:
                lock = aio.Lock(r, key, session=s2)
                self.assertTrue(await lock.acquire())
                self.assertFalse(await aio.Lock(admin, key).acquire())
            self.assertTrue(await aio.Lock(admin, key).acquire())
        finally:
            await r.aclose()
            await admin.aclose()


if __name__ == "__main__":
    unittest.main()
