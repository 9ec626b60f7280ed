"""A lock helper for the redis-lock module, with redis-py.

    import redis
    from redis_lock import lock, LeaseLost, LockNotAcquired

    r = redis.Redis(host="127.0.0.1", port=6379)
    with lock(r, "orders:42", ttl_ms=30_000, wait_ms=10_000) as lease:
        do_the_work()
        lease.check()                          # raises LeaseLost if the lease ran out
        storage.write(data, fencing_token=lease.token)

- Acquires with `LOCK.ACQUIRE key owner ttl WAIT ms`: the client waits inside
  the server (no polling) and gets a fencing token, or `LockNotAcquired`.
- A watchdog thread renews the lease every ttl/3 while the work runs. It is
  stopped (and joined) *before* the release, so no renewal can outlive the
  unlock; and the owner is a fresh UUID per acquisition, so even a renewal
  sent late could not extend somebody else's lock.
- The release happens in `finally`, also when the work raises.
- If the lease was lost (a renewal answered 0, the release answered nil: the
  lease expired, or an operator ran DEL), `lease.lost` becomes true at once,
  `lease.check()` raises, and leaving the block raises `LeaseLost`: whatever
  the work did after that point was not protected by the lock, and only the
  fencing token keeps the resource safe from it.

The client's `socket_timeout` (if any) must be longer than `wait_ms`, since
the reply to a waiting `LOCK.ACQUIRE` comes only when the lock is granted or
the wait runs out.
"""

import threading
import time
import uuid
from contextlib import contextmanager

import redis

__all__ = ["lock", "Lease", "LockError", "LockNotAcquired", "LeaseLost"]


class LockError(Exception):
    """Base class of the helper's errors."""


class LockNotAcquired(LockError):
    """The lock was not granted within `wait_ms`."""


class LeaseLost(LockError):
    """The lease ended before the work did: the work was not fully protected."""


class Lease:
    """One acquisition: its key, owner, fencing token and watchdog."""

    def __init__(self, r, key, owner, token, ttl_ms, sent):
        self.key = key
        self.owner = owner
        self.token = token
        self.ttl_ms = ttl_ms
        self._r = r
        # A lower bound of the server's deadline, on our monotonic clock: the
        # lease started after the request was sent.
        self._valid_until = sent + ttl_ms / 1000
        self._lost = threading.Event()
        self._why = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watchdog, name=f"lock-watchdog:{key}", daemon=True
        )

    @property
    def lost(self):
        """True once the lease is known to be gone, or may have run out."""
        return self._lost.is_set() or time.monotonic() >= self._valid_until

    def check(self):
        """Raises LeaseLost if the lease is gone: call it before a protected write."""
        if self.lost:
            raise LeaseLost(self._message())

    def _message(self):
        why = self._why or "its ttl ran out without a successful renewal"
        return f"lease on {self.key!r} (token {self.token}) lost: {why}"

    def _lose(self, why):
        if self._why is None:
            self._why = why
        self._lost.set()

    def _watchdog(self):
        interval = self.ttl_ms / 3000
        while not self._stop.wait(interval):
            sent = time.monotonic()
            try:
                renewed = self._r.execute_command(
                    "LOCK.RENEW", self.key, self.owner, self.ttl_ms
                )
            except redis.RedisError as e:
                # Transient (connection lost, timeout): try again at the next
                # tick, unless the lease may have run out meanwhile.
                if time.monotonic() >= self._valid_until:
                    self._lose(f"renewal failed until the ttl ran out ({e})")
                    return
                continue
            if renewed == 1:
                self._valid_until = sent + self.ttl_ms / 1000
            else:
                self._lose("LOCK.RENEW answered 0: the lease expired or the key was deleted")
                return

    def _end(self):
        """Stops the watchdog, then releases. Returns LOCK.RELEASE's reply."""
        self._stop.set()
        self._thread.join()
        released = self._r.execute_command("LOCK.RELEASE", self.key, self.owner)
        if released is None:
            self._lose("LOCK.RELEASE answered nil: the lock was no longer ours")
        return released


def _release_quietly(r, key, owner):
    try:
        r.execute_command("LOCK.RELEASE", key, owner)
    except redis.RedisError:
        pass  # the lease expires by itself


@contextmanager
def lock(r, key, ttl_ms=30_000, wait_ms=10_000, owner=None):
    """Holds `key` for the `with` block; yields the Lease.

    wait_ms: how long to wait in the server (0: without limit, None: do not wait).
    owner: a fresh UUID by default; pass a stable id only if you mean it.
    """
    timeout = r.connection_pool.connection_kwargs.get("socket_timeout")
    if wait_ms is not None and timeout is not None and (wait_ms == 0 or timeout * 1000 <= wait_ms):
        raise ValueError(
            f"socket_timeout {timeout}s would cut a WAIT of {wait_ms} ms: use a client "
            "without socket_timeout, or one longer than wait_ms"
        )
    owner = owner or str(uuid.uuid4())
    args = ["LOCK.ACQUIRE", key, owner, ttl_ms]
    if wait_ms is not None:
        args += ["WAIT", wait_ms]
    sent = time.monotonic()
    try:
        token = r.execute_command(*args)
    except (redis.ConnectionError, redis.TimeoutError):
        # The server may have granted it as we stopped listening: give it back.
        _release_quietly(r, key, owner)
        raise
    if token is None:
        raise LockNotAcquired(f"{key!r} not acquired within {wait_ms} ms")
    lease = Lease(r, key, owner, token, ttl_ms, sent)
    lease._thread.start()
    try:
        yield lease
    except BaseException:
        # The work failed: release, and let its own exception through.
        try:
            lease._end()
        except redis.RedisError:
            pass
        raise
    if lease._end() is None:
        raise LeaseLost(lease._message())
