"""A lock helper for the redis-lock module, with redis-py.

    import redis
    from redis_lock import lock, LeaseLost, LockNotAcquired

    r = redis.Redis(host="127.0.0.1", port=6379)
    with lock(r, "orders:42", ttl_ms=30_000, wait_ms=10_000) as lease:
        do_the_work()
        lease.check()                          # raises LeaseLost if the lease ran out
        storage.write(data, fencing_token=lease.token)

- Acquires with `LOCK.ACQUIRE key owner ttl WAIT ms BIND` on a connection of
  its own taken from the client's pool: the client waits inside the server
  (no polling) and gets a fencing token, or `LockNotAcquired`. `BIND` ties the
  lock to that connection: if this process dies (crash, kill -9, lost
  network), the server frees the lock the moment the connection closes,
  instead of at the end of the lease.
- One keepalive per connection (`LOCK.KEEPALIVE ttl` every ttl/3, a thread)
  renews the lease while the work runs; it answers how many locks it
  renewed, so a lock released or deleted behind our back shows as 0. It is
  stopped (and joined) *before* the release, so no renewal can outlive the
  unlock. The connection goes back to the pool only once the release said
  the lock is gone; in any doubt it is closed first (which frees whatever it
  still held), so a pooled connection never carries a bound lock to its next
  user.
- `bind=False` (or a server that refuses `BIND`, or a client without a
  connection pool of its own, such as a cluster client): a lease watchdog
  with `LOCK.RENEW` instead, on the client's shared connections. The owner is
  a fresh UUID per acquisition, so even a renewal sent late could not extend
  somebody else's lock.
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
    """One acquisition: its key, owner, fencing token and keepalive (or watchdog)."""

    def __init__(self, r, key, owner, token, ttl_ms, sent, conn=None):
        self.key = key
        self.owner = owner
        self.token = token
        self.ttl_ms = ttl_ms
        self._r = r
        # The connection the lock is bound to (BIND), used by this lease only.
        self._conn = conn
        self._io = threading.Lock()
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

    @property
    def bound(self):
        """True when the lock is bound to a connection of its own (BIND)."""
        return self._conn is not None

    def _call(self, *args):
        if self._conn is None:
            return self._r.execute_command(*args)
        with self._io:
            self._conn.send_command(*args)
            return self._conn.read_response()

    def _watchdog(self):
        interval = self.ttl_ms / 3000
        while not self._stop.wait(interval):
            sent = time.monotonic()
            try:
                if self._conn is not None:
                    renewed = self._call("LOCK.KEEPALIVE", self.ttl_ms)
                else:
                    renewed = self._call("LOCK.RENEW", self.key, self.owner, self.ttl_ms)
            except (redis.ConnectionError, redis.TimeoutError) as e:
                if self._conn is not None:
                    # The bound connection is gone: the server freed the lock.
                    self._lose(f"the connection the lock was bound to failed ({e})")
                    return
                # Transient on a shared connection: try again at the next
                # tick, unless the lease may have run out meanwhile.
                if time.monotonic() >= self._valid_until:
                    self._lose(f"renewal failed until the ttl ran out ({e})")
                    return
                continue
            except redis.RedisError as e:
                self._lose(f"renewal refused ({e})")
                return
            if renewed and renewed >= 1:
                self._valid_until = sent + self.ttl_ms / 1000
            elif self._conn is not None:
                self._lose("LOCK.KEEPALIVE renewed nothing: the lock was released, expired or deleted")
                return
            else:
                self._lose("LOCK.RENEW answered 0: the lease expired or the key was deleted")
                return

    def _end(self):
        """Stops the keepalive, then releases. Returns LOCK.RELEASE's reply."""
        self._stop.set()
        self._thread.join()
        try:
            released = self._call("LOCK.RELEASE", self.key, self.owner)
        except redis.RedisError:
            self._give_back(clean=False)
            if self._lost.is_set():
                return None  # already known lost: that is what to report
            raise
        if released is None:
            self._lose("LOCK.RELEASE answered nil: the lock was no longer ours")
        # Back to the pool only when nothing can still be bound to it.
        self._give_back(clean=released is not None or self._lost.is_set())
        return released

    def _give_back(self, clean):
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if not clean:
            conn.disconnect()  # the server frees whatever it still held
        self._r.connection_pool.release(conn)


def _release_quietly(r, key, owner):
    try:
        r.execute_command("LOCK.RELEASE", key, owner)
    except redis.RedisError:
        pass  # the lease expires by itself


def _acquire_bound(r, args):
    """LOCK.ACQUIRE ... BIND on a connection of its own: (token, conn), or
    None when the server refuses BIND (an older module)."""
    pool = r.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_command(*args, "BIND")
        token = conn.read_response()
    except redis.ResponseError as e:
        pool.release(conn)
        if "syntax" in str(e).lower():
            return None
        raise
    except BaseException:
        # The grant may have happened as we stopped listening: closing the
        # connection frees it (it was bound).
        conn.disconnect()
        pool.release(conn)
        raise
    if token is None:
        pool.release(conn)
    return token, conn


@contextmanager
def lock(r, key, ttl_ms=30_000, wait_ms=10_000, owner=None, bind=True):
    """Holds `key` for the `with` block; yields the Lease.

    wait_ms: how long to wait in the server (0: without limit, None: do not wait).
    owner: a fresh UUID by default; pass a stable id only if you mean it.
    bind: tie the lock to a connection of its own (freed at once if this
    process dies) with one keepalive; False: a lease watchdog instead.
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
    bound = _acquire_bound(r, args) if bind and hasattr(r.connection_pool, "get_connection") else None
    if bound is not None:
        token, conn = bound
    else:
        conn = None
        try:
            token = r.execute_command(*args)
        except (redis.ConnectionError, redis.TimeoutError):
            # The server may have granted it as we stopped listening: give it back.
            _release_quietly(r, key, owner)
            raise
    if token is None:
        raise LockNotAcquired(f"{key!r} not acquired within {wait_ms} ms")
    lease = Lease(r, key, owner, token, ttl_ms, sent, conn if token is not None else None)
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
