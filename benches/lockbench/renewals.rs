//! Section 6c: what keeping 10,000 locks alive costs the server, by way of
//! renewing (issue 42 item 3).
//!
//! One process holds [`LOCKS`] locks with a lease of [`TTL_MS`] and renews
//! them every third of it, as the packages do, for [`ROUNDS`] rounds:
//! - a lease per lock: a `LOCK.RENEW` per lock (a watchdog per lock, what
//!   every script-based lock and Redisson's watchdog do);
//! - `BIND`, a connection per lock (how the packages bind: each held lock
//!   on a connection of its own), one `LOCK.KEEPALIVE` per connection;
//! - `BIND`, every lock on one connection: one `LOCK.KEEPALIVE` renewing
//!   them all;
//! - one session: one `LOCK.SESSION KEEPALIVE`, whatever the locks.
//!
//! Each way is measured on the server's own counters: the renewal commands
//! it ran (`INFO commandstats` calls), the time it spent in them (their
//! `usec`), and its whole CPU time (`used_cpu_user` + `used_cpu_sys`, which
//! also counts work done after a command, in later turns), each per second
//! of holding.

use std::io;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{encode, Arg, Conn, Reply};
use crate::stats;

/// Locks the process holds.
pub const LOCKS: usize = 10_000;
/// Their lease; renewed every third of it.
const TTL_MS: u64 = 3_000;
/// Renewal rounds measured (the window: `ROUNDS` thirds of the lease).
const ROUNDS: usize = 6;

/// One way of renewing, measured.
pub struct Way {
    pub label: &'static str,
    /// Renewal commands the server ran, a second.
    pub commands: f64,
    /// Microseconds the server spent in them, a second (commandstats).
    pub command_us: f64,
    /// The server's CPU time, microseconds a second, less at rest.
    pub cpu_us: f64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum How {
    Lease,
    BindEach,
    BindOne,
    Session,
}

impl How {
    const ALL: [How; 4] = [How::Lease, How::BindEach, How::BindOne, How::Session];

    fn label(self) -> &'static str {
        match self {
            How::Lease => "a lease per lock: `LOCK.RENEW` per lock",
            How::BindEach => "`BIND`, a connection per lock (as the packages bind): `LOCK.KEEPALIVE` per connection",
            How::BindOne => "`BIND`, every lock on one connection: one `LOCK.KEEPALIVE`",
            How::Session => "one session: one `LOCK.SESSION KEEPALIVE`",
        }
    }

    fn prefix(self) -> &'static [u8] {
        match self {
            How::Lease => b"rn:lease:",
            How::BindEach => b"rn:each:",
            How::BindOne => b"rn:one:",
            How::Session => b"rn:sess:",
        }
    }
}

fn int(r: &Reply, what: &str) -> io::Result<i64> {
    r.as_int()
        .ok_or_else(|| io::Error::other(format!("{what}: {}", r.show())))
}

/// Sends every request `make` writes on `c` (pipelined), then reads as
/// many replies, none an error (`bind::pipelined`).
fn round_trip(c: &mut Conn, n: usize, make: &dyn Fn(usize, &mut Vec<u8>)) -> io::Result<()> {
    crate::bind::pipelined(c, n, make, &|r| !matches!(r, Reply::Error(_)))
}

/// The server's counters: renewal calls, their µs, and its CPU µs.
fn counters(c: &mut Conn) -> io::Result<(f64, f64, f64)> {
    let text = c.call(&[b"INFO", b"everything"])?.text();
    let (mut calls, mut usec, mut cpu) = (0.0, 0.0, 0.0);
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line
            .strip_prefix("cmdstat_lock.renew:")
            .or_else(|| line.strip_prefix("cmdstat_lock.keepalive:"))
            .or_else(|| line.strip_prefix("cmdstat_lock.session|keepalive:"))
        {
            for field in rest.split(',') {
                match field.split_once('=') {
                    Some(("calls", v)) => calls += v.parse::<f64>().unwrap_or(0.0),
                    Some(("usec", v)) => usec += v.parse::<f64>().unwrap_or(0.0),
                    _ => {}
                }
            }
        }
        for name in ["used_cpu_user:", "used_cpu_sys:"] {
            if let Some(v) = line.strip_prefix(name) {
                cpu += v.parse::<f64>().unwrap_or(0.0) * 1e6;
            }
        }
    }
    Ok((calls, usec, cpu))
}

/// The grants' own lease: long enough for 10,000 connections to be
/// opened on a loaded machine (the renewals then set [`TTL_MS`]).
const GRANT_TTL: &[u8] = b"600000";

fn grant(how: How, i: usize, session: &[u8], buf: &mut Vec<u8>) {
    let mut args = vec![
        Arg::B(b"LOCK.ACQUIRE"),
        Arg::K(how.prefix(), i),
        Arg::B(b"o"),
        Arg::B(GRANT_TTL),
    ];
    match how {
        How::BindEach | How::BindOne => args.push(Arg::B(b"BIND")),
        How::Session => args.extend([Arg::B(b"SESSION"), Arg::B(session)]),
        How::Lease => {}
    }
    encode(buf, &args);
}

/// Holds [`LOCKS`] locks renewed `how`, for [`ROUNDS`] rounds.
fn measure(port: u16, how: How, idle_cpu_per_s: f64) -> io::Result<Way> {
    let ttl = TTL_MS.to_string();
    let mut c = crate::server::connect(port)?;
    let mut session = Vec::new();
    if how == How::Session {
        let id = int(&c.call(&[b"LOCK.SESSION", b"OPEN", GRANT_TTL])?, "OPEN")?;
        session = id.to_string().into_bytes();
    }
    let mut each = Vec::new();
    match how {
        How::BindEach => {
            for i in 0..LOCKS {
                let mut h = crate::server::connect(port)?;
                grant(how, i, &session, h.out());
                h.flush()?;
                each.push(h);
            }
            for h in &mut each {
                int(&h.read_reply()?, "grant")?;
            }
        }
        _ => round_trip(&mut c, LOCKS, &|i, b| grant(how, i, &session, b))?,
    }
    let (calls0, usec0, cpu0) = counters(&mut c)?;
    let started = Instant::now();
    let third = Duration::from_millis(TTL_MS / 3);
    for round in 1..=ROUNDS {
        match how {
            How::Lease => round_trip(&mut c, LOCKS, &|i, b| {
                encode(
                    b,
                    &[
                        Arg::B(b"LOCK.RENEW"),
                        Arg::K(how.prefix(), i),
                        Arg::B(b"o"),
                        Arg::B(ttl.as_bytes()),
                    ],
                )
            })?,
            How::BindEach => {
                for h in &mut each {
                    encode(
                        h.out(),
                        &[Arg::B(b"LOCK.KEEPALIVE"), Arg::B(ttl.as_bytes())],
                    );
                    h.flush()?;
                }
                for h in &mut each {
                    if int(&h.read_reply()?, "KEEPALIVE")? != 1 {
                        return Err(io::Error::other("a bound lock was lost"));
                    }
                }
            }
            How::BindOne => {
                let n = int(&c.call(&[b"LOCK.KEEPALIVE", ttl.as_bytes()])?, "KEEPALIVE")?;
                if n != LOCKS as i64 {
                    return Err(io::Error::other(format!("KEEPALIVE renewed {n}")));
                }
            }
            How::Session => {
                let ok = c.call(&[b"LOCK.SESSION", b"KEEPALIVE", &session, ttl.as_bytes()])?;
                if int(&ok, "SESSION KEEPALIVE")? != 1 {
                    return Err(io::Error::other("the session ended"));
                }
            }
        }
        let next = third * round as u32;
        if let Some(left) = next.checked_sub(started.elapsed()) {
            thread::sleep(left);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let (calls1, usec1, cpu1) = counters(&mut c)?;
    // Every lock still held: none lost to a late renewal.
    let held =
        crate::server::connect(port)?.call(&[b"LOCK.INFO", &[how.prefix(), b"0"].concat()])?;
    if held == Reply::Nil {
        return Err(io::Error::other(format!(
            "{}: a lock was lost",
            how.label()
        )));
    }
    drop(each);
    c.call(&[b"FLUSHALL"])?;
    if how == How::Session {
        c.call(&[b"LOCK.SESSION", b"CLOSE", &session])?;
    }
    settle(&mut c)?;
    Ok(Way {
        label: how.label(),
        commands: (calls1 - calls0) / secs,
        command_us: (usec1 - usec0) / secs,
        cpu_us: ((cpu1 - cpu0) / secs - idle_cpu_per_s).max(0.0),
    })
}

/// Waits until the server has finished with a way's locks (closed
/// connections' bound holders and leases are ended over the turns after
/// their close): until a quarter of a second passes with the server's CPU
/// at rest, so that the next way's window counts only its own work.
fn settle(c: &mut Conn) -> io::Result<()> {
    let started = Instant::now();
    loop {
        let (_, _, before) = counters(c)?;
        thread::sleep(Duration::from_millis(250));
        let (_, _, after) = counters(c)?;
        if after - before < 5_000.0 {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(120) {
            return Err(io::Error::other("the server did not settle in 2 minutes"));
        }
    }
}

/// Every way, with the server's CPU at rest measured first (the same
/// window, nothing renewed).
pub fn run(port: u16) -> io::Result<Vec<Way>> {
    let mut c = crate::server::connect(port)?;
    let (_, _, cpu0) = counters(&mut c)?;
    let t = Instant::now();
    thread::sleep(Duration::from_millis(TTL_MS / 3 * ROUNDS as u64));
    let (_, _, cpu1) = counters(&mut c)?;
    let idle = (cpu1 - cpu0) / t.elapsed().as_secs_f64();
    How::ALL
        .iter()
        .map(|&how| measure(port, how, idle))
        .collect()
}

pub fn table(ways: &[Way]) -> String {
    let mut s = format!(
        "#### 6c. Keeping 10,000 locks alive: what the renewals cost the server\n\nOne process holds 10,000 locks with a lease of {} s and renews them every third of it, for {ROUNDS} rounds, each way in turn; the server's own counters, per second of holding (`cargo bench --bench lockbench -- --only 6`). The server's CPU is its whole (user and system, less the same server at rest), which also counts work done after a command and Redis's reading and writing.\n\n| renewing by | renewal commands a second | time in them a second | the server's CPU a second |\n|---|---:|---:|---:|\n",
        TTL_MS / 1000
    );
    for w in ways {
        s.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            w.label,
            stats::rate(w.commands),
            stats::dur_us(w.command_us),
            stats::dur_us(w.cpu_us)
        ));
    }
    s
}
