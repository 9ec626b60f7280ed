//! Section 3: latency of a hand-off and of a grant after an expiry.
//!
//! - Hand-off: A holds the lock, B waits for it; A's RELEASE is sent at t0,
//!   B's token arrives at t1; t1 - t0 (one thread drives A and B, so no
//!   scheduling between them). Baseline: B polls `SET NX PX` every 1 ms and
//!   A releases with the Lua compare-and-delete.
//! - Expiry: A takes the lock with a lease of a few ms and never releases;
//!   B waits. Lateness = the wall clock when B's grant arrives - the lock's
//!   deadline (`PEXPIRETIME`, same machine, same clock). Baseline: B polls
//!   `SET NX PX` every 1 ms.

use std::io;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::{Conn, Reply};
use crate::stats::{self, Percentiles};
use crate::throughput::Scripts;

pub struct Row {
    pub label: &'static str,
    pub samples: Percentiles,
    /// Lateness only: samples that arrived before the deadline (must be 0).
    pub early: usize,
}

fn expect(r: Reply, what: &str, ok: impl Fn(&Reply) -> bool) -> io::Result<Reply> {
    if ok(&r) {
        Ok(r)
    } else {
        Err(io::Error::other(format!("{what}: {}", r.show())))
    }
}

fn is_token(r: &Reply) -> bool {
    r.as_int().is_some_and(|t| t > 0)
}

fn waiters(info: &Reply) -> i64 {
    match info {
        Reply::Array(items) => items
            .iter()
            .position(|r| r.is("waiters"))
            .and_then(|i| items.get(i + 1))
            .and_then(Reply::as_int)
            .unwrap_or(0),
        _ => 0,
    }
}

fn wall_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// The hand-off with `WAIT`, and, interleaved with it (same conditions: an
/// idle server's wake-up time on a VM varies from run to run), one PING
/// round trip per sample as the reference.
fn handoff_wait(port: u16, n: usize) -> io::Result<(Row, Row)> {
    let (mut a, mut b, mut c) = (
        crate::server::connect(port)?,
        crate::server::connect(port)?,
        crate::server::connect(port)?,
    );
    let key: &[u8] = b"handoff";
    let (mut us, mut ping) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t0 = Instant::now();
        expect(c.call(&[b"PING"])?, "PING", |r| r.is("PONG"))?;
        ping.push(stats::micros(t0.elapsed()));
        expect(
            a.call(&[b"LOCK.ACQUIRE", key, b"A", b"10000"])?,
            "A acquires",
            is_token,
        )?;
        b.push(&[b"LOCK.ACQUIRE", key, b"B", b"10000", b"WAIT", b"5000"]);
        b.flush()?;
        while waiters(&c.call(&[b"LOCK.INFO", key])?) < 1 {}
        let t0 = Instant::now();
        a.push(&[b"LOCK.RELEASE", key, b"A"]);
        a.flush()?;
        expect(b.read_reply()?, "B's WAIT", is_token)?;
        us.push(stats::micros(t0.elapsed()));
        expect(a.read_reply()?, "A releases", |r| *r == Reply::Int(1))?;
        expect(b.call(&[b"LOCK.RELEASE", key, b"B"])?, "B releases", |r| {
            *r == Reply::Int(1)
        })?;
    }
    Ok((
        Row {
            label: "PING round trip (reference, interleaved with the next row)",
            samples: Percentiles::new(ping),
            early: 0,
        },
        Row {
            label: "hand-off: RELEASE -> the waiter's token (`WAIT`)",
            samples: Percentiles::new(us),
            early: 0,
        },
    ))
}

/// B polls `SET key B NX PX 10000` every 1 ms from its own thread.
fn handoff_poll(port: u16, scripts: &Scripts, n: usize) -> io::Result<Row> {
    let key: &'static [u8] = b"handoff-poll";
    let release = scripts.release.clone();
    let (start_tx, start_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<io::Result<Instant>>();
    let mut pb = crate::server::connect(port)?;
    let poller = thread::spawn(move || {
        while start_rx.recv().is_ok() {
            let granted = (|| -> io::Result<Instant> {
                loop {
                    if pb
                        .call(&[b"SET", key, b"B", b"NX", b"PX", b"10000"])?
                        .is("OK")
                    {
                        let t = Instant::now();
                        pb.ok(&[b"EVALSHA", &release, b"1", key, b"B"])?;
                        return Ok(t);
                    }
                    thread::sleep(Duration::from_millis(1));
                }
            })();
            if done_tx.send(granted).is_err() {
                break;
            }
        }
    });
    let mut a = crate::server::connect(port)?;
    let mut us = Vec::with_capacity(n);
    for i in 0..n {
        expect(
            a.call(&[b"SET", key, b"A", b"NX", b"PX", b"10000"])?,
            "A sets",
            |r| r.is("OK"),
        )?;
        start_tx
            .send(())
            .map_err(|_| io::Error::other("the poller stopped"))?;
        // Release at a varying phase of the poller's 1 ms cycle.
        thread::sleep(Duration::from_micros(2000 + (i as u64 * 137) % 1000));
        let t0 = Instant::now();
        expect(
            a.call(&[b"EVALSHA", &scripts.release, b"1", key, b"A"])?,
            "A releases",
            |r| *r == Reply::Int(1),
        )?;
        let t1 = done_rx
            .recv()
            .map_err(|_| io::Error::other("the poller stopped"))??;
        us.push(stats::micros(t1.saturating_duration_since(t0)));
    }
    drop(start_tx);
    poller
        .join()
        .map_err(|_| io::Error::other("the poller panicked"))?;
    Ok(Row {
        label: "hand-off: Lua release -> the poller's `SET NX PX` succeeds (polling every 1 ms)",
        samples: Percentiles::new(us),
        early: 0,
    })
}

fn deadline_ms(c: &mut Conn, key: &[u8]) -> io::Result<i64> {
    let r = c.call(&[b"PEXPIRETIME", key])?;
    r.as_int()
        .filter(|&t| t > 0)
        .ok_or_else(|| io::Error::other(format!("PEXPIRETIME: {}", r.show())))
}

fn expiry_wait(port: u16, n: usize) -> io::Result<Row> {
    let (mut a, mut b) = (crate::server::connect(port)?, crate::server::connect(port)?);
    let key: &[u8] = b"expiry";
    let (mut late, mut early) = (Vec::with_capacity(n), 0);
    for i in 0..n {
        let ttl = (3 + i % 5).to_string();
        expect(
            a.call(&[b"LOCK.ACQUIRE", key, b"A", ttl.as_bytes()])?,
            "A acquires",
            is_token,
        )?;
        let deadline = deadline_ms(&mut a, key)?;
        expect(
            b.call(&[b"LOCK.ACQUIRE", key, b"B", b"10000", b"WAIT", b"5000"])?,
            "B's WAIT",
            is_token,
        )?;
        let lateness = wall_us() - deadline * 1000;
        if lateness < 0 {
            early += 1;
        }
        late.push(lateness.max(0) as u64);
        expect(b.call(&[b"LOCK.RELEASE", key, b"B"])?, "B releases", |r| {
            *r == Reply::Int(1)
        })?;
    }
    Ok(Row {
        label: "grant after expiry: lateness past the deadline (`WAIT`)",
        samples: Percentiles::new(late),
        early,
    })
}

fn expiry_poll(port: u16, scripts: &Scripts, n: usize) -> io::Result<Row> {
    let (mut a, mut b) = (crate::server::connect(port)?, crate::server::connect(port)?);
    let key: &[u8] = b"expiry-poll";
    let (mut late, mut early) = (Vec::with_capacity(n), 0);
    for i in 0..n {
        let ttl = (3 + i % 5).to_string();
        expect(
            a.call(&[b"SET", key, b"A", b"NX", b"PX", ttl.as_bytes()])?,
            "A sets",
            |r| r.is("OK"),
        )?;
        let deadline = deadline_ms(&mut a, key)?;
        loop {
            if b.call(&[b"SET", key, b"B", b"NX", b"PX", b"10000"])?
                .is("OK")
            {
                break;
            }
            thread::sleep(Duration::from_millis(1));
        }
        let lateness = wall_us() - deadline * 1000;
        if lateness < 0 {
            early += 1;
        }
        late.push(lateness.max(0) as u64);
        b.ok(&[b"EVALSHA", &scripts.release, b"1", key, b"B"])?;
    }
    Ok(Row {
        label: "grant after expiry: lateness past the deadline (`SET NX PX` polling every 1 ms)",
        samples: Percentiles::new(late),
        early,
    })
}

pub struct Samples {
    pub handoff: usize,
    pub handoff_poll: usize,
    pub expiry: usize,
    pub expiry_poll: usize,
}

pub fn run(port: u16, scripts: &Scripts, n: &Samples) -> io::Result<Vec<Row>> {
    let (ping, handoff) = handoff_wait(port, n.handoff)?;
    let rows = vec![
        ping,
        handoff,
        handoff_poll(port, scripts, n.handoff_poll)?,
        expiry_wait(port, n.expiry)?,
        expiry_poll(port, scripts, n.expiry_poll)?,
    ];
    for r in &rows {
        eprintln!(
            "  {}: p50 {} p99 {}",
            r.label,
            stats::dur_us(r.samples.at(50.0)),
            stats::dur_us(r.samples.at(99.0))
        );
    }
    Ok(rows)
}

pub fn table(rows: &[Row]) -> String {
    let mut s = String::from("### 3. Latency\n\n");
    s.push_str("| measurement | samples | p50 | p99 | max |\n|---|---:|---:|---:|---:|\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            r.label,
            r.samples.len(),
            stats::dur_us(r.samples.at(50.0)),
            stats::dur_us(r.samples.at(99.0)),
            stats::dur_us(r.samples.max())
        ));
        if r.early > 0 {
            s.push_str(&format!(
                "\n**{} grants arrived before the deadline** ({})\n\n",
                r.early, r.label
            ));
        }
    }
    s
}
