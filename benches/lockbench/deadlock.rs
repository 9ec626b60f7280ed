//! Section 7: what deadlock detection costs. `waiters` requests wait on
//! `keys` keys (10 per key by default: 10,000 on 1,000), arranged so that the
//! wait graph is one long acyclic chain: key `k<i>` is held by owner `o<i>`,
//! and owner `o<j>` waits for the keys `k<j-1>` .. `k<j-10>`. Then, timed by
//! the server itself (`INFO commandstats`, microseconds per call of
//! `LOCK.ACQUIRE`, which counts the time a call runs, not the time a client
//! waits):
//!
//! - a blocking request on a key nobody else waits for (the search finds
//!   nothing to walk): the cost of blocking itself;
//! - a blocking request at the top of the chain (`WAIT 1`): the search walks
//!   the whole graph and finds no cycle (or stops at its limit);
//! - a request closing a short cycle (the owner of the second key from the
//!   top asks for the top key, whose owner waits for its key): answered
//!   `DEADLOCK` at once;
//! - a request closing the cycle through the whole chain (the bottom owner
//!   asks for the top key, `WAIT 1`): `DEADLOCK` if the search reaches it
//!   within its limit, else it waits (and times out);
//! - and, while the graph was built, the mean of all those blocking requests.

use std::io::{self, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::{Duration, Instant};

use crate::common::{encode_strs, Conn, Reply};
use crate::stats;

/// Each measured request, this many times.
const SAMPLES: usize = 200;

pub struct Results {
    pub keys: usize,
    pub waiters: usize,
    pub build_secs: f64,
    pub build_us_per_call: f64,
    pub empty_us: f64,
    pub walk_us: f64,
    pub walk_cut: u64,
    pub cycle_us: f64,
    pub cycle_rtt_us: f64,
    pub cycles_found: u64,
    pub long_us: f64,
    pub long_found: u64,
}

pub fn commandstats_us(c: &mut Conn) -> io::Result<(f64, f64)> {
    let text = c.ok(&[b"INFO", b"commandstats"])?.text();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_lock.acquire:"))
        .ok_or_else(|| io::Error::other("no cmdstat_lock.acquire"))?;
    let field = |name: &str| -> f64 {
        line.split(',')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    Ok((field("calls"), field("usec")))
}

/// Microseconds per `LOCK.ACQUIRE` call of `run` (RESETSTAT first).
pub fn per_call(c: &mut Conn, run: &mut dyn FnMut(&mut Conn) -> io::Result<()>) -> io::Result<f64> {
    c.ok(&[b"CONFIG", b"RESETSTAT"])?;
    // INFO lock makes the module follow the reset at once (not at the cron).
    c.try_info_field("lock", "lock_deadlocks")?;
    run(c)?;
    let (calls, usec) = commandstats_us(c)?;
    Ok(usec / calls)
}

pub fn stat(c: &mut Conn, field: &str) -> io::Result<u64> {
    c.try_info_field("lock", field)?
        .parse()
        .map_err(|_| io::Error::other(format!("{field} is not a number")))
}

pub fn run(port: u16, keys: usize, waiters: usize) -> io::Result<Results> {
    let mut c = crate::server::connect(port)?;
    c.ok(&[b"FLUSHALL"])?;
    let ttl = b"3600000";
    for i in 0..keys {
        c.push(&[
            b"LOCK.ACQUIRE",
            format!("k{i}").as_bytes(),
            format!("o{i}").as_bytes(),
            ttl,
        ]);
    }
    c.flush()?;
    for _ in 0..keys {
        if c.read_reply()?.as_int().is_none_or(|t| t <= 0) {
            return Err(io::Error::other("a chain key was not granted"));
        }
    }
    // The waiters: one connection each (a blocked client holds its
    // connection), written to and never read until they are closed.
    c.ok(&[b"CONFIG", b"RESETSTAT"])?;
    c.try_info_field("lock", "lock_deadlocks")?;
    let mut streams: Vec<TcpStream> = Vec::with_capacity(waiters);
    let per_key = waiters.div_ceil(keys).max(1);
    let start = Instant::now();
    'outer: for i in 0..keys {
        for m in 0..per_key {
            if streams.len() == waiters {
                break 'outer;
            }
            let j = i + 1 + m;
            let owner = if j < keys {
                format!("o{j}")
            } else {
                format!("x{i}-{m}")
            };
            let mut buf = Vec::new();
            encode_strs(
                &mut buf,
                &[
                    b"LOCK.ACQUIRE",
                    format!("k{i}").as_bytes(),
                    owner.as_bytes(),
                    ttl,
                    b"WAIT",
                    b"0",
                ],
            );
            let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
            s.set_nodelay(true)?;
            s.write_all(&buf)?;
            streams.push(s);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    while stat(&mut c, "lock_waiters")? < streams.len() as u64 {
        if Instant::now() > deadline {
            return Err(io::Error::other("the waiters did not all queue"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let build_secs = start.elapsed().as_secs_f64();
    let (calls, usec) = commandstats_us(&mut c)?;
    let build_us_per_call = usec / calls;
    if stat(&mut c, "lock_deadlocks")? > 0 {
        return Err(io::Error::other("the acyclic chain was answered DEADLOCK"));
    }

    // A blocking request nobody else's wait touches.
    c.ok(&[b"LOCK.ACQUIRE", b"solo", b"solo-holder", ttl])?;
    let timed = |c: &mut Conn, key: &[u8], owner: &[u8], want: &dyn Fn(&Reply) -> bool| {
        for _ in 0..SAMPLES {
            let r = c.call(&[b"LOCK.ACQUIRE", key, owner, ttl, b"WAIT", b"1"])?;
            if !want(&r) {
                return Err(io::Error::other(format!("unexpected {}", r.show())));
            }
        }
        Ok(())
    };
    let nil = |r: &Reply| *r == Reply::Nil;
    let empty_us = per_call(&mut c, &mut |c| timed(c, b"solo", b"solo-waiter", &nil))?;
    let top = format!("k{}", keys - 1);
    let cut_before = stat(&mut c, "lock_deadlock_searches_cut")?;
    let walk_us = per_call(&mut c, &mut |c| timed(c, top.as_bytes(), b"outsider", &nil))?;
    let walk_cut = stat(&mut c, "lock_deadlock_searches_cut")? - cut_before;
    let deadlock = |r: &Reply| matches!(r, Reply::Error(e) if e.starts_with("DEADLOCK"));
    let second = format!("o{}", keys.saturating_sub(2));
    let t0 = Instant::now();
    let cycle_us = per_call(&mut c, &mut |c| {
        timed(c, top.as_bytes(), second.as_bytes(), &deadlock)
    })?;
    let cycle_rtt_us = t0.elapsed().as_secs_f64() * 1e6 / SAMPLES as f64;
    let cycles_found = stat(&mut c, "lock_deadlocks")?;
    let either = |r: &Reply| *r == Reply::Nil || deadlock(r);
    let long_us = per_call(&mut c, &mut |c| timed(c, top.as_bytes(), b"o0", &either))?;
    let long_found = stat(&mut c, "lock_deadlocks")?;
    drop(streams);
    let deadline = Instant::now() + Duration::from_secs(60);
    while stat(&mut c, "lock_waiters")? > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    c.ok(&[b"FLUSHALL"])?;
    Ok(Results {
        keys,
        waiters,
        build_secs,
        build_us_per_call,
        empty_us,
        walk_us,
        walk_cut,
        cycle_us,
        cycle_rtt_us,
        cycles_found,
        long_us,
        long_found,
    })
}

pub fn table(r: &Results) -> String {
    let mut s = format!(
        "### 7. Deadlock detection ({} requests waiting on {} keys, one acyclic chain; server time per `LOCK.ACQUIRE` call from `INFO commandstats`, {SAMPLES} calls each)\n\n",
        r.waiters, r.keys
    );
    s.push_str("| request | µs per call | note |\n|---|---:|---|\n");
    s.push_str(&format!(
        "| blocking request, nobody else waits (the cost of blocking) | {:.1} | |\n",
        r.empty_us
    ));
    let cut = match r.walk_cut {
        0 => "whole graph walked, no cycle".to_string(),
        n => format!(
            "search given up in {n} of {SAMPLES} (`lock_deadlock_searches_cut`: its cycles came apart as it ran; waited as usual)"
        ),
    };
    s.push_str(&format!(
        "| blocking request at the top of the chain | {:.1} | {cut} |\n",
        r.walk_us
    ));
    s.push_str(&format!(
        "| request closing a cycle of two owners (answered `DEADLOCK`) | {:.1} | round trip {} per request; {} of {SAMPLES} found |\n",
        r.cycle_us,
        stats::dur_us(r.cycle_rtt_us),
        r.cycles_found
    ));
    let long = match r.long_found {
        0 => "not found before the request's `WAIT 1` ended: timed out (the search runs a slice a turn, so a loaded machine's turns decide)".to_string(),
        n if n as usize == SAMPLES => "found: answered `DEADLOCK`".to_string(),
        n => format!("found in {n} of {SAMPLES}"),
    };
    s.push_str(&format!(
        "| request closing the cycle through the whole chain | {:.1} | {long} |\n",
        r.long_us
    ));
    s.push_str(&format!(
        "| building the graph: each of the {} blocking requests | {:.1} | {:.1} s in all, connections included |\n",
        r.waiters, r.build_us_per_call, r.build_secs
    ));
    s
}
