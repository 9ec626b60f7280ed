"""The patterns of docs/clients.md ("Semaphores, several keys, and
DEADLOCK") with redis-py against a real server with the module.

    python3 test_kinds.py PORT      (server on 127.0.0.1:PORT)

Run by tests/it/clients.rs (`make test`), with redis-py on PYTHONPATH.
Prints one line per test, then "N passed, M failed"; exits 1 on a failure.
"""

import random
import sys
import threading
import time
import traceback
import uuid

import redis

PORT = int(sys.argv[1])
TESTS = []


def test(f):
    TESTS.append(f)
    return f


def client():
    return redis.Redis(host="127.0.0.1", port=PORT)


@test
def semaphore_guards_a_pool_of_ten():
    r = client()
    held = 0
    most = 0
    lock = threading.Lock()
    errors = []

    def worker():
        nonlocal held, most
        c = client()
        me = str(uuid.uuid4())
        token = c.execute_command("LOCK.SEMAPHORE", "pool:db", 10, me, 30_000, "WAIT", 5_000)
        if token is None:
            errors.append("no permit in 5 s")
            return
        try:
            with lock:
                held += 1
                most = max(most, held)
            time.sleep(0.1)
            with lock:
                held -= 1
        finally:
            assert c.execute_command("LOCK.RELEASE", "pool:db", me) == 1

    threads = [threading.Thread(target=worker) for _ in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert 1 < most <= 10, f"at most 10 at once (and more than one): {most}"
    assert r.execute_command("LOCK.INFO", "pool:db") is None
    try:
        r.execute_command("LOCK.SEMAPHORE", "pool:db", 10, "a", 1000)
        r.execute_command("LOCK.SEMAPHORE", "pool:db", 11, "b", 1000)
        raise AssertionError("another limit must be refused")
    except redis.ResponseError as e:
        assert "limit is 10" in str(e), e
    r.delete("pool:db")


@test
def transfer_takes_both_accounts_or_neither():
    r = client()
    me = f"transfer-{uuid.uuid4()}"
    keys = ["{acct}:alice", "{acct}:bob"]
    tokens = r.execute_command("LOCK.MACQUIRE", len(keys), *keys, me, 10_000, "WAIT", 2_000)
    assert len(tokens) == 2 and tokens[0] < tokens[1], tokens
    other = r.execute_command("LOCK.MACQUIRE", 2, "{acct}:bob", "{acct}:carol", "t2", 10_000)
    assert other is None
    assert r.execute_command("LOCK.INFO", "{acct}:carol") is None, "neither key taken"
    for k in keys:
        assert r.execute_command("LOCK.RELEASE", k, me) == 1


@test
def deadlock_is_a_response_error_and_giving_way_lets_both_finish():
    done = []

    def task(me, first, second, barrier):
        c = client()
        for attempt in range(20):
            assert c.execute_command("LOCK.ACQUIRE", first, me, 10_000, "WAIT", 5_000)
            barrier.wait()  # both hold their first lock: a cycle is certain
            try:
                c.execute_command("LOCK.ACQUIRE", second, me, 10_000, "WAIT", 5_000)
                done.append((me, attempt))
                c.execute_command("LOCK.RELEASE", second, me)
                c.execute_command("LOCK.RELEASE", first, me)
                return
            except redis.ResponseError as e:
                assert str(e).startswith("DEADLOCK"), e
                c.execute_command("LOCK.RELEASE", first, me)  # give way
                time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
                barrier = NoBarrier()
        raise AssertionError(f"{me} never finished")

    class NoBarrier:
        def wait(self):
            pass

    barrier = threading.Barrier(2)
    a = threading.Thread(target=task, args=("a", "x", "y", barrier))
    b = threading.Thread(target=task, args=("b", "y", "x", barrier))
    a.start()
    b.start()
    a.join()
    b.join()
    assert sorted(m for m, _ in done) == ["a", "b"], done
    deadlocks = int(client().info("lock")["lock_deadlocks"])
    assert deadlocks >= 1, deadlocks


def main():
    failed = 0
    for t in TESTS:
        try:
            t()
            print(f"ok   {t.__name__}")
        except Exception:  # noqa: BLE001 - report every failure
            failed += 1
            print(f"FAIL {t.__name__}")
            traceback.print_exc()
    print(f"{len(TESTS) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
