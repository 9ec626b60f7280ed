//! Soak (`make soak`, minutes; not part of `make test`): 64 clients on 4 hot
//! keys for `SOAK_SECS` seconds (default 180), with WAIT, re-entry,
//! renewals, readers, deliberate lease expiries, waits abandoned by
//! disconnecting and holders that vanish. Each writer then writes to a
//! "protected resource" (one string key per lock, updated by a Lua script)
//! that accepts a write only with a token greater than the last one it
//! accepted: fencing as Kleppmann describes it.
//!
//! Every client records, on its own clock (the server's wall clock, on the
//! same machine), when each lease was surely held: from the grant's reply
//! until the earlier of the RELEASE it sent and the lowest possible deadline
//! (`floor(send time) + ttl`, moved by each successful RENEW). Then:
//!
//! - mutual exclusion: no two such intervals overlap on one key unless both
//!   are readers; RELEASE and RENEW never report a lease lost before its
//!   lowest possible deadline, and RELEASE never succeeds after the highest;
//! - fencing: tokens follow grant order (a grant requested after another was
//!   answered has a greater token); a write made while the lease was surely
//!   held is accepted; a stale write (lease surely expired) is accepted only
//!   if no holder granted later has written yet (Kleppmann's rule: the
//!   resource has seen no newer token); one accepted after a newer holder's
//!   write is a "stale write accepted" and a failure;
//! - memory: `used_memory` after all locks are released and every client has
//!   disconnected is back to the baseline taken the same way after a
//!   warm-up (queues, timers and disconnected waiters leave nothing behind);
//!   `INFO lock` shows no key, holder or waiter left; the log has no panic.
//!
//! Run: `make soak`, or
//! `REDIS_LOCK_MODULE=$PWD/target/release/libredis_lock.so cargo test --release --test it soak:: -- --ignored --nocapture`.
//! Environment: `SOAK_SECS` (default 180), `SOAK_WARMUP_SECS` (default 15),
//! `SOAK_SEED`, `SOAK_MEMORY_SLACK` (bytes, default 262144).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::*;

const CLIENTS: usize = 64;
const KEYS: usize = 4;

/// Sets the resource to the token if it is greater than the last accepted
/// one; returns {accepted (1/0), last token before}.
/// Tokens are compared as decimal strings (Lua's numbers are doubles).
const FENCED_WRITE: &str = r"
local last = redis.call('GET', KEYS[1]) or '0'
local t = ARGV[1]
if #t > #last or (#t == #last and t > last) then
  redis.call('SET', KEYS[1], t)
  return {1, last}
end
return {0, last}
";

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The wall-clock millisecond (in µs) a time falls in.
fn floor_ms(us: u64) -> u64 {
    us / 1000 * 1000
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x % n.max(1)
    }

    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

/// When a lease was surely held, in µs of the wall clock.
#[derive(Clone, Debug)]
struct Interval {
    start: u64,
    end: u64,
    exclusive: bool,
    token: i64,
    owner: String,
}

/// A grant as the client saw it: requested at `s`, answered at `r`.
#[derive(Clone, Copy, Debug)]
struct Grant {
    s: u64,
    r: u64,
    token: i64,
    key: usize,
}

#[derive(Default)]
struct Shared {
    intervals: Mutex<Vec<Vec<Interval>>>,
    grants: Mutex<Vec<Grant>>,
    /// token -> its grant (to tell who wrote last at the resource).
    by_token: Mutex<HashMap<i64, Grant>>,
    violations: Mutex<Vec<String>>,
}

impl Shared {
    fn violation(&self, v: String) {
        eprintln!("VIOLATION: {v}");
        self.violations.lock().unwrap().push(v);
    }

    fn interval(&self, key: usize, iv: Interval) {
        if iv.start < iv.end {
            self.intervals.lock().unwrap()[key].push(iv);
        }
    }
}

#[derive(Default, Clone)]
struct Tally {
    grants_exclusive: u64,
    grants_shared: u64,
    reentries: u64,
    wait_timeouts: u64,
    renewals: u64,
    renewals_too_late: u64,
    deliberate_expiries: u64,
    vanished_holders: u64,
    abandoned_waits: u64,
    writes_accepted: u64,
    writes_unsure: u64,
    stale_rejected: u64,
    stale_accepted_unopposed: u64,
    stale_accepted: u64,
    releases: u64,
    releases_after_expiry: u64,
    errors: u64,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.grants_exclusive += o.grants_exclusive;
        self.grants_shared += o.grants_shared;
        self.reentries += o.reentries;
        self.wait_timeouts += o.wait_timeouts;
        self.renewals += o.renewals;
        self.renewals_too_late += o.renewals_too_late;
        self.deliberate_expiries += o.deliberate_expiries;
        self.vanished_holders += o.vanished_holders;
        self.abandoned_waits += o.abandoned_waits;
        self.writes_accepted += o.writes_accepted;
        self.writes_unsure += o.writes_unsure;
        self.stale_rejected += o.stale_rejected;
        self.stale_accepted_unopposed += o.stale_accepted_unopposed;
        self.stale_accepted += o.stale_accepted;
        self.releases += o.releases;
        self.releases_after_expiry += o.releases_after_expiry;
        self.errors += o.errors;
    }
}

struct Client {
    id: usize,
    port: u16,
    conn: Conn,
    rng: Rng,
    sha: String,
    shared: Arc<Shared>,
    tally: Tally,
}

impl Client {
    fn reconnect(&mut self) {
        self.conn = Conn::connect(self.port);
    }

    /// The fenced write: (accepted, last token before).
    fn write(&mut self, key: usize, token: i64) -> (bool, i64) {
        let r = self.conn.cmd(&[
            "EVALSHA",
            &self.sha,
            "1",
            &format!("soak:res:{key}"),
            &token.to_string(),
        ]);
        let a = r.array();
        (a[0].int() == 1, a[1].str().parse().unwrap())
    }

    fn run(&mut self, stop: &AtomicBool) {
        let mut seq = 0u64;
        while !stop.load(Ordering::Relaxed) {
            seq += 1;
            self.one(seq);
        }
    }

    /// One acquisition and what follows it.
    fn one(&mut self, seq: u64) {
        let id = self.id;
        let key = self.rng.below(KEYS as u64) as usize;
        let lock = format!("soak:{key}");
        let owner = format!("c{id}-{seq}");
        let reader = self.rng.chance(1, 5);
        let ttl = if reader {
            100 + self.rng.below(200)
        } else {
            100 + self.rng.below(300)
        };
        let cmd = if reader {
            "LOCK.READ"
        } else if self.rng.chance(1, 4) {
            "LOCK.RACQUIRE"
        } else {
            "LOCK.ACQUIRE"
        };
        let wait = 50 + self.rng.below(450);
        let args = [
            cmd.to_string(),
            lock.clone(),
            owner.clone(),
            ttl.to_string(),
            "WAIT".into(),
            wait.to_string(),
        ];
        if self.rng.chance(1, 50) {
            // Abandon the wait: disconnect while (probably) blocked.
            self.conn.send(&args).unwrap();
            thread::sleep(Duration::from_millis(self.rng.below(wait / 2)));
            self.reconnect();
            self.tally.abandoned_waits += 1;
            // The grant, if one raced the disconnect, is revoked by the
            // module (never observed); its lease ends by ttl at the latest.
            return;
        }
        let s = now_us();
        let reply = self.conn.cmd(&args);
        let r = now_us();
        let token = match reply {
            Reply::Nil => {
                self.tally.wait_timeouts += 1;
                return;
            }
            Reply::Int(t) if t > 0 => t,
            other => {
                self.tally.errors += 1;
                self.shared
                    .violation(format!("{args:?} answered {other:?}"));
                return;
            }
        };
        let grant = Grant { s, r, token, key };
        self.shared.grants.lock().unwrap().push(grant);
        self.shared.by_token.lock().unwrap().insert(token, grant);
        if reader {
            self.tally.grants_shared += 1;
        } else {
            self.tally.grants_exclusive += 1;
        }
        // The lease is surely held until at least this (µs): the grant came
        // after `s`. A waiter's lease starts at its grant, so after a long
        // wait LOCK.INFO gives a later bound: the deadline is at least the
        // server's time of the INFO (>= floor(its send time)) + ttl-ms-left.
        let mut sure_until = floor_ms(s) + ttl * 1000;
        let qs = now_us();
        let info = self.conn.lock_info(&lock);
        let qr = now_us();
        let mine = info
            .as_ref()
            .and_then(|i| i.holders.iter().find(|h| h.owner == owner.as_bytes()));
        match mine {
            Some(h) if h.token == token => {
                if h.ttl > ttl as i64 {
                    self.shared.violation(format!(
                        "{owner} asked {ttl} ms on {lock} but LOCK.INFO shows {} ms left",
                        h.ttl
                    ));
                }
                sure_until = sure_until.max(floor_ms(qs) + h.ttl as u64 * 1000);
            }
            _ if qr < sure_until => self.shared.violation(format!(
                "{owner} granted {lock} (token {token}) but LOCK.INFO shows {info:?}"
            )),
            _ => {}
        }
        let interval = |end: u64| Interval {
            start: r,
            end,
            exclusive: !reader,
            token,
            owner: owner.clone(),
        };
        let plan = self.rng.below(100);

        if plan < 6 && !reader {
            // Deliberate expiry: pause past the lease, then write anyway.
            self.tally.deliberate_expiries += 1;
            self.shared.interval(key, interval(sure_until));
            let expired_at = (r / 1000 + 1) * 1000 + ttl * 1000 + 20_000;
            let now = now_us();
            if now < expired_at {
                thread::sleep(Duration::from_micros(expired_at - now));
            }
            // Give a newer holder time to get in and write first (up to 1 s).
            let res = format!("soak:res:{key}");
            let newer = |last: &str| {
                let t = token.to_string();
                last.len() > t.len() || (last.len() == t.len() && last > t.as_str())
            };
            let give_up = Instant::now() + Duration::from_secs(1);
            while Instant::now() < give_up && !newer(&self.conn.cmd(&["GET", &res]).str()) {
                thread::sleep(Duration::from_millis(10));
            }
            let (accepted, last) = self.write(key, token);
            if !accepted {
                self.tally.stale_rejected += 1;
            } else {
                let newer = self.shared.by_token.lock().unwrap().get(&last).copied();
                match newer {
                    Some(g) if g.key == key && g.s > r => {
                        self.tally.stale_accepted += 1;
                        self.shared.violation(format!(
                            "stale write with token {token} (granted at {r}) accepted after \
                             token {last}, granted later (requested at {})",
                            g.s
                        ));
                    }
                    _ => self.tally.stale_accepted_unopposed += 1,
                }
            }
            let rel = self.conn.cmd(&["LOCK.RELEASE", &lock, &owner]);
            if !rel.is_nil() {
                self.shared.violation(format!(
                    "{owner} released {lock} {rel:?} after its lease surely ended"
                ));
            }
            return;
        }
        if plan < 8 {
            // The holder vanishes: its lease ends by expiry.
            self.tally.vanished_holders += 1;
            self.shared.interval(key, interval(sure_until));
            self.reconnect();
            return;
        }
        let mut holds = 1;
        if cmd == "LOCK.RACQUIRE" && self.rng.chance(1, 3) {
            let s2 = now_us();
            let again = self.conn.cmd(&args[..4]);
            let r2 = now_us();
            if again == Reply::Int(token) {
                holds += 1;
                self.tally.reentries += 1;
                sure_until = floor_ms(s2) + ttl * 1000;
            } else if r2 < sure_until {
                self.shared.violation(format!(
                    "re-entry of {owner} on {lock} answered {again:?} while its lease held"
                ));
            }
        }
        let mut lost = false;
        if plan < 40 {
            // Work in steps, renewing the lease.
            for _ in 0..1 + self.rng.below(3) {
                thread::sleep(Duration::from_millis(self.rng.below(ttl / 3)));
                let sn = now_us();
                let rr = self
                    .conn
                    .cmd(&["LOCK.RENEW", &lock, &owner, &ttl.to_string()]);
                let rn = now_us();
                match rr {
                    Reply::Int(1) => {
                        self.tally.renewals += 1;
                        sure_until = floor_ms(sn) + ttl * 1000;
                    }
                    Reply::Int(0) if rn >= sure_until => {
                        self.tally.renewals_too_late += 1;
                        lost = true;
                        break;
                    }
                    other => {
                        self.shared.violation(format!(
                            "RENEW {owner} on {lock} answered {other:?} {} µs before its lease \
                             could end",
                            sure_until - rn
                        ));
                        lost = true;
                        break;
                    }
                }
            }
        } else {
            thread::sleep(Duration::from_millis(self.rng.below(ttl / 4)));
        }
        if !reader && !lost && now_us() + 5_000 < sure_until {
            let (accepted, last) = self.write(key, token);
            let wr = now_us();
            if wr < sure_until {
                if accepted {
                    self.tally.writes_accepted += 1;
                } else {
                    self.shared.violation(format!(
                        "{owner} (token {token}) held {lock}, yet the resource had seen {last}"
                    ));
                }
            } else {
                self.tally.writes_unsure += 1;
            }
        }
        let xs = now_us();
        let mut last_reply = Reply::Nil;
        for _ in 0..holds {
            last_reply = self.conn.cmd(&["LOCK.RELEASE", &lock, &owner]);
        }
        let xr = now_us();
        match last_reply {
            Reply::Int(1) => self.tally.releases += 1,
            Reply::Nil if xr >= sure_until => self.tally.releases_after_expiry += 1,
            other => self.shared.violation(format!(
                "RELEASE {owner} on {lock} answered {other:?} {} µs before its lease could end",
                sure_until.saturating_sub(xr)
            )),
        }
        self.shared.interval(key, interval(xs.min(sure_until)));
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

fn used_memory(c: &mut Conn) -> i64 {
    c.info_field("memory", "used_memory").parse().unwrap()
}

/// Runs the 64 clients until `secs` pass; returns their tallies.
fn phase(port: u16, secs: u64, seed: u64, sha: &str, shared: &Arc<Shared>) -> Tally {
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let stop = stop.clone();
            let shared = shared.clone();
            let sha = sha.to_string();
            let seed = seed ^ (id as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            thread::spawn(move || {
                let mut c = Client {
                    id,
                    port,
                    conn: Conn::connect(port),
                    rng: Rng(seed.max(1)),
                    sha,
                    shared,
                    tally: Tally::default(),
                };
                c.run(&stop);
                c.tally
            })
        })
        .collect();
    thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    let mut total = Tally::default();
    for h in handles {
        total.add(&h.join().expect("a soak client failed"));
    }
    total
}

/// Waits until no lock key, holder or waiter is left, then lets Redis free
/// what disconnected clients left (one event-loop turn is enough; give it a
/// few).
fn quiesce(c: &mut Conn) -> BTreeMap<String, i64> {
    wait_until(
        Duration::from_secs(30),
        "every lock released or expired",
        || {
            let i = info_lock(c);
            let dbsize = c.cmd(&["DBSIZE"]).int();
            i.get("lock_keys") == Some(&0)
                && i.get("lock_waiters") == Some(&0)
                && i.get("lock_holders_exclusive") == Some(&0)
                && i.get("lock_holders_shared") == Some(&0)
                && dbsize == KEYS as i64
        },
    );
    wait_until(
        Duration::from_secs(10),
        "only this client connected",
        || {
            c.info_field("clients", "connected_clients") == "1"
                && c.info_field("clients", "blocked_clients") == "0"
        },
    );
    thread::sleep(Duration::from_millis(300));
    info_lock(c)
}

/// Blocks all 64 clients at once, then lets them through: the server's
/// pools (temporary clients for blocked clients, the registry's maps)
/// reach their high-water mark before the baseline is taken.
fn peak_burst(port: u16) {
    let mut holder = Conn::connect(port);
    for k in 0..KEYS {
        holder.cmd(&["LOCK.ACQUIRE", &format!("soak:{k}"), "burst", "60000"]);
    }
    let mut conns: Vec<Conn> = (0..CLIENTS)
        .map(|i| {
            let mut c = Conn::connect(port);
            c.send(&[
                "LOCK.ACQUIRE",
                &format!("soak:{}", i % KEYS),
                &format!("burst-{i}"),
                "1",
                "WAIT",
                "10000",
            ])
            .unwrap();
            c
        })
        .collect();
    wait_until(Duration::from_secs(10), "64 blocked clients", || {
        holder.info_field("clients", "blocked_clients") == CLIENTS.to_string()
    });
    for k in 0..KEYS {
        holder.cmd(&["LOCK.RELEASE", &format!("soak:{k}"), "burst"]);
    }
    for c in &mut conns {
        let r = c.read_reply().unwrap();
        assert!(
            matches!(r, Reply::Int(t) if t > 0),
            "burst waiter got {r:?}"
        );
    }
}

#[test]
#[ignore = "minutes long: run with `make soak`"]
fn soak_fencing_mutual_exclusion_memory() {
    let secs = env_u64("SOAK_SECS").unwrap_or(180);
    let warmup = env_u64("SOAK_WARMUP_SECS").unwrap_or(15);
    let slack = env_u64("SOAK_MEMORY_SLACK").unwrap_or(256 * 1024) as i64;
    let seed = env_u64("SOAK_SEED").unwrap_or_else(now_us);
    eprintln!(
        "soak: {CLIENTS} clients, {KEYS} keys, {secs} s (+{warmup} s warm-up), seed {seed}, \
         module {}",
        module_path().display()
    );
    let mut server = Server::builder()
        // Nothing that keeps history of commands: the memory check compares
        // like with like.
        .config("slowlog-log-slower-than -1")
        .config("latency-monitor-threshold 0")
        .start();
    let port = server.port;
    let mut c = server.conn();
    let sha = c.cmd(&["SCRIPT", "LOAD", FENCED_WRITE]).str();
    for k in 0..KEYS {
        c.cmd(&["SET", &format!("soak:res:{k}"), "0"]).ok();
    }

    // Warm-up, then the baseline. Both phases are checked.
    let shared = Arc::new(Shared {
        intervals: Mutex::new(vec![Vec::new(); KEYS]),
        ..Shared::default()
    });
    let warm = phase(port, warmup, seed ^ 0xabcdef, &sha, &shared);
    quiesce(&mut c);
    peak_burst(port);
    quiesce(&mut c);
    let before = used_memory(&mut c);
    eprintln!("soak: baseline used_memory {before} bytes after warm-up");

    // The soak itself, with used_memory sampled while it runs.
    let started = Instant::now();
    let sampler_stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = sampler_stop.clone();
        thread::spawn(move || {
            let mut c = Conn::connect(port);
            let mut samples = Vec::new();
            let t0 = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(250));
                if t0.elapsed().as_secs() >= 15 * (samples.len() as u64 + 1) {
                    let i = info_lock(&mut c);
                    samples.push(format!(
                        "t={:>4}s used_memory={} lock_keys={} waiters={} timer_keys={}",
                        t0.elapsed().as_secs(),
                        used_memory(&mut c),
                        i["lock_keys"],
                        i["lock_waiters"],
                        i["lock_timer_keys"]
                    ));
                }
            }
            samples
        })
    };
    let mut tally = phase(port, secs, seed, &sha, &shared);
    tally.add(&warm);
    sampler_stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().unwrap();
    let ran = started.elapsed();
    let info = quiesce(&mut c);
    let after = used_memory(&mut c);

    // Mutual exclusion: sweep each key's sure intervals by start.
    let mut me_violations = 0;
    for (key, ivs) in shared.intervals.lock().unwrap().iter_mut().enumerate() {
        ivs.sort_by_key(|iv| iv.start);
        let mut open_all: Option<Interval> = None; // the latest-ending so far
        let mut open_excl: Option<Interval> = None;
        for iv in ivs.iter() {
            let clash = if iv.exclusive {
                open_all.as_ref().filter(|o| iv.start < o.end)
            } else {
                open_excl.as_ref().filter(|o| iv.start < o.end)
            };
            if let Some(o) = clash {
                me_violations += 1;
                shared.violation(format!(
                    "key {key}: {} (token {}, {}) held [{}, {}) while {} (token {}, {}) held \
                     [{}, {})",
                    iv.owner,
                    iv.token,
                    if iv.exclusive { "exclusive" } else { "shared" },
                    iv.start,
                    iv.end,
                    o.owner,
                    o.token,
                    if o.exclusive { "exclusive" } else { "shared" },
                    o.start,
                    o.end
                ));
            }
            if open_all.as_ref().is_none_or(|o| iv.end > o.end) {
                open_all = Some(iv.clone());
            }
            if iv.exclusive && open_excl.as_ref().is_none_or(|o| iv.end > o.end) {
                open_excl = Some(iv.clone());
            }
        }
    }
    let intervals: usize = shared.intervals.lock().unwrap().iter().map(Vec::len).sum();

    // Tokens follow grant order, across keys.
    let mut token_violations = 0;
    {
        let grants = shared.grants.lock().unwrap();
        let mut by_r: Vec<Grant> = grants.clone();
        by_r.sort_by_key(|g| g.r);
        let mut by_s: Vec<Grant> = grants.clone();
        by_s.sort_by_key(|g| g.s);
        let mut i = 0;
        let mut max_before: Option<Grant> = None;
        for b in &by_s {
            while i < by_r.len() && by_r[i].r < b.s {
                if max_before.is_none_or(|m| by_r[i].token > m.token) {
                    max_before = Some(by_r[i]);
                }
                i += 1;
            }
            if let Some(m) = max_before.filter(|m| b.token <= m.token) {
                token_violations += 1;
                shared.violation(format!(
                    "token {} (requested at {}) is not above token {} (answered at {})",
                    b.token, b.s, m.token, m.r
                ));
            }
        }
    }

    // The log.
    let log = std::fs::read_to_string(server.log_path()).unwrap_or_default();
    let log_bad: Vec<&str> = log
        .lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("panic") || l.contains("internal error") || l.contains("crashed")
        })
        .collect();

    let t = &tally;
    eprintln!(
        "soak: ran {:.0} s (+{warmup} s warm-up; the figures cover both)",
        ran.as_secs_f64()
    );
    for s in &samples {
        eprintln!("  {s}");
    }
    eprintln!(
        "  grants: {} exclusive, {} shared ({:.0}/s), {} re-entries; {} WAITs timed out, \
         {} abandoned by disconnecting",
        t.grants_exclusive,
        t.grants_shared,
        (t.grants_exclusive + t.grants_shared) as f64 / (ran.as_secs_f64() + warmup as f64),
        t.reentries,
        t.wait_timeouts,
        t.abandoned_waits
    );
    eprintln!(
        "  renewals: {} ({} came too late); releases: {} ({} after expiry); \
         deliberate expiries: {}; vanished holders: {}",
        t.renewals,
        t.renewals_too_late,
        t.releases,
        t.releases_after_expiry,
        t.deliberate_expiries,
        t.vanished_holders
    );
    eprintln!(
        "  resource: {} writes accepted while the lease was surely held ({} not surely in \
         time); stale writes: {} rejected, {} accepted before any newer holder wrote \
         (allowed by fencing), {} ACCEPTED after a newer holder's write",
        t.writes_accepted,
        t.writes_unsure,
        t.stale_rejected,
        t.stale_accepted_unopposed,
        t.stale_accepted
    );
    eprintln!(
        "  mutual-exclusion violations: {me_violations} (over {intervals} leases); token-order \
         violations: {token_violations}; all violations: {}",
        shared.violations.lock().unwrap().len()
    );
    eprintln!(
        "  used_memory: {before} before, {after} after ({:+} bytes; slack {slack}); INFO lock \
         after: {info:?}",
        after - before
    );
    assert!(log_bad.is_empty(), "server log: {log_bad:?}");
    let violations = shared.violations.lock().unwrap().clone();
    assert!(
        violations.is_empty(),
        "{} violations: {violations:#?}",
        violations.len()
    );
    assert_eq!(t.stale_accepted, 0);
    assert!(
        t.grants_exclusive > 0 && t.stale_rejected > 0,
        "the soak did too little"
    );
    assert!(
        after - before <= slack,
        "used_memory grew by {} bytes (slack {slack}): a leak",
        after - before
    );
    c.ping();
    server.shutdown_nosave();
}
