//! Live-server fuzz: at least a million random `LOCK.*` commands against one
//! redis-server with the module, then a check that it is still sound.
//!
//! - Two fuzz connections (one RESP2, one RESP3) pipeline batches of 1000
//!   random commands: `LOCK.*` names in odd cases, random arities, binary and
//!   empty owners, keys of other types, ttls and WAITs that are huge, negative,
//!   zero, padded, signed, fractional or not numbers at all, unknown options,
//!   the internal `LOCK.SYNC`; now and then a `MULTI`/`EXEC` block or a Lua
//!   script (where `WAIT`, even `WAIT 0`, must be an immediate try), and a few
//!   other writes that free or change locks behind the module's back (`DEL`,
//!   `SET` over a lock, `PERSIST`, `RENAME`, `SWAPDB`, `FLUSHDB`, `DEBUG
//!   RELOAD`, `CLIENT UNBLOCK` of a waiting client). A grant that could block
//!   (a `WAIT` argument) is only sent inside `MULTI` on these connections, so
//!   a pipeline never stalls. Every reply is checked for its shape (a token is
//!   a positive integer, RELEASE answers 1, 0 or nil, LOCK.INFO satisfies the
//!   invariants below) and every error must be one the module or Redis
//!   documents: never the module's "internal error". Half the
//!   `LOCK.RELEASE` and `LOCK.RENEW` commands carry `TOKEN` (v4): a token
//!   this connection was granted for that key and owner, or any integer,
//!   now and then repeated or followed by another option.
//! - `LOCK.GUARD` (contract v3), one lock command in 40 and in MULTI
//!   blocks and scripts like the others: hot lock keys, the fuzz owners
//!   (so the owner sometimes holds), no TOKEN, a token this connection was
//!   granted or any integer; called: SET, INCR, DEL, HSET, GET, APPEND on
//!   data keys or on the lock key itself, lock commands, and what a guard
//!   refuses (blocking commands, MULTI, EXEC, WATCH, EVAL, a WAIT, a nested
//!   guard). Its reply is an allowed error or the called command's. And
//!   about 1 command in 300 is a digest-checked guard, alone in MULTI
//!   (nothing else runs, nothing expires meanwhile; `checked_guard`): a
//!   refused guard (NOTHELD, `ERR LOCK.GUARD cannot run`) leaves the digest
//!   of every key it names unchanged (in 1 block of 8, `DEBUG DIGEST` of the
//!   whole dataset: it costs about 10 us a key on a debug build); a guard
//!   that ran a data command answered as the command run directly on a
//!   `COPY` of its key, and left the key as that run left the copy.
//! - Four waiter threads on their own connections send grants with short
//!   WAITs (1-5 ms; `WAIT 0` only on a private key whose 20 ms lease is sure
//!   to end), disconnect while waiting, release, renew, re-enter; with
//!   `lock.max-waiters 2` some get the "too many waiters" error; half
//!   their releases and renewals name their grant's `TOKEN`. A waiter
//!   that gets no reply within 30 s fails the test (this found a client left
//!   without any reply when `CLIENT UNBLOCK id TIMEOUT` raced its grant).
//! - Afterwards: PING answers; the server log has no panic, no "internal
//!   error", no crash report; every key of type `redislock` in db 0 and 1
//!   has a `LOCK.INFO` (read in `MULTI` with its `PTTL`) where mode exclusive
//!   means exactly one holder, holders are unique, holds >= 1, 1 <= ttl-ms-left
//!   <= max ttl, the latest ttl is the key's PTTL, tokens >= 1 and unique
//!   across keys, no waiters left; the `INFO lock` gauges are non-negative,
//!   and after `FLUSHALL` the key and holder gauges are back to zero.
//!
//! Environment: `LIVE_FUZZ_COMMANDS` (default 1000000), `LIVE_FUZZ_SEED`
//! (replays the command choices, not the timing).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::errors::Unguardable;
use crate::common::*;

const BATCH: usize = 1000;
const HOT_KEYS: u64 = 16;
const FUZZ_CONNS: usize = 2;
const WAITERS: usize = 4;
/// Small, so that the waiters also meet the "too many waiters" error.
const MAX_WAITERS: i64 = 2;

// ---------------------------------------------------------------------------
// Randomness
// ---------------------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True with probability `num / den`.
    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    fn bytes(&mut self, max_len: u64) -> Vec<u8> {
        let n = self.below(max_len + 1);
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Random upper/lower case, so option and command names arrive in odd cases.
fn odd_case(rng: &mut Rng, s: &str) -> Vec<u8> {
    if rng.chance(2, 3) {
        return s.as_bytes().to_vec();
    }
    s.bytes()
        .map(|b| {
            if rng.chance(1, 2) {
                b.to_ascii_lowercase()
            } else {
                b.to_ascii_uppercase()
            }
        })
        .collect()
}

/// Integers as text, good and bad: the boundaries Redis's parser and the
/// module's ranges care about.
fn integer(rng: &mut Rng) -> Vec<u8> {
    const FIXED: &[&str] = &[
        "0",
        "1",
        "2",
        "5",
        "10",
        "100",
        "1000",
        "30000",
        "2592000000",
        "2592000001",
        "3153600000000",
        "1000000000000",
        "1000000000001",
        "9223372036854775807",
        "9223372036854775808",
        "-9223372036854775808",
        "-9223372036854775809",
        "18446744073709551615",
        "18446744073709551616",
        "99999999999999999999999999",
        "-1",
        "-0",
        "+1",
        "+0",
        "01",
        "00",
        " 1",
        "1 ",
        "1.5",
        "1e3",
        "0x10",
        "",
        "abc",
        "\0",
        "1\0",
        "٣",
    ];
    match rng.below(10) {
        0 => (rng.next() as i64).to_string().into_bytes(),
        1 => rng.next().to_string().into_bytes(),
        2 => (-(rng.below(1000) as i64)).to_string().into_bytes(),
        3..=5 => rng.pick(FIXED).as_bytes().to_vec(),
        _ => (1 + rng.below(200)).to_string().into_bytes(),
    }
}

/// A ttl: mostly short valid leases so that locks churn, and every bad form.
fn ttl(rng: &mut Rng) -> Vec<u8> {
    match rng.below(10) {
        0..=5 => (1 + rng.below(100)).to_string().into_bytes(),
        6 => (1 + rng.below(5000)).to_string().into_bytes(),
        7 if rng.chance(1, 20) => b"2592000000".to_vec(),
        _ => integer(rng),
    }
}

fn hot_key(rng: &mut Rng) -> Vec<u8> {
    format!("fz:{}", rng.below(HOT_KEYS)).into_bytes()
}

fn key(rng: &mut Rng) -> Vec<u8> {
    match rng.below(40) {
        0 => b"fz:str".to_vec(),
        1 => b"fz:list".to_vec(),
        2 => b"".to_vec(),
        3 => {
            let mut k = b"fz:bin:".to_vec();
            k.extend(rng.bytes(6));
            k
        }
        _ => hot_key(rng),
    }
}

fn owner(rng: &mut Rng) -> Vec<u8> {
    match rng.below(30) {
        0 => Vec::new(),
        1 => vec![0, 0xff, b'x', 0],
        2 => vec![b'L'; 600],
        3 => rng.bytes(12),
        _ => format!("o{}", rng.below(8)).into_bytes(),
    }
}

fn option(rng: &mut Rng) -> Vec<u8> {
    match rng.below(12) {
        0..=6 => odd_case(rng, "WAIT"),
        7 => b"NOWAIT".to_vec(),
        8 => b"WAITS".to_vec(),
        9 => b"".to_vec(),
        10 => b"W".to_vec(),
        _ => rng.bytes(5),
    }
}

// ---------------------------------------------------------------------------
// Commands and the replies they may get
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Grant,
    /// LOCK.MACQUIRE: an array of tokens, or nil.
    MultiGrant,
    Release,
    Renew,
    Info,
    Sync,
    Unknown,
    /// Any other command (its reply is only checked for internal errors).
    Other,
    Multi,
    Exec,
    /// LOCK.GUARD: an allowed error, or the called command's reply.
    Guard,
    /// The EXEC of a digest-checked guard block (`checked_guard`).
    GuardExec,
}

struct Cmd {
    kind: Kind,
    args: Vec<Vec<u8>>,
}

fn kind_of(name: &[u8]) -> Kind {
    let n = name.to_ascii_uppercase();
    match n.as_slice() {
        b"LOCK.ACQUIRE" | b"LOCK.RACQUIRE" | b"LOCK.READ" | b"LOCK.SEMAPHORE" => Kind::Grant,
        b"LOCK.MACQUIRE" => Kind::MultiGrant,
        b"LOCK.RELEASE" => Kind::Release,
        b"LOCK.RENEW" => Kind::Renew,
        b"LOCK.INFO" => Kind::Info,
        b"LOCK.SYNC" => Kind::Sync,
        b"LOCK.GUARD" => Kind::Guard,
        b"MULTI" => Kind::Multi,
        b"EXEC" => Kind::Exec,
        _ if n.starts_with(b"LOCK.") => Kind::Unknown,
        _ => Kind::Other,
    }
}

/// A grant with a `WAIT` option might block: on a pipelined connection it
/// must only be sent inside MULTI.
fn may_block(args: &[Vec<u8>]) -> bool {
    matches!(kind_of(&args[0]), Kind::Grant | Kind::MultiGrant)
        && args.iter().skip(1).any(|a| a.eq_ignore_ascii_case(b"WAIT"))
}

/// One random `LOCK.*` command (random arity, odd arguments).
fn lock_command(rng: &mut Rng, tokens: &Tokens) -> Vec<Vec<u8>> {
    if rng.chance(1, 40) {
        return guard_command(rng, tokens).0;
    }
    let name = match rng.below(100) {
        0..=14 => "LOCK.ACQUIRE",
        15..=25 => "LOCK.RACQUIRE",
        26..=39 => "LOCK.READ",
        40..=47 => "LOCK.SEMAPHORE",
        48..=53 => "LOCK.MACQUIRE",
        54..=71 => "LOCK.RELEASE",
        72..=81 => "LOCK.RENEW",
        82..=96 => "LOCK.INFO",
        97 => "LOCK.SYNC",
        98 => "LOCK.NOPE",
        _ => "LOCK.",
    };
    if name == "LOCK.SEMAPHORE" || name == "LOCK.MACQUIRE" {
        return new_kind_command(rng, name);
    }
    let mut args = vec![odd_case(rng, name)];
    let natural = match kind_of(name.as_bytes()) {
        Kind::Grant => {
            if rng.chance(1, 4) {
                6
            } else {
                4
            }
        }
        Kind::Release => 3,
        Kind::Renew => 4,
        Kind::Info => 2,
        _ => 1 + rng.below(8) as usize,
    };
    let len = if rng.chance(1, 12) {
        1 + rng.below(9) as usize
    } else {
        natural
    };
    for i in 1..len {
        let a = match (kind_of(name.as_bytes()), i) {
            (Kind::Sync, 2) => {
                let op = if rng.chance(1, 2) { "SET" } else { "DROP" };
                odd_case(rng, op)
            }
            (Kind::Sync, 4) => b"exclusive".to_vec(),
            (_, 1) => key(rng),
            (_, 2) => owner(rng),
            (_, 3) => ttl(rng),
            (Kind::Grant, n) if n % 2 == 0 => option(rng),
            (Kind::Grant, _) => integer(rng),
            _ => {
                if rng.chance(1, 2) {
                    integer(rng)
                } else {
                    rng.bytes(8)
                }
            }
        };
        args.push(a);
    }
    // `[TOKEN token]` on RELEASE and RENEW (v4): a token this connection
    // was granted for that key and owner (right while the grant lives), or
    // any integer; now and then followed by another option or a second TOKEN.
    let kind = kind_of(name.as_bytes());
    if matches!(kind, Kind::Release | Kind::Renew) && len == natural && rng.chance(1, 2) {
        let granted = tokens.get(&(args[1].clone(), args[2].clone())).copied();
        args.push(odd_case(rng, "TOKEN"));
        args.push(match granted {
            Some(t) if rng.chance(3, 4) => t.to_string().into_bytes(),
            _ => integer(rng),
        });
        if rng.chance(1, 20) {
            args.push(match rng.below(2) {
                0 => odd_case(rng, "TOKEN"),
                _ => option(rng),
            });
            args.push(integer(rng));
        }
    }
    args
}

/// A random `LOCK.SEMAPHORE key limit owner ttl [opts]` or `LOCK.MACQUIRE
/// numkeys key... owner ttl [opts]`: mostly well formed (small limits and
/// key counts over the hot keys, so they meet each other and the locks),
/// sometimes odd.
fn new_kind_command(rng: &mut Rng, name: &str) -> Vec<Vec<u8>> {
    let mut args = vec![odd_case(rng, name)];
    let small = |rng: &mut Rng| -> Vec<u8> {
        if rng.chance(1, 8) {
            integer(rng)
        } else {
            (1 + rng.below(3)).to_string().into_bytes()
        }
    };
    if name == "LOCK.SEMAPHORE" {
        args.push(key(rng));
        args.push(small(rng));
    } else {
        let n = small(rng);
        let count = std::str::from_utf8(&n)
            .ok()
            .and_then(|t| t.parse::<usize>().ok())
            .filter(|c| *c <= 4)
            .unwrap_or(1 + rng.below(3) as usize);
        args.push(n);
        for _ in 0..count {
            args.push(key(rng));
        }
    }
    args.push(owner(rng));
    args.push(ttl(rng));
    while rng.chance(1, 4) {
        args.push(option(rng));
        if rng.chance(1, 2) {
            args.push(integer(rng));
        }
    }
    if rng.chance(1, 12) {
        args.truncate(1 + rng.below(args.len() as u64) as usize);
    }
    args
}

/// A Lua script calling a random lock command; a `WAIT 0` inside must not block.
fn script(rng: &mut Rng, tokens: &Tokens) -> Vec<Vec<u8>> {
    let mut cmd = lock_command(rng, tokens);
    if kind_of(&cmd[0]) == Kind::Grant && cmd.len() == 4 {
        cmd.push(b"WAIT".to_vec());
        cmd.push(b"0".to_vec());
    }
    let n = cmd.len();
    let body = format!(
        "return redis.call({})",
        (1..=n)
            .map(|i| format!("ARGV[{i}]"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let mut args = vec![b"EVAL".to_vec(), body.into_bytes(), b"0".to_vec()];
    args.extend(cmd);
    args
}

/// Tokens this connection was granted, by `(key, owner)`: a guard's
/// `TOKEN` is sometimes one of them (right while the grant lives).
type Tokens = HashMap<(Vec<u8>, Vec<u8>), i64>;

/// Records the token of a granted `LOCK.ACQUIRE`, `RACQUIRE` or `READ`.
fn note_token(tokens: &mut Tokens, args: &[Vec<u8>], r: &Reply) {
    if let (Kind::Grant, Reply::Int(t), [name, key, owner, ..]) = (kind_of(&args[0]), r, args) {
        if *t > 0 && !name.eq_ignore_ascii_case(b"LOCK.SEMAPHORE") && key.starts_with(b"fz:") {
            if tokens.len() > 10_000 {
                tokens.clear();
            }
            tokens.insert((key.clone(), owner.clone()), *t);
        }
    }
}

/// Keys that guards write (strings and hashes, never locks: the guarded
/// lock commands only name hot keys), shared by both connections.
fn data_key(rng: &mut Rng) -> Vec<u8> {
    format!("fz:d:{}", rng.below(4)).into_bytes()
}

/// What a guard calls: plain data commands (checked against the same
/// command run directly), lock commands, what a guard refuses, odd forms.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Called {
    /// SET, INCR, DEL, HSET, GET, APPEND on a data key.
    Data,
    /// The same on the guard's own lock key.
    OnLock,
    Lock,
    Refused,
    Odd,
}

/// A plain data command on `key`.
fn data_command(rng: &mut Rng, key: Vec<u8>) -> Vec<Vec<u8>> {
    let s = |x: &str| x.as_bytes().to_vec();
    let name = rng_pick_name(rng);
    let name = odd_case(rng, name);
    let mut args = vec![name.clone(), key];
    match name.to_ascii_uppercase().as_slice() {
        b"SET" => args.push((rng.below(100)).to_string().into_bytes()),
        b"HSET" => {
            args.push(format!("f{}", rng.below(3)).into_bytes());
            args.push(s("v"));
        }
        b"APPEND" => args.push(s("x")),
        _ => {}
    }
    args
}

fn rng_pick_name(rng: &mut Rng) -> &'static str {
    const NAMES: &[&str] = &["SET", "SET", "INCR", "INCR", "DEL", "HSET", "GET", "APPEND"];
    NAMES[rng.below(NAMES.len() as u64) as usize]
}

/// `LOCK.GUARD key owner [TOKEN token] CALL command [arg ...]`: the lock
/// key is mostly a hot key, the owner one of the fuzz owners (so that it
/// sometimes holds), the token absent, one this connection was granted, or
/// any integer.
fn guard_command(rng: &mut Rng, tokens: &Tokens) -> (Vec<Vec<u8>>, Called) {
    let s = |x: &str| x.as_bytes().to_vec();
    let lock = if rng.chance(9, 10) {
        hot_key(rng)
    } else {
        key(rng)
    };
    let owner = if rng.chance(9, 10) {
        format!("o{}", rng.below(8)).into_bytes()
    } else {
        owner(rng)
    };
    let mut args = vec![odd_case(rng, "LOCK.GUARD"), lock.clone(), owner.clone()];
    match rng.below(10) {
        0..=3 => {}
        4..=7 => {
            args.push(odd_case(rng, "TOKEN"));
            let t = tokens.get(&(lock.clone(), owner.clone())).copied();
            args.push(match t {
                Some(t) if rng.chance(3, 4) => t.to_string().into_bytes(),
                _ => integer(rng),
            });
        }
        _ => args.push(option(rng)), // no CALL where it is due
    }
    args.push(odd_case(rng, "CALL"));
    let (called, what) = match rng.below(100) {
        0..=44 => {
            let d = data_key(rng);
            (data_command(rng, d), Called::Data)
        }
        45..=54 => (data_command(rng, lock.clone()), Called::OnLock),
        55..=69 => {
            let called = match rng.below(5) {
                0 => vec![s("LOCK.ACQUIRE"), hot_key(rng), owner.clone(), ttl(rng)],
                1 => vec![s("LOCK.RELEASE"), lock.clone(), owner.clone()],
                2 => vec![s("LOCK.RENEW"), lock.clone(), owner.clone(), ttl(rng)],
                3 => vec![s("LOCK.READ"), hot_key(rng), owner.clone(), ttl(rng)],
                _ => vec![s("LOCK.INFO"), hot_key(rng)],
            };
            (called, Called::Lock)
        }
        70..=94 => {
            let d = data_key(rng);
            let called: Vec<Vec<u8>> = match rng.below(10) {
                0 => vec![s("BLPOP"), d, s("0")],
                1 => vec![s("BRPOPLPUSH"), d.clone(), d, s("1")],
                2 => vec![s("XREAD"), s("BLOCK"), s("0"), s("STREAMS"), d, s("0")],
                3 => vec![s("MULTI")],
                4 => vec![s("EXEC")],
                5 => vec![s("WATCH"), d],
                6 => vec![s("EVAL"), s("return 1"), s("0")],
                7 => {
                    let mut c = vec![s("LOCK.ACQUIRE"), hot_key(rng), owner.clone(), ttl(rng)];
                    c.push(odd_case(rng, "WAIT"));
                    c.push(rng.pick(&["0", "5", "1000"]).as_bytes().to_vec());
                    c
                }
                8 => vec![
                    s("LOCK.MACQUIRE"),
                    s("1"),
                    hot_key(rng),
                    owner.clone(),
                    s("100"),
                    s("WAIT"),
                    s("0"),
                ],
                _ => vec![
                    s("LOCK.GUARD"),
                    lock.clone(),
                    owner.clone(),
                    s("CALL"),
                    s("SET"),
                    d,
                    s("nested"),
                ],
            };
            (called, Called::Refused)
        }
        _ => {
            let called = match rng.below(4) {
                0 => vec![s("NOSUCHCOMMAND"), data_key(rng)],
                1 => vec![s("SET"), data_key(rng)],
                2 => vec![Vec::new()],
                _ => vec![s("INCR"), s("fz:str")],
            };
            (called, Called::Odd)
        }
    };
    args.extend(called);
    (args, what)
}

/// A guard run alone in `MULTI` (no other client, timer or expiry runs
/// meanwhile), between two `DEBUG DIGEST`s: first a grant to the guard's
/// owner now and then (so that it often holds), `EXISTS` of the keys it
/// names (so that lazy expiry happens before the first digest, not inside
/// the guard), and for a data command a twin of its key (`COPY`), on which
/// the command then runs directly. `check_guard_exec` reads the 11 replies.
fn checked_guard(rng: &mut Rng, tokens: &Tokens) -> Vec<Cmd> {
    let s = |x: &str| x.as_bytes().to_vec();
    let (guard, what) = guard_command(rng, tokens);
    let call = guard
        .iter()
        .position(|a| a.eq_ignore_ascii_case(b"CALL"))
        .map_or(guard.len(), |i| i + 1);
    let called = guard[call.min(guard.len())..].to_vec();
    let lock = guard[1].clone();
    let twin = b"fz:twin".to_vec();
    let data = called.get(1).cloned().unwrap_or_else(|| b"fz:d:0".to_vec());
    let ping = || vec![s("PING")];
    let mut q: Vec<Vec<Vec<u8>>> = Vec::new();
    q.push(if rng.chance(1, 2) && guard.len() > 2 {
        let name = *rng.pick(&["LOCK.ACQUIRE", "LOCK.RACQUIRE", "LOCK.READ"]);
        vec![s(name), lock.clone(), guard[2].clone(), s("60000")]
    } else {
        ping()
    });
    // Every argument of the called command, as if it were a key.
    let named: Vec<Vec<u8>> = std::iter::once(lock.clone())
        .chain(called.iter().skip(1).cloned())
        .collect();
    let mut exists = vec![s("EXISTS")];
    exists.extend(named.iter().cloned());
    q.push(exists);
    let twinned = what == Called::Data && called.len() >= 2;
    q.push(vec![s("DEL"), twin.clone()]);
    q.push(if twinned {
        vec![s("COPY"), data.clone(), twin.clone()]
    } else {
        ping()
    });
    // The whole dataset's digest costs about 10 us a key (a debug build):
    // one block in 8; the others digest the keys the guard names.
    let digest = if rng.chance(1, 8) {
        vec![s("DEBUG"), s("DIGEST")]
    } else {
        let mut d = vec![s("DEBUG"), s("DIGEST-VALUE")];
        d.extend(named);
        d
    };
    q.push(digest.clone());
    q.push(guard);
    q.push(digest);
    if twinned {
        let mut direct = called.clone();
        direct[1] = twin.clone();
        q.push(direct);
        q.push(vec![
            s("DEBUG"),
            s("DIGEST-VALUE"),
            data.clone(),
            twin.clone(),
        ]);
    } else {
        q.push(ping());
        q.push(ping());
    }
    q.push(vec![
        s("TYPE"),
        if what == Called::OnLock { lock } else { data },
    ]);
    q.push(vec![s("DEL"), twin]);
    let mut cmds = vec![Cmd {
        kind: Kind::Multi,
        args: vec![s("MULTI")],
    }];
    cmds.extend(q.into_iter().map(|args| Cmd {
        kind: Kind::Other,
        args,
    }));
    cmds.push(Cmd {
        kind: Kind::GuardExec,
        args: vec![s("EXEC")],
    });
    cmds
}

/// The checks of a `checked_guard` block, on its queued commands and EXEC's
/// replies: a guard that answers an error (NOTHELD, `LOCK.GUARD cannot
/// run`, or the called command's own error unless it is a lock command's)
/// changed nothing (equal digests); a guard that ran a
/// data command answered what the command run directly answers and left
/// its key as the direct run left the twin; on its own lock key, SET
/// replaced the lock and DEL deleted it.
fn check_guard_exec(queued: &[&[Vec<u8>]], items: &[Reply], tally: &mut Tally) {
    if queued.len() != 11 || items.len() != 11 {
        return; // checked as any EXEC
    }
    for (args, item) in queued.iter().zip(items) {
        if kind_of(&args[0]) == Kind::Grant {
            check_reply(Kind::Grant, args, item, tally);
        }
    }
    let guard = queued[5];
    let reply = &items[5];
    check_reply(Kind::Guard, guard, reply, tally);
    let (d0, d1) = (&items[4], &items[6]);
    let refused = matches!(reply, Reply::Error(e) if e.starts_with("NOTHELD")
        || e.starts_with("ERR LOCK.GUARD cannot run"));
    tally.count(if refused {
        "guard refused (digest checked)"
    } else {
        "guard ran or failed (checked)"
    });
    let call = guard
        .iter()
        .position(|a| a.eq_ignore_ascii_case(b"CALL"))
        .unwrap_or(0);
    let name = guard.get(call + 1).map(|n| n.to_ascii_uppercase());
    // A lock command that fails may still drop holders whose leases ended
    // (as it does called directly): only the others' errors change nothing.
    let lock_command = name.as_ref().is_some_and(|n| n.starts_with(b"LOCK."));
    if reply.is_err() {
        if d0 != d1 && (refused || !lock_command) {
            tally.bad(format!(
                "{} -> {reply:?} changed the dataset: DEBUG DIGEST {d0:?} before, {d1:?} after",
                shown(guard)
            ));
        }
        return;
    }
    let direct = queued[7];
    if direct[0] != b"PING" {
        // The same data command, run directly on a twin of its key.
        if *reply != items[7] {
            tally.bad(format!(
                "{} -> {reply:?}, but {} -> {:?}",
                shown(guard),
                shown(direct),
                items[7]
            ));
        }
        match &items[8] {
            Reply::Array(v) if v.len() == 2 && v[0] == v[1] => {}
            other => tally.bad(format!(
                "{} left its key unlike {} left the twin: DEBUG DIGEST-VALUE {other:?}",
                shown(guard),
                shown(direct)
            )),
        }
        return;
    }
    let on_lock = guard.get(call + 2) == Some(&guard[1]);
    let after = items[9].text();
    match name.as_deref() {
        Some(b"SET") if on_lock && (*reply != Reply::Status("OK".into()) || after != "string") => {
            tally.bad(format!("{} -> {reply:?}, then TYPE {after}", shown(guard)))
        }
        Some(b"DEL") if on_lock && (*reply != Reply::Int(1) || after != "none") => {
            tally.bad(format!("{} -> {reply:?}, then TYPE {after}", shown(guard)))
        }
        _ => {}
    }
}

/// Writes that change or free locks without the module's commands.
fn other_command(rng: &mut Rng, waiter_ids: &Mutex<Vec<i64>>) -> Vec<Vec<u8>> {
    let s = |x: &str| x.as_bytes().to_vec();
    match rng.below(100) {
        0..=36 => vec![s("DEL"), hot_key(rng)],
        37..=39 => vec![s("SET"), hot_key(rng), s("x")],
        40..=49 => vec![s("PERSIST"), hot_key(rng)],
        50..=54 => vec![s("PEXPIRE"), hot_key(rng), s("1")],
        55..=64 => vec![s("RENAME"), hot_key(rng), hot_key(rng)],
        65..=69 => vec![s("UNLINK"), hot_key(rng)],
        70..=79 => vec![s("TYPE"), hot_key(rng)],
        80..=84 => vec![s("PTTL"), hot_key(rng)],
        85..=94 => {
            let id = {
                let ids = waiter_ids.lock().unwrap();
                if ids.is_empty() {
                    1
                } else {
                    *rng.pick(&ids)
                }
            };
            let how = if rng.chance(1, 2) { "TIMEOUT" } else { "ERROR" };
            vec![
                s("CLIENT"),
                s("UNBLOCK"),
                id.to_string().into_bytes(),
                s(how),
            ]
        }
        95 | 96 => vec![s("SWAPDB"), s("0"), s("1")],
        97 => vec![s("FLUSHDB")],
        _ => vec![s("DEBUG"), s("RELOAD")],
    }
}

/// Every error text the module documents (current configuration), and the
/// prefixes of Redis's own errors for these commands.
fn allowed_error(e: &str) -> bool {
    let module: Vec<String> = [
        LockError::WrongType,
        LockError::Arity,
        LockError::EmptyOwner,
        LockError::BadTtl(MAX_TTL),
        LockError::BadWait(MAX_WAIT_MS),
        LockError::Syntax,
        LockError::HeldShared,
        LockError::HeldExclusive,
        LockError::TooManyHolds,
        LockError::TooManyWaiters(MAX_WAITERS),
        LockError::InternalCommand,
        LockError::IsSemaphore,
        LockError::NotSemaphore,
        LockError::BadLimit(1_000_000),
        LockError::BadNumkeys(1000),
        LockError::RepeatedKey,
        LockError::Deadlock,
        LockError::BindInScript,
        LockError::NotHeld,
        LockError::BadToken,
        LockError::NotGuardable(Unguardable::Blocking),
        LockError::NotGuardable(Unguardable::NoScript),
        LockError::NotGuardable(Unguardable::Guard),
        LockError::NotGuardable(Unguardable::Wait),
    ]
    .iter()
    .map(|e| e.message())
    .collect();
    const REDIS: &[&str] = &[
        // The limit it names varies.
        "ERR this semaphore's limit is ",
        "ERR wrong number of arguments for",
        "ERR unknown command",
        "ERR unknown subcommand",
        "WRONGTYPE ",
        "EXECABORT ",
        "ERR no such key",
        "ERR No such key",
        "UNBLOCKED ",
        "ERR value is not an integer",
        "ERR syntax error",
        // Lua's own wording for these, inside EVAL.
        "ERR Unknown Redis command called from script",
        "ERR Wrong number of args calling Redis command from script",
        // Valkey's wording of the same.
        "ERR Unknown command called from script",
        "ERR Wrong number of args calling command from script",
    ];
    // Errors raised inside a script carry the script's location after them.
    module
        .iter()
        .any(|m| e == m || e.starts_with(&format!("{m} script:")))
        || REDIS.iter().any(|p| e.starts_with(p))
}

#[derive(Default)]
struct Tally {
    commands: u64,
    replies: BTreeMap<&'static str, u64>,
    errors: BTreeMap<String, u64>,
    unexpected: Vec<String>,
    infos_checked: u64,
}

impl Tally {
    fn count(&mut self, what: &'static str) {
        *self.replies.entry(what).or_default() += 1;
    }

    fn bad(&mut self, what: String) {
        if self.unexpected.len() < 50 {
            self.unexpected.push(what);
        }
    }

    fn merge(&mut self, other: Tally) {
        self.commands += other.commands;
        self.infos_checked += other.infos_checked;
        for (k, v) in other.replies {
            *self.replies.entry(k).or_default() += v;
        }
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
        self.unexpected.extend(other.unexpected);
    }
}

fn shown(args: &[Vec<u8>]) -> String {
    let parts: Vec<String> = args
        .iter()
        .map(|a| {
            let s = show(a);
            if s.len() > 40 {
                format!("{}...({} bytes)", &s[..40], a.len())
            } else {
                s
            }
        })
        .collect();
    format!("{parts:?}")
}

/// Checks one `LOCK.INFO` reply (either protocol) against the invariants.
fn check_info(r: &Reply) -> Result<Option<LockInfo>, String> {
    let info = std::panic::catch_unwind(|| LockInfo::parse(r))
        .map_err(|_| format!("LOCK.INFO reply of the wrong shape: {r:?}"))?;
    let Some(info) = info else {
        return Ok(None);
    };
    let n = info.holders.len();
    match info.mode.as_str() {
        "exclusive" if n != 1 => return Err(format!("exclusive with {n} holders: {info:?}")),
        "shared" if n == 0 => return Err(format!("shared with no holder: {info:?}")),
        "semaphore" => {
            let limit = info.limit.unwrap_or(0);
            if n == 0 || n as i64 > limit || info.holders.iter().any(|h| h.holds != 1) {
                return Err(format!("semaphore past its limit or with holds: {info:?}"));
            }
        }
        _ => {}
    }
    let owners: HashSet<&[u8]> = info.holders.iter().map(|h| h.owner.as_slice()).collect();
    if owners.len() != n {
        return Err(format!("duplicate holder: {info:?}"));
    }
    for h in &info.holders {
        if h.owner.is_empty() || h.holds < 1 || h.token < 1 || h.ttl < 1 || h.ttl > MAX_TTL {
            return Err(format!("bad holder {h:?} in {info:?}"));
        }
    }
    if info.waiters < 0 {
        return Err(format!("negative waiters: {info:?}"));
    }
    Ok(Some(info))
}

/// Checks one reply to one command.
fn check_reply(kind: Kind, args: &[Vec<u8>], r: &Reply, tally: &mut Tally) {
    if let Reply::Error(e) = r {
        tally.count("error");
        let short: String = e.chars().take(60).collect();
        *tally.errors.entry(short).or_default() += 1;
        if e.contains("internal error") || !allowed_error(e) {
            tally.bad(format!("{} -> {r:?}", shown(args)));
        }
        return;
    }
    let ok = match (kind, r) {
        (Kind::Grant, Reply::Int(t)) => {
            tally.count("token");
            *t > 0
        }
        (Kind::MultiGrant, Reply::Array(tokens)) => {
            tally.count("tokens");
            !tokens.is_empty() && tokens.iter().all(|t| matches!(t, Reply::Int(n) if *n > 0))
        }
        (Kind::Grant | Kind::MultiGrant | Kind::Release, Reply::Nil) => {
            tally.count("nil");
            true
        }
        (Kind::Release | Kind::Renew, Reply::Int(n)) => {
            tally.count("0/1");
            *n == 0 || *n == 1
        }
        (Kind::Info, r) => match check_info(r) {
            Ok(_) => {
                tally.count("info");
                tally.infos_checked += 1;
                true
            }
            Err(e) => {
                tally.bad(format!("{} -> {e}", shown(args)));
                return;
            }
        },
        (Kind::Guard, r) => {
            // The called command's reply.
            let call = args
                .iter()
                .position(|a| a.eq_ignore_ascii_case(b"CALL"))
                .map_or(args.len(), |i| i + 1);
            let called = &args[call.min(args.len())..];
            let Some(name) = called.first() else {
                tally.bad(format!("{} -> ran nothing, yet {r:?}", shown(args)));
                return;
            };
            match kind_of(name) {
                Kind::Other => {
                    tally.count("guarded");
                    match (name.to_ascii_uppercase().as_slice(), r) {
                        (b"SET", Reply::Status(ok)) => ok == "OK",
                        (b"INCR" | b"DEL" | b"HSET" | b"APPEND", Reply::Int(_)) => true,
                        (b"GET", Reply::Bulk(_) | Reply::Nil) => true,
                        _ => false,
                    }
                }
                Kind::Guard | Kind::Multi | Kind::Exec => false,
                kind => return check_reply(kind, called, r, tally),
            }
        }
        (Kind::Sync | Kind::Unknown, _) => false,
        (Kind::Other | Kind::Multi | Kind::Exec | Kind::GuardExec, _) => {
            tally.count("other");
            true
        }
        _ => false,
    };
    if !ok {
        tally.bad(format!("{} -> unexpected reply {r:?}", shown(args)));
    }
}

// ---------------------------------------------------------------------------
// The pipelined fuzz connections
// ---------------------------------------------------------------------------

/// One batch of about `BATCH` commands: the commands and how to check each
/// reply. Inside MULTI the replies are `+QUEUED` (or an error), and EXEC's
/// array holds the queued commands' replies.
fn batch(rng: &mut Rng, waiter_ids: &Mutex<Vec<i64>>, rare_ok: bool, tokens: &Tokens) -> Vec<Cmd> {
    let mut cmds = Vec::with_capacity(BATCH + 16);
    while cmds.len() < BATCH {
        let roll = rng.below(1000);
        if roll < 5 {
            // MULTI ... EXEC (or DISCARD): WAIT inside is an immediate try.
            cmds.push(Cmd {
                kind: Kind::Multi,
                args: vec![b"MULTI".to_vec()],
            });
            for _ in 0..1 + rng.below(8) {
                let mut args = lock_command(rng, tokens);
                if kind_of(&args[0]) == Kind::Grant && rng.chance(1, 2) && args.len() == 4 {
                    args.push(b"WAIT".to_vec());
                    args.push(if rng.chance(1, 2) {
                        b"0".to_vec()
                    } else {
                        b"5".to_vec()
                    });
                }
                cmds.push(Cmd {
                    kind: Kind::Other, // +QUEUED or an error
                    args,
                });
            }
            let end = if rng.chance(1, 10) { "DISCARD" } else { "EXEC" };
            cmds.push(Cmd {
                kind: Kind::Exec,
                args: vec![end.as_bytes().to_vec()],
            });
        } else if roll < 8 {
            cmds.push(Cmd {
                kind: Kind::Other,
                args: script(rng, tokens),
            });
        } else if roll < 20 {
            let mut args = other_command(rng, waiter_ids);
            let heavy = args[0] == b"SWAPDB" || args[0] == b"FLUSHDB" || args[0] == b"DEBUG";
            if heavy && !(rare_ok && rng.chance(1, 50)) {
                args = vec![b"DEL".to_vec(), hot_key(rng)];
            }
            cmds.push(Cmd {
                kind: Kind::Other,
                args,
            });
        } else if roll < 24 {
            // A guard alone in MULTI between two DEBUG DIGESTs.
            cmds.extend(checked_guard(rng, tokens));
        } else {
            let mut args = lock_command(rng, tokens);
            if may_block(&args) {
                // Could block: send it inside MULTI, where it is a try.
                cmds.push(Cmd {
                    kind: Kind::Multi,
                    args: vec![b"MULTI".to_vec()],
                });
                cmds.push(Cmd {
                    kind: Kind::Other,
                    args: std::mem::take(&mut args),
                });
                cmds.push(Cmd {
                    kind: Kind::Exec,
                    args: vec![b"EXEC".to_vec()],
                });
            } else {
                let kind = kind_of(&args[0]);
                cmds.push(Cmd { kind, args });
            }
        }
    }
    cmds
}

/// Sends one batch and checks every reply. EXEC's array is checked element by
/// element against the commands queued since MULTI.
fn run_batch(
    c: &mut Conn,
    cmds: &[Cmd],
    tally: &mut Tally,
    tokens: &mut Tokens,
) -> std::io::Result<()> {
    for cmd in cmds {
        c.send(&cmd.args)?;
    }
    let mut queued: Vec<usize> = Vec::new();
    let mut in_multi = false;
    for (i, cmd) in cmds.iter().enumerate() {
        let r = c.read_reply()?;
        tally.commands += 1;
        match cmd.args[0].as_slice() {
            b"SWAPDB" => tally.count("SWAPDB"),
            b"FLUSHDB" => tally.count("FLUSHDB"),
            b"DEBUG" if cmd.args[1].eq_ignore_ascii_case(b"RELOAD") => tally.count("DEBUG RELOAD"),
            b"EVAL" => tally.count("EVAL"),
            b"MULTI" => tally.count("MULTI"),
            b"CLIENT" => tally.count("CLIENT UNBLOCK"),
            _ => {}
        }
        match cmd.kind {
            Kind::Multi => {
                in_multi = true;
                queued.clear();
                check_reply(Kind::Other, &cmd.args, &r, tally);
            }
            Kind::GuardExec => {
                in_multi = false;
                match &r {
                    Reply::Array(items) => {
                        let q: Vec<&[Vec<u8>]> =
                            queued.iter().map(|&at| cmds[at].args.as_slice()).collect();
                        for (args, item) in q.iter().zip(items) {
                            note_token(tokens, args, item);
                        }
                        check_guard_exec(&q, items, tally);
                    }
                    other => check_reply(Kind::Other, &cmd.args, other, tally),
                }
            }
            Kind::Exec => {
                in_multi = false;
                match &r {
                    Reply::Array(items) => {
                        if items.len() != queued.len() {
                            tally.bad(format!(
                                "EXEC answered {} replies for {} queued",
                                items.len(),
                                queued.len()
                            ));
                        }
                        for (&at, item) in queued.iter().zip(items) {
                            let args = &cmds[at].args;
                            note_token(tokens, args, item);
                            check_reply(kind_of(&args[0]), args, item, tally);
                        }
                    }
                    other => check_reply(Kind::Other, &cmd.args, other, tally),
                }
            }
            _ if in_multi => {
                if r == Reply::Status("QUEUED".into()) {
                    queued.push(i);
                } else {
                    check_reply(kind_of(&cmd.args[0]), &cmd.args, &r, tally);
                }
            }
            kind => {
                note_token(tokens, &cmd.args, &r);
                check_reply(kind, &cmd.args, &r, tally)
            }
        }
    }
    Ok(())
}

fn fuzz_connection(
    port: u16,
    resp3: bool,
    seed: u64,
    quota: u64,
    waiter_ids: Arc<Mutex<Vec<i64>>>,
    rare_ok: bool,
) -> Tally {
    let mut c = Conn::connect(port);
    if resp3 {
        c.hello3();
    }
    // Lua errors and DEBUG RELOAD can take a while under valgrind.
    c.set_timeout(Duration::from_secs(60));
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    let mut tokens = Tokens::new();
    while tally.commands < quota {
        let cmds = batch(&mut rng, &waiter_ids, rare_ok, &tokens);
        if let Err(e) = run_batch(&mut c, &cmds, &mut tally, &mut tokens) {
            panic!(
                "fuzz connection (resp3={resp3}): {e} after {} commands; the batch began with {}",
                tally.commands,
                shown(&cmds[0].args)
            );
        }
    }
    tally
}

// ---------------------------------------------------------------------------
// Waiters
// ---------------------------------------------------------------------------

#[derive(Default)]
struct WaiterTally {
    requests: u64,
    granted: u64,
    nil: u64,
    errors: u64,
    disconnects: u64,
    wait0: u64,
    unexpected: Vec<String>,
}

fn connect_waiter(port: u16, ids: &Mutex<Vec<i64>>) -> (Conn, i64) {
    let mut c = Conn::connect(port);
    c.set_timeout(Duration::from_secs(30));
    let id = c.cmd(&["CLIENT", "ID"]).int();
    ids.lock().unwrap().push(id);
    (c, id)
}

fn forget_id(ids: &Mutex<Vec<i64>>, id: i64) {
    ids.lock().unwrap().retain(|&x| x != id);
}

fn waiter(
    port: u16,
    t: usize,
    seed: u64,
    stop: Arc<AtomicBool>,
    ids: Arc<Mutex<Vec<i64>>>,
) -> WaiterTally {
    let mut rng = Rng::new(seed);
    let mut tally = WaiterTally::default();
    let (mut c, mut id) = connect_waiter(port, &ids);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let roll = rng.below(100);
        if roll < 3 {
            // WAIT 0 on a private key whose 20 ms lease is sure to end.
            let key = format!("fz:private:{t}");
            let mut holder = Conn::connect(port);
            let got = holder.cmd(&["LOCK.ACQUIRE", &key, "keeper", "20"]);
            let r = c.cmd(&["LOCK.ACQUIRE", &key, &format!("w{t}"), "50", "WAIT", "0"]);
            tally.wait0 += 1;
            let _ = got;
            // A token; nil or an UNBLOCKED error only if CLIENT UNBLOCK reached it.
            match &r {
                Reply::Int(x) if *x > 0 => {}
                Reply::Nil => {}
                Reply::Error(e) if allowed_error(e) && !e.contains("internal error") => {}
                other => tally.unexpected.push(format!("WAIT 0 on {key}: {other:?}")),
            }
            let _ = c.cmd(&["LOCK.RELEASE", &key, &format!("w{t}")]);
            continue;
        }
        let name = *rng.pick(&[
            "LOCK.ACQUIRE",
            "LOCK.RACQUIRE",
            "LOCK.READ",
            "lock.read",
            "Lock.Acquire",
            "LOCK.SEMAPHORE",
            "LOCK.MACQUIRE",
        ]);
        let key = format!("fz:{}", rng.below(HOT_KEYS / 2));
        let other = format!("fz:{}", rng.below(HOT_KEYS / 2));
        let owner = format!("w{t}-{}", rng.below(4));
        let ttl = (1 + rng.below(30)).to_string();
        let opt = odd_case(&mut rng, "WAIT");
        let wait: Vec<u8> = match rng.below(20) {
            0 => b"-1".to_vec(),
            1 => b"abc".to_vec(),
            2 => b"1000000000001".to_vec(),
            3 => b"+3".to_vec(),
            _ => (1 + rng.below(5)).to_string().into_bytes(),
        };
        let mut args: Vec<Vec<u8>> = vec![name.as_bytes().to_vec()];
        match name {
            // Limit 2 mostly: full semaphores, and another limit now and then.
            "LOCK.SEMAPHORE" => {
                args.push(key.clone().into_bytes());
                args.push((2 + u64::from(rng.chance(1, 10))).to_string().into_bytes());
            }
            // Two keys, or one twice (an error); the release below is of
            // the first, the other is left to its lease.
            "LOCK.MACQUIRE" => {
                args.push(b"2".to_vec());
                args.push(key.clone().into_bytes());
                args.push(other.into_bytes());
            }
            _ => args.push(key.clone().into_bytes()),
        }
        args.extend([owner.clone().into_bytes(), ttl.into_bytes(), opt, wait]);
        tally.requests += 1;
        if roll < 8 {
            // Disconnect while (probably) waiting.
            let _ = c.send(&args);
            if rng.chance(1, 2) {
                thread::sleep(Duration::from_millis(1));
            }
            forget_id(&ids, id);
            (c, id) = connect_waiter(port, &ids);
            tally.disconnects += 1;
            continue;
        }
        let r = match c.try_cmd(&args) {
            Ok(r) => r,
            Err(e) => {
                // CLIENT KILL is not sent; any I/O error is a failure.
                panic!("waiter {t}: {e} on {}", shown(&args));
            }
        };
        let granted = match &r {
            Reply::Int(x) => *x > 0,
            Reply::Array(t) => {
                !t.is_empty() && t.iter().all(|t| matches!(t, Reply::Int(x) if *x > 0))
            }
            _ => false,
        };
        // Half the releases and renewals name the grant's token (v4).
        let token = match (&r, rng.chance(1, 2)) {
            (Reply::Int(t), true) => vec!["TOKEN".to_string(), t.to_string()],
            _ => Vec::new(),
        };
        let with_token = |args: &[&str]| -> Vec<String> {
            let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            args.extend(token.iter().cloned());
            args
        };
        match &r {
            _ if granted => {
                tally.granted += 1;
                match rng.below(4) {
                    0 | 1 => {
                        let r = c.cmd(&with_token(&["LOCK.RELEASE", &key, &owner]));
                        let fine = match &r {
                            Reply::Int(0 | 1) | Reply::Nil => true,
                            Reply::Error(e) => allowed_error(e),
                            _ => false,
                        };
                        if !fine {
                            tally.unexpected.push(format!("RELEASE: {r:?}"));
                        }
                    }
                    2 => {
                        let r = c.cmd(&with_token(&["LOCK.RENEW", &key, &owner, "20"]));
                        let fine = match &r {
                            Reply::Int(0 | 1) => true,
                            Reply::Error(e) => allowed_error(e),
                            _ => false,
                        };
                        if !fine {
                            tally.unexpected.push(format!("RENEW: {r:?}"));
                        }
                    }
                    _ => {} // left to expire
                }
            }
            Reply::Nil => tally.nil += 1,
            Reply::Error(e) => {
                tally.errors += 1;
                if e.contains("internal error") || !allowed_error(e) {
                    tally.unexpected.push(format!("{} -> {r:?}", shown(&args)));
                }
            }
            other => tally
                .unexpected
                .push(format!("{} -> {other:?}", shown(&args))),
        }
        if n.is_multiple_of(512) {
            thread::yield_now();
        }
    }
    forget_id(&ids, id);
    tally
}

// ---------------------------------------------------------------------------
// The final checks
// ---------------------------------------------------------------------------

fn scan_locks(c: &mut Conn) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    let mut cursor = b"0".to_vec();
    loop {
        let r = c.cmd(&[
            b"SCAN".as_slice(),
            &cursor,
            b"COUNT",
            b"1000",
            b"TYPE",
            TYPE_NAME.as_bytes(),
        ]);
        let parts = r.array();
        cursor = parts[0].bulk().to_vec();
        keys.extend(parts[1].array().iter().map(|k| k.bulk().to_vec()));
        if cursor == b"0" {
            return keys;
        }
    }
}

fn info_lock(c: &mut Conn) -> BTreeMap<String, i64> {
    c.info("lock")
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn live_fuzz_random_commands() {
    let total = env_u64("LIVE_FUZZ_COMMANDS").unwrap_or(1_000_000);
    let seed = env_u64("LIVE_FUZZ_SEED").unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(7, |d| d.as_nanos() as u64)
    });
    eprintln!("live fuzz: {total} commands, seed {seed} (LIVE_FUZZ_SEED={seed})");
    let mut server = Server::builder()
        .config(&format!("lock.max-waiters {MAX_WAITERS}"))
        .config("databases 2")
        .start();
    let port = server.port;
    {
        let mut c = server.conn();
        c.cmd(&["SET", "fz:str", "v"]).ok();
        c.cmd(&["RPUSH", "fz:list", "a"]);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let ids = Arc::new(Mutex::new(Vec::new()));
    let waiters: Vec<_> = (0..WAITERS)
        .map(|t| {
            let (stop, ids) = (stop.clone(), ids.clone());
            let s = seed ^ (0x9e37_79b9_7f4a_7c15u64.wrapping_mul(t as u64 + 101));
            thread::spawn(move || waiter(port, t, s, stop, ids))
        })
        .collect();

    let started = Instant::now();
    let fuzzers: Vec<_> = (0..FUZZ_CONNS)
        .map(|i| {
            let ids = ids.clone();
            let quota = total.div_ceil(FUZZ_CONNS as u64);
            let s = seed.wrapping_add(i as u64 * 7919);
            // Heavy commands (SWAPDB, FLUSHDB, DEBUG RELOAD) from one connection only.
            thread::spawn(move || fuzz_connection(port, i == 1, s, quota, ids, i == 0))
        })
        .collect();
    let mut tally = Tally::default();
    for f in fuzzers {
        tally.merge(f.join().expect("a fuzz connection failed"));
    }
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut wt = WaiterTally::default();
    for w in waiters {
        let t = w.join().expect("a waiter thread failed");
        wt.requests += t.requests;
        wt.granted += t.granted;
        wt.nil += t.nil;
        wt.errors += t.errors;
        wt.disconnects += t.disconnects;
        wt.wait0 += t.wait0;
        wt.unexpected.extend(t.unexpected);
    }

    eprintln!(
        "live fuzz: {} commands in {:.1} s ({:.0}/s) on {FUZZ_CONNS} pipelined connections",
        tally.commands,
        elapsed.as_secs_f64(),
        tally.commands as f64 / elapsed.as_secs_f64()
    );
    eprintln!(
        "  counts (replies by kind, some commands by name): {:?}; LOCK.INFO checked: {}",
        tally.replies, tally.infos_checked
    );
    let mut errors: Vec<_> = tally.errors.iter().collect();
    errors.sort_by(|a, b| b.1.cmp(a.1));
    for (e, n) in errors.iter().take(25) {
        eprintln!("  {n:>8} x {e}");
    }
    eprintln!(
        "  waiters: {} requests, {} granted, {} nil, {} errors, {} disconnects while waiting, {} WAIT 0",
        wt.requests, wt.granted, wt.nil, wt.errors, wt.disconnects, wt.wait0
    );

    // The server answers, and is the same process.
    let mut c = server.conn();
    c.ping();
    assert!(server.is_running(), "redis-server died");

    // Every lock satisfies the invariants; the key's PTTL is its latest lease.
    let mut all_tokens: HashSet<i64> = HashSet::new();
    let mut keys_checked = 0;
    let mut persisted = 0;
    let mut bad: Vec<String> = Vec::new();
    // Let the disconnected waiters' cleanup run.
    wait_until(Duration::from_secs(10), "no waiter left", || {
        info_lock(&mut c).get("lock_waiters") == Some(&0)
    });
    for db in ["0", "1"] {
        c.cmd(&["SELECT", db]).ok();
        for key in scan_locks(&mut c) {
            c.cmd(&["MULTI"]).ok();
            c.cmd(&[b"LOCK.INFO".as_slice(), &key]);
            c.cmd(&[b"PTTL".as_slice(), &key]);
            let r = c.cmd(&["EXEC"]);
            let items = r.array();
            let pttl = items[1].int();
            match check_info(&items[0]) {
                Err(e) => bad.push(format!("db {db} key {}: {e}", show(&key))),
                Ok(None) => {
                    if pttl > 0 {
                        bad.push(format!("db {db} key {}: free but PTTL {pttl}", show(&key)));
                    }
                }
                Ok(Some(info)) => {
                    keys_checked += 1;
                    let latest = info.holders.iter().map(|h| h.ttl).max().unwrap_or(0);
                    // PERSIST (sent by the fuzz) may have removed the key's
                    // expiry: allowed, it never extends a lease.
                    if pttl == -1 {
                        persisted += 1;
                    } else if (latest - pttl).abs() > 5 {
                        bad.push(format!(
                            "db {db} key {}: latest lease {latest} ms but PTTL {pttl}: {info:?}",
                            show(&key)
                        ));
                    }
                    if info.waiters != 0 {
                        bad.push(format!(
                            "db {db} key {}: waiters left: {info:?}",
                            show(&key)
                        ));
                    }
                    for h in &info.holders {
                        if !all_tokens.insert(h.token) {
                            bad.push(format!("token {} held twice (key {})", h.token, show(&key)));
                        }
                    }
                }
            }
        }
    }
    c.cmd(&["SELECT", "0"]).ok();
    eprintln!(
        "  final state: {keys_checked} held locks checked in db 0 and 1 ({persisted} PERSISTed)"
    );

    // INFO lock: gauges never negative; after FLUSHALL no key, no holder.
    let gauges = [
        "lock_keys",
        "lock_holders_exclusive",
        "lock_holders_shared",
        "lock_waiters",
        "lock_timer_keys",
    ];
    let info = info_lock(&mut c);
    eprintln!("  INFO lock: {info:?}");
    for (k, v) in &info {
        if *v < 0 {
            bad.push(format!("INFO lock {k} is negative: {v}"));
        }
    }
    for g in gauges {
        if !info.contains_key(g) {
            bad.push(format!("INFO lock has no {g}"));
        }
    }
    c.cmd(&["FLUSHALL", "SYNC"]).ok();
    let after = info_lock(&mut c);
    for g in [
        "lock_keys",
        "lock_holders_exclusive",
        "lock_holders_shared",
        "lock_waiters",
    ] {
        if after.get(g) != Some(&0) {
            bad.push(format!("after FLUSHALL, {g} is {:?}", after.get(g)));
        }
    }

    // The log: no panic, no internal error, no crash report.
    let log = std::fs::read_to_string(server.log_path()).unwrap_or_default();
    for line in log.lines() {
        let l = line.to_ascii_lowercase();
        if l.contains("panic")
            || l.contains("internal error")
            || l.contains("crashed by signal")
            || l.contains("assertion")
            || l.contains("guru meditation")
        {
            bad.push(format!("log: {line}"));
        }
    }
    c.ping();

    for u in tally.unexpected.iter().chain(&wt.unexpected) {
        eprintln!("UNEXPECTED: {u}");
    }
    for b in &bad {
        eprintln!("BAD: {b}");
    }
    assert!(
        tally.unexpected.is_empty() && wt.unexpected.is_empty() && bad.is_empty(),
        "live fuzz found problems (seed {seed}): {} unexpected replies, {} bad states",
        tally.unexpected.len() + wt.unexpected.len(),
        bad.len()
    );
    assert!(
        tally.commands >= total,
        "sent {} commands, wanted {total}",
        tally.commands
    );
    // A clean exit (valgrind then writes its leak summary).
    server.shutdown_nosave();
}

// ---------------------------------------------------------------------------
// Regressions for what the fuzz and the soak found
// ---------------------------------------------------------------------------

/// Found by the live fuzz: when `CLIENT UNBLOCK <id> TIMEOUT` reached a
/// waiter that a RELEASE had just granted (both in one read of the server,
/// before Redis handled the module's unblock), Redis dropped the grant's reply
/// and the client never got any. Each waiter gets exactly one reply, and it is
/// the truth.
#[test]
fn client_unblock_racing_a_grant_leaves_no_waiter_without_a_reply() {
    use std::io::{Read, Write};
    let server = Server::start();
    let mut holder = server.conn();
    let mut w = server.conn();
    w.set_timeout(Duration::from_secs(5));
    let wid = w.cmd(&["CLIENT", "ID"]).int().to_string();
    let mut raw = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let enc = |args: &[&str]| {
        let mut b = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            b.extend(format!("${}\r\n{a}\r\n", a.len()).bytes());
        }
        b
    };
    for how in ["TIMEOUT", "ERROR"] {
        for round in 0..10 {
            let key = format!("race:{how}:{round}");
            assert!(holder.acquire(&key, "A", 100_000).int() > 0);
            w.send(&["LOCK.ACQUIRE", &key, "W", "100000", "WAIT", "10000"])
                .unwrap();
            wait_until(Duration::from_secs(5), "the waiter blocked", || {
                holder.info_field("clients", "blocked_clients") == "1"
            });
            // One write: the release grants W, the unblock follows at once.
            let mut both = enc(&["LOCK.RELEASE", &key, "A"]);
            both.extend(enc(&["CLIENT", "UNBLOCK", &wid, how]));
            raw.write_all(&both).unwrap();
            let mut got = Vec::new();
            while got.iter().filter(|&&b| b == b'\n').count() < 2 {
                let mut buf = [0u8; 64];
                let n = raw.read(&mut buf).unwrap();
                assert!(n > 0, "connection closed");
                got.extend_from_slice(&buf[..n]);
            }
            let reply = w
                .read_reply()
                .unwrap_or_else(|e| panic!("{how} round {round}: the waiter got no reply: {e}"));
            let info = holder.lock_info(&key);
            match reply {
                Reply::Int(t) => assert_eq!(
                    info.map(|i| i.holder("W").token),
                    Some(t),
                    "{how} round {round}: told {t}, but LOCK.INFO disagrees"
                ),
                Reply::Nil | Reply::Error(_) => assert!(
                    info.is_none_or(|i| i.holders.iter().all(|h| h.owner != b"W")),
                    "{how} round {round}: told {reply:?}, yet W holds the lock"
                ),
                other => panic!("{how} round {round}: {other:?}"),
            }
            holder.release(&key, "W");
        }
    }
}

/// Found by the soak: a waiter that disconnected left its blocked-client
/// handle (and two temporary clients, about 35 KB) behind, because the
/// module never called `RM_UnblockClient` for it.
#[test]
fn waiters_that_disconnect_leave_no_memory_behind() {
    let server = Server::start();
    let mut c = server.conn();
    assert!(c.acquire("leak", "holder", 600_000).int() > 0);
    let round = |c: &mut Conn, n: usize| {
        for i in 0..n {
            let mut w = server.conn();
            w.send(&[
                "LOCK.ACQUIRE",
                "leak",
                &format!("w{i}"),
                "1000",
                "WAIT",
                "600000",
            ])
            .unwrap();
            wait_until(Duration::from_secs(5), "the waiter blocked", || {
                c.info_field("clients", "blocked_clients") == "1"
            });
        }
        wait_until(Duration::from_secs(10), "every waiter gone", || {
            c.info_field("clients", "blocked_clients") == "0"
                && c.info_field("lock", "lock_waiters") == "0"
        });
    };
    round(&mut c, 50); // pools and maps reach their size
    let before: i64 = c.info_field("memory", "used_memory").parse().unwrap();
    round(&mut c, 300);
    let after: i64 = c.info_field("memory", "used_memory").parse().unwrap();
    assert!(
        after - before < 300 * 1000,
        "300 disconnected waiters grew used_memory by {} bytes ({} per waiter)",
        after - before,
        (after - before) / 300
    );
}
