//! Sections 4 and 5: memory and persistence of many held locks.
//!
//! For each kind of lock (`SET NX PX` string, LOCK.ACQUIRE, the module API's
//! floor, Redisson-style hash), on an empty database: load N keys
//! (pipelined; each with its own UUID owner and a 10-minute lease), then
//! `used_memory` growth / N and the mean `MEMORY USAGE` of 100 keys; then
//! `SAVE` (timed by the client), the RDB's size, and a restart on that RDB
//! (load time from the server's log). Shared locks: K keys with R readers
//! each (R = 1, 10, 100).
//!
//! The floor is `FLOOR.SET` of the C reference module
//! (benches/cmodule/lockfloor.c, loaded `floor-only` beside this module on
//! the same server): a module value of one block with a lease, nothing else,
//! saved as one string buffer; what any module-typed lock costs at least.
//! Its second row stores the owner and 20 bytes more, as many as a lock
//! must keep beside its owner (token and deadline, 8 bytes each, and a
//! hold count of 4): what any module-typed lock that persists its state in
//! one string costs at least.

use std::fs;
use std::io;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{encode, Arg, Conn, Reply};
use crate::server::Server;
use crate::stats;
use crate::throughput::{Pool, Scripts, KEY_PREFIX};

const LEASE: &[u8] = b"600000";

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Strings,
    Locks,
    Floor,
    FloorState,
    Redisson,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Strings,
        Kind::Locks,
        Kind::Floor,
        Kind::FloorState,
        Kind::Redisson,
    ];

    /// Where its RDB is kept in the server's directory.
    fn file(self) -> &'static str {
        match self {
            Kind::Strings => "dump-strings.rdb",
            Kind::Locks => "dump-locks.rdb",
            Kind::Floor => "dump-floor.rdb",
            Kind::FloorState => "dump-floor-state.rdb",
            Kind::Redisson => "dump-redisson.rdb",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Kind::Strings => "`SET k <uuid> NX PX` string",
            Kind::Locks => "`LOCK.ACQUIRE k <uuid> ttl` exclusive lock",
            Kind::Floor => "`FLOOR.SET k <uuid> ttl` (C reference module): the module API's floor, one block with a lease",
            Kind::FloorState => "`FLOOR.SET k <uuid + 20 bytes> ttl`: the floor carrying what a lock keeps beside its owner (token, deadline, holds)",
            Kind::Redisson => "Redisson-style hash (`<uuid>:1` -> 1, PEXPIRE)",
        }
    }
}

/// A UUID-shaped owner (36 bytes), different for every `i`.
fn owner(i: usize) -> String {
    format!("{:08x}-3d47-4b8e-9f10-{:012x}", i as u32, i)
}

/// The owner and 20 bytes in the place of a lock's token, deadline and
/// hold count, each as a lock would hold it (a token near the clock times
/// a thousand, a deadline in unix ms, one hold), little-endian.
fn owner_and_state(i: usize) -> Vec<u8> {
    let mut v = owner(i).into_bytes();
    let token = 1_764_000_000_000_000u64 + i as u64;
    let deadline = 1_764_000_600_000u64 + i as u64 / 1000;
    v.extend_from_slice(&token.to_le_bytes());
    v.extend_from_slice(&deadline.to_le_bytes());
    v.extend_from_slice(&1u32.to_le_bytes());
    v
}

pub struct MemRow {
    pub kind: Kind,
    pub keys: usize,
    pub per_key: f64,
    pub memory_usage: f64,
}

pub struct SharedRow {
    pub readers: usize,
    pub keys: usize,
    pub per_lock: f64,
    pub memory_usage: f64,
}

pub struct PersistRow {
    pub kind: Kind,
    pub keys: usize,
    pub save_ms: f64,
    pub rdb_bytes: u64,
    /// Median over the interleaved rounds.
    pub load_ms: f64,
    /// Median of the rounds' load time over the strings' in the same round.
    pub load_ratio: f64,
    /// The lowest and highest of those ratios.
    pub ratio_spread: (f64, f64),
    pub loaded: i64,
}

/// Each kind's RDB is loaded this many times, the kinds taking turns (each
/// round starting with the next kind), so that the machine's other work
/// falls on all of them alike. One load's time moves by up to 10% on this
/// shared machine: nine rounds keep the median steady.
const LOAD_ROUNDS: usize = 9;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub struct Results {
    pub mem: Vec<MemRow>,
    pub shared: Vec<SharedRow>,
    pub persist: Vec<PersistRow>,
}

fn used_memory(c: &mut Conn) -> io::Result<f64> {
    c.try_info_field("memory", "used_memory")?
        .parse()
        .map_err(|_| io::Error::other("used_memory is not a number"))
}

/// Flushes, then waits until `used_memory` stops moving: connections an
/// earlier section closed (the deadlock section's 10,000) are freed over
/// a while, and memory freed during a load would be counted against it.
fn empty(c: &mut Conn) -> io::Result<f64> {
    c.ok(&[b"FLUSHALL"])?;
    let mut last = used_memory(c)?;
    for _ in 0..50 {
        thread::sleep(Duration::from_millis(200));
        let now = used_memory(c)?;
        if (now - last).abs() < 4096.0 {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}

fn mean_memory_usage(c: &mut Conn, keys: usize) -> io::Result<f64> {
    let samples = 100.min(keys);
    let mut total = 0.0;
    for s in 0..samples {
        let key = format!("lk:{}", s * keys / samples);
        let r = c.ok(&[b"MEMORY", b"USAGE", key.as_bytes(), b"SAMPLES", b"0"])?;
        total += r
            .as_int()
            .ok_or_else(|| io::Error::other(format!("MEMORY USAGE {key}: {}", r.show())))?
            as f64;
    }
    Ok(total / samples as f64)
}

fn load(
    port: u16,
    total: usize,
    encode_one: &dyn Fn(usize, &mut Vec<u8>),
    check: &dyn Fn(&Reply) -> bool,
) -> io::Result<()> {
    let mut pool = Pool::new(port, 20, 64)?;
    let out = pool.run(total, encode_one, &|_, r| check(r))?;
    if out.unexpected > 0 {
        return Err(io::Error::other(format!(
            "loading: {} unexpected replies ({})",
            out.unexpected,
            out.example.unwrap_or_default()
        )));
    }
    Ok(())
}

fn load_kind(port: u16, scripts: &Scripts, kind: Kind, n: usize) -> io::Result<()> {
    fn b(x: &[u8]) -> Arg<'_> {
        Arg::B(x)
    }
    match kind {
        Kind::Strings => load(
            port,
            n,
            &|i, buf| {
                let o = owner(i);
                encode(
                    buf,
                    &[
                        b(b"SET"),
                        Arg::K(KEY_PREFIX, i),
                        b(o.as_bytes()),
                        b(b"NX"),
                        b(b"PX"),
                        b(LEASE),
                    ],
                )
            },
            &|r| r.is("OK"),
        ),
        // A lock and the API's floor take the same arguments: key, owner,
        // lease; both answer a positive number.
        Kind::Locks | Kind::Floor | Kind::FloorState => {
            let command: &[u8] = match kind {
                Kind::Locks => b"LOCK.ACQUIRE",
                _ => b"FLOOR.SET",
            };
            load(
                port,
                n,
                &|i, buf| {
                    let o = match kind {
                        Kind::FloorState => owner_and_state(i),
                        _ => owner(i).into_bytes(),
                    };
                    encode(buf, &[b(command), Arg::K(KEY_PREFIX, i), b(&o), b(LEASE)])
                },
                &|r| r.as_int().is_some_and(|t| t > 0),
            )
        }
        Kind::Redisson => load(
            port,
            n,
            &|i, buf| {
                let field = format!("{}:1", owner(i));
                encode(
                    buf,
                    &[
                        b(b"EVALSHA"),
                        b(&scripts.redisson),
                        b(b"1"),
                        Arg::K(KEY_PREFIX, i),
                        b(LEASE),
                        b(field.as_bytes()),
                    ],
                )
            },
            &|r| *r == Reply::Nil,
        ),
    }
}

fn loaded_from_log(log: &std::path::Path) -> Option<f64> {
    let text = fs::read_to_string(log).ok()?;
    let line = text
        .lines()
        .rev()
        .find(|l| l.contains("DB loaded from disk:"))?;
    let secs = line
        .split("DB loaded from disk:")
        .nth(1)?
        .split_whitespace()
        .next()?;
    secs.parse::<f64>().ok().map(|s| s * 1000.0)
}

/// `server`: this module loaded, and the C reference module `floor-only`
/// (`FLOOR.SET`).
pub fn run(server: &mut Server, keys: usize, shared_grants: usize) -> io::Result<Results> {
    let mut results = Results {
        mem: Vec::new(),
        shared: Vec::new(),
        persist: Vec::new(),
    };
    for kind in Kind::ALL {
        let mut c = server.conn()?;
        let scripts = Scripts::load(&mut c)?;
        let before = empty(&mut c)?;
        let t = Instant::now();
        load_kind(server.port, &scripts, kind, keys)?;
        let loaded_in = t.elapsed();
        let after = used_memory(&mut c)?;
        let row = MemRow {
            kind,
            keys,
            per_key: (after - before) / keys as f64,
            memory_usage: mean_memory_usage(&mut c, keys)?,
        };
        let rdb = server.dir().join("dump.rdb");
        let _ = fs::remove_file(&rdb);
        let t = Instant::now();
        c.ok(&[b"SAVE"])?;
        let save_ms = t.elapsed().as_secs_f64() * 1000.0;
        let rdb_bytes = fs::metadata(&rdb)?.len();
        fs::copy(&rdb, server.dir().join(kind.file()))?;
        drop(c);
        let (load_ms, loaded) = load_rdb(server, kind)?;
        let mut c = server.conn()?;
        let persist = PersistRow {
            kind,
            keys,
            save_ms,
            rdb_bytes,
            load_ms,
            load_ratio: f64::NAN,
            ratio_spread: (f64::NAN, f64::NAN),
            loaded,
        };
        eprintln!(
            "  {}: loaded in {:.1} s, {} per key, MEMORY USAGE {}, SAVE {:.0} ms, RDB {} B/key, load {:.0} ms",
            kind.label(),
            loaded_in.as_secs_f64(),
            stats::bytes(row.per_key),
            stats::bytes(row.memory_usage),
            save_ms,
            rdb_bytes / keys as u64,
            persist.load_ms
        );
        results.mem.push(row);
        results.persist.push(persist);
        c.ok(&[b"FLUSHALL"])?;
    }
    // The loads again, in turns: each kind's median, and the median of its
    // ratio to the strings' load in the same round.
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); Kind::ALL.len()];
    for round in 0..LOAD_ROUNDS {
        for j in 0..Kind::ALL.len() {
            let i = (round + j) % Kind::ALL.len();
            if let (Some(kind), Some(t)) = (Kind::ALL.get(i), times.get_mut(i)) {
                t.push(load_rdb(server, *kind)?.0);
            }
        }
    }
    let strings = times.first().cloned().unwrap_or_default();
    for (row, t) in results.persist.iter_mut().zip(&times) {
        let ratios: Vec<f64> = t.iter().zip(&strings).map(|(a, b)| a / b).collect();
        row.load_ms = median(t.clone());
        row.load_ratio = median(ratios.clone());
        row.ratio_spread = (
            ratios.iter().copied().fold(f64::INFINITY, f64::min),
            ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        );
    }
    server.conn()?.ok(&[b"FLUSHALL"])?;
    let mut c = server.conn()?;
    for readers in [1usize, 10, 100] {
        let locks = (shared_grants / readers).max(1);
        let before = empty(&mut c)?;
        load(
            server.port,
            locks * readers,
            &|i, buf| {
                let o = owner(i);
                encode(
                    buf,
                    &[
                        Arg::B(b"LOCK.READ"),
                        Arg::K(KEY_PREFIX, i / readers),
                        Arg::B(o.as_bytes()),
                        Arg::B(LEASE),
                    ],
                )
            },
            &|r| r.as_int().is_some_and(|t| t > 0),
        )?;
        let after = used_memory(&mut c)?;
        results.shared.push(SharedRow {
            readers,
            keys: locks,
            per_lock: (after - before) / locks as f64,
            memory_usage: mean_memory_usage(&mut c, locks)?,
        });
    }
    c.ok(&[b"FLUSHALL"])?;
    Ok(results)
}

/// Restarts the server on `kind`'s saved RDB: the load time from the
/// server's log, and the keys loaded.
fn load_rdb(server: &mut Server, kind: Kind) -> io::Result<(f64, i64)> {
    let dir = server.dir().to_path_buf();
    fs::copy(dir.join(kind.file()), dir.join("dump.rdb"))?;
    let t = Instant::now();
    let log = server.restart()?;
    let wall_ms = t.elapsed().as_secs_f64() * 1000.0;
    let loaded = server.conn()?.ok(&[b"DBSIZE"])?.as_int().unwrap_or(-1);
    Ok((loaded_from_log(&log).unwrap_or(wall_ms), loaded))
}

pub fn tables(r: &Results) -> (String, String) {
    let set = r
        .mem
        .iter()
        .find(|m| m.kind == Kind::Strings)
        .map_or(f64::NAN, |m| m.per_key);
    let mut s = String::from("### 4. Memory per held lock\n\n");
    s.push_str("| what | keys | used_memory growth per key | MEMORY USAGE (mean of 100 keys) | vs `SET NX PX` | goal |\n");
    s.push_str("|---|---:|---:|---:|---:|---|\n");
    for m in &r.mem {
        let ratio = m.per_key / set;
        let goal = match m.kind {
            Kind::Locks if ratio <= 1.2 => "<= 1.2x met",
            Kind::Locks => "<= 1.2x **not met**",
            _ => "",
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            m.kind.label(),
            m.keys,
            stats::bytes(m.per_key),
            stats::bytes(m.memory_usage),
            stats::ratio(ratio),
            goal
        ));
    }
    let one = r.shared.first().map_or(f64::NAN, |x| x.per_lock);
    for x in &r.shared {
        let per_reader = if x.readers > 1 {
            format!(
                "; {} per extra reader",
                stats::bytes((x.per_lock - one) / (x.readers - 1) as f64)
            )
        } else {
            String::new()
        };
        s.push_str(&format!(
            "| `LOCK.READ` shared lock, {} reader{} | {} | {} per lock{} | {} | | |\n",
            x.readers,
            if x.readers == 1 { "" } else { "s" },
            x.keys,
            stats::bytes(x.per_lock),
            per_reader,
            stats::bytes(x.memory_usage)
        ));
    }
    let mut p = String::from("### 5. Persistence\n\n");
    p.push_str(&format!(
        "Load at start-up: the server's log, each kind's RDB loaded {LOAD_ROUNDS} times, the kinds taking turns; the median, and the median of the ratio to the strings' load of the same round (with the rounds' lowest and highest ratio).\n\n"
    ));
    p.push_str(
        "| what | keys | SAVE | RDB size per key | load at start-up | vs `SET NX PX` | rounds | goal | keys loaded |\n",
    );
    p.push_str("|---|---:|---:|---:|---:|---:|---:|---|---:|\n");
    for x in &r.persist {
        let goal = match x.kind {
            Kind::Locks if x.load_ratio <= 1.2 => "<= 1.2x met",
            Kind::Locks => "<= 1.2x **not met**",
            _ => "",
        };
        p.push_str(&format!(
            "| {} | {} | {:.0} ms | {:.1} B | {:.0} ms | {} | {}-{} | {} | {} |\n",
            x.kind.label(),
            x.keys,
            x.save_ms,
            x.rdb_bytes as f64 / x.keys as f64,
            x.load_ms,
            stats::ratio(x.load_ratio),
            stats::ratio(x.ratio_spread.0),
            stats::ratio(x.ratio_spread.1),
            goal,
            x.loaded
        ));
    }
    (s, p)
}
