"""What the sync and asyncio APIs share: errors, the lock kinds' commands,
units, reply parsing. No I/O here."""

from __future__ import annotations

import math
import uuid
from typing import Any, Dict, List, Optional, Sequence, Union

KeyT = Union[str, bytes]

__all__ = [
    "LockError",
    "LockNotAcquired",
    "LeaseLost",
    "DeadlockError",
    "NotDurable",
    "FewerReplicas",
    "Kind",
]


class LockError(Exception):
    """Base class of this package's errors."""


class LockNotAcquired(LockError):
    """The lock was not granted within the wait (raised by `with`; `acquire`
    returns False instead)."""


class LeaseLost(LockError):
    """The lease ended before the holder let go: it ran out, its bound
    connection failed, or the key was deleted. Whatever was done after that
    was not protected by the lock; only the fencing token keeps the resource
    safe from it."""


class DeadlockError(LockError):
    """The server answered DEADLOCK: waiting would have closed a cycle of
    waits (this holder, through others, waits for itself). Nothing changed;
    release what you hold and retry."""


class NotDurable(LockError):
    """`replicas=N`: fewer than N replicas acknowledged a grant or a renewal
    within `replicas_timeout` (`WAIT N ms` after it, on its connection). The
    grant was released (a renewal: the lease was given up). `acked` is how
    many did."""

    def __init__(self, message: str, acked: int = 0, wanted: int = 0) -> None:
        super().__init__(message)
        self.acked = acked
        self.wanted = wanted


class FewerReplicas(UserWarning):
    """`on_fewer_replicas="warn"`: a grant or renewal kept though fewer than
    `replicas` replicas acknowledged it (the holder's `durable` is False)."""


def check_replicas(replicas: Any, timeout: Any, on_fewer: Any) -> None:
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ValueError(f"replicas must be an integer >= 0, not {replicas!r}")
    ms(timeout, "replicas_timeout")
    if on_fewer not in ("raise", "warn"):
        raise ValueError(f'on_fewer_replicas must be "raise" or "warn", not {on_fewer!r}')


def wait_replicas(replicas: int, timeout: float) -> List[Any]:
    """`WAIT numreplicas ms`: Redis's own command (not the lock option)."""
    return ["WAIT", replicas, ms(timeout, "replicas_timeout")]


def ms(seconds: float, what: str) -> int:
    """Seconds (float) to whole milliseconds, at least 1."""
    if seconds is None or isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {seconds!r}")
    if math.isnan(seconds) or math.isinf(seconds) or seconds <= 0:
        raise ValueError(f"{what} must be a positive, finite number of seconds, not {seconds!r}")
    return max(1, int(round(seconds * 1000)))


def check_wait(wait: Optional[float]) -> Optional[float]:
    """A wait in seconds: None or 0 (do not wait), a positive number, or inf."""
    if wait is None:
        return None
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or math.isnan(wait) or wait < 0:
        raise ValueError(f"wait must be a number of seconds >= 0, None or inf, not {wait!r}")
    return wait


def wait_args(wait: Optional[float]) -> List[Any]:
    """`WAIT ms` for a wait in seconds: None or 0 do not wait, inf waits
    without limit (`WAIT 0`)."""
    wait = check_wait(wait)
    if wait is None or wait == 0:
        return []
    if math.isinf(wait):
        return ["WAIT", 0]
    return ["WAIT", max(1, int(round(wait * 1000)))]


def new_owner() -> bytes:
    """A fresh owner for one acquisition (a UUID, as ASCII bytes)."""
    return str(uuid.uuid4()).encode()


def owner_bytes(owner: KeyT) -> bytes:
    """An owner as given, as bytes: bytes kept as they are, str encoded as
    UTF-8 (as redis-py encodes it on the wire)."""
    if isinstance(owner, str):
        owner = owner.encode()
    if not isinstance(owner, bytes):
        raise TypeError(f"owner must be str or bytes, not {type(owner).__name__}")
    if not owner:
        raise ValueError("owner must not be empty")
    return owner


def check_key(key: Any) -> KeyT:
    if not isinstance(key, (str, bytes)):
        raise TypeError(f"a key must be str or bytes, not {type(key).__name__}")
    return key


def check_keys(keys: Any) -> List[KeyT]:
    """MultiLock's keys: a sequence of keys, never one str or bytes (which
    would be taken letter by letter)."""
    if isinstance(keys, (str, bytes, bytearray, memoryview)):
        raise TypeError(
            f"MultiLock takes a list of keys, not one {type(keys).__name__} ({keys!r}): "
            "write MultiLock(r, [key]) or use Lock(r, key)"
        )
    out = [check_key(k) for k in keys]
    if not out:
        raise ValueError("MultiLock needs at least one key")
    return out


def check_client(client: Any, want_async: bool, cls: str) -> None:
    """A blocking client for the blocking classes, an asyncio one for the
    asyncio classes: anything else is a TypeError naming the right class."""
    import redis
    import redis.asyncio

    is_async = isinstance(client, (redis.asyncio.Redis, redis.asyncio.RedisCluster))
    is_sync = isinstance(client, (redis.Redis, redis.RedisCluster))
    if want_async and not is_async:
        if is_sync:
            raise TypeError(
                f"redis_native_lock.aio.{cls} needs a redis.asyncio client; for a blocking "
                f"{type(client).__name__} use redis_native_lock.{cls}"
            )
        raise TypeError(f"{cls} needs a redis.asyncio.Redis or RedisCluster, not {type(client).__name__}")
    if not want_async and not is_sync:
        if is_async:
            raise TypeError(
                f"redis_native_lock.{cls} needs a blocking redis client; for "
                f"redis.asyncio.{type(client).__name__} use redis_native_lock.aio.{cls}"
            )
        raise TypeError(f"{cls} needs a redis.Redis or RedisCluster, not {type(client).__name__}")


def server_error(err: Exception, keys: Sequence[KeyT]) -> Exception:
    """A server error reply to a grant as this package's error."""
    text = str(err)
    if text.startswith("DEADLOCK"):
        return DeadlockError(text)
    if text.startswith("WRONGTYPE"):
        return LockError(f"{list(keys)!r}: a key holds another type than a lock ({text})")
    if text.startswith("owner holds this lock") or "owner holds this lock" in text:
        return LockError(f"{list(keys)!r}: {text} (one owner holds a key in one mode)")
    return LockError(f"{list(keys)!r}: the server refused: {text}")


translate = server_error


def op_timeout(socket_timeout: Optional[float], ttl_ms: int) -> float:
    """How long one command of the package may take: the client's
    socket_timeout, or the lease's length when the client has none."""
    if socket_timeout:
        return float(socket_timeout)
    return ttl_ms / 1000


def acquire_timeout(wait: Optional[float], base: float) -> Optional[float]:
    """The read timeout of an acquire: the wait (the server answers when it
    ends) plus one command's time; None (no limit) for an endless wait."""
    if wait is None or wait == 0:
        return base
    if math.isinf(wait):
        return None
    return wait + base


class Kind:
    """The commands one lock kind sends."""

    def __init__(self, verb: str, keys: Sequence[KeyT], limit: Optional[int] = None):
        self.verb = verb
        self.keys = list(keys)
        self.limit = limit

    def acquire(self, owner: bytes, ttl_ms: int, wait: Optional[float], bind: bool) -> List[Any]:
        if self.verb == "LOCK.MACQUIRE":
            args: List[Any] = [self.verb, len(self.keys), *self.keys, owner, ttl_ms]
        elif self.verb == "LOCK.SEMAPHORE":
            args = [self.verb, self.keys[0], self.limit, owner, ttl_ms]
        else:
            args = [self.verb, self.keys[0], owner, ttl_ms]
        args += wait_args(wait)
        if bind:
            args.append("BIND")
        return args

    @property
    def reentrant(self) -> bool:
        """Whether a repeat acquire adds a hold (released one at a time)."""
        return self.verb in ("LOCK.RACQUIRE", "LOCK.READ")


def parse_info(reply: Any) -> Optional[Dict[str, Any]]:
    """LOCK.INFO (RESP2 flat array or RESP3 map) as a dict with str keys;
    holders as a list of dicts (owner, holds, ttl_ms, token)."""
    if reply is None:
        return None
    if isinstance(reply, dict):
        items = list(reply.items())
    else:
        items = [(reply[i], reply[i + 1]) for i in range(0, len(reply) - 1, 2)]
    out: Dict[str, Any] = {}
    for k, v in items:
        name = k.decode() if isinstance(k, bytes) else str(k)
        if isinstance(v, bytes):
            v = v.decode()
        out[name] = v
    holders = []
    for h in out.get("holders") or []:
        owner = h[0].encode() if isinstance(h[0], str) else h[0]
        holders.append({"owner": owner, "holds": h[1], "ttl_ms": h[2], "token": h[3]})
    out["holders"] = holders
    return out


def holds(info: Optional[Dict[str, Any]], owner: bytes, token: Optional[int] = None) -> bool:
    """Whether LOCK.INFO lists `owner` (under `token`, when given)."""
    return info is not None and any(h["owner"] == owner and (token is None or h["token"] == token) for h in info["holders"])


def guard_args(key: KeyT, owner: bytes, token: int, command: Sequence[Any]) -> List[Any]:
    """`LOCK.GUARD key owner TOKEN token CALL command...`."""
    if not command:
        raise TypeError("guard() needs a command to run, e.g. guard(\"SET\", key, value)")
    return ["LOCK.GUARD", key, owner, "TOKEN", token, "CALL", *command]


def guard_route(client: Any, key: KeyT) -> Dict[str, Any]:
    """execute_command's keywords for a guard: in a cluster, the node that
    serves the lock key (the guarded command's keys must share its slot; the
    server answers CROSSSLOT otherwise)."""
    import redis
    import redis.asyncio

    if any(isinstance(client, t) for t in (redis.RedisCluster, redis.asyncio.RedisCluster)):
        return {"target_nodes": client.get_node_from_key(key)}
    return {}


def guarded_reply(client: Any, command: Sequence[Any], reply: Any) -> Any:
    """A guarded command's reply as `client.execute_command(*command)` would
    return it: through the client's response callback for that command."""
    callbacks = getattr(client, "response_callbacks", None)
    if callbacks is None and hasattr(client, "get_redis_connection"):  # a blocking RedisCluster: its nodes'
        callbacks = client.get_redis_connection(client.get_default_node()).response_callbacks
    name = command[0]
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    if not callbacks or not isinstance(name, str):
        return reply
    callback = callbacks.get(name) or callbacks.get(name.upper())
    return callback(reply) if callback is not None else reply


def raise_first(replies: List[Any]) -> List[Any]:
    """A pipeline's replies, each read (so the connection stays in step):
    the first error reply among them raised, else the replies."""
    for r in replies:
        if isinstance(r, Exception):
            raise r
    return replies
