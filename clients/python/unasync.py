"""Writes the blocking modules from the asyncio ones, so that each API has
one source: `_sync.py` from `_async.py`, `_dropin.py` from
`_dropin_async.py` (in src/redis_native_lock). What differs beyond
`async`/`await` is in `_async_io.py` and `_sync_io.py`, under the same
names; what is left is below: words, each module docstring's opening, and
a few exact passages, each of which must be found (else this script stops,
so that none goes stale).

    python3 clients/python/unasync.py          # rewrite the generated files
    python3 clients/python/unasync.py --check  # exit 1 if one is stale

Standard library only; run by the package's test (tests/it/python_package.rs).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import List, Tuple

PACKAGE = Path(__file__).resolve().parent / "src" / "redis_native_lock"

#: Every file: (pattern, replacement), in this order.
WORDS: List[Tuple[str, str]] = [
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\bAwaitable\[((?:[^\[\]]|\[[^\[\]]*\])*)\]", r"\1"),
    (r"\bUnion\[None, None\]", "None"),
    (r"\bAwaitable, ", ""),
    (r"^import redis\.asyncio\n", ""),
    (r"\bredis\.asyncio\.", "redis."),
    (r"\bfrom \._async import\b", "from ._sync import"),
    (r"\b_async_io\b", "_sync_io"),
    (r"\bAsyncClient\b", "SyncClient"),
    (r"\bwant_async=True\b", "want_async=False"),
    (r"\b_watch_task\b", "_watch_thread"),
    (r"\btasks\b", "threads"),
    (r"\btask\b", "thread"),
]

GENERATED = "# Generated from {src} by clients/python/unasync.py: do not edit; edit {src} and run it.\n"

#: Per file: the generated file; where the module docstring's opening
#: (about the asyncio API) ends, and what opens it instead; exact passages of
#: the source (each found exactly once) with what they are in the blocking API.
FILES = {
    "_async.py": (
        "_sync.py",
        "\nLayout:",
        '''"""The blocking API, on redis-py's `Redis` and `RedisCluster`.

Generated from `_async.py` (the asyncio API) by `clients/python/unasync.py`;
what differs beyond `async`/`await` lives in `_sync_io.py`.
''',
        [],
    ),
    "_dropin_async.py": (
        "_dropin.py",
        "\nredis-py's meanings",
        '''"""`NativeLock`: redis-py's `Lock` (redis/lock.py) on the module's commands,
for `Redis.lock(name, ..., lock_class=NativeLock)`.

Generated from `_dropin_async.py` by `clients/python/unasync.py`.
''',
        [
            (
                # redis-py's blocking Lock.acquire takes `sleep` first; its asyncio one has none.
                "        self,\n        blocking: Optional[bool] = None,\n        blocking_timeout: Optional[Number] = None,\n        token:",
                "        self,\n        sleep: Optional[Number] = None,\n        blocking: Optional[bool] = None,\n        blocking_timeout: Optional[Number] = None,\n        token:",
            ),
            ("`blocking_timeout` ran out.\"\"\"", "`blocking_timeout` ran out. `sleep` is unused.\"\"\""),
            ('"DEFAULT_LEASE", "holds"', '"DEFAULT_LEASE", "wait_of", "owner_of", "holds"'),
        ],
    ),
}


def generate(src: str, text: str) -> str:
    _, intro_end, intro, passages = FILES[src]
    if intro_end not in text:
        raise SystemExit(f"unasync.py: {src}: the docstring's {intro_end.strip()!r} is gone (update FILES)")
    text = intro + text[text.index(intro_end) :]
    for old, new in passages:
        n = text.count(old)
        if n != 1:
            raise SystemExit(f"unasync.py: {src}: a passage is found {n} times, not once (update FILES):\n{old}")
        text = text.replace(old, new)
    for pattern, replacement in WORDS:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    return GENERATED.format(src=src) + text


def main(argv: List[str]) -> int:
    check = argv[1:] == ["--check"]
    if argv[1:] and not check:
        print(__doc__, file=sys.stderr)
        return 2
    stale = []
    for src, (dst, *_) in FILES.items():
        want = generate(src, (PACKAGE / src).read_text(encoding="utf-8"))
        path = PACKAGE / dst
        have = path.read_text(encoding="utf-8") if path.exists() else None
        if have == want:
            continue
        stale.append(dst)
        if not check:
            path.write_text(want, encoding="utf-8")
    if check and stale:
        print(
            f"stale: {', '.join(stale)} (generated from the asyncio modules): "
            "run python3 clients/python/unasync.py and commit the result",
            file=sys.stderr,
        )
        return 1
    for dst in stale:
        print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
