"""Tests of redlock.py against independent servers with the module.

    python3 test_redlock.py UP DOWN

UP: comma-separated ports of running servers on 127.0.0.1; DOWN: ports of
servers that were stopped (may be empty). tests/clients.rs starts 5 servers
and runs this with 0, 2, then 3 of them stopped: with a majority up the lock
is granted; without one it is refused, and what the live servers granted is
released. Prints "N passed, M failed"; exits 1 on a failure.
"""

import sys
import traceback

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from redlock import LockNotAcquired, RedLock

UP = [int(p) for p in sys.argv[1].split(",") if p]
DOWN = [int(p) for p in sys.argv[2].split(",") if p] if len(sys.argv) > 2 else []
TESTS = []


def test(f):
    TESTS.append(f)
    return f


def client(port):
    # Short timeouts and no retries: a dead server must cost little of the ttl.
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        socket_connect_timeout=0.2,
        socket_timeout=0.2,
        retry=Retry(NoBackoff(), 0),
    )


def servers():
    # The dead ones first: the time lost on them counts against the validity.
    return [client(p) for p in DOWN + UP]


def lock_info_fields(r):
    return {k: int(v) for k, v in r.info("lock").items()}


# Whether the live servers make a majority of all of them.
QUORUM = len(UP) >= (len(UP) + len(DOWN)) // 2 + 1


@test
def granted_with_a_majority_refused_without():
    rl = RedLock(servers(), retries=1)
    up = [client(p) for p in UP]
    before = [lock_info_fields(r) for r in up]
    lease = rl.acquire("rl:job", ttl_ms=10_000)
    if not QUORUM:
        assert lease is None, "granted without a majority"
        for r, b in zip(up, before):
            f = lock_info_fields(r)
            # Each live server granted it, then it was released.
            assert f["lock_grants"] == b["lock_grants"] + 1, (b, f)
            assert f["lock_keys"] == 0 and f["lock_holders_exclusive"] == 0, f
            assert r.execute_command("LOCK.INFO", "rl:job") is None
        return
    assert lease is not None, "refused although a majority is up"
    assert len(lease.tokens) == len(UP), lease.tokens
    assert 0 < lease.validity_ms < 10_000 and lease.remaining_ms() > 0
    all_servers = DOWN + UP
    for i, token in lease.tokens.items():
        r = client(all_servers[i])
        reply = r.execute_command("LOCK.INFO", "rl:job")
        holders = dict(zip(reply[::2], reply[1::2]))[b"holders"]
        assert [(h[0].decode(), h[3]) for h in holders] == [(lease.owner, token)]
    assert rl.extend(lease)
    assert rl.release(lease) == len(UP)
    for r in up:
        assert r.execute_command("LOCK.INFO", "rl:job") is None


@test
def a_second_client_is_refused_while_the_first_holds():
    first, second = RedLock(servers(), retries=1), RedLock(servers(), retries=2, retry_delay_ms=20)
    if not QUORUM:
        try:
            with first.lock("rl:ctx", ttl_ms=10_000):
                raise AssertionError("the body must not run without a quorum")
        except LockNotAcquired as e:
            assert "no quorum" in str(e)
        for p in UP:
            assert client(p).execute_command("LOCK.INFO", "rl:ctx") is None
        return
    with first.lock("rl:ctx", ttl_ms=10_000) as lease:
        assert second.acquire("rl:ctx", ttl_ms=10_000) is None
        # The refused client left nothing behind, and the first still holds.
        for p in UP:
            reply = client(p).execute_command("LOCK.INFO", "rl:ctx")
            holders = dict(zip(reply[::2], reply[1::2]))[b"holders"]
            assert [h[0].decode() for h in holders] == [lease.owner]
    later = second.acquire("rl:ctx", ttl_ms=10_000)
    assert later is not None
    assert second.release(later) == len(UP)


@test
def a_minority_holding_it_blocks_nobody_else_from_a_quorum():
    # Someone holds the key on one live server only (a crashed RedLock client
    # that got no quorum): with a majority up besides it, or not, the outcome
    # follows the count of servers that can grant.
    if not UP:
        return
    squatter = client(UP[0])
    squatter.execute_command("LOCK.ACQUIRE", "rl:one", "squatter", 10_000)
    rl = RedLock(servers(), retries=1)
    lease = rl.acquire("rl:one", ttl_ms=10_000)
    can_grant = len(UP) - 1
    if can_grant >= (len(UP) + len(DOWN)) // 2 + 1:
        assert lease is not None and len(lease.tokens) == can_grant
        rl.release(lease)
    else:
        assert lease is None
    for p in UP[1:]:
        assert client(p).execute_command("LOCK.INFO", "rl:one") is None
    assert squatter.execute_command("LOCK.RELEASE", "rl:one", "squatter") == 1


def main():
    passed = failed = 0
    for t in TESTS:
        try:
            t()
        except Exception:
            failed += 1
            print(f"FAIL {t.__name__} (up {UP}, down {DOWN})")
            traceback.print_exc()
        else:
            passed += 1
            print(f"ok   {t.__name__} (up {len(UP)}, down {len(DOWN)})")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
