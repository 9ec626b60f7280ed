"""RedLock over N independent redis-lock servers, with redis-py.

    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    from redlock import RedLock

    servers = [redis.Redis(host=h, port=p, socket_connect_timeout=0.1, socket_timeout=0.1,
                           retry=Retry(NoBackoff(), 0))   # redis-py retries 3 times by default
               for h, p in [...5 independent masters...]]
    rl = RedLock(servers)
    with rl.lock("orders:42", ttl_ms=10_000) as lease:
        ...  # finish well within lease.validity_ms

The algorithm (see docs/redlock.md for when it helps and what it cannot
promise): ask every server for the lock with `LOCK.ACQUIRE key owner ttl` (no
WAIT: one slow server must not eat the lease), one owner for all; the lock is
held if a majority granted it and the time spent asking left some validity
(ttl - elapsed - clock drift). Otherwise release it everywhere (also where the
reply was lost) and retry after a random delay.

Each server issues its own fencing token: `lease.tokens` maps a server's index
to its token. They are not comparable across servers; there is no single
increasing number for the whole quorum.
"""

import random
import time
import uuid
from contextlib import contextmanager

import redis

from redis_lock import LockNotAcquired

__all__ = ["RedLock", "RedLease", "LockNotAcquired"]


class RedLease:
    """A quorum's grant: owner, per-server tokens, and how long it is valid."""

    def __init__(self, key, owner, ttl_ms, tokens, validity_ms, started):
        self.key = key
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.tokens = tokens  # {server index: fencing token}
        self.validity_ms = validity_ms
        self._valid_until = started + validity_ms / 1000

    def remaining_ms(self):
        """Validity left on our own monotonic clock (0 when it ran out)."""
        return max(0, int((self._valid_until - time.monotonic()) * 1000))


class RedLock:
    def __init__(self, servers, retries=3, retry_delay_ms=200, drift_factor=0.01):
        """servers: redis.Redis clients of independent masters, each with short
        socket_connect_timeout and socket_timeout and no retries (a dead
        server must cost little of the ttl)."""
        if not servers:
            raise ValueError("RedLock needs at least one server")
        self.servers = list(servers)
        self.quorum = len(self.servers) // 2 + 1
        self.retries = retries
        self.retry_delay_ms = retry_delay_ms
        self.drift_factor = drift_factor

    def _each(self, *args):
        """Sends one command to every server; a failed server answers None."""
        replies = []
        for s in self.servers:
            try:
                replies.append(s.execute_command(*args))
            except redis.RedisError:
                replies.append(None)
        return replies

    def acquire(self, key, ttl_ms, owner=None):
        """A RedLease, or None when no quorum granted it within `retries` tries.
        Whatever was granted without a quorum is released before returning."""
        owner = owner or str(uuid.uuid4())
        for attempt in range(self.retries):
            if attempt:
                time.sleep(random.uniform(0, self.retry_delay_ms) / 1000)
            started = time.monotonic()
            replies = self._each("LOCK.ACQUIRE", key, owner, ttl_ms)
            tokens = {i: t for i, t in enumerate(replies) if isinstance(t, int)}
            elapsed_ms = (time.monotonic() - started) * 1000
            validity_ms = ttl_ms - elapsed_ms - (ttl_ms * self.drift_factor + 2)
            if len(tokens) >= self.quorum and validity_ms > 0:
                return RedLease(key, owner, ttl_ms, tokens, validity_ms, started)
            # No quorum, or no time left: give back what we got, everywhere
            # (a server may have granted it and lost only the reply).
            self._each("LOCK.RELEASE", key, owner)
        return None

    def extend(self, lease, ttl_ms=None):
        """Renews on every server; True if a majority renewed in time (the
        lease's validity is then reset). Do it well before remaining_ms() is 0."""
        ttl_ms = ttl_ms or lease.ttl_ms
        started = time.monotonic()
        renewed = sum(r == 1 for r in self._each("LOCK.RENEW", lease.key, lease.owner, ttl_ms))
        elapsed_ms = (time.monotonic() - started) * 1000
        validity_ms = ttl_ms - elapsed_ms - (ttl_ms * self.drift_factor + 2)
        if renewed >= self.quorum and validity_ms > 0:
            lease.ttl_ms = ttl_ms
            lease.validity_ms = validity_ms
            lease._valid_until = started + validity_ms / 1000
            return True
        return False

    def release(self, lease):
        """Releases on every server; returns how many released a hold."""
        return sum(r is not None for r in self._each("LOCK.RELEASE", lease.key, lease.owner))

    @contextmanager
    def lock(self, key, ttl_ms):
        """Holds `key` on a quorum for the `with` block; raises LockNotAcquired."""
        lease = self.acquire(key, ttl_ms)
        if lease is None:
            raise LockNotAcquired(
                f"{key!r}: no quorum of {self.quorum}/{len(self.servers)} servers granted it"
            )
        try:
            yield lease
        finally:
            self.release(lease)
