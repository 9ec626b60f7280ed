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


def ms(seconds: float, what: str) -> int:
    """Seconds (float) to whole milliseconds, at least 1."""
    if seconds is None or isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {seconds!r}")
    if math.isnan(seconds) or seconds <= 0:
        raise ValueError(f"{what} must be positive, not {seconds!r}")
    return max(1, int(round(seconds * 1000)))


def wait_args(wait: Optional[float]) -> List[Any]:
    """`WAIT ms` for a wait in seconds: None or 0 do not wait, inf waits
    without limit (`WAIT 0`)."""
    if wait is None or wait == 0:
        return []
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or math.isnan(wait) or wait < 0:
        raise ValueError(f"wait must be a number of seconds >= 0, None or inf, not {wait!r}")
    if math.isinf(wait):
        return ["WAIT", 0]
    return ["WAIT", max(1, int(round(wait * 1000)))]


def new_owner() -> str:
    return str(uuid.uuid4())


def translate(err: Exception) -> Exception:
    """A server error reply as this package's error, when it has one."""
    text = str(err)
    if text.startswith("DEADLOCK"):
        return DeadlockError(text)
    return err


class Kind:
    """The commands one lock kind sends."""

    def __init__(self, verb: str, keys: Sequence[KeyT], limit: Optional[int] = None):
        self.verb = verb
        self.keys = list(keys)
        self.limit = limit

    def acquire(self, owner: str, ttl_ms: int, wait: Optional[float], bind: bool) -> List[Any]:
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
        owner = h[0].decode() if isinstance(h[0], bytes) else h[0]
        holders.append({"owner": owner, "holds": h[1], "ttl_ms": h[2], "token": h[3]})
    out["holders"] = holders
    return out


def as_str(owner: KeyT) -> str:
    return owner.decode() if isinstance(owner, bytes) else owner
