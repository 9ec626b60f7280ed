//! `--callgrind`: server instructions per request, on redis-servers running
//! under `valgrind --tool=callgrind`. Instruction counts do not depend on
//! what else the machine is doing, so this is the repeatable comparison (and
//! the dumps say where the instructions go: `callgrind_annotate
//! --inclusive=yes <dump>`).
//!
//! Servers from the same binary, one at a time: a plain one (what a user
//! compares with), one with the module, one with the C reference module
//! (benches/cmodule: the same work through the same module API), and the
//! last two again with a replica attached, so that every effect is built
//! and sent. All of them with one hash seed (tests/shims/seedshim.c) and
//! `activerehashing no`, so that a run repeats the one before. Every row is
//! one measured step:
//!
//! 1. `FLUSHALL SYNC`, then the keys the step needs (held locks for a
//!    renewal, plain keys for `DEL`), with leases of an hour: nothing expires
//!    during a step on any machine, and `hz 1` keeps the server's cron out of
//!    the way;
//! 2. a warm-up of the same command on other keys;
//! 3. the counters zeroed (`callgrind_control -z`), the measured requests,
//!    and a dump (`-d`): only those requests are counted.
//!
//! `--repeat N` measures everything N times and shows each row's spread;
//! `--write-baseline` stores the figures in benches/baseline.tsv and
//! `--check` compares with it (`make bench-check`: fails when a row got more
//! than 3% more expensive). `LOCKBENCH_KEEP_DUMPS=<dir>` keeps each
//! step's dump there as `<row>.out`, to compare two runs function by
//! function.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{encode, Arg, Conn, Reply};
use crate::server::{Options, Server};
use crate::throughput::{Op, Pool, Scripts, KEY_PREFIX, OWNER, TTL};

fn control(args: &[&str]) -> io::Result<()> {
    let out = Command::new("callgrind_control").args(args).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "callgrind_control {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

/// The newest dump `callgrind.out.<n>` in `dir`.
fn newest_dump(dir: &Path) -> Option<PathBuf> {
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n: u32 = name.strip_prefix("callgrind.out.")?.parse().ok()?;
            Some((n, e.path()))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, p)| p)
}

fn instructions(dump: &Path) -> io::Result<u64> {
    let text = fs::read_to_string(dump)?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| io::Error::other(format!("no summary in {}", dump.display())))
}

/// The instructions of the module's `CONFIG RESETSTAT` look in a dump
/// (`stats::follow_resetstat`, inclusive: Redis's `INFO commandstats` and
/// the module's mark). It runs once a second while the module's counters
/// move, by the clock, not per request: under callgrind a step lasts tens
/// of seconds, more on a loaded machine, so it is left out of the
/// per-request figures (8.2 million instructions, 410 a request, in one
/// busy `LOCK.ACQUIRE` step of a run on a loaded machine: +4.5% on a row
/// that is otherwise the same in every run), and shown beside them.
fn resetstat_look(dump: &Path) -> io::Result<u64> {
    Ok(annotated(dump, true, "stats::follow_resetstat ")?
        .max()
        .unwrap_or(0))
}

/// The instructions of the clock shim (tests/shims/clockshim.c) in a dump:
/// the bench's tool, not the server's work, left out of a row measured
/// with the clock held still ([`Profiled::start_frozen`]). What is left of
/// a clock read is then nothing where the C library's was its system
/// call's few instructions (about 30 a request on Redis 7.0).
fn clock_shim(dump: &Path) -> io::Result<u64> {
    Ok(annotated(dump, false, "libclockshim.so]")?.sum())
}

/// The counts `callgrind_annotate` gives the functions of `dump` whose
/// line contains `what`, inclusive or not.
fn annotated(dump: &Path, inclusive: bool, what: &str) -> io::Result<impl Iterator<Item = u64>> {
    let out = Command::new("callgrind_annotate")
        .arg(format!(
            "--inclusive={}",
            if inclusive { "yes" } else { "no" }
        ))
        .arg("--threshold=100")
        .arg(dump)
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "callgrind_annotate {}: {}",
            dump.display(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let counts: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(what))
        .filter_map(|l| {
            l.split_whitespace()
                .next()?
                .replace(',', "")
                .parse::<u64>()
                .ok()
        })
        .collect();
    Ok(counts.into_iter())
}

/// A command on keys that are not locks: what loading the module adds to it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Plain {
    Set,
    SetNxPx,
    Incr,
    Hset,
    Lpush,
    Del,
    Expire,
    LuaSetNxPx,
    LuaSet,
}

const LUA_SET: &str = "return redis.call('SET', KEYS[1], ARGV[1])";

impl Plain {
    pub const ALL: [Plain; 9] = [
        Plain::Set,
        Plain::SetNxPx,
        Plain::Incr,
        Plain::Hset,
        Plain::Lpush,
        Plain::Del,
        Plain::Expire,
        Plain::LuaSetNxPx,
        Plain::LuaSet,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Plain::Set => "`SET k v`",
            Plain::SetNxPx => "`SET k v NX PX 3600000`",
            Plain::Incr => "`INCR k`",
            Plain::Hset => "`HSET h f v`",
            Plain::Lpush => "`LPUSH l v`",
            Plain::Del => "`DEL k` (a string)",
            Plain::Expire => "`EXPIRE k 3600` (a string)",
            Plain::LuaSetNxPx => "Lua `SET NX PX` (EVALSHA)",
            Plain::LuaSet => "Lua `SET` (EVALSHA)",
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            Plain::Set => "set",
            Plain::SetNxPx => "set-nx-px-plain",
            Plain::Incr => "incr",
            Plain::Hset => "hset",
            Plain::Lpush => "lpush",
            Plain::Del => "del",
            Plain::Expire => "expire",
            Plain::LuaSetNxPx => "lua-set-nx-px",
            Plain::LuaSet => "lua-set",
        }
    }

    /// Whether the step needs a string at each key first.
    fn needs_strings(self) -> bool {
        matches!(self, Plain::Del | Plain::Expire)
    }

    pub fn encode(self, s: &Sha, i: usize, buf: &mut Vec<u8>) {
        let k = Arg::K(KEY_PREFIX, i);
        let b = Arg::B;
        match self {
            Plain::Set => encode(buf, &[b(b"SET"), k, b(OWNER)]),
            Plain::SetNxPx => encode(buf, &[b(b"SET"), k, b(OWNER), b(b"NX"), b(b"PX"), b(TTL)]),
            Plain::Incr => encode(buf, &[b(b"INCR"), k]),
            Plain::Hset => encode(buf, &[b(b"HSET"), k, b(b"f"), b(OWNER)]),
            Plain::Lpush => encode(buf, &[b(b"LPUSH"), k, b(OWNER)]),
            Plain::Del => encode(buf, &[b(b"DEL"), k]),
            Plain::Expire => encode(buf, &[b(b"EXPIRE"), k, b(b"3600")]),
            Plain::LuaSetNxPx => encode(
                buf,
                &[
                    b(b"EVALSHA"),
                    b(&s.scripts.acquire),
                    b(b"1"),
                    k,
                    b(OWNER),
                    b(TTL),
                ],
            ),
            Plain::LuaSet => encode(buf, &[b(b"EVALSHA"), b(&s.set), b(b"1"), k, b(OWNER)]),
        }
    }

    fn expected(self, r: &Reply) -> bool {
        match self {
            Plain::Set | Plain::SetNxPx | Plain::LuaSetNxPx | Plain::LuaSet => r.is("OK"),
            Plain::Incr | Plain::Hset | Plain::Lpush | Plain::Del | Plain::Expire => {
                *r == Reply::Int(1)
            }
        }
    }
}

/// The scripts, loaded on each server.
pub struct Sha {
    scripts: Scripts,
    set: Vec<u8>,
}

impl Sha {
    fn load(c: &mut Conn) -> io::Result<Sha> {
        let scripts = Scripts::load(c)?;
        let set = match c.ok(&[b"SCRIPT", b"LOAD", LUA_SET.as_bytes()])? {
            Reply::Bulk(sha) => sha,
            r => return Err(io::Error::other(format!("SCRIPT LOAD: {}", r.show()))),
        };
        Ok(Sha { scripts, set })
    }
}

/// Warm-up requests, on keys far from the measured ones.
const WARM: usize = 1000;
const WARM_OFFSET: usize = 100_000_000;

/// One server under callgrind, instrumented, with a pool of connections.
pub struct Profiled {
    server: Server,
    pid: String,
    pub c: Conn,
    pool: Pool,
    sha: Sha,
    /// Empty only the selected database between rows (`FLUSHDB`), keeping
    /// what other databases hold (section 11's busy server).
    pub flush_db_only: bool,
    /// On a server with a clock, before each step's freeze: let the
    /// clocks run until the server's time-driven work is done, as between
    /// a native run's rows ([`Profiled::settle`]). Section 11's servers.
    pub settle: bool,
    /// With `settle`: `INFO lock`'s `lock_name_filter_memory` at rest, which
    /// it must read again. A `FLUSHDB` that leaves locks in other databases
    /// starts the name filter's rebuild (design.md, "Lock names, counted"),
    /// a module timer's slices, which make no progress while the clocks
    /// stand still: without the wait, whether a step ran with the rebuild
    /// under way (every new name counted in two tables) depended on how far
    /// it got before the freeze.
    pub filter_at_rest: Option<u64>,
}

/// [`Profiled::settle`]'s wait with the clocks running: more than one cron
/// period at [`extra_config`]'s `hz 1`.
const CRON_PASS: std::time::Duration = std::time::Duration::from_millis(1500);

impl Profiled {
    pub fn start(opts: &Options) -> io::Result<Profiled> {
        Profiled::on(Server::start(opts)?)
    }

    /// [`Profiled::start`] on a server whose clocks each measured step holds
    /// still: for rows whose work depends on how much wall time passed,
    /// which under callgrind is many times what the requests take natively
    /// (a bound grant files its lease's deadline in a 4 ms slot: at native
    /// speed hundreds of grants share a slot; under callgrind a step of
    /// 20,000 made 1,800 to 2,900 of them, and their count moved the row).
    pub fn start_frozen(opts: &Options) -> io::Result<Profiled> {
        Profiled::on(Server::start_with_clock(opts)?)
    }

    fn on(server: Server) -> io::Result<Profiled> {
        let pid = server.pid().to_string();
        control(&["-i", "on", &pid])?;
        let mut c = server.conn()?;
        let sha = Sha::load(&mut c)?;
        // One connection, one request at a time: every request then costs the
        // same reads and writes (with pipelining, how many requests a read
        // picks up depends on timing, and so do the counts).
        let pool = Pool::new(server.port, 1, 1)?;
        Ok(Profiled {
            server,
            pid,
            c,
            pool,
            sha,
            flush_db_only: false,
            settle: false,
            filter_at_rest: None,
        })
    }

    pub fn port(&self) -> u16 {
        self.server.port
    }

    /// Where its dumps are written.
    pub fn dir(&self) -> &Path {
        self.server.dir()
    }

    /// [`Profiled::measure`] for a lock command (its keys prepared as the
    /// first table's rows are).
    pub fn measure_op(&mut self, name: &str, op: Op, requests: usize) -> io::Result<f64> {
        self.measure(
            name,
            (requests, op.replies()),
            &prepare_lock(op),
            &|s, i, b| op.encode(&s.scripts, i, b),
            &|r| op.expected(r),
        )
    }

    /// [`Profiled::measure`] for a command on keys that are not locks.
    pub fn measure_plain(&mut self, name: &str, op: Plain, requests: usize) -> io::Result<f64> {
        self.measure(
            name,
            (requests, 1),
            &prepare_plain(op),
            &|s, i, b| op.encode(s, i, b),
            &|r| op.expected(r),
        )
    }

    /// Runs `n` requests from key `offset` on, checking every reply.
    pub fn run(
        &mut self,
        what: &str,
        (n, offset, replies): (usize, usize, usize),
        encode: &dyn Fn(&Sha, usize, &mut Vec<u8>),
        check: &dyn Fn(&Reply) -> bool,
    ) -> io::Result<()> {
        let sha = &self.sha;
        let out =
            self.pool
                .run_replies(n, replies, &|i, b| encode(sha, i + offset, b), &|_, r| {
                    check(r)
                })?;
        if out.unexpected > 0 {
            return Err(io::Error::other(format!(
                "{what}: {} unexpected replies ({})",
                out.unexpected,
                out.example.unwrap_or_default()
            )));
        }
        Ok(())
    }

    /// Writes `n` plain strings (`SET`), keys from `offset` on: what a row
    /// on keys that are not locks acts on.
    pub fn set_strings(&mut self, what: &str, n: usize, offset: usize) -> io::Result<()> {
        self.run(
            what,
            (n, offset, 1),
            &|s, i, b| Plain::Set.encode(s, i, b),
            &|r| r.is("OK"),
        )
    }

    /// Runs `f` with callgrind's instrumentation off (several times faster):
    /// state a measurement needs around it, not measured.
    pub fn uninstrumented<T>(
        &mut self,
        f: impl FnOnce(&mut Profiled) -> io::Result<T>,
    ) -> io::Result<T> {
        control(&["-i", "off", &self.pid])?;
        let out = f(self);
        control(&["-i", "on", &self.pid])?;
        out
    }

    /// Runs `f` with the server's clocks held still, if it has a clock
    /// ([`Profiled::start_frozen`]).
    fn frozen<T>(&mut self, f: impl FnOnce(&mut Profiled) -> io::Result<T>) -> io::Result<T> {
        self.server.freeze_clock(true);
        let out = f(self);
        self.server.freeze_clock(false);
        out
    }

    /// `INFO lock`'s `lock_name_filter_memory`.
    pub fn filter_memory(&mut self) -> io::Result<u64> {
        let got = self.c.try_info_field("lock", "lock_name_filter_memory")?;
        got.parse()
            .map_err(|_| io::Error::other(format!("lock_name_filter_memory: {got}")))
    }

    /// With the clocks running, waits until the name filter's rebuild is
    /// done ([`Profiled::filter_at_rest`]), then for a pass of the cron
    /// ([`CRON_PASS`]): the cron's pass over every client (all of them once
    /// a second at `hz 1`) resizes their buffers, and the allocator's
    /// caches a step starts from depended on how long ago it ran (with
    /// 10,000 clients waiting, +0.3% to +3% on the grants between runs
    /// without it: jemalloc refilling its thread cache 8,000 to 12,000
    /// times a step where 2,200 did with the clocks running).
    fn settle(&mut self) -> io::Result<()> {
        let start = std::time::Instant::now();
        while let Some(want) = self.filter_at_rest {
            let got = self.filter_memory()?;
            if got == want {
                break;
            }
            if start.elapsed() > std::time::Duration::from_secs(120) {
                return Err(io::Error::other(format!(
                    "the name filter's rebuild: lock_name_filter_memory {got}, not {want}, after 120 s"
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::thread::sleep(CRON_PASS);
        // The pages the allocator would return to the system over the
        // next seconds (its decay, by elapsed time), returned now.
        self.c.ok(&[b"MEMORY", b"PURGE"])?;
        Ok(())
    }

    /// After a shape is built beside the measured keys (connections opened,
    /// clients waiting), with the clocks running: its clients idle for longer
    /// than Redis's 2 s and a cron pass over them (their query buffers freed,
    /// their reply buffers shrunk, 16 KiB each), so that the first rows
    /// after it do not start from what the cron does to 10,000 new clients.
    pub fn settle_shape(&mut self) -> io::Result<()> {
        std::thread::sleep(std::time::Duration::from_secs(2) + 2 * CRON_PASS);
        self.c.ok(&[b"MEMORY", b"PURGE"])?;
        Ok(())
    }

    /// Steps 1 to 3 above for one command; instructions per request.
    pub fn measure(
        &mut self,
        name: &str,
        (n, replies): (usize, usize),
        prepare: &dyn Fn(&mut Profiled, usize, usize) -> io::Result<()>,
        encode: &dyn Fn(&Sha, usize, &mut Vec<u8>),
        check: &dyn Fn(&Reply) -> bool,
    ) -> io::Result<f64> {
        let flush: &[u8] = match self.flush_db_only {
            true => b"FLUSHDB",
            false => b"FLUSHALL",
        };
        self.c.ok(&[flush, b"SYNC"])?;
        if self.settle && self.server.has_clock() {
            self.settle()?;
        }
        // Held still from the keys' preparation on (a server with a clock):
        // a release's work then also depends on how many deadline slots the
        // grants it ends were filed in, which the requests decide alone.
        self.frozen(|p| {
            prepare(p, WARM_OFFSET, WARM)?;
            prepare(p, 0, n)?;
            p.run(name, (WARM, WARM_OFFSET, replies), encode, check)?;
            control(&["-z", &p.pid])?;
            p.run(name, (n, 0, replies), encode, check)?;
            control(&["-d", name, &p.pid])
        })?;
        let dump = newest_dump(self.server.dir())
            .ok_or_else(|| io::Error::other("callgrind wrote no dump"))?;
        if let Some(keep) = std::env::var_os("LOCKBENCH_KEEP_DUMPS") {
            let _ = fs::copy(&dump, Path::new(&keep).join(format!("{name}.out")));
        }
        let look = resetstat_look(&dump)?;
        let shim = match self.server.has_clock() {
            true => clock_shim(&dump)?,
            false => 0,
        };
        let per_request = instructions(&dump)?.saturating_sub(look + shim) as f64 / n as f64;
        eprintln!(
            "  {name}: {per_request:.0} instructions/request (and the RESETSTAT look, {:.0} a request at this run's speed)",
            look as f64 / n as f64
        );
        Ok(per_request)
    }
}

/// Keys a lock step works on: held locks for renewals and releases.
fn prepare_lock(op: Op) -> impl Fn(&mut Profiled, usize, usize) -> io::Result<()> {
    move |p, offset, n| {
        if op.setup(0, &mut Vec::new()) {
            return p.run(
                "prepare",
                (n, offset, 1),
                &|_, i, b| {
                    op.setup(i, b);
                },
                &|r| r.is("OK"),
            );
        }
        let holder = match op {
            Op::Renew | Op::ReleaseHit => Op::Acquire,
            Op::LuaRenew | Op::LuaReleaseHit => Op::LuaAcquire,
            _ => return Ok(()),
        };
        p.run(
            "prepare",
            (n, offset, 1),
            &|s, i, b| holder.encode(&s.scripts, i, b),
            &|r| holder.expected(r),
        )
    }
}

fn prepare_plain(op: Plain) -> impl Fn(&mut Profiled, usize, usize) -> io::Result<()> {
    move |p, offset, n| {
        if !op.needs_strings() {
            return Ok(());
        }
        p.set_strings("prepare", n, offset)
    }
}

/// One measured row.
#[derive(Clone, Debug)]
pub struct Row {
    /// `lock-acquire`, or `plain:set` / `module:set` for the added-cost rows.
    pub name: String,
    pub per_request: f64,
}

/// redismodule.h, from the `redis-module` crate's sources in Cargo's
/// registry (the version this crate pins).
fn redismodule_h_dir() -> io::Result<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or_else(|| io::Error::other("neither CARGO_HOME nor HOME is set"))?;
    let registry = home.join("registry/src");
    for index in fs::read_dir(&registry)?.flatten() {
        let dir = index.path().join("redis-module-2.0.8/src/include");
        if dir.join("redismodule.h").exists() {
            return Ok(dir);
        }
    }
    Err(io::Error::other(format!(
        "redismodule.h of redis-module 2.0.8 not found under {}",
        registry.display()
    )))
}

/// Builds the C reference module into `dir`.
pub fn build_floor(dir: &Path) -> io::Result<PathBuf> {
    let root = crate::root();
    let src = root.join("benches/cmodule/lockfloor.c");
    let out = dir.join("lockfloor.so");
    let status = Command::new("cc")
        .args([
            "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-I",
        ])
        .arg(redismodule_h_dir()?)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()?;
    if !status.success() {
        return Err(io::Error::other(format!("cc {} failed", src.display())));
    }
    Ok(out)
}

/// The profiled servers' configuration beyond the defaults: no cron work
/// of Redis's own in the counts (`hz 1`, no active rehashing).
pub fn extra_config() -> Vec<String> {
    ["--hz", "1", "--activerehashing", "no"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// A profiled server's options: under callgrind, loading `module` (none:
/// plain Redis), its files in `dir`, configured as [`extra_config`].
pub fn options(module: Option<&Path>, dir: PathBuf) -> Options {
    Options {
        module: module.map(Path::to_path_buf),
        dir,
        callgrind: true,
        extra: extra_config(),
    }
}

/// What a measurement covers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every row: the baselines, the module, the C reference module, both
    /// with and without a replica (the report's tables).
    All,
    /// Only the rows `--check` gates (the module's server, with and without
    /// a replica): two servers of the five, for CI.
    Gated,
}

/// One full measurement: every lock command on the module's server, the
/// baselines and the plain commands on the plain server, the plain commands
/// again on the module's server, and the C reference module's commands on a
/// server of its own (with `Scope::Gated`, only the module's servers).
pub fn run(dir: &Path, module: &Path, requests: usize, scope: Scope) -> io::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let extra = extra_config();
    let sides: &[bool] = match scope {
        Scope::All => &[false, true],
        Scope::Gated => &[true],
    };
    for &with_module in sides {
        let sub = dir.join(if with_module { "module" } else { "plain" });
        fs::create_dir_all(&sub)?;
        let opts = Options {
            module: with_module.then(|| module.to_path_buf()),
            dir: sub,
            callgrind: true,
            extra: extra.clone(),
        };
        let mut p = Profiled::start(&opts)?;
        let side = if with_module { "module" } else { "plain" };
        // The commands on other keys first, on a fresh server: both servers
        // then run them with the same allocator history, which the lock
        // commands' work would change.
        for op in Plain::ALL {
            let name = format!("{side}:{}", op.short());
            let per_request = p.measure(
                &name,
                (requests, 1),
                &prepare_plain(op),
                &|s, i, b| op.encode(s, i, b),
                &|r| op.expected(r),
            )?;
            rows.push(Row { name, per_request });
        }
        for op in Op::ALL {
            // FLOOR.SET is the C reference module's only (section 1).
            if op.on_floor() || op.needs_module() != with_module {
                continue;
            }
            let per_request = p.measure(
                op.short(),
                (requests, op.replies()),
                &prepare_lock(op),
                &|s, i, b| op.encode(&s.scripts, i, b),
                &|r| op.expected(r),
            )?;
            rows.push(Row {
                name: op.short().to_string(),
                per_request,
            });
        }
    }
    if scope == Scope::Gated {
        let sent = measure_sent(dir, "sent", module.to_path_buf(), &extra, requests)?;
        rows.extend(sent);
        return Ok(rows);
    }
    let floor = build_floor(dir)?;
    let sub = dir.join("floor");
    fs::create_dir_all(&sub)?;
    let opts = Options {
        module: Some(floor.clone()),
        dir: sub,
        callgrind: true,
        extra: extra.clone(),
    };
    let mut p = Profiled::start(&opts)?;
    rows.extend(measure_floor_ops(&mut p, "floor", requests)?);
    drop(p);
    // The same commands again with a replica attached, so that every effect
    // is built and sent: on the module's server and on the C module's.
    for (side, module) in [("sent", module.to_path_buf()), ("floor-sent", floor)] {
        rows.extend(measure_sent(dir, side, module, &extra, requests)?);
    }
    Ok(rows)
}

/// Readers of the one key of the `wide:` rows (the default
/// `lock.max-holders`).
const WIDE: usize = 1000;

/// The `wide:` rows (`--callgrind --only 1`, and in a full `--callgrind`
/// run; not gated): a reader's repeat `LOCK.READ` and a reader's
/// `LOCK.RENEW` on one key with 1,000 readers, request i by reader i modulo
/// 1,000: what a grant or a renewal costs on a key of many holders (the
/// owner's look-up, and any pass over the holders per command).
pub fn wide(dir: &Path, module: &Path, requests: usize) -> io::Result<Vec<Row>> {
    let sub = dir.join("wide");
    fs::create_dir_all(&sub)?;
    let mut p = Profiled::start(&options(Some(module), sub))?;
    // The readers once, before the measured requests (not the warm-up's).
    let prepare = |p: &mut Profiled, offset: usize, _: usize| -> io::Result<()> {
        if offset != 0 {
            return Ok(());
        }
        p.run(
            "prepare",
            (WIDE, 0, 1),
            &|_, i, b| {
                encode(
                    b,
                    &[
                        Arg::B(b"LOCK.READ"),
                        Arg::B(b"wide"),
                        Arg::K(b"reader-", i),
                        Arg::B(TTL),
                    ],
                )
            },
            &|r| r.as_int().is_some_and(|t| t > 0),
        )
    };
    let mut rows = Vec::new();
    for (name, command, check) in [
        (
            "wide:read",
            b"LOCK.READ".as_slice(),
            (|t| t > 0) as fn(i64) -> bool,
        ),
        ("wide:renew", b"LOCK.RENEW".as_slice(), |t| t == 1),
    ] {
        let per_request = p.measure(
            name,
            (requests, 1),
            &prepare,
            &|_, i, b| {
                encode(
                    b,
                    &[
                        Arg::B(command),
                        Arg::B(b"wide"),
                        Arg::K(b"reader-", i % WIDE),
                        Arg::B(TTL),
                    ],
                )
            },
            &|r| r.as_int().is_some_and(check),
        )?;
        rows.push(Row {
            name: name.to_string(),
            per_request,
        });
    }
    Ok(rows)
}

/// The `wide:` rows' table (empty when they were not measured).
pub fn wide_table(runs: &[Vec<Row>], requests: usize) -> String {
    let Some(rows) = runs.last() else {
        return String::new();
    };
    let (read, renew) = (get(rows, "wide:read"), get(rows, "wide:renew"));
    if read.is_nan() {
        return String::new();
    }
    format!(
        "\n### 1b. A key with {WIDE} readers: instructions per request (callgrind, server side, {requests} requests each, one connection, request i by reader i modulo {WIDE})\n\n\
         | command | instructions/request |\n|---|---:|\n\
         | `LOCK.READ wide reader-i 3600000` (a repeat) | {read:.0} |\n\
         | `LOCK.RENEW wide reader-i 3600000` | {renew:.0} |\n"
    )
}

/// The lock commands the C reference module has, on a server loading
/// `module` with a replica attached, as rows `<side>:<command>`.
fn measure_sent(
    dir: &Path,
    side: &str,
    module: PathBuf,
    extra: &[String],
    requests: usize,
) -> io::Result<Vec<Row>> {
    let sub = dir.join(side);
    fs::create_dir_all(sub.join("replica"))?;
    let opts = Options {
        module: Some(module.clone()),
        dir: sub.clone(),
        callgrind: true,
        extra: extra.to_vec(),
    };
    let mut p = Profiled::start(&opts)?;
    let replica = Server::start(&Options {
        module: Some(module),
        dir: sub.join("replica"),
        callgrind: false,
        extra: Vec::new(),
    })?;
    attach(&replica, p.server.port)?;
    measure_floor_ops(&mut p, side, requests)
}

/// The lock commands the C reference module has, as rows `<side>:<command>`.
fn measure_floor_ops(p: &mut Profiled, side: &str, requests: usize) -> io::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for op in Op::FLOOR {
        let name = format!("{side}:{}", op.short());
        let per_request = p.measure(
            &name,
            (requests, op.replies()),
            &prepare_lock(op),
            &|s, i, b| op.encode(&s.scripts, i, b),
            &|r| op.expected(r),
        )?;
        rows.push(Row { name, per_request });
    }
    Ok(rows)
}

/// Makes `replica` a replica of the server on `master_port` and waits for
/// its link (the full sync done).
fn attach(replica: &Server, master_port: u16) -> io::Result<()> {
    let mut c = replica.conn()?;
    c.ok(&[
        b"REPLICAOF",
        b"127.0.0.1",
        master_port.to_string().as_bytes(),
    ])?;
    let start = std::time::Instant::now();
    loop {
        let link = c.try_info_field("replication", "master_link_status")?;
        let syncing = c.try_info_field("replication", "master_sync_in_progress")?;
        if link == "up" && syncing == "0" {
            return Ok(());
        }
        if start.elapsed() > std::time::Duration::from_secs(60) {
            return Err(io::Error::other("the replica did not sync within 60 s"));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn get(rows: &[Row], name: &str) -> f64 {
    rows.iter()
        .find(|r| r.name == name)
        .map_or(f64::NAN, |r| r.per_request)
}

/// `| a | b | c |` from cells.
fn line(cells: &[String]) -> String {
    format!("| {} |\n", cells.join(" | "))
}

/// The lock commands against their baselines (on the plain server), then
/// what loading the module adds to other commands. With several runs, each
/// row's spread (max - min) / min over them.
pub fn table(runs: &[Vec<Row>], requests: usize) -> String {
    let Some(rows) = runs.first() else {
        return String::new();
    };
    let many = runs.len() > 1;
    let spread = |name: &str| -> Vec<String> {
        if !many {
            return Vec::new();
        }
        let v: Vec<f64> = runs.iter().map(|r| get(r, name)).collect();
        let lo = v.iter().cloned().fold(f64::MAX, f64::min);
        let hi = v.iter().cloned().fold(f64::MIN, f64::max);
        vec![format!("{:.2}%", (hi - lo) / lo * 100.0)]
    };
    let head = |cols: &[&str], right: usize| -> String {
        let mut cols: Vec<String> = cols.iter().map(|c| c.to_string()).collect();
        if many {
            cols.push(format!("spread over {} runs", runs.len()));
        }
        let mut sep: Vec<String> = (0..cols.len())
            .map(|i| {
                if i >= right {
                    "---:".into()
                } else {
                    "---".into()
                }
            })
            .collect();
        if many {
            if let Some(last) = sep.last_mut() {
                *last = "---:".into();
            }
        }
        line(&cols) + &line(&sep)
    };
    let mut s = format!(
        "### Instructions per request (callgrind, server side, {requests} requests each, one connection, one request at a time, `hz 1`, leases of an hour)\n\n\
         Each baseline runs on the same redis-server binary without the module: the command a user compares with.\n\n"
    );
    s.push_str(&head(
        &[
            "command",
            "instructions/request",
            "compared with (no module)",
            "ratio (lower is better)",
        ],
        1,
    ));
    for op in Op::ALL {
        let Some(row) = rows.iter().find(|r| r.name == op.short()) else {
            continue;
        };
        let bases = op.baselines();
        let mut cells = vec![op.label().to_string(), format!("{:.0}", row.per_request)];
        match bases.first() {
            None => cells.extend([String::new(), String::new()]),
            Some((base, _)) => {
                let b = get(rows, base.short());
                cells.push(format!("{} ({b:.0})", base.label()));
                cells.push(format!("{:.2}x", row.per_request / b));
            }
        }
        cells.extend(spread(&row.name));
        s.push_str(&line(&cells));
        let floor = get(rows, &format!("floor:{}", op.short()));
        if !floor.is_nan() {
            let mut cells = vec![
                String::new(),
                String::new(),
                format!("the C reference module, same work through the module API ({floor:.0})"),
                format!("{:.2}x", row.per_request / floor),
            ];
            cells.extend(spread(&format!("floor:{}", op.short())));
            s.push_str(&line(&cells));
        }
        for (base, _) in bases.iter().skip(1) {
            let b = get(rows, base.short());
            let mut cells = vec![
                String::new(),
                String::new(),
                format!("{} ({b:.0})", base.label()),
                format!("{:.2}x", row.per_request / b),
            ];
            if many {
                cells.push(String::new());
            }
            s.push_str(&line(&cells));
        }
    }
    if !get(rows, "sent:lock-acquire").is_nan() {
        s.push_str(
            "\n### With a replica attached (every effect built and sent; the rows above have no listener)\n\n",
        );
        s.push_str(&head(
            &[
                "command",
                "this module",
                "the C reference module",
                "ratio (lower is better)",
            ],
            1,
        ));
        for op in Op::FLOOR {
            let ours = get(rows, &format!("sent:{}", op.short()));
            let floor = get(rows, &format!("floor-sent:{}", op.short()));
            let mut cells = vec![
                op.label().to_string(),
                format!("{ours:.0}"),
                format!("{floor:.0}"),
                format!("{:.2}x", ours / floor),
            ];
            cells.extend(spread(&format!("sent:{}", op.short())));
            s.push_str(&line(&cells));
        }
    }
    s.push_str("\n### What loading the module adds to other commands (callgrind, same binary)\n\n");
    s.push_str(&head(
        &[
            "command (keys that are not locks)",
            "without the module",
            "with the module",
            "added",
        ],
        1,
    ));
    for op in Plain::ALL {
        let plain = get(rows, &format!("plain:{}", op.short()));
        let module = get(rows, &format!("module:{}", op.short()));
        let mut cells = vec![
            op.label().to_string(),
            format!("{plain:.0}"),
            format!("{module:.0}"),
            format!("{:+.1}%", (module - plain) / plain * 100.0),
        ];
        cells.extend(spread(&format!("module:{}", op.short())));
        s.push_str(&line(&cells));
    }
    s
}

/// The largest spread of any row over the runs, in percent.
pub fn max_spread(runs: &[Vec<Row>]) -> f64 {
    let Some(first) = runs.first() else {
        return 0.0;
    };
    first
        .iter()
        .map(|row| {
            let v: Vec<f64> = runs.iter().map(|r| get(r, &row.name)).collect();
            let lo = v.iter().cloned().fold(f64::MAX, f64::min);
            let hi = v.iter().cloned().fold(f64::MIN, f64::max);
            (hi - lo) / lo * 100.0
        })
        .fold(0.0, f64::max)
}

/// `name<TAB>instructions per request`, one row a line.
pub fn baseline_text(rows: &[Row]) -> String {
    let mut s = String::from("# make bench-check compares with these (instructions per request)\n");
    for r in rows {
        s.push_str(&format!("{}\t{:.0}\n", r.name, r.per_request));
    }
    s
}

/// `--check`'s report: each gated row measured, its baseline and the change.
pub fn check_table(rows: &[Row], baseline: &str) -> String {
    let mut s = String::from(
        "| row | instructions/request | baseline | change |\n| --- | ---: | ---: | ---: |\n",
    );
    for (name, base) in gated_baseline(baseline) {
        let now = get(rows, name);
        // A row whose baseline is 0 (the module's own code at rest) is
        // shown as its change in instructions.
        let change = match base == 0.0 {
            true => format!("{now:+.0}"),
            false => format!("{:+.1}%", (now - base) / base * 100.0),
        };
        s.push_str(&format!("| {name} | {now:.0} | {base:.0} | {change} |\n"));
    }
    s
}

/// The rows of `baseline` (benches/baseline.tsv) that `check` gates, with
/// their figures: the module's server's, not Redis's or the C reference
/// module's.
fn gated_baseline(baseline: &str) -> impl Iterator<Item = (&str, f64)> {
    baseline
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let mut parts = line.split('\t');
            Some((parts.next()?, parts.next()?.parse::<f64>().ok()?))
        })
        .filter(|(name, _)| {
            (name.starts_with("lock-")
                || name.starts_with("module:")
                || name.starts_with("sent:")
                || name.starts_with("busy:"))
                && !UNGATED.contains(name)
        })
}

/// Rows of the module's server that are Redis's own work and move with its
/// allocator between runs by more than the gate's 3%: a connection's whole
/// life (measured less the cron's ticks at rest, which are not gated
/// either: two runs of one build gave 21,305 and 20,967 against a baseline
/// of 20,595). The module's own code per connection (`module:conn-own`, 0)
/// is gated.
const UNGATED: [&str; 1] = ["module:conn"];

/// Rows of the module's server (its commands, and the other commands with
/// the module loaded) more than `tolerance` (0.03 = 3%) more expensive than
/// the baseline. The plain server's rows measure Redis, not this code.
pub fn regressions(rows: &[Row], baseline: &str, tolerance: f64) -> Vec<String> {
    let mut out = Vec::new();
    for (name, base) in gated_baseline(baseline) {
        let now = get(rows, name);
        if now.is_nan() {
            out.push(format!("{name}: no longer measured"));
        } else if now > base * (1.0 + tolerance) {
            out.push(format!(
                "{name}: {now:.0} instructions/request, {:+.1}% over the baseline {base:.0}",
                (now - base) / base * 100.0
            ));
        }
    }
    out
}
