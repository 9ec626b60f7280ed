//! Section 1: throughput, uncontended, unique keys. Every command is driven
//! by the same client (one thread, `conns` connections, `pipeline` commands
//! in flight on each, like `redis-benchmark -c 50 -P 16`), for a fixed number
//! of requests, and every reply is checked. Rounds are interleaved: each
//! round runs every command once, a command right next to the one it is
//! compared with, the order of each pair alternating from round to round
//! (A B, B A, A B ...); the table shows medians over the rounds, and each
//! ratio is the median of the ratios within a round. Every command that
//! creates keys starts on an empty database of its own (SELECT 0..8), so
//! none pays for another's keys; renewals and releases run on the keys
//! their acquire created. `FLOOR.SET` is the module API's floor, the C
//! reference module's (benches/cmodule/lockfloor.c): a module value of one
//! block with a lease, nothing else, run on that module's server and
//! compared with `SET NX PX` as LOCK.ACQUIRE is.

use std::collections::HashMap;
use std::io;
use std::time::Instant;

use crate::common::{encode, Arg, Conn, Reply};
use crate::stats;

/// The lock owner (or `SET` value): a UUID, as lock libraries use.
pub const OWNER: &[u8] = b"8c1f6a52-3d47-4b8e-9f10-5a7e2c9d0b31";
/// Redisson's hash field: `<client uuid>:<thread id>`.
pub const REDISSON_FIELD: &[u8] = b"8c1f6a52-3d47-4b8e-9f10-5a7e2c9d0b31:1";
/// An hour: nothing a bench creates expires while it runs, on any machine.
pub const TTL: &[u8] = b"3600000";
pub const KEY_PREFIX: &[u8] = b"lk:";

/// The acquire script of Lua-based lock libraries: `SET ... NX PX` in a script.
pub const LUA_ACQUIRE: &str = "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])";
/// Redisson's `RedissonLock.tryLockInnerAsync`: a reentrant lock in a hash
/// (field `<uuid>:<thread>` = hold count). ARGV[1] = lease ms, ARGV[2] = field.
pub const LUA_REDISSON_LOCK: &str = "\
if ((redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then \
redis.call('hincrby', KEYS[1], ARGV[2], 1); \
redis.call('pexpire', KEYS[1], ARGV[1]); \
return nil; \
end; \
return redis.call('pttl', KEYS[1]);";
/// Redisson's `RedissonSemaphore.tryAcquireAsync`: take ARGV[1] permits from
/// a counter set beforehand (`trySetPermits`); no owner, no lease.
pub const LUA_REDISSON_SEMAPHORE: &str = "\
local value = redis.call('get', KEYS[1]); \
if (value ~= false and tonumber(value) >= tonumber(ARGV[1])) then \
local val = redis.call('decrby', KEYS[1], ARGV[1]); \
return 1; \
end; \
return 0;";
/// The permits every semaphore of the bench has (`LOCK.SEMAPHORE`'s limit,
/// Redisson's counter set beforehand).
pub const PERMITS: &[u8] = b"10";
/// The canonical compare-and-delete release (Redlock, redis-py, ...).
pub const LUA_RELEASE: &str = "\
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
/// The canonical compare-and-pexpire renewal.
pub const LUA_RENEW: &str = "\
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";

/// The SHA1s of the scripts, loaded with SCRIPT LOAD.
pub struct Scripts {
    pub acquire: Vec<u8>,
    pub redisson: Vec<u8>,
    pub semaphore: Vec<u8>,
    pub release: Vec<u8>,
    pub renew: Vec<u8>,
}

impl Scripts {
    pub fn load(c: &mut Conn) -> io::Result<Scripts> {
        let mut load = |s: &str| -> io::Result<Vec<u8>> {
            match c.ok(&[b"SCRIPT", b"LOAD", s.as_bytes()])? {
                Reply::Bulk(sha) => Ok(sha),
                r => Err(io::Error::other(format!("SCRIPT LOAD: {}", r.show()))),
            }
        };
        Ok(Scripts {
            acquire: load(LUA_ACQUIRE)?,
            redisson: load(LUA_REDISSON_LOCK)?,
            semaphore: load(LUA_REDISSON_SEMAPHORE)?,
            release: load(LUA_RELEASE)?,
            renew: load(LUA_RENEW)?,
        })
    }
}

/// One measured command (one row of the table).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Op {
    Ping,
    Set,
    LuaAcquire,
    Acquire,
    Redisson,
    Racquire,
    Read,
    RedissonSemaphore,
    Semaphore,
    RedissonMulti,
    Macquire,
    LuaRenew,
    Renew,
    LuaReleaseHit,
    ReleaseHit,
    LuaReleaseMiss,
    ReleaseMiss,
    FloorSet,
}

impl Op {
    /// Table order.
    pub const ALL: [Op; 18] = [
        Op::Ping,
        Op::Set,
        Op::FloorSet,
        Op::LuaAcquire,
        Op::Acquire,
        Op::Redisson,
        Op::Racquire,
        Op::Read,
        Op::RedissonSemaphore,
        Op::Semaphore,
        Op::RedissonMulti,
        Op::Macquire,
        Op::LuaRenew,
        Op::Renew,
        Op::LuaReleaseHit,
        Op::ReleaseHit,
        Op::LuaReleaseMiss,
        Op::ReleaseMiss,
    ];

    /// The lock commands the C reference module (benches/cmodule/lockfloor.c)
    /// does: the same work through the same module API, measured on a server
    /// of its own (rows `floor:<command>`, here and in the profile).
    pub const FLOOR: [Op; 6] = [
        Op::Acquire,
        Op::Racquire,
        Op::Read,
        Op::Renew,
        Op::ReleaseHit,
        Op::ReleaseMiss,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Op::Ping => "PING (client ceiling)",
            Op::Set => "`SET k v NX PX 3600000`",
            Op::LuaAcquire => "Lua acquire (`SET NX PX` in EVALSHA)",
            Op::Acquire => "`LOCK.ACQUIRE k o 3600000`",
            Op::Redisson => "Redisson reentrant lock script (hash)",
            Op::Racquire => "`LOCK.RACQUIRE k o 3600000`",
            Op::Read => "`LOCK.READ k o 3600000`",
            Op::RedissonSemaphore => "Redisson RSemaphore acquire script (counter set beforehand)",
            Op::Semaphore => "`LOCK.SEMAPHORE k 10 o 3600000`",
            Op::RedissonMulti => "Redisson MultiLock: two lock scripts in one MULTI/EXEC",
            Op::Macquire => "`LOCK.MACQUIRE 2 k1 k2 o 3600000`",
            Op::LuaRenew => "Lua compare-and-pexpire (held)",
            Op::Renew => "`LOCK.RENEW k o 3600000` (held)",
            Op::LuaReleaseHit => "Lua compare-and-delete (held)",
            Op::ReleaseHit => "`LOCK.RELEASE k o` (held)",
            Op::LuaReleaseMiss => "Lua compare-and-delete (missing key)",
            Op::ReleaseMiss => "`LOCK.RELEASE k o` (missing key)",
            Op::FloorSet => "`FLOOR.SET k v 3600000` (C reference module): the module API's floor, a module value of one block with a lease, nothing else",
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            Op::Ping => "ping",
            Op::Set => "set-nx-px",
            Op::LuaAcquire => "lua-acquire",
            Op::Acquire => "lock-acquire",
            Op::Redisson => "redisson-lock",
            Op::Racquire => "lock-racquire",
            Op::Read => "lock-read",
            Op::RedissonSemaphore => "redisson-semaphore",
            Op::Semaphore => "lock-semaphore",
            Op::RedissonMulti => "redisson-multilock",
            Op::Macquire => "lock-macquire",
            Op::LuaRenew => "lua-renew",
            Op::Renew => "lock-renew",
            Op::LuaReleaseHit => "lua-release-hit",
            Op::ReleaseHit => "lock-release-hit",
            Op::LuaReleaseMiss => "lua-release-miss",
            Op::ReleaseMiss => "lock-release-miss",
            Op::FloorSet => "floor-set",
        }
    }

    /// Whether this command needs the module; the others (`SET`, the Lua
    /// scripts, PING) run on a server without it, as a user compares them.
    pub fn needs_module(self) -> bool {
        matches!(
            self,
            Op::Acquire
                | Op::Racquire
                | Op::Read
                | Op::Semaphore
                | Op::Macquire
                | Op::Renew
                | Op::ReleaseHit
                | Op::ReleaseMiss
        )
    }

    /// Whether this command is the C reference module's own (`FLOOR.SET`):
    /// it runs on that module's server only.
    pub fn on_floor(self) -> bool {
        matches!(self, Op::FloorSet)
    }

    /// What this row is compared with, and the goal for the ratio, if any.
    pub fn baselines(self) -> &'static [(Op, Option<f64>)] {
        match self {
            Op::Acquire => &[(Op::Set, Some(0.9)), (Op::LuaAcquire, Some(1.6))],
            Op::Racquire => &[(Op::Redisson, Some(2.0))],
            Op::Semaphore => &[(Op::RedissonSemaphore, None)],
            Op::Macquire => &[(Op::RedissonMulti, None)],
            Op::Renew => &[(Op::LuaRenew, None)],
            Op::ReleaseHit => &[(Op::LuaReleaseHit, None)],
            Op::ReleaseMiss => &[(Op::LuaReleaseMiss, None)],
            Op::FloorSet => &[(Op::Set, None)],
            _ => &[],
        }
    }

    /// Appends request number `i` of this command.
    pub fn encode(self, s: &Scripts, i: usize, buf: &mut Vec<u8>) {
        let k = Arg::K(KEY_PREFIX, i);
        let b = Arg::B;
        match self {
            Op::Ping => encode(buf, &[b(b"PING")]),
            Op::Set => encode(buf, &[b(b"SET"), k, b(OWNER), b(b"NX"), b(b"PX"), b(TTL)]),
            Op::LuaAcquire => encode(
                buf,
                &[b(b"EVALSHA"), b(&s.acquire), b(b"1"), k, b(OWNER), b(TTL)],
            ),
            Op::Acquire => encode(buf, &[b(b"LOCK.ACQUIRE"), k, b(OWNER), b(TTL)]),
            Op::Redisson => encode(
                buf,
                &[
                    b(b"EVALSHA"),
                    b(&s.redisson),
                    b(b"1"),
                    k,
                    b(TTL),
                    b(REDISSON_FIELD),
                ],
            ),
            Op::Racquire => encode(buf, &[b(b"LOCK.RACQUIRE"), k, b(OWNER), b(TTL)]),
            Op::Read => encode(buf, &[b(b"LOCK.READ"), k, b(OWNER), b(TTL)]),
            Op::RedissonSemaphore => {
                encode(buf, &[b(b"EVALSHA"), b(&s.semaphore), b(b"1"), k, b(b"1")])
            }
            Op::Semaphore => encode(
                buf,
                &[b(b"LOCK.SEMAPHORE"), k, b(PERMITS), b(OWNER), b(TTL)],
            ),
            Op::RedissonMulti => {
                let (k1, k2) = (Arg::K(KEY_PREFIX, 2 * i), Arg::K(KEY_PREFIX, 2 * i + 1));
                let lock = |k| {
                    [
                        b(b"EVALSHA"),
                        b(&s.redisson),
                        b(b"1"),
                        k,
                        b(TTL),
                        b(REDISSON_FIELD),
                    ]
                };
                encode(buf, &[b(b"MULTI")]);
                encode(buf, &lock(k1));
                encode(buf, &lock(k2));
                encode(buf, &[b(b"EXEC")]);
            }
            Op::Macquire => {
                let (k1, k2) = (Arg::K(KEY_PREFIX, 2 * i), Arg::K(KEY_PREFIX, 2 * i + 1));
                encode(
                    buf,
                    &[b(b"LOCK.MACQUIRE"), b(b"2"), k1, k2, b(OWNER), b(TTL)],
                )
            }
            Op::LuaRenew => encode(
                buf,
                &[b(b"EVALSHA"), b(&s.renew), b(b"1"), k, b(OWNER), b(TTL)],
            ),
            Op::Renew => encode(buf, &[b(b"LOCK.RENEW"), k, b(OWNER), b(TTL)]),
            Op::LuaReleaseHit | Op::LuaReleaseMiss => {
                encode(buf, &[b(b"EVALSHA"), b(&s.release), b(b"1"), k, b(OWNER)])
            }
            Op::ReleaseHit | Op::ReleaseMiss => encode(buf, &[b(b"LOCK.RELEASE"), k, b(OWNER)]),
            Op::FloorSet => encode(buf, &[b(b"FLOOR.SET"), k, b(OWNER), b(TTL)]),
        }
    }

    /// Whether `r` is the reply this request must get (unique keys, so every
    /// grant is granted and every release of a held lock succeeds).
    pub fn expected(self, r: &Reply) -> bool {
        match self {
            Op::Ping => r.is("PONG"),
            Op::Set | Op::LuaAcquire => r.is("OK"),
            Op::Redisson => *r == Reply::Nil,
            Op::RedissonSemaphore => *r == Reply::Int(1),
            Op::Semaphore => r.as_int().is_some_and(|t| t > 0),
            // EXEC's reply: both scripts answered nil (granted).
            Op::RedissonMulti => *r == Reply::Array(vec![Reply::Nil, Reply::Nil]),
            Op::Macquire => {
                matches!(r, Reply::Array(t) if t.len() == 2 && t.iter().all(|t| t.as_int().is_some_and(|t| t > 0)))
            }
            Op::Acquire | Op::Racquire | Op::Read | Op::FloorSet => {
                r.as_int().is_some_and(|t| t > 0)
            }
            Op::LuaRenew | Op::Renew | Op::LuaReleaseHit | Op::ReleaseHit => *r == Reply::Int(1),
            Op::LuaReleaseMiss => *r == Reply::Int(0),
            Op::ReleaseMiss => *r == Reply::Nil,
        }
    }
}

impl Op {
    /// Replies per request (the last one is checked): a MULTI/EXEC of two
    /// scripts is four commands.
    pub fn replies(self) -> usize {
        match self {
            Op::RedissonMulti => 4,
            _ => 1,
        }
    }

    /// What must exist before the timed run (not timed): Redisson's
    /// semaphore counters (`trySetPermits`), one per key.
    pub fn setup(self, i: usize, buf: &mut Vec<u8>) -> bool {
        match self {
            Op::RedissonSemaphore => {
                let k = Arg::K(KEY_PREFIX, i);
                encode(buf, &[Arg::B(b"SET"), k, Arg::B(PERMITS)]);
                true
            }
            _ => false,
        }
    }

    /// The database this command runs in: each creating command has its own
    /// (empty at the start of a round); renew and release run where their
    /// acquire created the keys.
    pub fn db(self) -> usize {
        match self {
            Op::RedissonSemaphore | Op::Semaphore => 6,
            Op::RedissonMulti | Op::Macquire => 7,
            Op::Ping | Op::Set | Op::LuaRenew | Op::LuaReleaseHit | Op::LuaReleaseMiss => 0,
            Op::Acquire | Op::Renew | Op::ReleaseHit | Op::ReleaseMiss => 1,
            Op::LuaAcquire => 2,
            Op::Redisson => 3,
            Op::Racquire => 4,
            Op::Read => 5,
            Op::FloorSet => 8,
        }
    }
}

/// One step of a round.
#[derive(Clone, Copy)]
pub enum Step {
    FlushAll,
    Run(Op),
}

/// Round `round` (from 1): compared commands side by side, each pair's
/// order reversed every other round.
pub fn round_plan(round: usize) -> Vec<Step> {
    let groups: [&[Op]; 7] = [
        // Creating keys, each on an empty database. `SET` between the two
        // compared with it.
        &[
            Op::FloorSet,
            Op::Set,
            Op::Acquire,
            Op::LuaAcquire,
            Op::Redisson,
            Op::Racquire,
            Op::Read,
        ],
        &[Op::RedissonSemaphore, Op::Semaphore],
        &[Op::RedissonMulti, Op::Macquire],
        // On the keys just created (held for an hour).
        &[Op::LuaRenew, Op::Renew],
        &[Op::LuaReleaseHit, Op::ReleaseHit],
        // The keys are gone now.
        &[Op::LuaReleaseMiss, Op::ReleaseMiss],
        &[Op::Ping],
    ];
    let mut plan = vec![Step::FlushAll];
    for group in groups {
        let mut ops = group.to_vec();
        if round.is_multiple_of(2) {
            ops.reverse();
        }
        plan.extend(ops.into_iter().map(Step::Run));
    }
    plan.push(Step::FlushAll);
    plan
}

/// Connections with pipelining, driven from one thread.
pub struct Pool {
    conns: Vec<Conn>,
    pipeline: usize,
    db: usize,
}

/// What one run measured.
pub struct Outcome {
    pub secs: f64,
    pub total: usize,
    pub unexpected: usize,
    pub example: Option<String>,
}

impl Outcome {
    pub fn rate(&self) -> f64 {
        self.total as f64 / self.secs
    }
}

impl Pool {
    pub fn new(port: u16, conns: usize, pipeline: usize) -> io::Result<Pool> {
        let conns = (0..conns)
            .map(|_| crate::server::connect(port))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Pool {
            conns,
            pipeline,
            db: 0,
        })
    }

    /// Makes every connection use database `db` (not timed).
    pub fn select(&mut self, db: usize) -> io::Result<()> {
        if db != self.db {
            let db_text = db.to_string();
            for c in &mut self.conns {
                if !c.call(&[b"SELECT", db_text.as_bytes()])?.is("OK") {
                    return Err(io::Error::other("SELECT failed"));
                }
            }
            self.db = db;
        }
        Ok(())
    }

    /// Sends requests `0..total` (`encode(i, buf)` writes request `i`), each
    /// connection keeping `pipeline` requests in flight, and checks each reply.
    pub fn run(
        &mut self,
        total: usize,
        encode: &dyn Fn(usize, &mut Vec<u8>),
        check: &dyn Fn(usize, &Reply) -> bool,
    ) -> io::Result<Outcome> {
        self.run_replies(total, 1, encode, check)
    }

    /// As [`Pool::run`], each request answered by `replies` replies (the
    /// last one is checked).
    pub fn run_replies(
        &mut self,
        total: usize,
        replies: usize,
        encode: &dyn Fn(usize, &mut Vec<u8>),
        check: &dyn Fn(usize, &Reply) -> bool,
    ) -> io::Result<Outcome> {
        let p = self.pipeline;
        let mut next = 0usize;
        let mut inflight = vec![(0usize, 0usize); self.conns.len()];
        let mut unexpected = 0;
        let mut example = None;
        let start = Instant::now();
        for (c, slot) in self.conns.iter_mut().zip(inflight.iter_mut()) {
            let n = p.min(total - next);
            for i in next..next + n {
                encode(i, c.out());
            }
            c.flush()?;
            *slot = (next, n);
            next += n;
        }
        loop {
            let mut busy = false;
            for (c, slot) in self.conns.iter_mut().zip(inflight.iter_mut()) {
                let (first, n) = *slot;
                if n == 0 {
                    continue;
                }
                busy = true;
                for i in first..first + n {
                    let mut r = c.read_reply()?;
                    for _ in 1..replies {
                        r = c.read_reply()?;
                    }
                    if !check(i, &r) {
                        unexpected += 1;
                        example.get_or_insert_with(|| format!("request {i}: {}", r.show()));
                    }
                }
                let n = p.min(total - next);
                for i in next..next + n {
                    encode(i, c.out());
                }
                c.flush()?;
                *slot = (next, n);
                next += n;
            }
            if !busy {
                break;
            }
        }
        Ok(Outcome {
            secs: start.elapsed().as_secs_f64(),
            total,
            unexpected,
            example,
        })
    }
}

/// Section 1's results: each command's rate in each round, and the same
/// commands' on the C reference module's server.
pub struct Results {
    pub rounds: stats::Rounds<Op>,
    pub floor_rates: HashMap<Op, Vec<f64>>,
}

impl std::ops::Deref for Results {
    type Target = stats::Rounds<Op>;
    fn deref(&self) -> &stats::Rounds<Op> {
        &self.rounds
    }
}

impl Results {
    /// Median over rounds of (rate of `op` / rate of the same command on
    /// the C reference module) in the same round.
    pub fn floor_ratio(&self, op: Op) -> f64 {
        let (Some(a), Some(b)) = (self.rates.get(&op), self.floor_rates.get(&op)) else {
            return f64::NAN;
        };
        let r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
        stats::median(&r)
    }
}

/// One server the section drives: a connection for FLUSHALL, the pool, the
/// scripts loaded there.
pub struct Side<'a> {
    pub c: &'a mut Conn,
    pub pool: &'a mut Pool,
    pub scripts: &'a Scripts,
}

/// Runs `rounds` interleaved rounds of every command, `requests` each: the
/// lock commands on `module`, their baselines (`SET`, the scripts) on
/// `plain`, a server without the module, as a user compares them.
/// `floor`: the C reference module's server, where the commands it has run
/// right after their run on `module`, in every round, and its own
/// (`FLOOR.SET`) in their place in the round.
pub fn run(
    module: Side,
    plain: Side,
    floor: Side,
    requests: usize,
    rounds: usize,
) -> io::Result<Results> {
    let Side { c, pool, scripts } = module;
    let Side {
        c: plain_c,
        pool: plain_pool,
        scripts: plain_scripts,
    } = plain;
    let Side {
        c: floor_c,
        pool: floor_pool,
        scripts: floor_scripts,
    } = floor;
    let mut results = Results {
        rounds: stats::Rounds::new(requests, rounds, pool.conns.len(), pool.pipeline),
        floor_rates: HashMap::new(),
    };
    for round in 1..=rounds {
        eprint!("  round {round}/{rounds}:");
        for step in round_plan(round) {
            match step {
                Step::FlushAll => {
                    c.ok(&[b"FLUSHALL"])?;
                    plain_c.ok(&[b"FLUSHALL"])?;
                    floor_c.ok(&[b"FLUSHALL"])?;
                }
                Step::Run(op) => {
                    let (pool, scripts) = if op.on_floor() {
                        (&mut *floor_pool, floor_scripts)
                    } else if op.needs_module() {
                        (&mut *pool, scripts)
                    } else {
                        (&mut *plain_pool, plain_scripts)
                    };
                    let rate = run_op(pool, scripts, op, requests, &mut results.rounds.problems)?;
                    eprint!(" {} {}", op.short(), stats::rate(rate));
                    results.rounds.rates.entry(op).or_default().push(rate);
                    if Op::FLOOR.contains(&op) {
                        let rate = run_op(
                            floor_pool,
                            floor_scripts,
                            op,
                            requests,
                            &mut results.rounds.problems,
                        )?;
                        eprint!(" (C {})", stats::rate(rate));
                        results.floor_rates.entry(op).or_default().push(rate);
                    }
                }
            }
        }
        eprintln!();
    }
    Ok(results)
}

/// One run of `op` on `pool`'s server: its rate; unexpected replies are
/// noted in `problems`.
fn run_op(
    pool: &mut Pool,
    scripts: &Scripts,
    op: Op,
    requests: usize,
    problems: &mut Vec<String>,
) -> io::Result<f64> {
    pool.select(op.db())?;
    if op.setup(0, &mut Vec::new()) {
        pool.run(
            requests,
            &|i, buf| {
                op.setup(i, buf);
            },
            &|_, r| r.is("OK"),
        )?;
    }
    let out = pool.run_replies(
        requests,
        op.replies(),
        &|i, buf| op.encode(scripts, i, buf),
        &|_, r| op.expected(r),
    )?;
    if out.unexpected > 0 {
        problems.push(format!(
            "{}: {} unexpected replies (first: {})",
            op.short(),
            out.unexpected,
            out.example.clone().unwrap_or_default()
        ));
    }
    Ok(out.rate())
}

/// The section's table (Markdown).
pub fn table(r: &Results) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "### 1. Throughput, uncontended, unique keys ({} requests per run, {} connections x pipeline {}, median of {} interleaved rounds)\n\n",
        r.requests, r.conns, r.pipeline, r.rounds.rounds
    ));
    s.push_str("| command | req/s (median) | rounds min-max | compared with | ratio | goal |\n");
    s.push_str("|---|---:|---:|---|---:|---|\n");
    for op in Op::ALL {
        let rates = r.rates.get(&op).cloned().unwrap_or_default();
        let (lo, hi) = stats::min_max(&rates);
        let bases = op.baselines();
        let head = format!(
            "| {} | {} | {}-{} ",
            op.label(),
            stats::rate(r.median(op)),
            stats::rate(lo),
            stats::rate(hi)
        );
        if bases.is_empty() {
            s.push_str(&head);
            s.push_str("| | | |\n");
        }

        for (i, (base, goal)) in bases.iter().enumerate() {
            let ratio = r.paired_ratio(op, *base);
            let goal = match goal {
                Some(g) if ratio >= *g => format!(">= {g} met"),
                Some(g) => format!(">= {g} **not met**"),
                None => String::new(),
            };
            if i == 0 {
                s.push_str(&head);
            } else {
                s.push_str("| | | ");
            }
            s.push_str(&format!(
                "| {} | {} | {} |\n",
                base.label(),
                stats::ratio(ratio),
                goal
            ));
        }
        if let Some(floor) = r.floor_rates.get(&op).filter(|f| !f.is_empty()) {
            s.push_str(&format!(
                "| | | | the C reference module, same work ({}) | {} | |\n",
                stats::rate(stats::median(floor)),
                stats::ratio(r.floor_ratio(op))
            ));
        }
    }
    for p in &r.problems {
        s.push_str(&format!("\n**Unexpected replies**: {p}\n"));
    }
    s
}
