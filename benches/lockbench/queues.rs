//! Section 8: waiting at scale (issue 30). Server time per new blocking
//! `LOCK.ACQUIRE` (`INFO commandstats`) as queues grow, on one hot key and
//! on one chain of waits over many keys (section 7's shape, `n / 10` keys);
//! then storms at the largest size, each with the longest PING round trip
//! on another connection meanwhile; and hand-off throughput through a long
//! queue against a short one.

use std::io::{self, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{encode_strs, Conn, Reply};
use crate::deadlock::{self, per_call, stat};
use crate::stats;

/// New blocking requests measured at each size.
const SAMPLES: usize = 200;
const TTL: &[u8] = b"600000";

/// One size of the growth curve: µs per new blocking request.
pub struct Growth {
    pub waiting: usize,
    /// With nobody waiting on the key it blocks on (the floor).
    pub empty_us: f64,
    /// On a key `waiting` clients already wait for.
    pub hot_us: f64,
    /// At the top of a chain of `waiting` requests (an owner holding
    /// nothing: no cycle can close through it).
    pub chain_us: f64,
    /// Building the chain: each of its blocking requests, on average.
    pub chain_build_us: f64,
    /// The bottom owner closing the cycle through the whole chain.
    pub cycle_us: f64,
    pub cycles_found: u64,
    pub searches_cut: u64,
}

/// The longest PING round trip on its own connection while it runs.
struct Pinger {
    stop: Arc<AtomicBool>,
    /// Each round trip: when it ended, and how long it took.
    thread: thread::JoinHandle<Vec<(Instant, Duration)>>,
}

impl Pinger {
    fn start(port: u16) -> io::Result<Pinger> {
        let mut c = crate::server::connect(port)?;
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

    fn trips(self) -> Option<Vec<(Instant, Duration)>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().ok()
    }

    fn stop(self) -> Duration {
        match self.trips() {
            Some(trips) => trips.iter().map(|(_, d)| *d).max().unwrap_or_default(),
            None => Duration::MAX,
        }
    }

    /// The longest round trip that ended before `at`, and the longest
    /// after it.
    fn stop_split(self, at: Instant) -> (Duration, Duration) {
        let Some(trips) = self.trips() else {
            return (Duration::MAX, Duration::MAX);
        };
        let worst = |after: bool| {
            trips
                .iter()
                .filter(|(end, _)| (*end >= at) == after)
                .map(|(_, d)| *d)
                .max()
                .unwrap_or_default()
        };
        (worst(false), worst(true))
    }
}

fn request(key: &[u8], owner: &[u8], wait: &[u8]) -> Vec<u8> {
    let mut buf = Vec::new();
    encode_strs(&mut buf, &[b"LOCK.ACQUIRE", key, owner, TTL, b"WAIT", wait]);
    buf
}

fn connect(port: u16) -> io::Result<TcpStream> {
    let s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    s.set_nodelay(true)?;
    Ok(s)
}

fn wait_for(c: &mut Conn, what: &str, want: impl Fn(u64) -> bool) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if want(stat(c, "lock_waiters")?) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(io::Error::other(format!("timed out waiting for {what}")));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// `n` clients waiting on `key` held by `holder`, owners `w0..`, each
/// on a connection of its own, all connected first, then all written to.
fn queue(c: &mut Conn, port: u16, key: &[u8], n: usize, wait: &[u8]) -> io::Result<Vec<TcpStream>> {
    queue_timed(c, port, key, n, wait).map(|(streams, _)| streams)
}

/// [`queue`], with when the first request was written (no WAIT can end
/// sooner than its time after that).
fn queue_timed(
    c: &mut Conn,
    port: u16,
    key: &[u8],
    n: usize,
    wait: &[u8],
) -> io::Result<(Vec<TcpStream>, Instant)> {
    let before = stat(c, "lock_waiters")?;
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        streams.push(connect(port)?);
    }
    let written = Instant::now();
    for (i, s) in streams.iter_mut().enumerate() {
        s.write_all(&request(key, format!("w{i}").as_bytes(), wait))?;
    }
    let want = before + n as u64;
    wait_for(c, "the waiters to queue", |w| w >= want)?;
    Ok((streams, written))
}

fn drain(c: &mut Conn, streams: Vec<TcpStream>) -> io::Result<()> {
    drop(streams);
    wait_for(c, "the waiters to leave", |w| w == 0)?;
    c.ok(&[b"FLUSHALL"])?;
    Ok(())
}

/// µs per new blocking request on a key `n` clients already wait for.
fn hot(port: u16, n: usize) -> io::Result<f64> {
    let mut c = crate::server::connect(port)?;
    c.ok(&[b"FLUSHALL"])?;
    c.ok(&[b"LOCK.ACQUIRE", b"hot", b"holder", TTL])?;
    let mut streams = queue(&mut c, port, b"hot", n, b"0")?;
    let mut extra = Vec::with_capacity(SAMPLES);
    let us = per_call(&mut c, &mut |c| {
        for i in 0..SAMPLES {
            let mut s = connect(port)?;
            s.write_all(&request(b"hot", format!("new{i}").as_bytes(), b"0"))?;
            extra.push(s);
        }
        let want = (n + SAMPLES) as u64;
        wait_for(c, "the new requests to queue", |w| w >= want)
    })?;
    streams.append(&mut extra);
    drain(&mut c, streams)?;
    Ok(us)
}

pub fn growth(port: u16, sizes: &[usize]) -> io::Result<Vec<Growth>> {
    // The measured requests join a queue already at the largest size.
    let mut c = crate::server::connect(port)?;
    c.ok(&[b"CONFIG", b"SET", b"lock.max-waiters", b"1000000"])?;
    let mut rows = Vec::new();
    for &n in sizes {
        eprintln!("   {n} waiting");
        let hot_us = hot(port, n)?;
        let chain = deadlock::run(port, (n / 10).max(2), n)?;
        rows.push(Growth {
            waiting: n,
            empty_us: chain.empty_us,
            hot_us,
            chain_us: chain.walk_us,
            chain_build_us: chain.build_us_per_call,
            cycle_us: chain.long_us,
            cycles_found: chain.long_found,
            searches_cut: chain.walk_cut,
        });
    }
    Ok(rows)
}

/// The storms at `n` waiters: each the longest PING meanwhile.
pub struct Storms {
    pub n: usize,
    pub timeouts: Duration,
    /// The same waiters before any WAIT ends: nothing happening.
    pub quiet: Duration,
    /// As many WAITs ending together over 200 keys.
    pub timeouts_keys: Duration,
    pub disconnects: Duration,
    pub flushall: Duration,
    pub del: Duration,
    pub handoff: Duration,
    /// The same disconnect storm of clients blocked in `BLPOP`: Redis's own.
    pub blpop_disconnects: Duration,
    /// Hand-off grants per second through an `n` queue and a 10 queue.
    pub handoff_long: f64,
    pub handoff_short: f64,
}

/// Every queued waiter timing out within about the time it takes to write
/// to all of them (their WAIT deadlines that close together): the longest
/// PING while they all wait, before the first WAIT can end (the same
/// clients connected, nothing happening: what the machine and Redis cost
/// alone), and from then until the last has timed out (the storm).
fn timeouts(port: u16, n: usize) -> io::Result<(Duration, Duration)> {
    let mut c = crate::server::connect(port)?;
    c.ok(&[b"FLUSHALL"])?;
    c.ok(&[b"LOCK.ACQUIRE", b"hot", b"holder", TTL])?;
    let wait = Duration::from_millis(1500);
    let (streams, written) = queue_timed(
        &mut c,
        port,
        b"hot",
        n,
        wait.as_millis().to_string().as_bytes(),
    )?;
    let pinger = Pinger::start(port)?;
    wait_for(&mut c, "the waits to time out", |w| w == 0)?;
    let (quiet, worst) = pinger.stop_split(written + wait);
    drain(&mut c, streams)?;
    Ok((quiet, worst))
}

/// The same storm over `keys` keys, `n / keys` waiters on each (a tick
/// visits up to 200 keys: this is what the tick's share of timeouts
/// bounds): the longest PING from the first WAIT's end until the last.
fn timeouts_on_keys(port: u16, n: usize, keys: usize) -> io::Result<Duration> {
    let mut c = crate::server::connect(port)?;
    c.ok(&[b"FLUSHALL"])?;
    let wait = Duration::from_millis(1500);
    let names: Vec<Vec<u8>> = (0..keys.max(1))
        .map(|k| format!("hot{k}").into_bytes())
        .collect();
    for key in &names {
        c.ok(&[b"LOCK.ACQUIRE", key, b"holder", TTL])?;
    }
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        streams.push(connect(port)?);
    }
    // Round the keys, so that every key's WAITs end over the same span.
    let written = Instant::now();
    let ms = wait.as_millis().to_string();
    for (i, s) in streams.iter_mut().enumerate() {
        let key = &names[i % names.len()];
        s.write_all(&request(key, format!("w{i}").as_bytes(), ms.as_bytes()))?;
    }
    wait_for(&mut c, "the waiters to queue", |w| w >= n as u64)?;
    let pinger = Pinger::start(port)?;
    wait_for(&mut c, "the waits to time out", |w| w == 0)?;
    let (_, worst) = pinger.stop_split(written + wait);
    drain(&mut c, streams)?;
    Ok(worst)
}

/// Something done to a key `n` clients wait for, with the longest PING
/// until `done` says it is over.
fn storm(
    port: u16,
    n: usize,
    act: &mut dyn FnMut(&mut Conn, &mut Vec<TcpStream>) -> io::Result<()>,
    done: &dyn Fn(&mut Conn) -> io::Result<bool>,
) -> io::Result<Duration> {
    let mut c = crate::server::connect(port)?;
    c.ok(&[b"FLUSHALL"])?;
    c.ok(&[b"LOCK.ACQUIRE", b"hot", b"holder", TTL])?;
    let mut streams = queue(&mut c, port, b"hot", n, b"0")?;
    let pinger = Pinger::start(port)?;
    thread::sleep(Duration::from_millis(50));
    act(&mut c, &mut streams)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done(&mut c)? && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    thread::sleep(Duration::from_millis(50));
    let worst = pinger.stop();
    drain(&mut c, streams)?;
    Ok(worst)
}

/// What Redis itself costs: `n` clients blocked in `BLPOP` on one list
/// disconnecting together, with the longest PING meanwhile.
fn blpop_disconnects(port: u16, n: usize) -> io::Result<Duration> {
    let mut c = crate::server::connect(port)?;
    c.ok(&[b"FLUSHALL"])?;
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        streams.push(connect(port)?);
    }
    let mut buf = Vec::new();
    encode_strs(&mut buf, &[b"BLPOP".as_slice(), b"list", b"0"]);
    for s in &mut streams {
        s.write_all(&buf)?;
    }
    let blocked = |c: &mut Conn| -> io::Result<u64> {
        c.try_info_field("clients", "blocked_clients")?
            .parse()
            .map_err(|_| io::Error::other("blocked_clients"))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while blocked(&mut c)? < n as u64 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    let pinger = Pinger::start(port)?;
    thread::sleep(Duration::from_millis(50));
    drop(streams);
    while blocked(&mut c)? > 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    thread::sleep(Duration::from_millis(50));
    Ok(pinger.stop())
}

/// Grants per second handed down a queue of `n`: the holder's release,
/// then each waiter's, pipelined on one connection (each release grants
/// the next waiter in the same transaction), `rounds` times.
fn handoff(port: u16, n: usize, rounds: usize) -> io::Result<(f64, Duration)> {
    let mut c = crate::server::connect(port)?;
    let mut timed = Duration::ZERO;
    let mut worst = Duration::ZERO;
    for _ in 0..rounds {
        c.ok(&[b"FLUSHALL"])?;
        c.ok(&[b"LOCK.ACQUIRE", b"hot", b"holder", TTL])?;
        let streams = queue(&mut c, port, b"hot", n, b"0")?;
        let pinger = Pinger::start(port)?;
        let t = Instant::now();
        let owners: Vec<Vec<u8>> = std::iter::once(b"holder".to_vec())
            .chain((0..n).map(|i| format!("w{i}").into_bytes()))
            .collect();
        // In batches of 32, as a client pipelines: other clients are
        // served between batches (one pipeline of 10,000 commands would
        // hold the event loop for all of them, whatever they are).
        for batch in owners.chunks(32) {
            for owner in batch {
                c.push(&[b"LOCK.RELEASE", b"hot", owner]);
            }
            c.flush()?;
            for _ in batch {
                if c.read_reply()? != Reply::Int(1) {
                    return Err(io::Error::other("a hand-off was not released"));
                }
            }
        }
        timed += t.elapsed();
        worst = worst.max(pinger.stop());
        drop(streams);
    }
    c.ok(&[b"FLUSHALL"])?;
    Ok(((n * rounds) as f64 / timed.as_secs_f64(), worst))
}

pub fn storms(port: u16, n: usize) -> io::Result<Storms> {
    eprintln!("   storms at {n}");
    let waiters_gone = |c: &mut Conn| Ok(stat(c, "lock_waiters")? == 0);
    let one_granted = |c: &mut Conn| Ok(stat(c, "lock_grants_after_wait")? >= 1);
    let (quiet, timeouts) = timeouts(port, n)?;
    let timeouts_keys = timeouts_on_keys(port, n, 200)?;
    let disconnects = storm(
        port,
        n,
        &mut |_, streams| {
            streams.clear();
            Ok(())
        },
        &waiters_gone,
    )?;
    let freed = |cmd: &'static [u8]| {
        storm(
            port,
            n,
            &mut |c, _| {
                c.ok(&[b"CONFIG", b"RESETSTAT"])?;
                c.try_info_field("lock", "lock_grants")?;
                match cmd {
                    b"DEL" => c.ok(&[b"DEL", b"hot"]).map(drop),
                    _ => c.ok(&[cmd]).map(drop),
                }
            },
            &one_granted,
        )
    };
    let flushall = freed(b"FLUSHALL")?;
    let del = freed(b"DEL")?;
    let (handoff_long, handoff_ping) = handoff(port, n, 1)?;
    let (handoff_short, _) = handoff(port, 10, (n / 10).clamp(1, 200))?;
    let blpop_disconnects = blpop_disconnects(port, n)?;
    Ok(Storms {
        blpop_disconnects,
        n,
        timeouts,
        quiet,
        timeouts_keys,
        disconnects,
        flushall,
        del,
        handoff: handoff_ping,
        handoff_long,
        handoff_short,
    })
}

pub fn table(rows: &[Growth], storms: &Storms) -> String {
    let mut s = String::from(
        "### 8. Waiting at scale (server time per new blocking `LOCK.ACQUIRE` from `INFO commandstats`, 200 requests at each size; the chain is section 7's shape, `n / 10` keys)\n\n",
    );
    s.push_str("| clients waiting | nobody waiting on its key (µs) | on one hot key (µs) | ratio | top of a chain (µs) | ratio | building the chain, per request (µs) | closing the cycle through the chain (µs) | cycles found | searches cut |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.2}x | {:.1} | {:.2}x | {:.1} | {:.1} | {} of 200 | {} |\n",
            r.waiting,
            r.empty_us,
            r.hot_us,
            r.hot_us / r.empty_us,
            r.chain_us,
            r.chain_us / r.empty_us,
            r.chain_build_us,
            r.cycle_us,
            r.cycles_found,
            r.searches_cut,
        ));
    }
    s.push_str(&format!(
        "\nStorms with {} clients waiting on one key: the longest PING round trip on another connection while each runs.\n\n| storm | longest PING |\n|---|---:|\n",
        storms.n
    ));
    for (what, d) in [
        ("every WAIT timing out together", storms.timeouts),
        (
            "(the same clients waiting, before any WAIT ends: nothing happening)",
            storms.quiet,
        ),
        (
            "every WAIT timing out together, the clients spread over 200 keys",
            storms.timeouts_keys,
        ),
        (
            "every waiting client disconnecting together",
            storms.disconnects,
        ),
        (
            "(Redis alone: as many clients blocked in `BLPOP` disconnecting together)",
            storms.blpop_disconnects,
        ),
        ("`FLUSHALL`", storms.flushall),
        ("`DEL` of the key", storms.del),
        (
            "`RELEASE` handing the lock down the whole queue",
            storms.handoff,
        ),
    ] {
        s.push_str(&format!(
            "| {what} | {} |\n",
            stats::dur_us(d.as_secs_f64() * 1e6)
        ));
    }
    s.push_str(&format!(
        "\nHand-off through the queue (each release grants the next waiter; releases pipelined 32 at a time on one connection): {:.0} grants/s through {} waiting, {:.0} through 10: {:.2}x.\n",
        storms.handoff_long,
        storms.n,
        storms.handoff_short,
        storms.handoff_long / storms.handoff_short
    ));
    s
}

/// The growth curve as SVG: µs per new blocking request (log) against the
/// clients already waiting (log), one line per shape, and the floor.
pub fn growth_svg(rows: &[Growth], subtitle: &str) -> String {
    use std::fmt::Write as _;
    let (w, h, left, top, pw, ph) = (760.0, 420.0, 80.0, 70.0, 600.0, 280.0);
    let xs: Vec<f64> = rows.iter().map(|r| (r.waiting as f64).log10()).collect();
    let (x0, x1) = (
        xs.iter().copied().fold(f64::INFINITY, f64::min).floor(),
        xs.iter().copied().fold(f64::NEG_INFINITY, f64::max).ceil(),
    );
    type Series<'a> = (&'a str, &'a str, &'a dyn Fn(&Growth) -> f64);
    let series: [Series; 4] = [
        ("nobody waiting on its key", "#777777", &|r| r.empty_us),
        ("one hot key", "#1f6fb4", &|r| r.hot_us),
        ("top of a chain", "#2ca02c", &|r| r.chain_us),
        ("closing the cycle through the chain", "#d62728", &|r| {
            r.cycle_us
        }),
    ];
    let values: Vec<f64> = series
        .iter()
        .flat_map(|(_, _, f)| rows.iter().map(f))
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let y0 = values
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .log10()
        .floor();
    let y1 = values
        .iter()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max)
        .log10()
        .ceil()
        .max(y0 + 1.0);
    let px = |x: f64| left + (x - x0) / (x1 - x0).max(1.0) * pw;
    let py = |v: f64| top + ph - (v.max(1e-9).log10() - y0) / (y1 - y0) * ph;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12"><rect width="{w}" height="{h}" fill="white"/>"#
    );
    let _ = writeln!(
        svg,
        r##"<text x="{left}" y="24" font-size="15">Server time per new blocking LOCK.ACQUIRE as queues grow</text><text x="{left}" y="44" fill="#555">{}</text>"##,
        subtitle.replace('&', "&amp;").replace('<', "&lt;")
    );
    let mut e = y0;
    while e <= y1 {
        let y = py(10f64.powf(e));
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" x2="{}" y1="{y}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{} µs</text>"##,
            left + pw,
            left - 6.0,
            y + 4.0,
            10f64.powf(e)
        );
        e += 1.0;
    }
    let mut e = x0;
    while e <= x1 {
        let x = px(e);
        let _ = writeln!(
            svg,
            r##"<line x1="{x}" x2="{x}" y1="{top}" y2="{}" stroke="#eee"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
            top + ph,
            top + ph + 16.0,
            10f64.powf(e)
        );
        e += 1.0;
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">clients already waiting</text>"#,
        left + pw / 2.0,
        top + ph + 36.0
    );
    for (i, (name, color, f)) in series.iter().enumerate() {
        let pts: Vec<String> = rows
            .iter()
            .zip(&xs)
            .map(|(r, x)| format!("{:.1},{:.1}", px(*x), py(f(r))))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        let ly = top + 14.0 + 16.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{}" y="{}">{name}</text>"#,
            left + 12.0,
            left + 36.0,
            left + 42.0,
            ly + 4.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}
