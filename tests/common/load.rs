//! Load under faults: client threads acquire, re-enter, renew and release locks
//! with short leases on many keys, and each keeps a ledger of what it was told.
//!
//! Every thread uses its own owner name, so what it knows about its own
//! holdings is exact: only it can change them (apart from expiry). Each
//! acknowledged request appends the thread's new state for that key to the
//! key's history, with the send and reply instants and the deadline's bounds
//! (the server computes `now + ttl` somewhere between sending and the reply).
//! The one request in flight when the server dies is kept with each of its
//! possible outcomes.
//!
//! After a crash, a restart or a promotion, [`check`] compares what a server
//! shows (`LOCK.INFO` of every key) with the ledgers: for each thread and key
//! the shown state must be one the thread went through within a [`Window`]
//! (e.g. "everything acknowledged before the kill, maybe the request in
//! flight" for an AOF with `appendfsync always`; "what was acknowledged before
//! SAVE was sent, up to what was sent before SAVE answered" for an RDB).
//!
//! Fencing tokens: each thread checks, as it goes, that every new grant's token
//! is above every earlier one it got from the same server (port), and keeps
//! every token with the instant it was acknowledged, so a test can check that
//! a server issues tokens above everything it may have seen.

#![allow(dead_code)]

use super::*;
use std::collections::{BTreeMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

// ---------------------------------------------------------------------------
// Randomness (reproducible from a printed seed)
// ---------------------------------------------------------------------------

/// xorshift64*: small, fast, reproducible.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng((seed ^ 0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }

    /// True with probability `pct` percent.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

/// The seed of a test: `FAULTS_SEED` if set, else the clock. Printed, so a
/// failing run can be replayed.
pub fn test_seed(test: &str) -> u64 {
    let seed = std::env::var("FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("{test}: seed {seed} (set FAULTS_SEED={seed} to replay)");
    seed
}

// ---------------------------------------------------------------------------
// A client that can serve the load: one server, or a cluster
// ---------------------------------------------------------------------------

/// What the load needs from a client.
pub trait LockClient: Send {
    /// Sends one command about `key`. An `Err` means the connection failed: the
    /// command may or may not have run.
    fn call(&mut self, key: &[u8], args: &[Vec<u8>]) -> io::Result<Reply>;
    /// `WAIT numreplicas timeout` on the connection that served the last call.
    fn wait_replicas(&mut self, n: i64, ms: i64) -> io::Result<Reply>;
    /// The port of the server that answered the last call.
    fn served_by(&self) -> u16;
}

/// One server, one connection.
pub struct Single(pub Conn);

impl LockClient for Single {
    fn call(&mut self, _key: &[u8], args: &[Vec<u8>]) -> io::Result<Reply> {
        self.0.try_cmd(args)
    }

    fn wait_replicas(&mut self, n: i64, ms: i64) -> io::Result<Reply> {
        self.0.try_cmd(&["WAIT", &n.to_string(), &ms.to_string()])
    }

    fn served_by(&self) -> u16 {
        self.0.port
    }
}

// ---------------------------------------------------------------------------
// Ledger
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Exclusive,
    Shared,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
        }
    }
}

/// A thread's holding of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub mode: Mode,
    pub holds: i64,
    /// None: a grant in flight whose token the thread never saw.
    pub token: Option<i64>,
    /// Bounds of the absolute deadline, unix ms.
    pub dl_lo: i64,
    pub dl_hi: i64,
}

/// One state in a key's history and the request that led to it.
#[derive(Clone, Debug)]
pub struct Entry {
    pub state: Option<Held>,
    pub sent: Instant,
    pub acked: Instant,
    pub what: String,
}

/// The request in flight when the connection failed, with its outcomes.
#[derive(Clone, Debug)]
pub struct InFlight {
    pub key: usize,
    pub sent: Instant,
    pub outcomes: Vec<Option<Held>>,
    pub what: String,
}

/// A grant's token as the thread got it.
#[derive(Clone, Copy, Debug)]
pub struct Grant {
    pub port: u16,
    pub token: i64,
    pub key: usize,
    pub sent: Instant,
    pub acked: Instant,
}

/// Everything one thread knows about its own holdings.
#[derive(Clone, Debug)]
pub struct Ledger {
    pub thread: usize,
    pub owner: String,
    /// Per key, the history of this owner's state (entry 0: the start).
    pub keys: Vec<Vec<Entry>>,
    pub inflight: Option<InFlight>,
    /// Every new grant (not re-entries), in order.
    pub grants: Vec<Grant>,
    /// Per key, the index of the latest entry a `WAIT 1` confirmed replicated.
    pub confirmed: Vec<usize>,
    pub stats: Stats,
}

#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub requests: u64,
    pub grants: u64,
    pub refusals: u64,
    pub reentries: u64,
    pub renewals: u64,
    pub releases: u64,
    pub blocking: u64,
    pub confirmations: u64,
    pub unconfirmed: u64,
    pub unblocked: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.requests += o.requests;
        self.grants += o.grants;
        self.refusals += o.refusals;
        self.reentries += o.reentries;
        self.renewals += o.renewals;
        self.releases += o.releases;
        self.blocking += o.blocking;
        self.confirmations += o.confirmations;
        self.unconfirmed += o.unconfirmed;
        self.unblocked += o.unblocked;
    }
}

impl Ledger {
    /// Fresh ledgers for `threads` threads over `nkeys` keys; owners `<prefix><i>`.
    pub fn fresh(threads: usize, nkeys: usize, prefix: &str) -> Vec<Ledger> {
        let start = Instant::now();
        (0..threads)
            .map(|t| Ledger {
                thread: t,
                owner: format!("{prefix}{t}"),
                keys: (0..nkeys)
                    .map(|_| {
                        vec![Entry {
                            state: None,
                            sent: start,
                            acked: start,
                            what: "start".into(),
                        }]
                    })
                    .collect(),
                inflight: None,
                grants: Vec::new(),
                confirmed: vec![0; nkeys],
                stats: Stats::default(),
            })
            .collect()
    }

    /// Starts a new history from what a server shows (after a checked restart).
    pub fn rebase(&mut self, obs: &[Observed]) {
        let now = Instant::now();
        for (k, o) in obs.iter().enumerate() {
            let state = o.holder(self.owner.as_bytes()).map(|(mode, h)| Held {
                mode,
                holds: h.holds,
                token: Some(h.token),
                dl_lo: o.sent_ms + h.ttl,
                dl_hi: o.acked_ms + h.ttl,
            });
            self.keys[k] = vec![Entry {
                state,
                sent: now,
                acked: now,
                what: "rebased on what the server showed".into(),
            }];
            self.confirmed[k] = 0;
        }
        self.inflight = None;
    }

    pub fn last(&self, k: usize) -> &Option<Held> {
        &self.keys[k].last().expect("history is never empty").state
    }

    /// The largest token this thread was given.
    pub fn max_token(&self) -> i64 {
        self.grants.iter().map(|g| g.token).max().unwrap_or(0)
    }
}

/// Totals over ledgers.
pub fn totals(ledgers: &[Ledger]) -> Stats {
    let mut s = Stats::default();
    for l in ledgers {
        s.add(&l.stats);
    }
    s
}

/// Every token any thread was given.
pub fn all_grants(ledgers: &[Ledger]) -> Vec<Grant> {
    ledgers
        .iter()
        .flat_map(|l| l.grants.iter().copied())
        .collect()
}

// ---------------------------------------------------------------------------
// The load
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct LoadCfg {
    pub keys: Vec<Vec<u8>>,
    /// Lease bounds, ms.
    pub ttl: (i64, i64),
    /// Percent of new grants that block (`WAIT ms`).
    pub blocking_pct: u64,
    /// Bounds of those WAITs, ms.
    pub blocking_ms: (i64, i64),
    /// Percent of changes followed by `WAIT 1 <confirm_ms>` (replica check).
    pub confirm_pct: u64,
    pub confirm_ms: i64,
    /// Most holds one owner takes on a key.
    pub max_holds: i64,
    /// Pause between requests, ms (bounds).
    pub pace_ms: (i64, i64),
    /// The first `short_keys` keys get leases of `short_ttl` ms instead: they
    /// expire under load, and waiters are granted by the module's timer.
    pub short_keys: usize,
    pub short_ttl: (i64, i64),
}

impl LoadCfg {
    pub fn new(keys: Vec<Vec<u8>>) -> LoadCfg {
        LoadCfg {
            keys,
            ttl: (6_000, 9_000),
            blocking_pct: 15,
            blocking_ms: (20, 200),
            confirm_pct: 0,
            confirm_ms: 1_000,
            max_holds: 3,
            pace_ms: (0, 2),
            short_keys: 0,
            short_ttl: (150, 400),
        }
    }

    /// Keys `<prefix>0 .. <prefix>n-1`.
    pub fn numbered(prefix: &str, n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| format!("{prefix}{i}").into_bytes())
            .collect()
    }
}

/// What the threads share.
pub struct Shared {
    pub stop: AtomicBool,
    /// Requests answered so far (all threads).
    pub answered: AtomicU64,
    /// The latest instant such that everything acknowledged before it is
    /// known to be on a replica (a `WAIT 1` that answered >= 1 covered it).
    pub confirmed_before: Mutex<Option<Instant>>,
    /// Contract violations seen while running.
    pub violations: Mutex<Vec<String>>,
}

pub struct Running {
    pub shared: Arc<Shared>,
    handles: Vec<JoinHandle<Ledger>>,
}

impl Running {
    /// Starts one thread per ledger, each with the client `make(thread)` returns.
    pub fn start<C: LockClient + 'static>(
        ledgers: Vec<Ledger>,
        cfg: &LoadCfg,
        seed: u64,
        make: impl Fn(usize) -> C,
    ) -> Running {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            answered: AtomicU64::new(0),
            confirmed_before: Mutex::new(None),
            violations: Mutex::new(Vec::new()),
        });
        let handles = ledgers
            .into_iter()
            .map(|mut ledger| {
                let mut client = make(ledger.thread);
                let cfg = cfg.clone();
                let shared = Arc::clone(&shared);
                let mut rng = Rng::new(seed.wrapping_add(ledger.thread as u64 * 7919));
                thread::spawn(move || {
                    // Bounded: the tests stop or kill well before this.
                    let deadline = Instant::now() + Duration::from_secs(60);
                    while !shared.stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                        if !step(&mut ledger, &mut client, &mut rng, &cfg, &shared) {
                            break;
                        }
                        let pause = rng.range(cfg.pace_ms.0, cfg.pace_ms.1);
                        if pause > 0 {
                            thread::sleep(Duration::from_millis(pause as u64));
                        }
                    }
                    ledger
                })
            })
            .collect();
        Running { shared, handles }
    }

    /// Waits until the threads got at least `n` replies in all (bounded).
    pub fn wait_answered(&self, n: u64, timeout: Duration) {
        let start = Instant::now();
        while self.shared.answered.load(Ordering::SeqCst) < n && start.elapsed() < timeout {
            thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }

    /// Joins every thread (they stop by themselves once their server is gone,
    /// or when told to); returns the ledgers and panics on violations seen
    /// while running.
    pub fn join(self) -> (Vec<Ledger>, Option<Instant>) {
        let ledgers: Vec<Ledger> = self
            .handles
            .into_iter()
            .map(|h| h.join().expect("a load thread panicked"))
            .collect();
        let violations = self.shared.violations.lock().expect("violations").clone();
        assert!(
            violations.is_empty(),
            "contract violations under load:\n{}",
            violations.join("\n")
        );
        let confirmed = *self.shared.confirmed_before.lock().expect("confirmed");
        (ledgers, confirmed)
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Acquire,
    RAcquire,
    Read,
    Renew,
    Release,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Acquire => "LOCK.ACQUIRE",
            Op::RAcquire => "LOCK.RACQUIRE",
            Op::Read => "LOCK.READ",
            Op::Renew => "LOCK.RENEW",
            Op::Release => "LOCK.RELEASE",
        }
    }
}

fn violation(shared: &Shared, msg: String) {
    shared.violations.lock().expect("violations").push(msg);
}

/// One request. Returns false when the connection failed (the thread stops).
fn step<C: LockClient>(
    l: &mut Ledger,
    c: &mut C,
    rng: &mut Rng,
    cfg: &LoadCfg,
    shared: &Shared,
) -> bool {
    let k = rng.below(cfg.keys.len() as u64) as usize;
    let key = cfg.keys[k].clone();
    let now = now_ms();
    let cur = match l.last(k).clone() {
        // Surely expired: the server no longer counts it.
        Some(h) if h.dl_hi + 5 < now => None,
        // Maybe expiring right now: leave this key alone for a while.
        Some(h) if h.dl_lo <= now + 100 || (k < cfg.short_keys && h.dl_lo <= now + 1_000) => {
            return true
        }
        other => other,
    };
    let ttl = if k < cfg.short_keys {
        rng.range(cfg.short_ttl.0, cfg.short_ttl.1)
    } else {
        rng.range(cfg.ttl.0, cfg.ttl.1)
    };
    let op = match &cur {
        None => match rng.below(3) {
            0 => Op::Acquire,
            1 => Op::RAcquire,
            _ => Op::Read,
        },
        Some(h) if h.mode == Mode::Exclusive => match rng.below(5) {
            0 => Op::Renew,
            1 => Op::Acquire, // idempotent retry
            2 if h.holds < cfg.max_holds => Op::RAcquire,
            _ => Op::Release,
        },
        Some(h) => match rng.below(4) {
            0 => Op::Renew,
            1 if h.holds < cfg.max_holds => Op::Read,
            _ => Op::Release,
        },
    };
    let mut args: Vec<Vec<u8>> = vec![op.name().into(), key.clone(), l.owner.clone().into_bytes()];
    let mut blocking = None;
    match op {
        Op::Release => {}
        _ => args.push(ttl.to_string().into_bytes()),
    }
    if cur.is_none() && rng.chance(cfg.blocking_pct) {
        let w = rng.range(cfg.blocking_ms.0, cfg.blocking_ms.1);
        args.push(b"WAIT".to_vec());
        args.push(w.to_string().into_bytes());
        blocking = Some(w);
    }
    let what = format!(
        "{}{}",
        args.iter().map(|a| show(a)).collect::<Vec<_>>().join(" "),
        match &cur {
            None => " (holding nothing)".to_string(),
            Some(h) => format!(" (holding {h:?})"),
        }
    );
    let sent_ms = now_ms();
    let sent = Instant::now();
    // What the state becomes if the request runs, deadline bounds aside.
    let reset = |h: &Held, holds: i64| Held {
        mode: h.mode,
        holds,
        token: h.token,
        dl_lo: sent_ms + ttl,
        dl_hi: i64::MAX / 4,
    };
    let outcomes: Vec<Option<Held>> = match (&cur, op) {
        (None, _) => {
            let mode = if matches!(op, Op::Read) {
                Mode::Shared
            } else {
                Mode::Exclusive
            };
            vec![
                cur.clone(),
                Some(Held {
                    mode,
                    holds: 1,
                    token: None,
                    dl_lo: sent_ms + ttl,
                    dl_hi: i64::MAX / 4,
                }),
            ]
        }
        (Some(h), Op::Acquire | Op::Renew) => vec![cur.clone(), Some(reset(h, h.holds))],
        (Some(h), Op::RAcquire | Op::Read) => vec![cur.clone(), Some(reset(h, h.holds + 1))],
        (Some(h), Op::Release) => vec![
            cur.clone(),
            if h.holds > 1 {
                Some(Held {
                    holds: h.holds - 1,
                    ..h.clone()
                })
            } else {
                None
            },
        ],
    };
    l.inflight = Some(InFlight {
        key: k,
        sent,
        outcomes,
        what: what.clone(),
    });
    l.stats.requests += 1;
    if blocking.is_some() {
        l.stats.blocking += 1;
    }
    let reply = match c.call(&key, &args) {
        Ok(r) => r,
        Err(_) => return false,
    };
    let acked = Instant::now();
    let acked_ms = now_ms();
    l.inflight = None;
    shared.answered.fetch_add(1, Ordering::SeqCst);
    let port = c.served_by();
    let bad = |shared: &Shared, why: &str| {
        violation(
            shared,
            format!(
                "thread {} on port {port}: {what}: got {reply:?}: {why}",
                l.thread
            ),
        )
    };
    let deadline = |h: &Held, holds: i64| Held {
        mode: h.mode,
        holds,
        token: h.token,
        dl_lo: sent_ms + ttl,
        dl_hi: acked_ms + ttl,
    };
    if let Reply::Error(e) = &reply {
        // A waiter of a demoted master: Redis answers UNBLOCKED, and on
        // Valkey (which keeps it blocked) the module answers READONLY.
        if (e.starts_with("UNBLOCKED") || e.starts_with("READONLY"))
            && cur.is_none()
            && blocking.is_some()
        {
            // A waiter force-unblocked by a role change: not granted.
            l.stats.unblocked += 1;
            return true;
        }
    }
    let next: Option<Option<Held>> = match (&cur, op, &reply) {
        (None, _, Reply::Int(t)) => {
            let mode = if matches!(op, Op::Read) {
                Mode::Shared
            } else {
                Mode::Exclusive
            };
            if let Some(prev) = l
                .grants
                .iter()
                .filter(|g| g.port == port)
                .map(|g| g.token)
                .max()
            {
                if *t <= prev {
                    bad(
                        shared,
                        &format!("a new grant's token is not above this client's earlier {prev}"),
                    );
                }
            }
            if *t <= 0 {
                bad(shared, "a token is positive");
            }
            l.grants.push(Grant {
                port,
                token: *t,
                key: k,
                sent,
                acked,
            });
            l.stats.grants += 1;
            Some(Some(Held {
                mode,
                holds: 1,
                token: Some(*t),
                dl_lo: sent_ms + ttl,
                dl_hi: acked_ms + ttl,
            }))
        }
        (None, _, Reply::Nil) => {
            l.stats.refusals += 1;
            None
        }
        // Clients holding some keys while waiting for others can close a
        // cycle of waits: answered at once, nothing changed (a refusal).
        (None, _, Reply::Error(e)) if e.starts_with("DEADLOCK") && blocking.is_some() => {
            l.stats.refusals += 1;
            None
        }
        (Some(h), Op::Acquire, Reply::Int(t)) if Some(*t) == h.token => {
            l.stats.reentries += 1;
            Some(Some(deadline(h, h.holds)))
        }
        (Some(h), Op::RAcquire | Op::Read, Reply::Int(t)) if Some(*t) == h.token => {
            l.stats.reentries += 1;
            Some(Some(deadline(h, h.holds + 1)))
        }
        (Some(h), Op::Renew, Reply::Int(1)) => {
            l.stats.renewals += 1;
            Some(Some(deadline(h, h.holds)))
        }
        (Some(h), Op::Release, Reply::Int(1)) if h.holds == 1 => {
            l.stats.releases += 1;
            Some(None)
        }
        (Some(h), Op::Release, Reply::Int(0)) if h.holds > 1 => {
            l.stats.releases += 1;
            Some(Some(Held {
                holds: h.holds - 1,
                ..h.clone()
            }))
        }
        _ => {
            bad(shared, "not what the contract says for this holder");
            None
        }
    };
    let Some(state) = next else {
        return true;
    };
    l.keys[k].push(Entry {
        state,
        sent,
        acked,
        what,
    });
    if cfg.confirm_pct > 0 && rng.chance(cfg.confirm_pct) {
        match c.wait_replicas(1, cfg.confirm_ms) {
            Ok(Reply::Int(n)) if n >= 1 => {
                l.stats.confirmations += 1;
                l.confirmed[k] = l.keys[k].len() - 1;
                // Everything acknowledged before this request was sent came
                // before it in the replication stream.
                let mut c = shared.confirmed_before.lock().expect("confirmed");
                if c.is_none_or(|c| c < sent) {
                    *c = Some(sent);
                }
            }
            Ok(_) => l.stats.unconfirmed += 1,
            Err(_) => return false,
        }
    }
    true
}

// ---------------------------------------------------------------------------
// Observing a server
// ---------------------------------------------------------------------------

/// `LOCK.INFO` and `PTTL` of one key, with when the query was sent and answered.
#[derive(Clone, Debug)]
pub struct Observed {
    pub key: Vec<u8>,
    pub info: Option<LockInfo>,
    pub pttl: i64,
    pub sent_ms: i64,
    pub acked_ms: i64,
}

impl Observed {
    /// The holder named `owner`, with the lock's mode.
    pub fn holder(&self, owner: &[u8]) -> Option<(Mode, &HolderInfo)> {
        let info = self.info.as_ref()?;
        let mode = if info.mode == "shared" {
            Mode::Shared
        } else {
            Mode::Exclusive
        };
        info.holders
            .iter()
            .find(|h| h.owner == owner)
            .map(|h| (mode, h))
    }

    /// Bounds of a holder's absolute deadline.
    pub fn deadline(&self, h: &HolderInfo) -> (i64, i64) {
        (self.sent_ms + h.ttl, self.acked_ms + h.ttl)
    }

    pub fn tokens(&self) -> Vec<i64> {
        self.info
            .as_ref()
            .map(|i| i.holders.iter().map(|h| h.token).collect())
            .unwrap_or_default()
    }
}

/// Reads every key of the load.
pub fn observe<C: LockClient>(c: &mut C, keys: &[Vec<u8>]) -> Vec<Observed> {
    keys.iter()
        .map(|k| {
            let sent_ms = now_ms();
            let r = c
                .call(k, &[b"LOCK.INFO".to_vec(), k.clone()])
                .unwrap_or_else(|e| panic!("LOCK.INFO {}: {e}", show(k)));
            let acked_ms = now_ms();
            assert!(!r.is_err(), "LOCK.INFO {}: {r:?}", show(k));
            let info = LockInfo::parse(&r);
            let pttl = match c.call(k, &[b"PTTL".to_vec(), k.clone()]) {
                Ok(Reply::Int(p)) => p,
                other => panic!("PTTL {}: {other:?}", show(k)),
            };
            Observed {
                key: k.clone(),
                info,
                pttl,
                sent_ms,
                acked_ms,
            }
        })
        .collect()
}

/// Every token a server shows.
pub fn observed_tokens(obs: &[Observed]) -> Vec<i64> {
    obs.iter().flat_map(|o| o.tokens()).collect()
}

// ---------------------------------------------------------------------------
// Checking a server against the ledgers
// ---------------------------------------------------------------------------

/// Which of a thread's states a server may show.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    /// Everything acknowledged before this instant must be there.
    pub guaranteed_before: Option<Instant>,
    /// Also everything a `WAIT 1` confirmed for the thread itself.
    pub own_confirmations: bool,
    /// Nothing sent after this instant can be there (None: no limit; the
    /// request in flight is then possible too).
    pub possible_until: Option<Instant>,
}

impl Window {
    /// Every acknowledged change, and maybe the request in flight (AOF with
    /// `appendfsync always`, or a stopped load).
    pub fn everything() -> Window {
        Window {
            guaranteed_before: Some(Instant::now()),
            own_confirmations: false,
            possible_until: None,
        }
    }
}

/// How many ms two deadline estimates may differ beyond their bounds (clock
/// granularity on both sides).
const DEADLINE_SLACK_MS: i64 = 3;

fn matches(
    cand: &Option<Held>,
    o: &Observed,
    shown: Option<(Mode, &HolderInfo)>,
    max_known: i64,
) -> bool {
    match (cand, shown) {
        (None, None) => true,
        (None, Some(_)) => false,
        // It may have expired by the time it was read.
        (Some(c), None) => c.dl_lo <= o.acked_ms + DEADLINE_SLACK_MS,
        (Some(c), Some((mode, h))) => {
            // Surely expired before the read: it cannot be listed.
            if c.dl_hi + DEADLINE_SLACK_MS < o.sent_ms {
                return false;
            }
            let (lo, hi) = o.deadline(h);
            let token_ok = match c.token {
                Some(t) => t == h.token,
                None => h.token > max_known,
            };
            c.mode == mode
                && c.holds == h.holds
                && token_ok
                && lo <= c.dl_hi + DEADLINE_SLACK_MS
                && c.dl_lo <= hi + DEADLINE_SLACK_MS
        }
    }
}

/// Compares what a server shows with the ledgers; returns the problems found.
/// Also: owners no thread uses, a key's PTTL that is not its latest deadline.
pub fn check(ledgers: &[Ledger], obs: &[Observed], w: Window, what: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let owners: HashSet<Vec<u8>> = ledgers
        .iter()
        .map(|l| l.owner.clone().into_bytes())
        .collect();
    for l in ledgers {
        let max_known = l.max_token();
        for (k, o) in obs.iter().enumerate() {
            let hist = &l.keys[k];
            let mut lo = 0;
            for (i, e) in hist.iter().enumerate() {
                if w.guaranteed_before.is_some_and(|g| e.acked < g) {
                    lo = i;
                }
            }
            if w.own_confirmations {
                lo = lo.max(l.confirmed[k]);
            }
            let mut hi = lo;
            for (i, e) in hist.iter().enumerate() {
                if w.possible_until.is_none_or(|u| e.sent <= u) {
                    hi = hi.max(i);
                }
            }
            let mut cands: Vec<(Option<Held>, String)> = hist[lo..=hi]
                .iter()
                .map(|e| (e.state.clone(), e.what.clone()))
                .collect();
            if let Some(f) = &l.inflight {
                if f.key == k
                    && w.possible_until.is_none_or(|u| f.sent <= u)
                    && hi + 1 == hist.len()
                {
                    for out in &f.outcomes {
                        cands.push((out.clone(), format!("in flight: {}", f.what)));
                    }
                }
            }
            let shown = o.holder(l.owner.as_bytes());
            if !cands.iter().any(|(c, _)| matches(c, o, shown, max_known)) {
                let shown_s = match shown {
                    None => "nothing".to_string(),
                    Some((m, h)) => {
                        let (dlo, dhi) = o.deadline(h);
                        format!(
                            "{} holds {} token {} deadline in [{dlo}, {dhi}]",
                            m.name(),
                            h.holds,
                            h.token
                        )
                    }
                };
                let cands_s: Vec<String> = cands
                    .iter()
                    .map(|(c, why)| format!("      {c:?}   <- {why}"))
                    .collect();
                problems.push(format!(
                    "{what}: key {} owner {}: the server shows {shown_s} (read at [{}, {}]); \
                     the thread's possible states (history {lo}..={hi} of {}):\n{}",
                    show(&o.key),
                    l.owner,
                    o.sent_ms,
                    o.acked_ms,
                    hist.len(),
                    cands_s.join("\n")
                ));
            }
        }
    }
    for o in obs {
        if let Some(info) = &o.info {
            for h in &info.holders {
                if !owners.contains(&h.owner) {
                    problems.push(format!(
                        "{what}: key {} lists an owner no thread uses: {:?}",
                        show(&o.key),
                        info
                    ));
                }
            }
            // The key's TTL is its latest deadline (read a little later).
            let latest = info.holders.iter().map(|h| h.ttl).max().unwrap_or(0);
            if o.pttl >= 0 && (o.pttl > latest + 5 || o.pttl < latest - 200) {
                problems.push(format!(
                    "{what}: key {}: PTTL {} but the latest deadline is {latest} ms away: {info:?}",
                    show(&o.key),
                    o.pttl
                ));
            }
        }
    }
    problems
}

/// Panics with every problem, one per line.
#[track_caller]
pub fn assert_no_problems(problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// How many threads' last acknowledged live holdings a server does not show
/// as acknowledged (lost, or changed by the request in flight).
pub fn count_differences(ledgers: &[Ledger], obs: &[Observed]) -> usize {
    let mut n = 0;
    for l in ledgers {
        for (k, o) in obs.iter().enumerate() {
            let shown = o.holder(l.owner.as_bytes());
            if !matches(l.last(k), o, shown, l.max_token()) {
                n += 1;
            }
        }
    }
    n
}

/// Tokens per port: a short summary for the logs.
pub fn token_summary(ledgers: &[Ledger]) -> BTreeMap<u16, (usize, i64, i64)> {
    let mut m: BTreeMap<u16, (usize, i64, i64)> = BTreeMap::new();
    for g in all_grants(ledgers) {
        let e = m.entry(g.port).or_insert((0, i64::MAX, 0));
        e.0 += 1;
        e.1 = e.1.min(g.token);
        e.2 = e.2.max(g.token);
    }
    m
}
