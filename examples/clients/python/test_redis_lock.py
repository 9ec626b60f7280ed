"""Tests of redis_lock.py against a real server with the module.

    python3 test_redis_lock.py PORT      (server on 127.0.0.1:PORT)

Run by tests/clients.rs (`make test`), with redis-py on PYTHONPATH.
Prints one line per test, then "N passed, M failed"; exits 1 on a failure.
"""

import sys
import threading
import time
import traceback

import redis

from redis_lock import LeaseLost, LockNotAcquired, lock

PORT = int(sys.argv[1])
TESTS = []


def test(f):
    TESTS.append(f)
    return f


def client(**kw):
    return redis.Redis(host="127.0.0.1", port=PORT, **kw)


def info(r, key):
    """LOCK.INFO as {owner: (holds, token)}, or None when free."""
    reply = r.execute_command("LOCK.INFO", key)
    if reply is None:
        return None
    fields = dict(zip(reply[::2], reply[1::2]))
    return {h[0].decode(): (h[1], h[3]) for h in fields[b"holders"]}


def renew_calls(r):
    """Renewals sent so far: LOCK.KEEPALIVE (bound locks) and LOCK.RENEW."""
    stats = r.info("commandstats")
    return sum(
        stats.get(f"cmdstat_lock.{c}", {}).get("calls", 0) for c in ("renew", "keepalive")
    )


def bound_holders(r):
    return int(r.info("lock")["lock_bound_holders"])


def wait_for(what, pred, timeout=5.0):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(0.01)


class FencedStore:
    """The protected resource: refuses a write older than one it has seen."""

    def __init__(self):
        self.last_token = 0
        self.value = None

    def write(self, value, token):
        if token < self.last_token:
            return False
        self.last_token, self.value = token, value
        return True


@test
def holds_the_lock_with_a_token_and_releases_it():
    r, other = client(), client()
    with lock(r, "py:basic", ttl_ms=10_000) as lease:
        assert isinstance(lease.token, int) and lease.token > 0, lease.token
        assert info(other, "py:basic") == {lease.owner: (1, lease.token)}
        # Someone else is refused while we hold it.
        assert other.execute_command("LOCK.ACQUIRE", "py:basic", "intruder", 1000) is None
        assert not lease.lost
        lease.check()
    assert info(other, "py:basic") is None


@test
def waits_in_the_server_until_the_holder_releases():
    r, holder = client(), client()
    first = holder.execute_command("LOCK.ACQUIRE", "py:wait", "holder", 30_000)
    t = threading.Timer(0.2, lambda: client().execute_command("LOCK.RELEASE", "py:wait", "holder"))
    t.start()
    try:
        with lock(r, "py:wait", ttl_ms=10_000, wait_ms=10_000) as lease:
            assert lease.token > first, (lease.token, first)
    finally:
        t.join()
    assert info(r, "py:wait") is None


@test
def wait_running_out_raises_lock_not_acquired():
    r = client()
    r.execute_command("LOCK.ACQUIRE", "py:busy", "holder", 30_000)
    try:
        with lock(r, "py:busy", ttl_ms=1000, wait_ms=100):
            raise AssertionError("the body must not run")
    except LockNotAcquired as e:
        assert "py:busy" in str(e)
    else:
        raise AssertionError("expected LockNotAcquired")
    # Nothing was left queued or held by us.
    assert list(info(r, "py:busy")) == ["holder"]
    assert r.execute_command("LOCK.INFO", "py:busy")[-1] == 0  # no waiter left
    assert r.execute_command("LOCK.RELEASE", "py:busy", "holder") == 1


@test
def keepalive_keeps_the_lease_while_the_work_runs():
    for bind in (True, False):
        r, other = client(), client()
        before = renew_calls(other)
        with lock(r, "py:long", ttl_ms=900, bind=bind) as lease:
            assert lease.bound == bind
            assert bound_holders(other) == (1 if bind else 0)
            for _ in range(4):  # 1.2 s of work: longer than the ttl
                time.sleep(0.3)
                assert info(other, "py:long") == {lease.owner: (1, lease.token)}
                lease.check()
        assert renew_calls(other) - before >= 2
        assert info(other, "py:long") is None
        # The connection went back to the pool holding nothing.
        assert bound_holders(other) == 0


@test
def a_bound_lock_is_freed_the_moment_its_holder_connection_dies():
    r = client(client_name="py-holder")
    admin, waiter = client(), client()
    try:
        with lock(r, "py:dies", ttl_ms=6_000) as lease:
            ids = [c["id"] for c in admin.client_list() if c.get("name") == "py-holder"]
            assert ids, admin.client_list()
            got = []
            t = threading.Thread(
                target=lambda: got.append(
                    waiter.execute_command("LOCK.ACQUIRE", "py:dies", "next", 10_000, "WAIT", 5_000)
                )
            )
            t.start()
            wait_for("the waiter to queue", lambda: int(admin.info("lock")["lock_waiters"]) == 1)
            start = time.monotonic()
            for i in ids:  # the process "dies": its connections close
                admin.execute_command("CLIENT", "KILL", "ID", i)
            t.join()
            assert got and got[0] is not None, got
            assert time.monotonic() - start < 1, "granted at the close, not at the 6 s lease"
            wait_for("the keepalive notices", lambda: lease.lost)
    except LeaseLost as e:
        assert "py:dies" in str(e), str(e)
    else:
        raise AssertionError("leaving the block must raise LeaseLost")
    assert info(admin, "py:dies") == {"next": (1, got[0])}


@test
def the_lease_watchdog_is_used_without_bind():
    r, other = client(), client()
    with lock(r, "py:nobind", ttl_ms=10_000, bind=False) as lease:
        assert not lease.bound
        assert bound_holders(other) == 0
    assert info(other, "py:nobind") is None


@test
def watchdog_stops_at_release_and_never_renews_after_unlock():
    # The Redisson race: a renewal timer outliving unlock extends the next
    # lock of the same owner id. Here the owner is stable on purpose.
    r, other = client(), client()
    with lock(r, "py:race", ttl_ms=150, owner="worker-1"):
        time.sleep(0.2)  # at least one renewal happened
    after_release = renew_calls(other)
    # The same owner takes the lock again, briefly, by hand.
    assert other.execute_command("LOCK.ACQUIRE", "py:race", "worker-1", 200) is not None
    time.sleep(0.5)  # ten watchdog intervals
    assert renew_calls(other) == after_release, "a renewal was sent after the release"
    assert info(other, "py:race") is None, "the second lease was extended"
    assert threading.active_count() == 1, threading.enumerate()


@test
def a_lost_lease_is_reported_and_someone_elses_lock_is_untouched():
    r, admin = client(), client()
    try:
        with lock(r, "py:lost", ttl_ms=300) as lease:
            admin.delete("py:lost")  # forced unlock by an operator
            theirs = admin.execute_command("LOCK.ACQUIRE", "py:lost", "successor", 10_000)
            wait_for("the watchdog notices", lambda: lease.lost)
            try:
                lease.check()
                raise AssertionError("check() must raise once the lease is lost")
            except LeaseLost as e:
                assert "LOCK.KEEPALIVE renewed nothing" in str(e), str(e)
    except LeaseLost as e:
        assert "py:lost" in str(e), str(e)
    else:
        raise AssertionError("leaving the block must raise LeaseLost")
    assert info(admin, "py:lost") == {"successor": (1, theirs)}


@test
def the_fencing_token_rejects_the_stale_holders_write():
    r, admin = client(), client()
    store = FencedStore()
    try:
        with lock(r, "py:fence", ttl_ms=10_000) as a:
            assert store.write("from a", a.token)
            # a stalls; its lease is taken away and b gets the lock.
            admin.delete("py:fence")
            with lock(client(), "py:fence", ttl_ms=10_000) as b:
                assert b.token > a.token
                assert store.write("from b", b.token)
            # a wakes up and writes with its old token: refused.
            assert not store.write("late from a", a.token)
    except LeaseLost:
        pass
    else:
        raise AssertionError("a's lease was lost: leaving the block must say so")
    assert store.value == "from b"


@test
def an_exception_in_the_work_releases_and_propagates():
    r = client()
    try:
        with lock(r, "py:boom", ttl_ms=10_000):
            raise KeyError("boom")
    except KeyError:
        pass
    assert info(r, "py:boom") is None


@test
def a_socket_timeout_shorter_than_the_wait_is_refused_up_front():
    r = client(socket_timeout=0.5)
    try:
        with lock(r, "py:timeout", wait_ms=5_000):
            raise AssertionError("the body must not run")
    except ValueError as e:
        assert "socket_timeout" in str(e)
    with lock(r, "py:timeout", wait_ms=100):  # shorter waits are fine
        pass


def main():
    passed = failed = 0
    for t in TESTS:
        try:
            t()
        except Exception:
            failed += 1
            print(f"FAIL {t.__name__}")
            traceback.print_exc()
        else:
            passed += 1
            print(f"ok   {t.__name__}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
