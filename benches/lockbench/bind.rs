//! Section 6: locks bound to their connection (`BIND`).
//!
//! - Kill to grant: a holder *process* (this bench, re-run as
//!   `--hold PORT KEY BIND|LEASE`) takes the lock and sleeps; another client
//!   waits for it; the holder is killed with SIGKILL at t0 and the waiter's
//!   token arrives at t1. With `BIND` the server frees the lock when it sees
//!   the connection close; without it (what every other Redis lock does) the
//!   lock frees at the end of its lease.
//! - Keepalive: one connection holding 1,000 bound locks renews them all with
//!   one `LOCK.KEEPALIVE` against 1,000 pipelined `LOCK.RENEW`s (a watchdog
//!   per lock), wall time per renewal round.
//! - Disconnect stall: a connection holding 100,000 bound locks closes while
//!   another client PINGs in a loop; the longest PING round trip is the
//!   longest the event loop stalled. Compared with what Redis takes for as
//!   much state of its own: `DEL` (synchronous) and `UNLINK` of a
//!   100,000-element list, and closing a client whose 100,000 unbound locks
//!   stay (nothing to free).

use std::io;
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use std::path::Path;

use crate::common::{encode, Arg, Conn, Reply};
use crate::profile::{self, Profiled, Row};
use crate::stats::{self, Percentiles};
use crate::throughput::KEY_PREFIX;

fn token(r: &Reply, what: &str) -> io::Result<i64> {
    r.as_int()
        .filter(|t| *t > 0)
        .ok_or_else(|| io::Error::other(format!("{what}: {}", r.show())))
}

/// `--hold PORT KEY BIND|LEASE`: take the lock, say so, sleep until killed.
pub fn hold(args: &[String]) -> io::Result<()> {
    let port: u16 = args
        .first()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| io::Error::other("--hold PORT KEY BIND|LEASE"))?;
    let key = args.get(1).map_or("k", String::as_str);
    let bind = args.get(2).is_some_and(|m| m == "BIND");
    let mut c = crate::server::connect(port)?;
    let lease = if bind {
        b"60000".as_slice()
    } else {
        LEASE_MS.as_bytes()
    };
    let mut cmd: Vec<&[u8]> = vec![b"LOCK.ACQUIRE", key.as_bytes(), b"holder", lease];
    if bind {
        cmd.push(b"BIND");
    }
    token(&c.call(&cmd)?, "the holder's grant")?;
    println!("held");
    io::stdout().flush()?;
    thread::sleep(Duration::from_secs(3600));
    Ok(())
}

/// The unbound holder's lease: what a killed holder's lock costs elsewhere.
const LEASE_MS: &str = "2000";

fn spawn_holder(port: u16, key: &str, bind: bool) -> io::Result<Child> {
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "--hold",
            &port.to_string(),
            key,
            if bind { "BIND" } else { "LEASE" },
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut out = child
        .stdout
        .take()
        .ok_or_else(|| io::Error::other("no stdout"))?;
    let mut buf = [0u8; 5];
    out.read_exact(&mut buf)?;
    if &buf != b"held\n" {
        return Err(io::Error::other("the holder did not take the lock"));
    }
    Ok(child)
}

/// One kill-to-grant sample, in microseconds.
fn kill_to_grant(port: u16, key: &str, bind: bool) -> io::Result<u64> {
    let mut child = spawn_holder(port, key, bind)?;
    let mut w = crate::server::connect(port)?;
    w.set_read_timeout(Duration::from_secs(30))?;
    w.push(&[
        b"LOCK.ACQUIRE",
        key.as_bytes(),
        b"waiter",
        b"60000",
        b"WAIT",
        b"30000",
    ]);
    w.flush()?;
    let mut probe = crate::server::connect(port)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = probe.call(&[b"LOCK.INFO", key.as_bytes()])?;
        if let Reply::Array(items) = &info {
            if items
                .iter()
                .position(|r| r.is("waiters"))
                .and_then(|i| items.get(i + 1)?.as_int())
                == Some(1)
            {
                break;
            }
        }
        if Instant::now() > deadline {
            return Err(io::Error::other("the waiter did not queue"));
        }
        thread::sleep(Duration::from_millis(1));
    }
    let t0 = Instant::now();
    child.kill()?;
    let r = w.read_reply()?;
    let us = stats::micros(t0.elapsed());
    token(&r, "the waiter's grant")?;
    let _ = child.wait();
    probe.ok(&[b"LOCK.RELEASE", key.as_bytes(), b"waiter"])?;
    Ok(us)
}

pub struct Results {
    pub bound: Percentiles,
    pub lease: Percentiles,
    pub keepalive_us: f64,
    pub renews_us: f64,
    pub locks: usize,
    pub stalls: Vec<(&'static str, f64)>,
    pub stall_locks: usize,
    /// From the close until the last bound holder was released (about).
    pub all_released_us: f64,
}

/// The longest PING round trip (µs) on a second connection while `act` runs.
fn longest_ping_during(port: u16, act: impl FnOnce() -> io::Result<()>) -> io::Result<f64> {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let pinger = thread::spawn(move || -> io::Result<u64> {
        let mut c = crate::server::connect(port)?;
        let mut worst = 0;
        let stop_after = Instant::now() + Duration::from_secs(30);
        loop {
            let t = Instant::now();
            c.call(&[b"PING"])?;
            worst = worst.max(stats::micros(t.elapsed()));
            if rx.try_recv().is_ok() || Instant::now() > stop_after {
                return Ok(worst);
            }
        }
    });
    thread::sleep(Duration::from_millis(50));
    act()?;
    // Long enough for the server to finish what the act started.
    thread::sleep(Duration::from_millis(300));
    let _ = tx.send(());
    pinger
        .join()
        .map_err(|_| io::Error::other("the PING thread panicked"))?
        .map(|us| us as f64)
}

/// Sends `n` requests (`make(i)`) on `c`, pipelined, and checks every reply.
pub fn pipelined(
    c: &mut Conn,
    n: usize,
    make: &dyn Fn(usize, &mut Vec<u8>),
    ok: &dyn Fn(&Reply) -> bool,
) -> io::Result<()> {
    const BATCH: usize = 1000;
    let mut sent = 0;
    while sent < n {
        let m = BATCH.min(n - sent);
        for i in sent..sent + m {
            make(i, c.out());
        }
        c.flush()?;
        for _ in 0..m {
            let r = c.read_reply()?;
            if !ok(&r) {
                return Err(io::Error::other(format!("unexpected reply {}", r.show())));
            }
        }
        sent += m;
    }
    Ok(())
}

pub fn run(port: u16, samples: usize, stall_locks: usize) -> io::Result<Results> {
    let mut bound = Vec::new();
    for i in 0..samples {
        bound.push(kill_to_grant(port, &format!("bind:{i}"), true)?);
    }
    let mut lease = Vec::new();
    for i in 0..3 {
        lease.push(kill_to_grant(port, &format!("lease:{i}"), false)?);
    }

    // Keepalive against a RENEW per lock, 1,000 locks, 20 rounds each.
    let locks = 1000;
    let mut c = crate::server::connect(port)?;
    pipelined(
        &mut c,
        locks,
        &|i, b| {
            encode(
                b,
                &[
                    Arg::B(b"LOCK.ACQUIRE"),
                    Arg::K(b"ka:", i),
                    Arg::B(b"o"),
                    Arg::B(b"60000"),
                    Arg::B(b"BIND"),
                ],
            )
        },
        &|r| r.as_int().is_some_and(|t| t > 0),
    )?;
    let mut keep = Vec::new();
    let mut renew = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let n = c.call(&[b"LOCK.KEEPALIVE", b"60000"])?;
        keep.push(stats::micros(t.elapsed()) as f64);
        if n.as_int() != Some(locks as i64) {
            return Err(io::Error::other(format!("KEEPALIVE renewed {}", n.show())));
        }
        let t = Instant::now();
        pipelined(
            &mut c,
            locks,
            &|i, b| {
                encode(
                    b,
                    &[
                        Arg::B(b"LOCK.RENEW"),
                        Arg::K(b"ka:", i),
                        Arg::B(b"o"),
                        Arg::B(b"60000"),
                    ],
                )
            },
            &|r| *r == Reply::Int(1),
        )?;
        renew.push(stats::micros(t.elapsed()) as f64);
    }
    drop(c);

    // Disconnect stalls.
    let mut stalls = Vec::new();
    let fill = |bind: bool| -> io::Result<Conn> {
        let mut h = crate::server::connect(port)?;
        pipelined(
            &mut h,
            stall_locks,
            &|i, b| {
                let mut args = vec![
                    Arg::B(b"LOCK.ACQUIRE"),
                    Arg::K(if bind { b"sb:" } else { b"su:" }, i),
                    Arg::B(b"o"),
                    Arg::B(b"600000"),
                ];
                if bind {
                    args.push(Arg::B(b"BIND"));
                }
                encode(b, &args);
            },
            &|r| r.as_int().is_some_and(|t| t > 0),
        )?;
        Ok(h)
    };
    let h = fill(true)?;
    stalls.push((
        "closing a connection with its bound locks (all released, replicated)",
        longest_ping_during(port, move || {
            drop(h);
            Ok(())
        })?,
    ));
    // Released a share per timer tick: wait for the last one, and time it
    // from the close (the act above started about 50 ms into that window).
    let mut probe = crate::server::connect(port)?;
    let waited = Instant::now();
    loop {
        if probe.try_info_field("lock", "lock_bound_holders")? == "0" {
            break;
        }
        if waited.elapsed() > Duration::from_secs(60) {
            return Err(io::Error::other(
                "bound holders left a minute after the close",
            ));
        }
        thread::sleep(Duration::from_millis(5));
    }
    let all_released_us = stats::micros(waited.elapsed()) as f64 + 300_000.0;
    let h = fill(false)?;
    stalls.push((
        "closing a connection whose locks are not bound (nothing to do)",
        longest_ping_during(port, move || {
            drop(h);
            Ok(())
        })?,
    ));
    for (label, cmd) in [
        ("`DEL` of a list of as many elements", b"DEL".as_slice()),
        (
            "`UNLINK` of a list of as many elements",
            b"UNLINK".as_slice(),
        ),
    ] {
        let mut l = crate::server::connect(port)?;
        pipelined(
            &mut l,
            stall_locks / 100,
            &|i, b| {
                let mut args = vec![Arg::B(b"RPUSH"), Arg::B(b"biglist")];
                for j in 0..100 {
                    args.push(Arg::K(b"e", i * 100 + j));
                }
                encode(b, &args);
            },
            &|r| r.as_int().is_some(),
        )?;
        stalls.push((
            label,
            longest_ping_during(port, move || l.ok(&[cmd, b"biglist"]).map(|_| ()))?,
        ));
    }
    probe.ok(&[b"FLUSHALL"])?;
    Ok(Results {
        bound: Percentiles::new(bound),
        lease: Percentiles::new(lease),
        keepalive_us: stats::median(&keep),
        renews_us: stats::median(&renew),
        locks,
        stalls,
        stall_locks,
        all_released_us,
    })
}

pub fn table(r: &Results) -> String {
    let mut s = String::from("### 6. Locks bound to their connection (`BIND`)\n\n");
    s.push_str("Kill to grant: a holder process killed with SIGKILL while another client waits (`WAIT`).\n\n");
    s.push_str("| holder | samples | p50 | p99 | max |\n|---|---:|---:|---:|---:|\n");
    for (label, p) in [
        (
            "`LOCK.ACQUIRE ... BIND`: freed when the connection closes",
            &r.bound,
        ),
        (
            "without `BIND` (every other Redis lock): freed at the end of the lease (2 s here)",
            &r.lease,
        ),
    ] {
        s.push_str(&format!(
            "| {label} | {} | {} | {} | {} |\n",
            p.len(),
            stats::dur_us(p.at(50.0)),
            stats::dur_us(p.at(99.0)),
            stats::dur_us(p.max())
        ));
    }
    s.push_str(&format!(
        "\nRenewing {} locks held by one connection (median of 20 rounds): one `LOCK.KEEPALIVE` {} against {} `LOCK.RENEW`s pipelined {}: {:.1}x less server time, and one round trip and one timer per connection instead of one per lock.\n\n",
        r.locks,
        stats::dur_us(r.keepalive_us),
        r.locks,
        stats::dur_us(r.renews_us),
        r.renews_us / r.keepalive_us
    ));
    s.push_str(&format!(
        "Longest event-loop stall (longest PING round trip on another connection) while the server frees {} items:\n\n| what | longest PING |\n|---|---:|\n",
        r.stall_locks
    ));
    for (label, us) in &r.stalls {
        s.push_str(&format!("| {label} | {} |\n", stats::dur_us(*us)));
    }
    s.push_str(&format!(
        "\nThe {} bound locks were all released (replicated, waiters woken) within {} of the close, a share each timer tick.\n",
        r.stall_locks,
        stats::dur_us(r.all_released_us)
    ));
    s
}

// ---------------------------------------------------------------------------
// Instructions (callgrind): what `BIND` adds to a grant and to a release
// ---------------------------------------------------------------------------

/// The lease of the profiled grants: an hour, as the profile's.
const PROFILE_TTL: &[u8] = b"3600000";
/// How many bound locks the connection holds already in the `-100k` rows.
pub const FILL: usize = 100_000;

/// One measured request: a grant or a release, bound or not.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cost {
    Acquire,
    AcquireBind,
    Release,
    ReleaseBind,
}

impl Cost {
    const ALL: [Cost; 4] = [
        Cost::Acquire,
        Cost::AcquireBind,
        Cost::Release,
        Cost::ReleaseBind,
    ];

    fn bound(self) -> bool {
        matches!(self, Cost::AcquireBind | Cost::ReleaseBind)
    }

    /// The row, with `-100k` when the connection holds [`FILL`] more
    /// locks, bound as this one. `lock-` rows are gated by `make
    /// bench-check`: all but the unbound ones with the fill (`base:`),
    /// which only the full profile measures.
    fn row(self, filled: bool) -> String {
        let what = match self {
            Cost::Acquire => "acquire",
            Cost::AcquireBind => "acquire-bind",
            Cost::Release => "release",
            Cost::ReleaseBind => "release-bind",
        };
        match (filled, self.bound()) {
            (false, _) => format!("lock-bind:{what}"),
            (true, true) => format!("lock-bind:{what}-100k"),
            (true, false) => format!("base:bind-{what}-100k"),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Cost::Acquire => "`LOCK.ACQUIRE k o 3600000`",
            Cost::AcquireBind => "`LOCK.ACQUIRE k o 3600000 BIND`",
            Cost::Release => "`LOCK.RELEASE k o` (held unbound)",
            Cost::ReleaseBind => "`LOCK.RELEASE k o` (held with `BIND`)",
        }
    }
}

/// `LOCK.ACQUIRE <prefix>i o 3600000 [BIND]`.
fn encode_grant(prefix: &'static [u8], i: usize, bind: bool, buf: &mut Vec<u8>) {
    let mut args = vec![
        Arg::B(b"LOCK.ACQUIRE"),
        Arg::K(prefix, i),
        Arg::B(b"o"),
        Arg::B(PROFILE_TTL),
    ];
    if bind {
        args.push(Arg::B(b"BIND"));
    }
    encode(buf, &args);
}

/// The grants and releases, bound and not, on one server with `module`
/// under callgrind (the profile's steps, [`crate::profile`]): first on a
/// connection holding only the measured locks, then on one holding
/// [`FILL`] more, bound as the measured ones are (taken with callgrind's
/// instrumentation off). Its dumps go below `dir`. Without `all`, only the
/// rows `make bench-check` gates. The server's clocks stand still in each
/// measured step ([`Profiled::start_frozen`]): a bound grant's lease slots
/// then depend on the requests, not on how slowly callgrind ran them.
pub fn profile(dir: &Path, module: &Path, requests: usize, all: bool) -> io::Result<Vec<Row>> {
    let sub = dir.join("bind-module");
    std::fs::create_dir_all(&sub)?;
    let mut p = Profiled::start_frozen(&profile::options(Some(module), sub))?;
    let mut rows = Vec::new();
    for filled in [false, true] {
        for cost in Cost::ALL {
            let bind = cost.bound();
            if filled && !bind && !all {
                continue;
            }
            let release = matches!(cost, Cost::Release | Cost::ReleaseBind);
            let prepare = |p: &mut Profiled, offset: usize, n: usize| -> io::Result<()> {
                // The fill once, before the measured keys (after the warm-up's).
                if filled && offset == 0 {
                    p.uninstrumented(|p| {
                        p.run(
                            "fill",
                            (FILL, 0, 1),
                            &|_, i, b| encode_grant(b"fill:", i, bind, b),
                            &|r| r.as_int().is_some_and(|t| t > 0),
                        )
                    })?;
                }
                if !release {
                    return Ok(());
                }
                p.run(
                    "prepare",
                    (n, offset, 1),
                    &|_, i, b| encode_grant(KEY_PREFIX, i, bind, b),
                    &|r| r.as_int().is_some_and(|t| t > 0),
                )
            };
            let name = cost.row(filled);
            let per_request = p.measure(
                &name,
                (requests, 1),
                &prepare,
                &|_, i, b| match release {
                    true => encode(
                        b,
                        &[Arg::B(b"LOCK.RELEASE"), Arg::K(KEY_PREFIX, i), Arg::B(b"o")],
                    ),
                    false => encode_grant(KEY_PREFIX, i, bind, b),
                },
                &|r| match release {
                    true => *r == Reply::Int(1),
                    false => r.as_int().is_some_and(|t| t > 0),
                },
            )?;
            rows.push(Row { name, per_request });
        }
    }
    Ok(rows)
}

/// The goal: a bound grant or release at most this many times the unbound.
const BIND_GOAL: f64 = 1.10;

/// The callgrind table (Markdown) of [`profile`]'s rows from the last of
/// `runs`; empty when they were not measured.
pub fn callgrind_table(runs: &[Vec<Row>], requests: usize) -> String {
    let Some(rows) = runs.last() else {
        return String::new();
    };
    let get = |name: &str| {
        rows.iter()
            .find(|r| r.name == name)
            .map_or(f64::NAN, |r| r.per_request)
    };
    if get(&Cost::AcquireBind.row(false)).is_nan() {
        return String::new();
    }
    let mut s = format!(
        "\n### 6b. What `BIND` costs: instructions per request (callgrind, server side, {requests} requests each, one connection, one request at a time; request i on lock `k:i`)\n\n"
    );
    s.push_str("| the connection holds | command | instructions/request | vs unbound | goal |\n");
    s.push_str("|---|---|---:|---:|---|\n");
    for filled in [false, true] {
        let holds = match filled {
            false => format!("the measured locks only (0 to {requests})"),
            true => format!("{FILL} more, bound as the measured ones"),
        };
        for (bound, base) in [
            (Cost::AcquireBind, Cost::Acquire),
            (Cost::ReleaseBind, Cost::Release),
        ] {
            let (b, u) = (get(&bound.row(filled)), get(&base.row(filled)));
            let ratio = b / u;
            let verdict = match ratio <= BIND_GOAL {
                true => format!("at most {BIND_GOAL:.2}x: met"),
                false => format!("at most {BIND_GOAL:.2}x: not met"),
            };
            s.push_str(&format!(
                "| {holds} | {} | {u:.0} | |  |\n| | {} | {b:.0} | {ratio:.3}x | {verdict} |\n",
                base.label(),
                bound.label()
            ));
        }
    }
    s
}
