//! Section 10: stalls (issue 38). For each shape of state a client can
//! build, the longest PING round trip on another connection while the work
//! happens (how long the event loop was held), the request's own server
//! time (`INFO commandstats`, usec per call), its round trip, how late
//! `WAIT` deadlines were answered where that applies, and the worst event of
//! `LATENCY LATEST` (`latency-monitor-threshold 1`: Redis's own record of a
//! command that ran 1 ms or more).
//!
//! The shapes: (1) readers x waiting writers x keys, a request by a reader
//! on a key whose holder waits for nothing (and one closing a cycle); (2) a
//! request joining a chain of waits in its middle, and one closing a cycle
//! through the whole chain; (3) `WAIT`s with one deadline on one held key
//! (and over many keys), readers freed together (the holder limit raised,
//! and at its default), waiters of one session's keys; the worst
//! `LATENCY LATEST` event shows a `lock-tick`, a tick of the module that
//! used a millisecond or more of the main thread's CPU;
//! (4) `LOCK.KEEPALIVE` with many bound holders, alone and inside MULTI; (5)
//! the close of a connection holding them; (6) keyspace commands on a key
//! with 20,000 holders; (7) `FLUSHDB`, `FLUSHALL` and `SWAPDB` of a
//! database with a million bound holders, or a session's million holders,
//! beside the same of a million plain keys (Redis's own part); (8) readers
//! granted one by one on a master, applied by a replica; (9) a million
//! bound grants in a row, pipelined, each command's own time from
//! `SLOWLOG` (the longest, and how many took over 1 ms: a map of the
//! module's that grew all at once shows here), then their releases in
//! rounds of every other one; (10) `SWAPDB` while
//! thousands of multi-key requests wait in both databases; (11) the
//! promotion of a replica where many leases ran out; (12) thousands of
//! waiters of one key answered an error together (a `SET` over the lock
//! key); (13) grants, repeats, renewals and releases on one key with
//! hundreds of thousands of readers (`lock.max-holders` raised). Its own
//! server (waiters connect over a Unix socket;
//! the open-file limit raised where the bench may, else a chain too long
//! for it is built of `LOCK.MACQUIRE`s of ten keys, the same graph), never
//! part of `make bench-check`: wall-clock figures on a shared machine.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{encode_strs, Conn, Reply};
use crate::server::{self, Options, Server, TempDir};
use crate::stats;

/// Sizes of one run.
pub struct Plan {
    /// Readers holding every key of the fan.
    pub fan_readers: usize,
    /// Connections waiting as writers on all the keys of the fan.
    pub fan_writers: usize,
    pub fan_keys: Vec<usize>,
    /// Requests in a chain of waits (section 7's shape: 10 a key).
    pub chains: Vec<usize>,
    /// `WAIT`s with one deadline on one key.
    pub deadlines: usize,
    /// Bound holders of one connection.
    pub bound: Vec<usize>,
    /// Holders of one key.
    pub holders: usize,
    /// Bound holders, and a session's holders, a flush or swap finds.
    pub flush: usize,
    /// Bound grants in a row of shape (9).
    pub grants: usize,
    /// Connections waiting, each a `LOCK.MACQUIRE` of ten keys, half in
    /// each database, at the `SWAPDB` of shape (10).
    pub swap_waiters: usize,
    /// Keys of two readers whose first reader's lease runs out on a replica
    /// before its promotion, shape (11).
    pub promoted: usize,
    /// Readers of one key, shape (13): a run for each count.
    pub wide: Vec<usize>,
    /// `--shapes 1,3`: those shapes alone (all when `None`).
    pub shapes: Option<Vec<u32>>,
}

impl Plan {
    pub fn full() -> Plan {
        Plan {
            fan_readers: 1000,
            fan_writers: 10_000,
            fan_keys: vec![30, 100],
            chains: vec![10_000, 100_000],
            deadlines: 10_000,
            bound: vec![100_000, 1_000_000],
            holders: 20_000,
            flush: 1_000_000,
            grants: 1_000_000,
            swap_waiters: 10_000,
            promoted: 200_000,
            wide: vec![200_000, 1_000_000],
            shapes: None,
        }
    }

    pub fn quick() -> Plan {
        Plan {
            fan_readers: 100,
            fan_writers: 1000,
            fan_keys: vec![30],
            chains: vec![1000, 10_000],
            deadlines: 1000,
            bound: vec![10_000, 100_000],
            holders: 2000,
            flush: 100_000,
            grants: 100_000,
            swap_waiters: 1000,
            promoted: 20_000,
            wide: vec![20_000],
            shapes: None,
        }
    }

    /// The most connections open at once (the longest chain).
    fn connections(&self) -> usize {
        self.chains
            .iter()
            .copied()
            .chain([self.fan_writers + 1, self.deadlines, self.swap_waiters])
            .max()
            .unwrap_or(0)
    }
}

/// One row of the table.
pub struct Row {
    pub shape: String,
    /// The longest PING round trip while it happened.
    pub ping: Duration,
    /// Server time of the request (µs per call, `INFO commandstats`).
    pub server_us: Option<f64>,
    /// The request's round trip, or how long the work took.
    pub took: Option<Duration>,
    /// How late the nils came after their deadline: p50 and max.
    pub late: Option<(Duration, Duration)>,
    /// `LATENCY LATEST`'s worst event: name and ms.
    pub latency: Option<(String, i64)>,
    pub note: String,
}

impl Row {
    fn new(shape: String, m: Measured) -> Row {
        Row {
            shape,
            ping: m.ping,
            server_us: m.server_us,
            took: Some(m.took),
            late: None,
            latency: m.latency,
            note: String::new(),
        }
    }

    fn note(mut self, note: impl Into<String>) -> Row {
        self.note = note.into();
        self
    }
}

/// PINGs on its own connection until stopped: each round trip, when it
/// ended and how long it took.
struct Pinger {
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<Vec<(Instant, Duration)>>,
}

impl Pinger {
    fn start(port: u16) -> io::Result<Pinger> {
        let mut c = server::connect(port)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = thread::spawn(move || {
            let mut trips = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let t = Instant::now();
                if c.call(&[b"PING"]).is_err() {
                    break;
                }
                let end = Instant::now();
                trips.push((end, end - t));
            }
            trips
        });
        Ok(Pinger { stop, thread })
    }

    /// The longest round trip.
    fn stop(self) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.join() {
            Ok(trips) => trips.iter().map(|(_, d)| *d).max().unwrap_or_default(),
            Err(_) => Duration::MAX,
        }
    }
}

/// What one measured act gave.
struct Measured {
    ping: Duration,
    server_us: Option<f64>,
    took: Duration,
    latency: Option<(String, i64)>,
    reply: Option<Reply>,
}

/// `(calls, usec)` of `cmdstat_<name>` (zero when never called).
fn cmdstat(c: &mut Conn, name: &str) -> io::Result<(f64, f64)> {
    let text = c.ok(&[b"INFO", b"commandstats"])?.text();
    let prefix = format!("cmdstat_{name}:");
    let Some(line) = text.lines().find_map(|l| l.strip_prefix(prefix.as_str())) else {
        return Ok((0.0, 0.0));
    };
    let field = |f: &str| -> f64 {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    Ok((field("calls"), field("usec")))
}

/// `LATENCY LATEST`'s worst event since the last `LATENCY RESET`.
fn latency_worst(c: &mut Conn) -> io::Result<Option<(String, i64)>> {
    let r = c.ok(&[b"LATENCY", b"LATEST"])?;
    let Reply::Array(events) = r else {
        return Ok(None);
    };
    Ok(events
        .iter()
        .filter_map(|e| match e {
            Reply::Array(f) => {
                let name = f.first()?.text();
                let max = f.get(3)?.as_int()?;
                Some((name, max))
            }
            _ => None,
        })
        .max_by_key(|(_, ms)| *ms))
}

/// The server's clients blocked now (`INFO clients`).
fn blocked_clients(c: &mut Conn) -> io::Result<u64> {
    c.try_info_field("clients", "blocked_clients")?
        .parse()
        .map_err(|_| io::Error::other("blocked_clients is not a number"))
}

fn stat(c: &mut Conn, field: &str) -> io::Result<u64> {
    c.try_info_field("lock", field)?
        .parse()
        .map_err(|_| io::Error::other(format!("{field} is not a number")))
}

fn wait_stat(c: &mut Conn, field: &str, what: &str, want: impl Fn(u64) -> bool) -> io::Result<()> {
    wait_for(c, |c| stat(c, field), what, want)
}

/// Waits until `want(read(c))`, ten minutes at most.
fn wait_for(
    c: &mut Conn,
    read: impl Fn(&mut Conn) -> io::Result<u64>,
    what: &str,
    want: impl Fn(u64) -> bool,
) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if want(read(c)?) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(io::Error::other(format!("timed out waiting for {what}")));
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// `CONFIG RESETSTAT`, then `INFO lock` at once: the module sees a reset
/// at its next look (design.md, "What the module hears"), and what the
/// act counted before a look the module's timer made up to a second later
/// would go with the reset (a count waited for could then never come).
fn reset_stats(c: &mut Conn) -> io::Result<()> {
    c.ok(&[b"CONFIG", b"RESETSTAT"])?;
    c.ok(&[b"INFO", b"lock"])?;
    Ok(())
}

/// Runs `act` (which returns its reply, if a request) with the statistics
/// reset before and a PING loop on another connection around it; `done`
/// says when the work it started is over (a close's releases); `stat_of`
/// names the command whose server time counts.
fn measure(
    c: &mut Conn,
    port: u16,
    stat_of: Option<&str>,
    act: &mut dyn FnMut(&mut Conn) -> io::Result<Option<Reply>>,
    done: &mut dyn FnMut(&mut Conn) -> io::Result<bool>,
) -> io::Result<Measured> {
    reset_stats(c)?;
    c.ok(&[b"LATENCY", b"RESET"])?;
    let pinger = Pinger::start(port)?;
    thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    let reply = act(c)?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while !done(c)? && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(1));
    }
    let took = t.elapsed();
    // What the act left to the module's timer.
    thread::sleep(Duration::from_millis(100));
    let ping = pinger.stop();
    let server_us = match stat_of {
        Some(name) => {
            let (calls, usec) = cmdstat(c, name)?;
            (calls > 0.0).then(|| usec / calls)
        }
        None => None,
    };
    let latency = latency_worst(c)?;
    Ok(Measured {
        ping,
        server_us,
        took,
        latency,
        reply,
    })
}

/// One request on `c`, measured.
fn request(c: &mut Conn, port: u16, stat_of: &str, args: &[&[u8]]) -> io::Result<Measured> {
    measure(
        c,
        port,
        Some(stat_of),
        &mut |c| c.call(args).map(Some),
        &mut |_| Ok(true),
    )
}

/// [`request`], and the server main thread's CPU time from just before the
/// request was sent until its reply, in ms (`INFO cpu`): the module's work
/// (a search going on over many turns) and Redis's own between its slices
/// (the PING loop among it), whatever share of the cores the machine's load
/// leaves the server.
fn request_cpu(
    c: &mut Conn,
    port: u16,
    stat_of: &str,
    args: &[&[u8]],
) -> io::Result<(Measured, f64)> {
    let mut cpu = f64::NAN;
    let m = measure(
        c,
        port,
        Some(stat_of),
        &mut |c| {
            let before = main_thread_cpu(c)?;
            let reply = c.call(args)?;
            cpu = (main_thread_cpu(c)? - before) * 1000.0;
            Ok(Some(reply))
        },
        &mut |_| Ok(true),
    )?;
    Ok((m, cpu))
}

/// The server main thread's CPU time so far, in seconds (user and system).
fn main_thread_cpu(c: &mut Conn) -> io::Result<f64> {
    let text = c.ok(&[b"INFO", b"cpu"])?.text();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(':')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(f64::NAN)
    };
    Ok(field("used_cpu_user_main_thread") + field("used_cpu_sys_main_thread"))
}

/// Connections that wait: each written one request and left blocked.
struct Waiters {
    socks: Vec<UnixStream>,
    /// How many of them wait in the server now (`lock_waiters`).
    waiting: fn(&mut Conn) -> io::Result<u64>,
    /// When their requests time out together, if they do
    /// ([`Waiters::timing_out_at`]).
    until: Option<Instant>,
}

impl Waiters {
    fn open(sock: &Path, n: usize) -> io::Result<Waiters> {
        Waiters::counted(sock, n, |c| stat(c, "lock_waiters"))
    }

    /// `n` connections whose requests waiting are counted by `waiting`.
    fn counted(
        sock: &Path,
        n: usize,
        waiting: fn(&mut Conn) -> io::Result<u64>,
    ) -> io::Result<Waiters> {
        let mut socks = Vec::with_capacity(n);
        for _ in 0..n {
            socks.push(UnixStream::connect(sock)?);
        }
        Ok(Waiters {
            socks,
            waiting,
            until: None,
        })
    }

    /// Their requests all time out at `at`: writing them stops with an
    /// error once it is past (on a loaded machine the first ones could
    /// time out before the last are queued, and the count waited for
    /// would never come).
    fn timing_out_at(&mut self, at: Instant) {
        self.until = Some(at);
    }

    /// Writes `make(i)`'s request to connection `i`, in batches of
    /// `batch`, each waited for (the requests waiting reaching `before`
    /// plus the requests written) so that every request is in the server
    /// when the next batch is written.
    fn write(
        &mut self,
        c: &mut Conn,
        batch: usize,
        make: &mut dyn FnMut(usize) -> Vec<u8>,
    ) -> io::Result<()> {
        let before = (self.waiting)(c)?;
        let n = self.socks.len();
        let mut i = 0;
        while i < n {
            let end = (i + batch).min(n);
            for (j, s) in self.socks.iter_mut().enumerate().take(end).skip(i) {
                s.write_all(&make(j))?;
            }
            i = end;
            let want = before + i as u64;
            let until = self.until;
            let late = || until.is_some_and(|u| Instant::now() >= u);
            wait_for(c, self.waiting, "the waiters to queue", |w| {
                w >= want || late()
            })?;
            if late() {
                return Err(io::Error::other(
                    "the requests were written too slowly for their common deadline",
                ));
            }
        }
        Ok(())
    }

    /// Closes them all and waits until no request waits.
    fn close(self, c: &mut Conn) -> io::Result<()> {
        drop(self.socks);
        wait_for(c, self.waiting, "the waiters to leave", |w| w == 0)
    }
}

fn cmd(args: &[&[u8]]) -> Vec<u8> {
    let mut buf = Vec::new();
    encode_strs(&mut buf, args);
    buf
}

/// `n` requests `make(i)` pipelined on `c` in batches, every reply checked.
fn pipelined(
    c: &mut Conn,
    n: usize,
    make: &dyn Fn(usize) -> Vec<Vec<u8>>,
    ok: &dyn Fn(&Reply) -> bool,
) -> io::Result<()> {
    const BATCH: usize = 2000;
    let mut i = 0;
    while i < n {
        let end = (i + BATCH).min(n);
        for j in i..end {
            let args = make(j);
            let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            c.push(&refs);
        }
        c.flush()?;
        for _ in i..end {
            let r = c.read_reply()?;
            if !ok(&r) {
                return Err(io::Error::other(format!("unexpected reply {}", r.show())));
            }
        }
        i = end;
    }
    Ok(())
}

fn is_token(r: &Reply) -> bool {
    r.as_int().is_some_and(|t| t > 0)
}

fn is_deadlock(r: &Reply) -> bool {
    matches!(r, Reply::Error(e) if e.starts_with("DEADLOCK"))
}

fn show(r: &Option<Reply>) -> String {
    match r {
        Some(Reply::Nil) => "nil".into(),
        Some(Reply::Error(e)) => e.split_whitespace().next().unwrap_or("").to_string(),
        Some(r) => r.show(),
        None => "-".into(),
    }
}

const TTL: &[u8] = b"3600000";

/// The soft limit on open files, raised to `want` when it is lower (as
/// root, or within the hard limit): what the bench and the server it
/// starts next may open.
fn raise_fd_limit(want: usize) -> usize {
    let read = || -> Option<usize> {
        fs::read_to_string("/proc/self/limits")
            .ok()?
            .lines()
            .find(|l| l.starts_with("Max open files"))?
            .split_whitespace()
            .nth(3)?
            .parse()
            .ok()
    };
    let now = read().unwrap_or(1024);
    if now >= want {
        return now;
    }
    let _ = std::process::Command::new("prlimit")
        .args([
            "--pid",
            &std::process::id().to_string(),
            &format!("--nofile={want}:{want}"),
        ])
        .status();
    read().unwrap_or(now)
}

/// (1) `readers` hold each of `keys` keys (`LOCK.READ`, one connection
/// grants them all), `writers` connections wait as writers on all the keys
/// (`LOCK.MACQUIRE keys ... WAIT 0`; the first also holds `zc`); then
/// `reader-0` asks for `z`, held by an owner who waits for nothing, and for
/// `zc`, which closes a cycle (`DEADLOCK`).
fn fan(
    c: &mut Conn,
    port: u16,
    sock: &Path,
    readers: usize,
    writers: usize,
    keys: usize,
) -> io::Result<Vec<Row>> {
    eprintln!("   fan: {readers} readers x {writers} waiting writers x {keys} keys");
    c.ok(&[b"FLUSHALL"])?;
    let names: Vec<Vec<u8>> = (0..keys).map(|k| format!("f{k}").into_bytes()).collect();
    pipelined(
        c,
        readers * keys,
        &|i| {
            vec![
                b"LOCK.READ".to_vec(),
                names[i % keys].clone(),
                format!("reader-{}", i / keys).into_bytes(),
                TTL.to_vec(),
            ]
        },
        &is_token,
    )?;
    c.ok(&[b"LOCK.ACQUIRE", b"z", b"z-holder", TTL])?;
    c.ok(&[b"LOCK.ACQUIRE", b"zc", b"writer-0", TTL])?;
    let mut w = Waiters::open(sock, writers)?;
    let numkeys = keys.to_string();
    let started = Instant::now();
    w.write(c, 100, &mut |i| {
        let owner = format!("writer-{i}");
        let mut args: Vec<&[u8]> = vec![b"LOCK.MACQUIRE", numkeys.as_bytes()];
        args.extend(names.iter().map(Vec::as_slice));
        args.extend([owner.as_bytes(), TTL, b"WAIT", b"0"]);
        cmd(&args)
    })?;
    eprintln!(
        "   ({:.1} s to queue them)",
        started.elapsed().as_secs_f64()
    );
    let shape = format!("(1) {readers} readers x {writers} waiting writers x {keys} keys");
    let m = request(
        c,
        port,
        "lock.acquire",
        &[b"LOCK.ACQUIRE", b"z", b"reader-0", b"1000", b"WAIT", b"1"],
    )?;
    let plain = Row::new(
        format!("{shape}: `LOCK.ACQUIRE z reader-0 1000 WAIT 1`, z's holder waits for nothing"),
        m.clone_reply(),
    )
    .note(format!("answered {}", show(&m.reply)));
    let (m, cpu) = request_cpu(
        c,
        port,
        "lock.acquire",
        &[
            b"LOCK.ACQUIRE",
            b"zc",
            b"reader-0",
            b"1000",
            b"WAIT",
            b"10000",
        ],
    )?;
    let found = m.reply.as_ref().is_some_and(is_deadlock);
    let cycle = Row::new(
        format!("{shape}: the same reader closing a cycle (`zc` held by a waiting writer)"),
        m.clone_reply(),
    )
    .note(format!(
        "answered {}{}; main thread CPU {cpu:.1} ms",
        show(&m.reply),
        if found { "" } else { " (not DEADLOCK)" }
    ));
    w.close(c)?;
    c.ok(&[b"FLUSHALL"])?;
    Ok(vec![plain, cycle])
}

impl Measured {
    /// A copy without the reply (a row keeps only the figures).
    fn clone_reply(&self) -> Measured {
        Measured {
            ping: self.ping,
            server_us: self.server_us,
            took: self.took,
            latency: self.latency.clone(),
            reply: None,
        }
    }
}

/// (2) A chain of `n` waiting requests over `n / 10` keys (section 7's
/// shape: key `k<i>` held by `o<i>`, who waits for the ten keys below its
/// own); then `o<mid>` asks for `side`, held by an owner further down (the
/// request joins the chain in its middle: no cycle), and `o0`, at the
/// bottom, asks for the top key (a cycle through the whole chain).
///
/// `multi`: each owner's ten waits are one `LOCK.MACQUIRE` of its ten keys
/// on one connection instead of ten requests on ten: the same wait-for
/// graph, `n` requests queued on the keys, a tenth of the connections (what
/// fits a limit of 20,000 open files for `n` = 100,000).
fn chain(c: &mut Conn, port: u16, sock: &Path, n: usize, multi: bool) -> io::Result<Vec<Row>> {
    eprintln!("   chain of {n}{}", if multi { " (MACQUIRE)" } else { "" });
    c.ok(&[b"FLUSHALL"])?;
    let keys = (n / 10).max(2);
    pipelined(
        c,
        keys,
        &|i| {
            vec![
                b"LOCK.ACQUIRE".to_vec(),
                format!("k{i}").into_bytes(),
                format!("o{i}").into_bytes(),
                TTL.to_vec(),
            ]
        },
        &is_token,
    )?;
    let mid = keys / 2;
    let below = mid.saturating_sub(20);
    c.ok(&[
        b"LOCK.ACQUIRE",
        b"side",
        format!("o{below}").as_bytes(),
        TTL,
    ])?;
    // Who waits for key `i`: `o<i+1>` .. `o<i+10>`, `x<j>` above the top.
    let owner = |j: usize| match j < keys {
        true => format!("o{j}"),
        false => format!("x{j}"),
    };
    let started = Instant::now();
    let w = match multi {
        false => {
            let mut w = Waiters::open(sock, keys * 10)?;
            w.write(c, 100, &mut |j| {
                let (i, m) = (j / 10, j % 10);
                cmd(&[
                    b"LOCK.ACQUIRE",
                    format!("k{i}").as_bytes(),
                    owner(i + 1 + m).as_bytes(),
                    TTL,
                    b"WAIT",
                    b"0",
                ])
            })?;
            w
        }
        true => {
            // Owner `j` (1 ..= keys + 9) waits for the keys `j - 10` ..
            // `j - 1` that exist, in one request.
            let mut w = Waiters::open(sock, keys + 9)?;
            w.write(c, 100, &mut |x| {
                let j = x + 1;
                let ks: Vec<Vec<u8>> = (j.saturating_sub(10)..j.min(keys))
                    .map(|i| format!("k{i}").into_bytes())
                    .collect();
                let numkeys = ks.len().to_string();
                let who = owner(j);
                let mut args: Vec<&[u8]> = vec![b"LOCK.MACQUIRE", numkeys.as_bytes()];
                args.extend(ks.iter().map(Vec::as_slice));
                args.extend([who.as_bytes(), TTL, b"WAIT", b"0"]);
                cmd(&args)
            })?;
            w
        }
    };
    eprintln!(
        "   ({:.1} s to queue them)",
        started.elapsed().as_secs_f64()
    );
    let form = match multi {
        true => format!("{n} (as {} `MACQUIRE`s of 10 keys)", keys + 9),
        false => n.to_string(),
    };
    let mid_owner = format!("o{mid}");
    let m = request(
        c,
        port,
        "lock.acquire",
        &[
            b"LOCK.ACQUIRE",
            b"side",
            mid_owner.as_bytes(),
            b"1000",
            b"WAIT",
            b"1000",
        ],
    )?;
    let middle = Row::new(
        format!("(2) a request joining a chain of {form} in its middle (no cycle; `WAIT 1000`)"),
        m.clone_reply(),
    )
    .note(format!("answered {}", show(&m.reply)));
    let top = format!("k{}", keys - 1);
    let (m, cpu) = request_cpu(
        c,
        port,
        "lock.acquire",
        &[
            b"LOCK.ACQUIRE",
            top.as_bytes(),
            b"o0",
            b"1000",
            b"WAIT",
            b"10000",
        ],
    )?;
    let found = m.reply.as_ref().is_some_and(is_deadlock);
    let cycle = Row::new(
        format!("(2) a request closing a cycle through the chain of {form} (`WAIT 10000`)"),
        m.clone_reply(),
    )
    .note(format!(
        "answered {}{}; main thread CPU {cpu:.1} ms",
        show(&m.reply),
        if found { "" } else { " (not DEADLOCK)" }
    ));
    w.close(c)?;
    c.ok(&[b"FLUSHALL"])?;
    Ok(vec![middle, cycle])
}

/// What falls together in shape (3).
#[derive(Clone, Copy)]
enum Together {
    /// `n` `WAIT`s with one deadline, on `keys` held keys (waiter `i` on
    /// key `i % keys`): answered nil.
    Nils { keys: usize },
    /// `n` readers wait behind a writer whose lease ends at the deadline,
    /// `lock.max-holders` raised to fit (`raised`: all granted together)
    /// or at its default (the first 1,000 granted, the rest wait).
    Readers { raised: bool },
    /// `n` waiters on `n` keys held by one session that ends at the
    /// deadline: each granted its key.
    Session,
    /// Redis alone, the floor beside the nils: `n` clients in `BLPOP` on
    /// one empty list with one deadline, answered nil by Redis's own
    /// timeouts (no module code runs).
    Blpop,
}

/// (3) `n` requests answered together at one common moment: `WAIT`s with
/// one deadline (each sent with the time left to it; written 100 at a
/// time, each batch in the server before the next is written) on one key
/// or spread over keys, or waiters freed by one lease's or one session's
/// end. How late the server answered them (`lock_waiters` read in a loop
/// on another connection: p50 when half had been answered, max when the
/// last was), and the longest PING meanwhile.
fn together(c: &mut Conn, port: u16, sock: &Path, n: usize, what: Together) -> io::Result<Row> {
    c.ok(&[b"FLUSHALL"])?;
    let target = Instant::now() + Duration::from_millis(3000 + n as u64 / 5);
    let left_ms = || {
        target
            .saturating_duration_since(Instant::now())
            .as_millis()
            .max(1)
            .to_string()
    };
    let shape = match what {
        Together::Nils { keys: 1 } => format!("(3) {n} `WAIT`s on one held key with one deadline"),
        Together::Nils { keys } => {
            format!("(3) {n} `WAIT`s with one deadline spread over {keys} held keys")
        }
        Together::Readers { raised: true } => {
            format!("(3) {n} readers waiting behind a writer whose lease ends, granted together")
        }
        Together::Readers { raised: false } => {
            format!("(3) {n} readers waiting behind a writer whose lease ends, at the default `lock.max-holders` (the first {DEFAULT_HOLDERS} granted together)")
        }
        Together::Session => {
            format!("(3) {n} waiters on {n} keys held by one session that ends, each granted")
        }
        Together::Blpop => {
            format!("(3) Redis alone: {n} `BLPOP`s on one empty list with one deadline")
        }
    };
    eprintln!("   {shape}");
    match what {
        Together::Nils { keys } => pipelined(
            c,
            keys,
            &|i| {
                vec![
                    b"LOCK.ACQUIRE".to_vec(),
                    format!("hot{i}").into_bytes(),
                    b"holder".to_vec(),
                    TTL.to_vec(),
                ]
            },
            &is_token,
        )?,
        Together::Readers { raised } => {
            if raised {
                set_max_holders(c, n + DEFAULT_HOLDERS)?;
            }
            c.ok(&[b"LOCK.ACQUIRE", b"hot0", b"writer", left_ms().as_bytes()])?;
        }
        Together::Session => {
            let id = c.call(&[b"LOCK.SESSION", b"OPEN", left_ms().as_bytes()])?;
            let id = id
                .as_int()
                .ok_or_else(|| io::Error::other(format!("LOCK.SESSION OPEN: {}", id.show())))?
                .to_string();
            pipelined(
                c,
                n,
                &|i| {
                    vec![
                        b"LOCK.ACQUIRE".to_vec(),
                        format!("hot{i}").into_bytes(),
                        b"holder".to_vec(),
                        TTL.to_vec(),
                        b"SESSION".to_vec(),
                        id.clone().into_bytes(),
                    ]
                },
                &is_token,
            )?;
        }
        Together::Blpop => {}
    }
    let mut w = match what {
        Together::Blpop => Waiters::counted(sock, n, blocked_clients)?,
        _ => Waiters::open(sock, n)?,
    };
    w.timing_out_at(target);
    let mut too_late = false;
    w.write(c, 100, &mut |i| {
        let left = left_ms();
        too_late |= left.len() < 3;
        let owner = format!("w{i}");
        match what {
            Together::Nils { keys } => cmd(&[
                b"LOCK.ACQUIRE",
                format!("hot{}", i % keys).as_bytes(),
                owner.as_bytes(),
                TTL,
                b"WAIT",
                left.as_bytes(),
            ]),
            Together::Readers { .. } => {
                cmd(&[b"LOCK.READ", b"hot0", owner.as_bytes(), TTL, b"WAIT", b"0"])
            }
            Together::Session => cmd(&[
                b"LOCK.ACQUIRE",
                format!("hot{i}").as_bytes(),
                owner.as_bytes(),
                TTL,
                b"WAIT",
                b"0",
            ]),
            // BLPOP's timeout is in seconds, to the millisecond.
            Together::Blpop => {
                let ms: u64 = left.parse().unwrap_or(1);
                let secs = format!("{}.{:03}", ms / 1000, ms % 1000);
                cmd(&[b"BLPOP", b"empty", secs.as_bytes()])
            }
        }
    })?;
    if too_late {
        return Err(io::Error::other(
            "the requests were written too slowly for their common deadline",
        ));
    }
    reset_stats(c)?;
    c.ok(&[b"LATENCY", b"RESET"])?;
    thread::sleep(
        target
            .saturating_duration_since(Instant::now())
            .saturating_sub(Duration::from_millis(200)),
    );
    let pinger = Pinger::start(port)?;
    let (mut half, mut last) = (None, None);
    let limit = Instant::now() + Duration::from_secs(60);
    // At the default holder limit, only the first readers are granted:
    // counted by their grants (the rest keep waiting).
    let answered = match what {
        Together::Readers { raised: false } => n.min(DEFAULT_HOLDERS),
        _ => n,
    };
    while last.is_none() && Instant::now() < limit {
        let done = match what {
            Together::Readers { raised: false } => stat(c, "lock_grants_after_wait")?,
            Together::Blpop => (n as u64).saturating_sub(blocked_clients(c)?),
            _ => (n as u64).saturating_sub(stat(c, "lock_waiters")?),
        };
        let at = Instant::now();
        if half.is_none() && done >= (answered / 2) as u64 {
            half = Some(at);
        }
        if done >= answered as u64 {
            last = Some(at);
        }
    }
    thread::sleep(Duration::from_millis(50));
    let ping = pinger.stop();
    let late =
        |at: Option<Instant>| at.map_or(Duration::MAX, |t| t.saturating_duration_since(target));
    // Every reply as expected: a nil, or a token.
    let (mut good, want) = match what {
        Together::Nils { .. } | Together::Blpop => (0, "answered nil"),
        _ => (0, "granted"),
    };
    for s in w.socks.iter_mut().take(answered) {
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut buf = [0u8; 5];
        let ok = match what {
            Together::Nils { .. } => s.read_exact(&mut buf).is_ok() && buf.starts_with(b"$-1"),
            // RESP2's nil array.
            Together::Blpop => s.read_exact(&mut buf).is_ok() && buf.starts_with(b"*-1"),
            _ => s.read(&mut buf).is_ok_and(|got| got > 1 && buf[0] == b':'),
        };
        good += usize::from(ok);
    }
    let latency = latency_worst(c)?;
    w.close(c)?;
    c.ok(&[b"FLUSHALL"])?;
    if let Together::Readers { raised: true } = what {
        set_max_holders(c, DEFAULT_HOLDERS)?;
    }
    Ok(Row {
        shape,
        ping,
        server_us: None,
        took: None,
        late: Some((late(half), late(last))),
        latency,
        note: format!("{good} of {answered} {want}"),
    })
}

/// `lock.max-holders` by default.
const DEFAULT_HOLDERS: usize = 1000;

/// Sets `lock.max-holders` to `n`.
fn set_max_holders(c: &mut Conn, n: usize) -> io::Result<()> {
    c.ok(&[
        b"CONFIG",
        b"SET",
        b"lock.max-holders",
        n.to_string().as_bytes(),
    ])?;
    Ok(())
}

/// (4) and (5): one connection holding `n` bound locks renews them with
/// `LOCK.KEEPALIVE`, alone and inside MULTI/EXEC, then closes.
fn bound(c: &mut Conn, port: u16, n: usize) -> io::Result<Vec<Row>> {
    eprintln!("   {n} bound holders");
    c.ok(&[b"FLUSHALL"])?;
    let mut h = server::connect(port)?;
    let started = Instant::now();
    pipelined(
        &mut h,
        n,
        &|i| {
            vec![
                b"LOCK.ACQUIRE".to_vec(),
                format!("b:{i}").into_bytes(),
                b"O".to_vec(),
                TTL.to_vec(),
                b"BIND".to_vec(),
            ]
        },
        &is_token,
    )?;
    eprintln!(
        "   ({:.1} s to grant them)",
        started.elapsed().as_secs_f64()
    );
    let count = |r: &Option<Reply>| r.as_ref().and_then(Reply::as_int);
    let m = request(&mut h, port, "lock.keepalive", &[b"LOCK.KEEPALIVE", TTL])?;
    let alone = Row::new(
        format!("(4) `LOCK.KEEPALIVE` with {n} bound holders"),
        m.clone_reply(),
    )
    .note(format!(
        "renewed {}",
        count(&m.reply).map_or("?".into(), |n| n.to_string())
    ));
    let m = measure(
        &mut h,
        port,
        Some("lock.keepalive"),
        &mut |h| {
            h.ok(&[b"MULTI"])?;
            h.call(&[b"LOCK.KEEPALIVE", TTL])?;
            h.call(&[b"EXEC"]).map(Some)
        },
        &mut |_| Ok(true),
    )?;
    let renewed = match &m.reply {
        Some(Reply::Array(a)) => a.first().and_then(Reply::as_int),
        _ => None,
    };
    let multi = Row::new(
        format!("(4) `LOCK.KEEPALIVE` inside MULTI/EXEC with {n} bound holders"),
        m.clone_reply(),
    )
    .note(format!(
        "renewed {}",
        renewed.map_or("?".into(), |n| n.to_string())
    ));
    let mut holder = Some(h);
    let m = measure(
        c,
        port,
        None,
        &mut |_| {
            drop(holder.take());
            Ok(None)
        },
        &mut |c| Ok(c.ok(&[b"DBSIZE"])?.as_int() == Some(0)),
    )?;
    let close = Row {
        server_us: None,
        ..Row::new(
            format!("(5) a connection holding {n} bound locks closes"),
            m.clone_reply(),
        )
    }
    .note("took: until the last of its keys was gone (`DBSIZE` 0)");
    c.ok(&[b"FLUSHALL"])?;
    Ok(vec![alone, multi, close])
}

/// `SLOWLOG`'s entries of `command`: each one's time in µs.
fn slowlog_of(c: &mut Conn, command: &str) -> io::Result<Vec<i64>> {
    // Each entry: id, time, duration (µs), the command's arguments, ...
    Ok(match c.ok(&[b"SLOWLOG", b"GET", b"-1"])? {
        Reply::Array(entries) => entries
            .iter()
            .filter_map(|e| match e {
                Reply::Array(f) => {
                    let us = f.get(2)?.as_int()?;
                    let what = match f.get(3)? {
                        Reply::Array(a) => a.first().map(Reply::text).unwrap_or_default(),
                        _ => String::new(),
                    };
                    what.eq_ignore_ascii_case(command).then_some(us)
                }
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    })
}

/// (9) `n` bound grants in a row on one connection, pipelined (as the bind
/// rows build them): the longest command's own time and how many took over
/// 1 ms, from `SLOWLOG` (every command of 0.5 ms or more logged). Then
/// their releases, in rounds of every other one still held in the order
/// bound, down to 1,000 (each round made the connection's list compact
/// itself in one pass before it was linked): the same figures.
fn grants(c: &mut Conn, port: u16, n: usize) -> io::Result<Vec<Row>> {
    eprintln!("   {n} bound grants in a row");
    c.ok(&[b"FLUSHALL"])?;
    c.ok(&[b"CONFIG", b"SET", b"slowlog-log-slower-than", b"500"])?;
    c.ok(&[b"CONFIG", b"SET", b"slowlog-max-len", b"100000"])?;
    c.ok(&[b"SLOWLOG", b"RESET"])?;
    c.ok(&[b"LATENCY", b"RESET"])?;
    let mut h = server::connect(port)?;
    let pinger = Pinger::start(port)?;
    let started = Instant::now();
    pipelined(
        &mut h,
        n,
        &|i| {
            vec![
                b"LOCK.ACQUIRE".to_vec(),
                format!("g:{i}").into_bytes(),
                b"O".to_vec(),
                TTL.to_vec(),
                b"BIND".to_vec(),
            ]
        },
        &is_token,
    )?;
    let took = started.elapsed();
    let ping = pinger.stop();
    let latency = latency_worst(c)?;
    let slow = slowlog_of(c, "lock.acquire")?;
    let longest = slow.iter().copied().max().unwrap_or(0);
    let over_1ms = slow.iter().filter(|us| **us > 1000).count();
    let granted = Row {
        shape: format!("(9) {n} bound grants in a row (pipelined, one connection)"),
        ping,
        server_us: Some(longest as f64),
        took: Some(took),
        late: None,
        latency,
        note: String::new(),
    }
    .note(format!(
        "server time: the longest grant's (`SLOWLOG`, none logged: under 0.5 ms); {} over 0.5 ms, {over_1ms} over 1 ms",
        slow.len()
    ));
    eprintln!("   their releases, every other one a round");
    c.ok(&[b"SLOWLOG", b"RESET"])?;
    c.ok(&[b"LATENCY", b"RESET"])?;
    let pinger = Pinger::start(port)?;
    let started = Instant::now();
    let mut live: Vec<usize> = (0..n).collect();
    let mut released = 0;
    while live.len() > 1000 {
        let gone: Vec<usize> = live.iter().copied().skip(1).step_by(2).collect();
        live = live.iter().copied().step_by(2).collect();
        pipelined(
            &mut h,
            gone.len(),
            &|i| {
                vec![
                    b"LOCK.RELEASE".to_vec(),
                    format!("g:{}", gone.get(i).copied().unwrap_or(0)).into_bytes(),
                    b"O".to_vec(),
                ]
            },
            &|r: &Reply| r.as_int() == Some(1),
        )?;
        released += gone.len();
    }
    let took = started.elapsed();
    let ping = pinger.stop();
    let latency = latency_worst(c)?;
    let slow = slowlog_of(c, "lock.release")?;
    let longest = slow.iter().copied().max().unwrap_or(0);
    let over_1ms = slow.iter().filter(|us| **us > 1000).count();
    let releases = Row {
        shape: format!(
            "(9) their releases, every other one still bound a round in the order bound ({released}, {} left)",
            live.len()
        ),
        ping,
        server_us: Some(longest as f64),
        took: Some(took),
        late: None,
        latency,
        note: String::new(),
    }
    .note(format!(
        "server time: the longest release's (`SLOWLOG`, none logged: under 0.5 ms); {} over 0.5 ms, {over_1ms} over 1 ms",
        slow.len()
    ));
    c.ok(&[b"CONFIG", b"SET", b"slowlog-log-slower-than", b"10000"])?;
    c.ok(&[b"CONFIG", b"SET", b"slowlog-max-len", b"128"])?;
    c.ok(&[b"FLUSHALL"])?;
    drop(h);
    Ok(vec![granted, releases])
}

/// This thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`: page faults count,
/// time the thread was not running does not).
fn thread_cpu() -> Duration {
    #[repr(C)]
    struct Timespec {
        s: i64,
        ns: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut t = Timespec { s: 0, ns: 0 };
    // SAFETY: `t` is a valid timespec for the call to fill.
    unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut t) };
    Duration::new(t.s.max(0) as u64, t.ns.clamp(0, 999_999_999) as u32)
}

/// (9), the map alone, in this process: `n` inserts in a row into a std
/// `HashMap` and into the module's `lock_core::shards::Sharded`, keyed and
/// hashed as the lease table's followers (values of 72 bytes): the longest
/// insert's thread CPU time and how many used over 1 ms (a loaded
/// machine's preemptions, which the server's `SLOWLOG` counts, do not
/// count here).
fn map_growth(n: usize) -> Vec<Row> {
    use lock_core::hash::Keyed;
    use lock_core::shards::Sharded;
    use std::collections::HashMap;
    fn run(n: usize, insert: &mut dyn FnMut(u64)) -> (Duration, usize, usize) {
        let (mut worst, mut at, mut over) = (Duration::ZERO, 0, 0);
        for i in 0..n {
            let t = thread_cpu();
            insert(i as u64 * 7919);
            let d = thread_cpu().saturating_sub(t);
            over += usize::from(d > Duration::from_millis(1));
            if d > worst {
                (worst, at) = (d, i);
            }
        }
        (worst, at, over)
    }
    let mut std_map: HashMap<u64, [u64; 9], Keyed> = HashMap::default();
    let std_row = run(n, &mut |k| {
        std_map.insert(k, [k; 9]);
    });
    drop(std_map);
    let mut sharded: Sharded<u64, [u64; 9], Keyed> = Sharded::default();
    let sharded_row = run(n, &mut |k| {
        sharded.insert(k, [k; 9]);
    });
    drop(sharded);
    // A connection's list of bindings: (number, slot) pushed in a row.
    let mut vec: Vec<(u64, u32)> = Vec::new();
    let vec_row = run(n, &mut |k| vec.push((k, k as u32)));
    drop(vec);
    let mut chunked: lock_core::chunked::Chunked<(u64, u32)> = Default::default();
    let chunked_row = run(n, &mut |k| chunked.push((k, k as u32)));
    drop(chunked);
    [
        ("inserts", "into a std `HashMap`", std_row),
        (
            "inserts",
            "into `lock_core::shards::Sharded` (the module's)",
            sharded_row,
        ),
        ("pushes", "onto a std `Vec` of `(u64, u32)`", vec_row),
        (
            "pushes",
            "onto `lock_core::chunked::Chunked` (the module's)",
            chunked_row,
        ),
    ]
    .into_iter()
    .map(|(act, what, (worst, at, over))| Row {
        shape: format!("(9) {n} {act} in a row {what}, in process (no server)"),
        ping: Duration::ZERO,
        server_us: Some(worst.as_secs_f64() * 1e6),
        took: None,
        late: None,
        latency: None,
        note: format!(
            "server time: the longest one's thread CPU time (number {at}); {over} over 1 ms"
        ),
    })
    .collect()
}

/// (9), a connection lease's table alone, in this process
/// (`lock_core::lease::Leases`): `n` followers bound and renewed one at a
/// time (a batch each in one generation), then every other one gone and
/// 1,000 KEEPALIVEs (the gone batches pruned), then the generation's end
/// read a page of 100 at a time (as the timer does): the longest call's
/// thread CPU time of each.
fn lease_batches(n: usize) -> Vec<Row> {
    let mut t: lock_core::lease::Leases<u64> = Default::default();
    let now = 1_000_000;
    let worst = |d: &mut (Duration, usize), f: &mut dyn FnMut()| {
        let s = thread_cpu();
        f();
        let took = thread_cpu().saturating_sub(s);
        d.0 = d.0.max(took);
        d.1 += usize::from(took > Duration::from_millis(1));
    };
    let mut bound = (Duration::ZERO, 0);
    for i in 0..n as u64 {
        t.set_own_new(i + 1, 1, now + 1000, i);
        worst(&mut bound, &mut || {
            t.keepalive(1, now, now + 600_000);
        });
    }
    for i in (0..n as u64).skip(1).step_by(2) {
        t.leave(i + 1);
    }
    let mut renewed = (Duration::ZERO, 0);
    for _ in 0..1000 {
        worst(&mut renewed, &mut || {
            t.keepalive(1, now, now + 600_000);
        });
    }
    let (mut ended, mut pages, mut keys) = ((Duration::ZERO, 0), 0, 0);
    let end = now + 600_001;
    while t.next_due().is_some_and(|at| at <= end) && pages < 10 * n {
        worst(&mut ended, &mut || {
            keys += t.end_due(end, 100).len();
        });
        pages += 1;
    }
    [
        (
            format!("{n} followers bound and renewed one at a time"),
            bound,
            String::new(),
        ),
        (
            "then every other one gone, 1000 KEEPALIVEs".to_string(),
            renewed,
            String::new(),
        ),
        (
            "then the generation's end, pages of 100".to_string(),
            ended,
            format!(" ({pages} pages, {keys} ended)"),
        ),
    ]
    .into_iter()
    .map(|(what, (longest, over), more)| Row {
        shape: format!("(9) a connection lease's table: {what}, in process (no server)"),
        ping: Duration::ZERO,
        server_us: Some(longest.as_secs_f64() * 1e6),
        took: None,
        late: None,
        latency: None,
        note: format!("server time: the longest call's thread CPU time; {over} over 1 ms{more}"),
    })
    .collect()
}

/// (6) `n` readers of one key (`lock.max-holders` raised to fit), then
/// PERSIST, PEXPIRE, RENAME, MOVE and RESTORE of that key.
fn holders(c: &mut Conn, port: u16, n: usize) -> io::Result<Vec<Row>> {
    eprintln!("   {n} holders on one key");
    c.ok(&[b"FLUSHALL"])?;
    set_max_holders(c, n.max(DEFAULT_HOLDERS))?;
    pipelined(
        c,
        n,
        &|i| {
            vec![
                b"LOCK.READ".to_vec(),
                b"big".to_vec(),
                format!("r{i}").into_bytes(),
                TTL.to_vec(),
            ]
        },
        &is_token,
    )?;
    let payload = c.ok(&[b"DUMP", b"big"])?;
    let payload = payload.bulk().to_vec();
    let steps: [(&str, &str, Vec<&[u8]>); 5] = [
        (
            "persist",
            "PERSIST big",
            vec![b"PERSIST".as_slice(), b"big"],
        ),
        (
            "pexpire",
            "PEXPIRE big 3600000",
            vec![b"PEXPIRE".as_slice(), b"big", b"3600000"],
        ),
        (
            "rename",
            "RENAME big big2",
            vec![b"RENAME".as_slice(), b"big", b"big2"],
        ),
        (
            "move",
            "MOVE big2 1",
            vec![b"MOVE".as_slice(), b"big2", b"1"],
        ),
        (
            "restore",
            "RESTORE big3 0 <DUMP of it>",
            vec![b"RESTORE".as_slice(), b"big3", b"0", &payload],
        ),
    ];
    let mut rows = Vec::new();
    for (stat_of, label, args) in &steps {
        let m = request(c, port, stat_of, args)?;
        rows.push(
            Row::new(
                format!("(6) `{label}` of a key with {n} holders"),
                m.clone_reply(),
            )
            .note(format!("answered {}", show(&m.reply))),
        );
    }
    rows.push(expiring(c, port, n, &payload)?);
    c.ok(&[b"FLUSHALL"])?;
    set_max_holders(c, DEFAULT_HOLDERS)?;
    Ok(rows)
}

/// Shape (6)'s purge: `n` readers of one key, all but one of whose leases
/// end at one deadline (restored with it: grants would spread theirs), the
/// last one's going on (the key stays: the module's visit drops them, not
/// Redis's expiry), measured from before the deadline until every lease
/// is counted expired. `like` is a DUMP of any lock (its header).
fn expiring(c: &mut Conn, port: u16, n: usize, like: &[u8]) -> io::Result<Row> {
    use crate::common::{dump_parts, dump_with_footer, old_lock_body, OldHolder};
    let (head, version) = dump_parts(like);
    let token = |c: &mut Conn| -> io::Result<u64> {
        let r = c.call(&[b"LOCK.READ", b"exp-token", b"t", b"1000"])?;
        Ok(r.as_int().and_then(|t| u64::try_from(t).ok()).unwrap_or(0))
    };
    let first = token(c)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    // Far enough for the RESTORE of `n` holders to land before it.
    let deadline = now + 3000 + (n as u64) / 500;
    let n = n.max(2);
    let holders: Vec<OldHolder> = (0..n)
        .map(|i| OldHolder {
            owner: format!("r{i}").into_bytes(),
            holds: 1,
            token: first + 1 + i as u64,
            deadline: if i == n - 1 {
                now + 3_600_000
            } else {
                deadline
            },
        })
        .collect();
    let body = old_lock_body(head, 2, 1, None, &holders);
    let payload = dump_with_footer(&body, version);
    drop(holders);
    set_max_holders(c, n.max(DEFAULT_HOLDERS))?;
    c.ok(&[b"RESTORE", b"exp", b"0", &payload])?;
    eprintln!("   {} leases ending together", n - 1);
    let m = measure(
        c,
        port,
        None,
        &mut |_| {
            let left = deadline.saturating_sub(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
            );
            thread::sleep(Duration::from_millis(left));
            Ok(None)
        },
        &mut |c| Ok(stat(c, "lock_expired_leases")? >= n as u64 - 1),
    )?;
    Ok(Row::new(
        format!(
            "(6) {} leases of a key's {n} ending together (one goes on)",
            n - 1
        ),
        m,
    )
    .note("took: from before the deadline (the wait for it included) until every lease was counted expired"))
}

/// Shape (13): `n` readers of one key (`lock.max-holders` raised to let
/// them), then one request of each kind on it: a new reader's grant, a
/// reader's repeat, a renewal, a release. Each is a grant, release or
/// renewal on a key of `n` holders: what it costs beyond the owner's look-up
/// is what still walks the holders per command.
fn wide_reads(c: &mut Conn, port: u16, n: usize) -> io::Result<Vec<Row>> {
    // At most the setting's maximum, one place left for the new reader.
    let limit = (n + 1000).min(1_000_000);
    let n = n.min(limit - 1);
    eprintln!("   {n} readers of one key, then more requests on it");
    c.ok(&[b"FLUSHALL"])?;
    set_max_holders(c, limit)?;
    pipelined(
        c,
        n,
        &|i| {
            vec![
                b"LOCK.READ".to_vec(),
                b"wide".to_vec(),
                format!("r{i}").into_bytes(),
                TTL.to_vec(),
            ]
        },
        &is_token,
    )?;
    let (first, last) = (b"r0".to_vec(), format!("r{}", n - 1).into_bytes());
    let steps: [(&str, &str, Vec<&[u8]>); 5] = [
        (
            "lock.read",
            "LOCK.READ wide new-reader 3600000",
            vec![b"LOCK.READ".as_slice(), b"wide", b"new-reader", TTL],
        ),
        (
            "lock.read",
            "LOCK.READ wide <the last reader> 3600000 (a repeat)",
            vec![b"LOCK.READ".as_slice(), b"wide", &last, TTL],
        ),
        (
            "lock.renew",
            "LOCK.RENEW wide <the first reader> 60000",
            vec![b"LOCK.RENEW".as_slice(), b"wide", &first, b"60000"],
        ),
        (
            "lock.release",
            "LOCK.RELEASE wide <the first reader>",
            vec![b"LOCK.RELEASE".as_slice(), b"wide", &first],
        ),
        (
            "lock.release",
            "LOCK.RELEASE wide new-reader",
            vec![b"LOCK.RELEASE".as_slice(), b"wide", b"new-reader"],
        ),
    ];
    step_rows(c, port, &steps, |label| {
        format!("(13) `{label}` on a key with {n} readers")
    })
}

/// A row for each of `steps` (the command's stat, its label, its
/// arguments), named by `name` from the label; then the server emptied and
/// `lock.max-holders` back at its default.
fn step_rows(
    c: &mut Conn,
    port: u16,
    steps: &[(&str, &str, Vec<&[u8]>)],
    name: impl Fn(&str) -> String,
) -> io::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (stat_of, label, args) in steps {
        let m = request(c, port, stat_of, args)?;
        rows.push(
            Row::new(name(label), m.clone_reply()).note(format!("answered {}", show(&m.reply))),
        );
    }
    c.ok(&[b"FLUSHALL"])?;
    set_max_holders(c, DEFAULT_HOLDERS)?;
    Ok(rows)
}

/// A field of `INFO replication`.
fn replication_field(c: &mut Conn, f: &str) -> io::Result<String> {
    let text = c.ok(&[b"INFO", b"replication"])?.text();
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(f)?.strip_prefix(':'))
        .unwrap_or("")
        .trim()
        .to_string())
}

/// A replica of the master on `port` (the module loaded, `extra`
/// arguments), linked: its directory, its server, a connection to it
/// (600 s read timeout) and the deadline (600 s) the shape's waits share.
fn linked_replica(
    module: &Path,
    port: u16,
    extra: &[&str],
) -> io::Result<(TempDir, Server, Conn, Instant)> {
    let dir = TempDir::new()?;
    let replica = Server::start(&Options {
        module: Some(module.to_path_buf()),
        dir: dir.0.clone(),
        callgrind: false,
        extra: extra.iter().map(|s| s.to_string()).collect(),
    })?;
    let mut r = replica.conn()?;
    r.set_read_timeout(Duration::from_secs(600))?;
    r.ok(&[b"REPLICAOF", b"127.0.0.1", port.to_string().as_bytes()])?;
    let deadline = Instant::now() + Duration::from_secs(600);
    linked(&mut r, deadline)?;
    Ok((dir, replica, r, deadline))
}

/// Waits until replica `r`'s link to its master is up (an error past
/// `deadline`).
fn linked(r: &mut Conn, deadline: Instant) -> io::Result<()> {
    while replication_field(r, "master_link_status")? != "up" {
        if Instant::now() > deadline {
            return Err(io::Error::other("the replica never linked"));
        }
        thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Waits until replica `r` applied everything master `c` sent (or
/// `deadline`).
fn caught_up(c: &mut Conn, r: &mut Conn, deadline: Instant) -> io::Result<()> {
    loop {
        let sent: u64 = replication_field(c, "master_repl_offset")?
            .parse()
            .unwrap_or(u64::MAX);
        let done: u64 = replication_field(r, "slave_repl_offset")?
            .parse()
            .unwrap_or(0);
        if done >= sent || Instant::now() > deadline {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// (8) `n` readers granted one by one on a master (`LOCK.READ`, pipelined
/// 500 at a time) with a replica attached: the replica applies each
/// grant's `LOCK.SYNC` on a key of up to `n` holders. The replica's longest
/// PING, its `LOCK.SYNC` server time per call (commandstats) and its
/// longest one (`SLOWLOG`, all calls over 100 µs kept), until it caught up.
fn replica_apply(module: &Path, c: &mut Conn, port: u16, n: usize) -> io::Result<Vec<Row>> {
    eprintln!("   {n} readers granted on a master, applied by its replica");
    c.ok(&[b"FLUSHALL"])?;
    let raised = n.max(DEFAULT_HOLDERS);
    set_max_holders(c, raised)?;
    let raised = raised.to_string();
    let (dir, replica, mut r, deadline) = linked_replica(
        module,
        port,
        &[
            "--lock.max-holders",
            &raised,
            "--latency-monitor-threshold",
            "1",
            "--slowlog-log-slower-than",
            "100",
            "--slowlog-max-len",
            &(n + 10).to_string(),
        ],
    )?;
    reset_stats(c)?;
    reset_stats(&mut r)?;
    r.ok(&[b"LATENCY", b"RESET"])?;
    r.ok(&[b"SLOWLOG", b"RESET"])?;
    let pinger = Pinger::start(replica.port)?;
    thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    pipelined(
        c,
        n,
        &|i| {
            vec![
                b"LOCK.READ".to_vec(),
                b"big".to_vec(),
                format!("reader-{i}").into_bytes(),
                TTL.to_vec(),
            ]
        },
        &is_token,
    )?;
    // Until the replica applied everything the master sent.
    caught_up(c, &mut r, deadline)?;
    let took = t.elapsed();
    thread::sleep(Duration::from_millis(100));
    let ping = pinger.stop();
    let (calls, usec) = cmdstat(&mut r, "lock.sync")?;
    let (reads, read_usec) = cmdstat(c, "lock.read")?;
    let latency = latency_worst(&mut r)?;
    let slow: Vec<i64> = match r.ok(&[b"SLOWLOG", b"GET", b"-1"])? {
        Reply::Array(entries) => entries
            .iter()
            .filter_map(|e| match e {
                Reply::Array(f) => f.get(2)?.as_int(),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    let longest = slow.iter().copied().max().unwrap_or(0);
    let over_1ms = slow.iter().filter(|&&us| us >= 1000).count();
    let row = Row {
        shape: format!(
            "(8) {n} readers granted on a master (`LOCK.READ`, 500 pipelined at a time): its replica applies each grant's `LOCK.SYNC`"
        ),
        ping,
        server_us: (calls > 0.0).then(|| usec / calls),
        took: Some(took),
        late: None,
        latency,
        note: format!(
            "replica: {calls} `LOCK.SYNC`, the longest {longest} µs, {over_1ms} of 1 ms or more (`SLOWLOG`); master: `LOCK.READ` {:.0} µs a call",
            read_usec / reads.max(1.0)
        ),
    };
    drop(r);
    drop(replica);
    drop(dir);
    c.ok(&[b"FLUSHALL"])?;
    set_max_holders(c, DEFAULT_HOLDERS)?;
    Ok(vec![row])
}

/// What a flush or swap of (7) finds in database 0.
#[derive(Clone, Copy)]
enum Filled {
    /// Plain keys (`SET`): Redis's own part.
    Plain,
    /// Locks bound to a connection that stays open.
    Bound,
    /// Locks held by one session.
    Session,
}

/// (7) `FLUSHDB`, `FLUSHDB ASYNC`, `FLUSHALL` and `SWAPDB 0 1` of database 0
/// holding `n` plain keys, `n` locks bound to one open connection, or `n`
/// locks of one session: the longest PING and the command's server time
/// (the module's part: a lock row less the plain row).
fn flushes(c: &mut Conn, port: u16, n: usize) -> io::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let acts: [(&str, &str, Vec<&[u8]>); 4] = [
        ("flushdb", "FLUSHDB", vec![b"FLUSHDB".as_slice()]),
        (
            "flushdb",
            "FLUSHDB ASYNC",
            vec![b"FLUSHDB".as_slice(), b"ASYNC"],
        ),
        ("flushall", "FLUSHALL", vec![b"FLUSHALL".as_slice()]),
        (
            "swapdb",
            "SWAPDB 0 1",
            vec![b"SWAPDB".as_slice(), b"0", b"1"],
        ),
    ];
    for filled in [Filled::Plain, Filled::Bound, Filled::Session] {
        for (stat_of, label, args) in &acts {
            c.ok(&[b"FLUSHALL"])?;
            let mut h = server::connect(port)?;
            let started = Instant::now();
            let what = match filled {
                Filled::Plain => {
                    pipelined(
                        &mut h,
                        n,
                        &|i| {
                            vec![
                                b"SET".to_vec(),
                                format!("f:{i}").into_bytes(),
                                b"v".to_vec(),
                            ]
                        },
                        &|r| matches!(r, Reply::Status(_)),
                    )?;
                    format!("{n} plain keys")
                }
                Filled::Bound => {
                    pipelined(
                        &mut h,
                        n,
                        &|i| {
                            vec![
                                b"LOCK.ACQUIRE".to_vec(),
                                format!("f:{i}").into_bytes(),
                                b"O".to_vec(),
                                TTL.to_vec(),
                                b"BIND".to_vec(),
                            ]
                        },
                        &is_token,
                    )?;
                    format!("{n} bound holders")
                }
                Filled::Session => {
                    let id = h.call(&[b"LOCK.SESSION", b"OPEN", TTL])?;
                    let id = id
                        .as_int()
                        .ok_or_else(|| {
                            io::Error::other(format!("LOCK.SESSION OPEN: {}", id.show()))
                        })?
                        .to_string();
                    pipelined(
                        &mut h,
                        n,
                        &|i| {
                            vec![
                                b"LOCK.ACQUIRE".to_vec(),
                                format!("f:{i}").into_bytes(),
                                b"O".to_vec(),
                                TTL.to_vec(),
                                b"SESSION".to_vec(),
                                id.clone().into_bytes(),
                            ]
                        },
                        &is_token,
                    )?;
                    format!("a session's {n} holders")
                }
            };
            eprintln!(
                "   {label} of {what} ({:.1} s to make them)",
                started.elapsed().as_secs_f64()
            );
            // The PINGs go on for a second after the reply: the module drops
            // what the flush left over the next turns.
            let m = measure(
                c,
                port,
                Some(stat_of),
                &mut |c| c.call(args).map(Some),
                &mut |_| {
                    thread::sleep(Duration::from_secs(1));
                    Ok(true)
                },
            )?;
            rows.push(
                Row {
                    took: None,
                    ..Row::new(format!("(7) `{label}` of {what}"), m.clone_reply())
                }
                .note(format!("answered {}", show(&m.reply))),
            );
            drop(h);
        }
    }
    c.ok(&[b"FLUSHALL"])?;
    Ok(rows)
}

/// Shape (10): `SWAPDB 0 1` while `n` connections wait, half in each
/// database, each a `LOCK.MACQUIRE` of ten held keys (`WAIT 0`): `n`
/// waiting requests, `10 n` queued on `10 n` keys; the same names in both
/// databases.
fn swap_waiters(c: &mut Conn, port: u16, sock: &Path, n: usize) -> io::Result<Vec<Row>> {
    const PER: usize = 10;
    c.ok(&[b"FLUSHALL"])?;
    let half = n / 2;
    let mut h = server::connect(port)?;
    for db in [b"0".as_slice(), b"1"] {
        h.ok(&[b"SELECT", db])?;
        pipelined(
            &mut h,
            half * PER,
            &|i| {
                vec![
                    b"LOCK.ACQUIRE".to_vec(),
                    format!("s:{i}").into_bytes(),
                    b"H".to_vec(),
                    TTL.to_vec(),
                ]
            },
            &is_token,
        )?;
    }
    let mut waiters = Waiters::open(sock, half * 2)?;
    waiters.write(c, 500, &mut |j| {
        let (db, i) = (j / half, j % half);
        let mut buf = cmd(&[b"SELECT", db.to_string().as_bytes()]);
        let mut args: Vec<Vec<u8>> = vec![b"LOCK.MACQUIRE".to_vec(), PER.to_string().into_bytes()];
        args.extend((0..PER).map(|k| format!("s:{}", i * PER + k).into_bytes()));
        args.extend([
            format!("w:{j}").into_bytes(),
            TTL.to_vec(),
            b"WAIT".to_vec(),
            b"0".to_vec(),
        ]);
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        buf.extend(cmd(&refs));
        buf
    })?;
    eprintln!("   SWAPDB 0 1 with {} waiting requests", half * 2);
    let m = request(c, port, "swapdb", &[b"SWAPDB", b"0", b"1"])?;
    let row = Row::new(
        format!(
            "(10) `SWAPDB 0 1` with {} waiting `LOCK.MACQUIRE`s of {PER} keys ({} queued, half in each database)",
            half * 2,
            half * 2 * PER
        ),
        m.clone_reply(),
    )
    .note(format!("answered {}", show(&m.reply)));
    // Then database 0's locks flushed: its waiters' keys are free, every
    // one visited (and its waiter granted) over the next turns.
    eprintln!("   FLUSHDB ASYNC of {half} waiting requests' keys");
    c.ok(&[b"SELECT", b"0"])?;
    let want = half as u64;
    let flush = measure(
        c,
        port,
        Some("flushdb"),
        &mut |c| c.call(&[b"FLUSHDB", b"ASYNC"]).map(Some),
        &mut |c| Ok(stat(c, "lock_waiters")? <= want),
    )?;
    let flushed = Row::new(
        format!(
            "(10) `FLUSHDB ASYNC` of the database where {half} of them wait ({} keys)",
            half * PER
        ),
        flush.clone_reply(),
    )
    .note(format!(
        "took: until they were all granted; answered {}",
        show(&flush.reply)
    ));
    waiters.close(c)?;
    c.ok(&[b"FLUSHALL"])?;
    drop(h);
    Ok(vec![row, flushed])
}

/// Shape (12): `n` connections wait (`WAIT 0`) for one held key, then a
/// `SET` over it: the key's visit finds another type and answers every
/// waiter `WRONGTYPE` (`waiting::fail_all`, a slice at a time): the
/// longest PING until the last is answered, and the worst `LATENCY
/// LATEST` event (a `lock-tick` of a millisecond or more of CPU).
fn failed(c: &mut Conn, port: u16, sock: &Path, n: usize) -> io::Result<Row> {
    eprintln!("   {n} waiters of one key answered WRONGTYPE");
    c.ok(&[b"FLUSHALL"])?;
    c.ok(&[b"LOCK.ACQUIRE", b"failed", b"H", TTL])?;
    let mut waiters = Waiters::open(sock, n)?;
    waiters.write(c, 500, &mut |j| {
        cmd(&[
            b"LOCK.ACQUIRE",
            b"failed",
            format!("w:{j}").as_bytes(),
            TTL,
            b"WAIT",
            b"0",
        ])
    })?;
    let m = measure(
        c,
        port,
        Some("set"),
        &mut |c| c.call(&[b"SET", b"failed", b"x"]).map(Some),
        &mut |c| Ok(stat(c, "lock_waiters")? == 0),
    )?;
    let row = Row::new(
        format!("(12) `SET` over a lock key {n} connections wait for: each answered `WRONGTYPE`"),
        m.clone_reply(),
    )
    .note("took: until the last was answered");
    waiters.close(c)?;
    c.ok(&[b"FLUSHALL"])?;
    Ok(row)
}

/// Shape (11): `n` keys of two readers each on the section's server, a
/// replica of its own attached; the master's writes paused (`CLIENT PAUSE
/// WRITE`: it purges nothing), the first reader's lease runs out on the
/// replica (its timer defers the `n` keys: a replica writes nothing), then
/// `REPLICAOF NO ONE` on the replica: its server time, the replica's
/// longest PING and worst `LATENCY LATEST` event (a `lock-tick` is a tick
/// of a millisecond or more of CPU), until every dead reader is gone.
fn promotion(module: &Path, c: &mut Conn, port: u16, n: usize) -> io::Result<Row> {
    eprintln!("   a replica promoted with {n} keys' leases run out");
    c.ok(&[b"FLUSHALL"])?;
    let (dir, replica, mut r, deadline) =
        linked_replica(module, port, &["--latency-monitor-threshold", "1"])?;
    let read = |i: usize, owner: &[u8], ttl: &[u8]| {
        vec![
            b"LOCK.READ".to_vec(),
            format!("p:{i}").into_bytes(),
            owner.to_vec(),
            ttl.to_vec(),
        ]
    };
    pipelined(c, n, &|i| read(i, b"r2", TTL), &is_token)?;
    let t = Instant::now();
    const SHORT_MS: u64 = 15_000;
    let short = SHORT_MS.to_string();
    pipelined(c, n, &|i| read(i, b"r1", short.as_bytes()), &is_token)?;
    let ends = t + Duration::from_millis(SHORT_MS);
    caught_up(c, &mut r, deadline)?;
    c.ok(&[b"CLIENT", b"PAUSE", b"600000", b"WRITE"])?;
    if Instant::now() > ends {
        c.ok(&[b"CLIENT", b"UNPAUSE"])?;
        return Err(io::Error::other(
            "set-up too slow: the short leases ran out",
        ));
    }
    thread::sleep(ends.saturating_duration_since(Instant::now()) + Duration::from_millis(200));
    wait_stat(
        &mut r,
        "lock_timer_keys",
        "the replica's timer to defer them",
        |k| k == 0,
    )?;
    let holders = |r: &mut Conn| stat(r, "lock_holders_shared");
    let before = holders(&mut r)?;
    let m = measure(
        &mut r,
        replica.port,
        Some("replicaof"),
        &mut |r| r.call(&[b"REPLICAOF", b"NO", b"ONE"]).map(Some),
        &mut |r| Ok(holders(r)? <= n as u64),
    )?;
    let after = holders(&mut r)?;
    c.ok(&[b"CLIENT", b"UNPAUSE"])?;
    drop(r);
    drop(replica);
    drop(dir);
    c.ok(&[b"FLUSHALL"])?;
    Ok(Row::new(
        format!(
            "(11) `REPLICAOF NO ONE` of a replica where {n} keys' first reader ran out (of two)"
        ),
        m.clone_reply(),
    )
    .note(format!(
        "took: until every dead reader was gone (shared holders {before} to {after}); answered {}",
        show(&m.reply)
    )))
}

/// Nothing happening: what the machine costs a PING at rest.
fn at_rest(c: &mut Conn, port: u16) -> io::Result<Row> {
    let m = measure(
        c,
        port,
        None,
        &mut |_| {
            thread::sleep(Duration::from_secs(1));
            Ok(None)
        },
        &mut |_| Ok(true),
    )?;
    Ok(Row {
        took: None,
        ..Row::new("(nothing happening: 1 s at rest)".into(), m)
    })
}

pub fn run(module: &Path, plan: &Plan) -> io::Result<Vec<Row>> {
    let conns = plan.connections();
    // The bench's connections and the server's (which inherits the limit).
    let limit = raise_fd_limit(conns + 10_000);
    let fits = |n: usize| n + 1000 <= limit;
    let skipped = |n: usize, what: String| {
        Row {
        shape: what,
        ping: Duration::ZERO,
        server_us: None,
        took: None,
        late: None,
        latency: None,
        note: format!("skipped: {n} connections, the open-file limit is {limit} (run as root, or raise `ulimit -n`)"),
    }
    };
    let dir = TempDir::new()?;
    let sock: PathBuf = dir.0.join("redis.sock");
    let server = Server::start(&Options {
        module: Some(module.to_path_buf()),
        dir: dir.0.clone(),
        callgrind: false,
        extra: [
            "--maxclients",
            &(conns + 1000).min(limit.saturating_sub(100)).to_string(),
            "--unixsocket",
            &sock.display().to_string(),
            "--unixsocketperm",
            "700",
            "--latency-monitor-threshold",
            "1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    })?;
    let port = server.port;
    let mut c = server.conn()?;
    c.set_read_timeout(Duration::from_secs(600))?;
    c.ok(&[b"CONFIG", b"SET", b"lock.max-waiters", b"1000000"])?;
    let wants = |n: u32| plan.shapes.as_ref().is_none_or(|s| s.contains(&n));
    let mut rows = vec![at_rest(&mut c, port)?];
    for &keys in plan.fan_keys.iter().filter(|_| wants(1)) {
        if !fits(plan.fan_writers) {
            rows.push(skipped(
                plan.fan_writers,
                format!("(1) fan over {keys} keys"),
            ));
            continue;
        }
        rows.extend(fan(
            &mut c,
            port,
            &sock,
            plan.fan_readers,
            plan.fan_writers,
            keys,
        )?);
    }
    for &n in plan.chains.iter().filter(|_| wants(2)) {
        // One connection a request when they fit, else one a MACQUIRE of
        // ten keys (the same graph).
        if fits(n) {
            rows.extend(chain(&mut c, port, &sock, n, false)?);
        } else if fits(n / 10 + 10) {
            rows.extend(chain(&mut c, port, &sock, n, true)?);
        } else {
            rows.push(skipped(n / 10, format!("(2) a chain of {n}")));
        }
    }
    let n = plan.deadlines;
    match fits(n) {
        _ if !wants(3) => {}
        true => {
            for what in [
                Together::Nils { keys: 1 },
                Together::Blpop,
                Together::Nils { keys: n },
                Together::Readers { raised: true },
                Together::Readers { raised: false },
                Together::Session,
            ] {
                rows.push(together(&mut c, port, &sock, n, what)?);
            }
        }
        false => rows.push(skipped(n, "(3) deadlines together".into())),
    }
    for &n in plan.bound.iter().filter(|_| wants(4) || wants(5)) {
        rows.extend(bound(&mut c, port, n)?);
    }
    if wants(6) {
        rows.extend(holders(&mut c, port, plan.holders)?);
    }
    if wants(7) {
        rows.extend(flushes(&mut c, port, plan.flush)?);
    }
    if wants(8) {
        rows.extend(replica_apply(module, &mut c, port, plan.holders / 2)?);
    }
    if wants(9) {
        rows.extend(grants(&mut c, port, plan.grants)?);
        rows.extend(map_growth(plan.grants));
        rows.extend(lease_batches(plan.grants));
    }
    if wants(10) {
        match fits(plan.swap_waiters) {
            true => rows.extend(swap_waiters(&mut c, port, &sock, plan.swap_waiters)?),
            false => rows.push(skipped(
                plan.swap_waiters,
                "(10) SWAPDB with waiters".into(),
            )),
        }
    }
    if wants(11) {
        rows.push(promotion(module, &mut c, port, plan.promoted)?);
    }
    if wants(12) {
        match fits(plan.deadlines) {
            true => rows.push(failed(&mut c, port, &sock, plan.deadlines)?),
            false => rows.push(skipped(plan.deadlines, "(12) waiters failed".into())),
        }
    }
    if wants(13) {
        for &n in &plan.wide {
            rows.extend(wide_reads(&mut c, port, n)?);
        }
    }
    drop(c);
    drop(server);
    drop(dir);
    Ok(rows)
}

pub fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "### 10. Stalls (a server of its own; the longest PING round trip on another connection while each shape happens; the request's server time from `INFO commandstats`, which Redis 7.0 counts twice for a request that blocked; `LATENCY LATEST`'s worst event with `latency-monitor-threshold 1`: `command` is the call alone)\n\n",
    );
    s.push_str("| shape | longest PING | request's server time (commandstats) | round trip / took | nils late (p50 / max) | `LATENCY LATEST` | |\n|---|---:|---:|---:|---:|---|---|\n");
    let us = |d: Duration| stats::dur_us(d.as_secs_f64() * 1e6);
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            r.shape,
            us(r.ping),
            r.server_us.map_or("-".into(), stats::dur_us),
            r.took.map_or("-".into(), us),
            r.late.map_or("-".into(), |(p50, max)| format!(
                "{} / {}",
                us(p50),
                us(max)
            )),
            r.latency
                .as_ref()
                .map_or("-".into(), |(e, ms)| format!("{e} {ms} ms")),
            r.note,
        ));
    }
    s
}
