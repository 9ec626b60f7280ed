//! Real automatic failover: a master, replicas and Sentinels on loopback
//! ([`Group`]), a lock load whose clients follow the master Sentinel names
//! or keep talking to the first one ([`Load`]), a resource that keeps the
//! highest fencing token it accepted ([`Resource`]), and checks over the
//! whole history, not per client ([`check`]).
//!
//! What the checks rest on: every server is on this machine's one clock, so
//! the client's send and reply instants bound when a server did something.
//! A grant's holder believes it holds from the reply until it sends its
//! RELEASE or until `sent + ttl`, whichever comes first; the server's hold
//! lasts at least that long (it computes the deadline after the request
//! was sent). The test's driver records each failover ([`Term`]): which
//! server became the master and from when it could grant (the instant the
//! old master was paused or killed: before that it was a replica).

#![allow(dead_code)]

use super::load::Rng;
use super::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The name the Sentinels monitor.
pub const NAME: &str = "locks";

// ---------------------------------------------------------------------------
// The group
// ---------------------------------------------------------------------------

/// One master, replicas and Sentinels, every process on 127.0.0.1.
pub struct Group {
    /// Data servers (the module loaded); index 0 started as the master.
    pub servers: Vec<Server>,
    pub sentinels: Vec<Server>,
    /// The replicas' first link to the master goes through it.
    pub link: Proxy,
}

impl Group {
    /// `replicas` replicas of a fresh master, `sentinels` Sentinels with a
    /// quorum of a majority, `down-after-milliseconds` `down_after_ms`.
    /// `extra` are redis.conf lines for the data servers. Returns once every
    /// Sentinel knows every replica and every other Sentinel.
    pub fn start(replicas: usize, sentinels: usize, down_after_ms: u64, extra: &[&str]) -> Group {
        let build = || {
            let mut b = Server::builder();
            for l in extra {
                b = b.config(l);
            }
            b.start()
        };
        let master = build();
        let link = Proxy::start(master.port);
        let mut servers = vec![master];
        for _ in 0..replicas {
            let r = build();
            r.conn()
                .cmd(&["REPLICAOF", "127.0.0.1", &link.port.to_string()])
                .ok();
            wait_for_sync(&servers[0], &r);
            servers.push(r);
        }
        let quorum = sentinels / 2 + 1;
        let sentinels: Vec<Server> = (0..sentinels)
            .map(|_| {
                Server::builder()
                    .sentinel()
                    .config(&format!(
                        "sentinel monitor {NAME} 127.0.0.1 {} {quorum}",
                        servers[0].port
                    ))
                    .config(&format!(
                        "sentinel down-after-milliseconds {NAME} {down_after_ms}"
                    ))
                    // A failover that does not finish is retried after twice
                    // this; the next one can start as soon as this one ended.
                    .config(&format!("sentinel failover-timeout {NAME} 5000"))
                    .config(&format!("sentinel parallel-syncs {NAME} {replicas}"))
                    .start()
            })
            .collect();
        let g = Group {
            servers,
            sentinels,
            link,
        };
        g.wait_known(replicas, Duration::from_secs(30));
        g
    }

    /// Waits until every Sentinel sees `replicas` replicas and every other
    /// Sentinel, and agrees on the master.
    pub fn wait_known(&self, replicas: usize, timeout: Duration) {
        let others = self.sentinels.len() - 1;
        wait_until(
            timeout,
            "the Sentinels know each other and the replicas",
            || {
                let masters: HashSet<Option<u16>> = self
                    .sentinels
                    .iter()
                    .map(|s| sentinel_master_addr(s.port))
                    .collect();
                masters.len() == 1
                    && self.sentinels.iter().all(|s| {
                        let Ok(mut c) = Conn::try_connect(s.port) else {
                            return false;
                        };
                        let Ok(r) = c.try_cmd(&["SENTINEL", "MASTER", NAME]) else {
                            return false;
                        };
                        let field = |name: &str| -> usize {
                            r.get(name)
                                .map(|v| v.str().parse().unwrap_or(0))
                                .unwrap_or(0)
                        };
                        field("num-slaves") >= replicas && field("num-other-sentinels") >= others
                    })
            },
        );
    }

    /// The master's port as the first Sentinel that answers names it.
    pub fn master_port(&self) -> Option<u16> {
        self.sentinels
            .iter()
            .find_map(|s| sentinel_master_addr(s.port))
    }

    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    pub fn server(&self, port: u16) -> &Server {
        self.servers
            .iter()
            .find(|s| s.port == port)
            .unwrap_or_else(|| panic!("no data server on port {port}"))
    }

    pub fn server_mut(&mut self, port: u16) -> &mut Server {
        self.servers
            .iter_mut()
            .find(|s| s.port == port)
            .unwrap_or_else(|| panic!("no data server on port {port}"))
    }

    /// Waits until the Sentinels name a master other than `old`.
    pub fn wait_new_master(&self, old: u16, timeout: Duration) -> u16 {
        let mut new = None;
        wait_until(timeout, "the Sentinels promote a replica", || {
            new = self.master_port().filter(|p| *p != old);
            new.is_some()
        });
        new.unwrap_or(old)
    }

    /// Waits until every Sentinel names the same master, which is a master,
    /// and every other data server is its replica, linked and in sync;
    /// returns it. (Sentinels may fail over twice for one fault: the master
    /// is the one they agree on in the end, not necessarily the first one
    /// they promoted.)
    pub fn wait_settled(&self, timeout: Duration) -> u16 {
        let mut settled = 0;
        wait_until(
            timeout,
            "the Sentinels agree on a master whose replicas are in sync",
            || {
                let named: HashSet<Option<u16>> = self
                    .sentinels
                    .iter()
                    .map(|s| sentinel_master_addr(s.port))
                    .collect();
                match named.iter().next() {
                    Some(Some(master)) if named.len() == 1 && self.synced_to(*master) => {
                        settled = *master;
                        true
                    }
                    _ => false,
                }
            },
        );
        settled
    }

    /// Whether `master` is a master and every other data server its synced
    /// replica.
    fn synced_to(&self, master: u16) -> bool {
        if role_of(master) != Some("master".into()) {
            return false;
        }
        let Ok(mut m) = Conn::try_connect(master) else {
            return false;
        };
        let Ok(Reply::Bulk(info)) = m.try_cmd(&["INFO", "replication"]) else {
            return false;
        };
        let target: i64 = info_get(&String::from_utf8_lossy(&info), "master_repl_offset")
            .and_then(|v| v.parse().ok())
            .unwrap_or(i64::MAX);
        self.servers.iter().filter(|s| s.port != master).all(|s| {
            let Ok(mut c) = Conn::try_connect(s.port) else {
                return false;
            };
            let Ok(Reply::Bulk(info)) = c.try_cmd(&["INFO", "replication"]) else {
                return false;
            };
            let info = String::from_utf8_lossy(&info).into_owned();
            info_get(&info, "role").as_deref() == Some("slave")
                && info_get(&info, "master_port").as_deref() == Some(master.to_string().as_str())
                && info_get(&info, "master_link_status").as_deref() == Some("up")
                && info_get(&info, "master_sync_in_progress").as_deref() == Some("0")
                && info_get(&info, "slave_repl_offset")
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|o| o >= target)
        })
    }

    /// `lock_last_token` of every replica of `master`: the last token each
    /// received from it (read while the master is stopped, before a
    /// promotion: what the promoted one inherits).
    pub fn replicas_last_tokens(&self, master: u16) -> HashMap<u16, i64> {
        self.servers
            .iter()
            .filter(|s| s.port != master)
            .filter_map(|s| {
                let mut c = Conn::try_connect(s.port).ok()?;
                c.set_timeout(Duration::from_millis(500));
                let info = match c.try_cmd(&["INFO", "lock"]).ok()? {
                    Reply::Bulk(b) => String::from_utf8_lossy(&b).into_owned(),
                    _ => return None,
                };
                let t = info_get(&info, "lock_last_token")?.parse().ok()?;
                Some((s.port, t))
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------
// Who is a master, when
// ---------------------------------------------------------------------------

/// Polls every data server's `ROLE` every 20 ms, so that the terms come from
/// what the servers were, not from what the test expected: Sentinels may
/// fail over twice for one fault, and two masters can grant at once.
pub struct RoleMonitor {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Vec<Observation>>>,
}

/// One `ROLE` reading; `master` is None when the server did not answer.
#[derive(Clone, Copy, Debug)]
pub struct Observation {
    pub port: u16,
    pub at_ms: i64,
    pub master: Option<bool>,
}

/// What the test did that the monitor cannot see.
#[derive(Clone, Debug)]
pub enum Fault {
    /// `old` (the master) was stopped or killed at `at_ms`; `received`: each
    /// replica's `lock_last_token` read right after.
    MasterStopped {
        old: u16,
        at_ms: i64,
        received: HashMap<u16, i64>,
    },
    /// `port` was restarted from its own files at `at_ms`: a stale master
    /// until the Sentinels demote it.
    Restarted { port: u16, at_ms: i64 },
}

impl RoleMonitor {
    pub fn start(ports: Vec<u16>) -> RoleMonitor {
        let stop = Arc::new(AtomicBool::new(false));
        let st = Arc::clone(&stop);
        let handle = thread::spawn(move || {
            let mut seen = Vec::new();
            while !st.load(Ordering::SeqCst) {
                for &port in &ports {
                    let at_ms = now_ms();
                    let master = role_of(port).map(|r| r == "master");
                    seen.push(Observation {
                        port,
                        at_ms,
                        master,
                    });
                }
                thread::sleep(Duration::from_millis(20));
            }
            seen
        });
        RoleMonitor {
            stop,
            handle: Some(handle),
        }
    }

    /// Stops, and turns the readings into terms. A server's term begins at
    /// its last reading before it was seen a master (it granted nothing
    /// before that), the first master's at 0; a server restarted from its
    /// files begins a stale term when seen a master again.
    pub fn terms(mut self, first: u16, faults: &[Fault]) -> Vec<Term> {
        self.stop.store(true, Ordering::SeqCst);
        let seen = self
            .handle
            .take()
            .map(|h| h.join().expect("the role monitor panicked"))
            .unwrap_or_default();
        let restarted = |port: u16, from: i64, to: i64| {
            faults.iter().any(|f| {
                matches!(f, Fault::Restarted { port: p, at_ms } if *p == port && from <= *at_ms && *at_ms <= to)
            })
        };
        let mut terms = vec![Term::new(first, 0)];
        let mut ports: Vec<u16> = seen.iter().map(|o| o.port).collect();
        ports.sort_unstable();
        ports.dedup();
        for port in ports {
            let mut prev_ms = 0;
            let mut replica_ms = 0;
            // The last reading that saw it a master, while it is one.
            let mut master_seen: Option<i64> = (port == first).then_some(0);
            for o in seen.iter().filter(|o| o.port == port) {
                if let (Some(true), Some(last)) = (o.master, master_seen) {
                    if restarted(port, last, o.at_ms) {
                        master_seen = None; // restarted in between: a new term
                    }
                }
                match (o.master, master_seen) {
                    (Some(true), None) => {
                        terms.push(Term {
                            // Restarted since it was last a replica.
                            stale: restarted(port, replica_ms, o.at_ms),
                            ..Term::new(port, prev_ms)
                        });
                        master_seen = Some(o.at_ms);
                    }
                    (Some(true), Some(_)) => master_seen = Some(o.at_ms),
                    (Some(false), _) => {
                        master_seen = None;
                        replica_ms = o.at_ms;
                    }
                    (None, _) => {}
                }
                prev_ms = o.at_ms;
            }
        }
        terms.sort_by_key(|t| t.from_ms);
        // What a promoted server had received from the master a fault
        // stopped, when it took over from that one.
        for i in 1..terms.len() {
            if terms[i].stale {
                continue;
            }
            let Some(prev) = (0..i).rev().find(|p| !terms[*p].stale) else {
                continue;
            };
            let (port, from, prev_port) = (terms[i].port, terms[i].from_ms, terms[prev].port);
            terms[i].inherited = faults.iter().rev().find_map(|f| match f {
                Fault::MasterStopped {
                    old,
                    at_ms,
                    received,
                } if *old == prev_port && *at_ms <= from + 5_000 => received.get(&port).copied(),
                _ => None,
            });
        }
        terms
    }
}

impl Drop for RoleMonitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------
// A link that can be cut
// ---------------------------------------------------------------------------

/// A TCP relay on 127.0.0.1 to a port. [`Proxy::cut`] drops everything in
/// both directions from then on without closing anything: a partition the
/// ends notice only by timeouts.
pub struct Proxy {
    pub port: u16,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    pub fn start(target: u16) -> Proxy {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, st) = (Arc::clone(&cut), Arc::clone(&stop));
        thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((down, _)) => {
                        let Ok(up) = std::net::TcpStream::connect(("127.0.0.1", target)) else {
                            continue;
                        };
                        for (from, to) in [(&down, &up), (&up, &down)] {
                            let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
                                continue;
                            };
                            let (c, st) = (Arc::clone(&c), Arc::clone(&st));
                            thread::spawn(move || pump(from, to, &c, &st));
                        }
                    }
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Proxy { port, cut, stop }
    }

    /// Cuts the link: bytes read from either end are dropped.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn pump(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    cut: &AtomicBool,
    stop: &AtomicBool,
) {
    use std::io::{Read, Write};
    let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::SeqCst) {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if !cut.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME` from one Sentinel (short timeouts).
pub fn sentinel_master_addr(port: u16) -> Option<u16> {
    let mut c = Conn::try_connect(port).ok()?;
    c.set_timeout(Duration::from_millis(500));
    let r = c
        .try_cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", NAME])
        .ok()?;
    match r {
        Reply::Array(a) if a.len() == 2 => a[1].str().parse().ok(),
        _ => None,
    }
}

/// `ROLE`'s first element, or None when the server does not answer in 500 ms.
pub fn role_of(port: u16) -> Option<String> {
    let mut c = Conn::try_connect(port).ok()?;
    c.set_timeout(Duration::from_millis(500));
    match c.try_cmd(&["ROLE"]).ok()? {
        Reply::Array(a) if !a.is_empty() => Some(a[0].str()),
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// The resource the locks protect
// ---------------------------------------------------------------------------

/// Keeps, per key, the highest token it accepted, and refuses a write with
/// a lower one (what docs/clients.md tells a resource to do).
#[derive(Default)]
pub struct Resource {
    keys: Mutex<HashMap<usize, KeyState>>,
}

#[derive(Clone, Copy, Debug, Default)]
struct KeyState {
    highest: i64,
    /// The grant that wrote `highest`.
    by: Option<GrantId>,
}

/// A grant: the port of the server that granted it and its token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GrantId {
    pub port: u16,
    pub token: i64,
}

/// A write the resource refused.
#[derive(Clone, Copy, Debug)]
pub struct Refusal {
    pub key: usize,
    pub writer: GrantId,
    /// The accepted grant whose token was higher.
    pub over: GrantId,
    /// The writer's lease had ended by its own clock (a stalled holder).
    pub stalled: bool,
}

impl Resource {
    /// A write under `writer`'s grant: accepted when its token is at least
    /// the highest accepted so far.
    fn write(&self, key: usize, writer: GrantId) -> Result<(), GrantId> {
        let mut keys = self.keys.lock().expect("resource");
        let s = keys.entry(key).or_default();
        if writer.token >= s.highest {
            s.highest = writer.token;
            s.by = Some(writer);
            Ok(())
        } else {
            Err(s.by.unwrap_or(writer))
        }
    }
}

// ---------------------------------------------------------------------------
// The load
// ---------------------------------------------------------------------------

/// How a client finds its server.
#[derive(Clone, Copy, Debug)]
pub enum Route {
    /// Asks the Sentinels for the master after every failure.
    Follow,
    /// Keeps talking to this port (a client with a stale configuration).
    Pinned(u16),
}

/// One client thread's behaviour.
#[derive(Clone, Copy, Debug)]
pub struct ClientCfg {
    pub route: Route,
    /// `WAIT 1 <ms>` after every grant; the grant counts as held only when
    /// the reply is at least 1 (the recipe of docs/design.md).
    pub confirm_ms: Option<i64>,
    /// Percent of grants after which the holder stalls past its lease and
    /// then writes (a client paused by a GC or a VM stall).
    pub stall_pct: u64,
    /// How long a reply may take before the client gives up on the request.
    pub timeout_ms: u64,
}

#[derive(Clone, Debug)]
pub struct LoadCfg {
    pub keys: usize,
    pub ttl: (i64, i64),
    /// Percent of acquires that wait (`WAIT ms`) and for how long.
    pub blocking_pct: u64,
    pub blocking_ms: (i64, i64),
    /// How long a holder works before releasing, ms.
    pub hold_ms: (i64, i64),
}

impl Default for LoadCfg {
    fn default() -> Self {
        LoadCfg {
            keys: 12,
            ttl: (800, 2_500),
            blocking_pct: 40,
            blocking_ms: (50, 400),
            hold_ms: (0, 40),
        }
    }
}

/// One acknowledged grant and what its holder did with it.
#[derive(Clone, Debug)]
pub struct Grant {
    pub thread: usize,
    pub key: usize,
    pub id: GrantId,
    pub sent_ms: i64,
    /// The earliest the server may have granted it: the send of an earlier
    /// acquire of the same key by the same client that got no reply (then
    /// this one is that grant given back: a holder asking again gets its
    /// token), else `sent_ms`.
    pub granted_from_ms: i64,
    pub acked_ms: i64,
    pub ttl: i64,
    /// When the holder sent its RELEASE (None: it let the lease run out).
    pub release_sent_ms: Option<i64>,
    /// `WAIT 1` answered at least 1 (only for clients that confirm).
    pub confirmed: bool,
    /// The client confirms its grants: unconfirmed ones it does not use.
    pub confirming: bool,
    /// The holder stalled past its lease before its last write.
    pub stalled: bool,
    /// The writes the resource accepted and refused under this grant.
    pub writes: u32,
    pub refused: u32,
}

impl Grant {
    /// Until when the holder believed it held the lock, by its own clock.
    pub fn believed_until(&self) -> i64 {
        let lease = self.sent_ms + self.ttl;
        self.release_sent_ms.map_or(lease, |r| r.min(lease))
    }

    /// Whether the holder used it (wrote under it) as a lock.
    pub fn used(&self) -> bool {
        !self.confirming || self.confirmed
    }
}

#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub requests: u64,
    pub grants: u64,
    pub refusals: u64,
    /// Requests whose reply never came (timeout or closed connection).
    pub unknown: u64,
    /// Error replies (READONLY, UNBLOCKED, LOADING, ...): routed again.
    pub errors: u64,
    pub unconfirmed: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.requests += o.requests;
        self.grants += o.grants;
        self.refusals += o.refusals;
        self.unknown += o.unknown;
        self.errors += o.errors;
        self.unconfirmed += o.unconfirmed;
    }
}

struct ThreadOut {
    grants: Vec<Grant>,
    refusals: Vec<Refusal>,
    counts: Counts,
}

/// Client threads running against a [`Group`].
pub struct Load {
    stop: Arc<AtomicBool>,
    pub answered: Arc<AtomicU64>,
    handles: Vec<JoinHandle<ThreadOut>>,
}

/// What a run of the load recorded.
pub struct History {
    pub grants: Vec<Grant>,
    pub refusals: Vec<Refusal>,
    pub counts: Counts,
}

impl Load {
    pub fn start(
        sentinels: Vec<u16>,
        first_master: u16,
        clients: &[ClientCfg],
        cfg: &LoadCfg,
        seed: u64,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU64::new(0));
        let resource = Arc::new(Resource::default());
        let handles = clients
            .iter()
            .enumerate()
            .map(|(t, cc)| {
                let cc = *cc;
                let cfg = cfg.clone();
                let stop = Arc::clone(&stop);
                let answered = Arc::clone(&answered);
                let resource = Arc::clone(&resource);
                let sentinels = sentinels.clone();
                let rng = Rng::new(seed.wrapping_add(t as u64 * 104_729));
                thread::spawn(move || {
                    let mut c = Client {
                        unanswered: HashMap::new(),
                        thread: t,
                        owner: format!("client-{t}"),
                        cc,
                        cfg,
                        rng,
                        sentinels,
                        last_master: first_master,
                        conn: None,
                        out: ThreadOut {
                            grants: Vec::new(),
                            refusals: Vec::new(),
                            counts: Counts::default(),
                        },
                    };
                    while !stop.load(Ordering::SeqCst) {
                        c.step(&resource, &answered, &stop);
                    }
                    c.out
                })
            })
            .collect();
        Load {
            stop,
            answered,
            handles,
        }
    }

    /// Waits until the clients got `n` more replies (bounded).
    pub fn wait_more(&self, n: u64, timeout: Duration) {
        let target = self.answered.load(Ordering::SeqCst) + n;
        let start = Instant::now();
        while self.answered.load(Ordering::SeqCst) < target && start.elapsed() < timeout {
            thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn stop(self) -> History {
        self.stop.store(true, Ordering::SeqCst);
        let mut h = History {
            grants: Vec::new(),
            refusals: Vec::new(),
            counts: Counts::default(),
        };
        for handle in self.handles {
            let out = handle.join().expect("a client thread panicked");
            h.grants.extend(out.grants);
            h.refusals.extend(out.refusals);
            h.counts.add(&out.counts);
        }
        h
    }
}

struct Client {
    /// Per key, the send of the earliest acquire without a reply since the
    /// client last knew it held nothing there.
    unanswered: HashMap<usize, i64>,
    thread: usize,
    owner: String,
    cc: ClientCfg,
    cfg: LoadCfg,
    rng: Rng,
    sentinels: Vec<u16>,
    last_master: u16,
    conn: Option<Conn>,
    out: ThreadOut,
}

enum Outcome {
    Reply(Reply),
    /// No reply: timeout or closed connection (the connection is dropped).
    Lost,
}

impl Client {
    fn route(&mut self) -> u16 {
        match self.cc.route {
            Route::Pinned(p) => p,
            Route::Follow => {
                let n = self.sentinels.len();
                let first = self.rng.below(n as u64) as usize;
                for i in 0..n {
                    if let Some(p) = sentinel_master_addr(self.sentinels[(first + i) % n]) {
                        self.last_master = p;
                        return p;
                    }
                }
                self.last_master
            }
        }
    }

    fn call(&mut self, args: &[Vec<u8>], extra_ms: i64) -> Outcome {
        if self.conn.is_none() {
            let port = self.route();
            match Conn::try_connect(port) {
                Ok(c) => self.conn = Some(c),
                Err(_) => {
                    thread::sleep(Duration::from_millis(20));
                    return Outcome::Lost;
                }
            }
        }
        let Some(c) = self.conn.as_mut() else {
            return Outcome::Lost;
        };
        c.set_timeout(Duration::from_millis(
            self.cc.timeout_ms + extra_ms.max(0) as u64,
        ));
        match c.try_cmd(args) {
            Ok(r) => {
                if let Reply::Error(_) = &r {
                    // READONLY, UNBLOCKED, LOADING, MASTERDOWN...: the
                    // server is not (or no longer) a master; route again.
                    self.conn = None;
                    thread::sleep(Duration::from_millis(20));
                }
                Outcome::Reply(r)
            }
            Err(_) => {
                self.conn = None;
                Outcome::Lost
            }
        }
    }

    fn step(&mut self, resource: &Resource, answered: &AtomicU64, stop: &AtomicBool) {
        let k = self.rng.below(self.cfg.keys as u64) as usize;
        let key = format!("lock:{k}").into_bytes();
        let ttl = self.rng.range(self.cfg.ttl.0, self.cfg.ttl.1);
        let mut args: Vec<Vec<u8>> = vec![
            b"LOCK.ACQUIRE".to_vec(),
            key.clone(),
            self.owner.clone().into_bytes(),
            ttl.to_string().into_bytes(),
        ];
        let mut wait = 0;
        if self.rng.chance(self.cfg.blocking_pct) {
            wait = self
                .rng
                .range(self.cfg.blocking_ms.0, self.cfg.blocking_ms.1);
            args.push(b"WAIT".to_vec());
            args.push(wait.to_string().into_bytes());
        }
        self.out.counts.requests += 1;
        let sent_ms = now_ms();
        let port = match &self.conn {
            Some(c) => c.port,
            None => 0,
        };
        let reply = self.call(&args, wait);
        let acked_ms = now_ms();
        let port = self.conn.as_ref().map_or(port, |c| c.port);
        let token = match reply {
            Outcome::Lost => {
                self.out.counts.unknown += 1;
                self.unanswered.entry(k).or_insert(sent_ms);
                return;
            }
            Outcome::Reply(Reply::Int(t)) => t,
            Outcome::Reply(Reply::Nil) => {
                answered.fetch_add(1, Ordering::SeqCst);
                self.out.counts.refusals += 1;
                return;
            }
            Outcome::Reply(_) => {
                self.out.counts.errors += 1;
                return;
            }
        };
        answered.fetch_add(1, Ordering::SeqCst);
        self.out.counts.grants += 1;
        let mut g = Grant {
            thread: self.thread,
            key: k,
            id: GrantId { port, token },
            sent_ms,
            granted_from_ms: self.unanswered.get(&k).copied().unwrap_or(sent_ms),
            acked_ms,
            ttl,
            release_sent_ms: None,
            confirmed: false,
            confirming: self.cc.confirm_ms.is_some(),
            stalled: false,
            writes: 0,
            refused: 0,
        };
        if let Some(ms) = self.cc.confirm_ms {
            match self.call(
                &[b"WAIT".to_vec(), b"1".to_vec(), ms.to_string().into_bytes()],
                ms,
            ) {
                Outcome::Reply(Reply::Int(n)) if n >= 1 => g.confirmed = true,
                _ => self.out.counts.unconfirmed += 1,
            }
        }
        if g.used() && now_ms() < g.believed_until() - 5 {
            self.write(resource, &mut g, false);
        }
        let hold = self.rng.range(self.cfg.hold_ms.0, self.cfg.hold_ms.1);
        if hold > 0 {
            thread::sleep(Duration::from_millis(hold as u64));
        }
        if g.used() && self.rng.chance(self.cc.stall_pct) && !stop.load(Ordering::SeqCst) {
            // Stalled past the lease, it writes as if it still held the lock.
            let until = g.sent_ms + g.ttl + 50;
            while now_ms() < until {
                thread::sleep(Duration::from_millis(10));
            }
            g.stalled = true;
            self.write(resource, &mut g, true);
        } else if g.used() && now_ms() < g.believed_until() - 5 {
            self.write(resource, &mut g, false);
        }
        g.release_sent_ms = Some(now_ms());
        let rel = vec![
            b"LOCK.RELEASE".to_vec(),
            key,
            self.owner.clone().into_bytes(),
        ];
        if let Outcome::Reply(Reply::Int(1) | Reply::Nil) = self.call(&rel, 0) {
            // Nothing of ours is left on that key (on that server).
            self.unanswered.remove(&k);
        }
        self.out.grants.push(g);
    }

    fn write(&mut self, resource: &Resource, g: &mut Grant, stalled: bool) {
        match resource.write(g.key, g.id) {
            Ok(()) => g.writes += 1,
            Err(over) => {
                g.refused += 1;
                self.out.refusals.push(Refusal {
                    key: g.key,
                    writer: g.id,
                    over,
                    stalled,
                });
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The checks
// ---------------------------------------------------------------------------

/// A master's term: from `from_ms` (the instant its predecessor was paused or
/// killed; before that it was a replica and granted nothing) on.
///
/// A stale term is a side branch, not a successor: a killed master restarted
/// from its own file is a master until the Sentinels turn it into a replica,
/// while the real master goes on. Its tokens are above everything before its
/// restart (the skew-margin jump), but the real master's are not above its
/// own until the real master's clock passes them (at most
/// `lock.clock-skew-ms`): a resource that accepted one of its grants refuses
/// the real master's holders until then.
#[derive(Clone, Copy, Debug)]
pub struct Term {
    pub port: u16,
    pub from_ms: i64,
    pub stale: bool,
    /// The last token of the previous term this master had received when
    /// that one stopped (its `lock_last_token` as a replica): the previous
    /// term's grants above it were lost.
    pub inherited: Option<i64>,
}

impl Term {
    pub fn new(port: u16, from_ms: i64) -> Term {
        Term {
            port,
            from_ms,
            stale: false,
            inherited: None,
        }
    }
}

/// How many ms the clients' clock readings may be off the server's events
/// (the reading happens a little before or after).
const SLACK_MS: i64 = 3;

/// What the history shows.
#[derive(Debug, Default)]
pub struct Report {
    /// Contract violations: each makes the test fail.
    pub violations: Vec<String>,
    pub grants_per_term: BTreeMap<usize, usize>,
    /// Grants acknowledged before a failover that the new master never
    /// received (token above what it had received when the old one stopped).
    pub lost: usize,
    /// Of those, the ones a `WAIT 1` had confirmed (the recipe says none).
    pub lost_confirmed: usize,
    /// Pairs of holders of one key at once, each with a grant from a
    /// different term (a lost grant or a split brain; tokens decide).
    pub cross_term_overlaps: usize,
    /// Grants by a master after its successor's term began (split brain).
    pub split_brain_grants: usize,
    /// Writes the resource refused: under a lost or split-brain grant, or
    /// by a stalled holder.
    pub refused_stale_term: usize,
    pub refused_stalled: usize,
    /// Writes refused because a restarted stale master's grant had written a
    /// higher token (a liveness loss bounded by the skew margin).
    pub refused_by_stale_master: usize,
}

impl Report {
    pub fn print(&self, what: &str, counts: &Counts) {
        eprintln!(
            "{what}: {} requests, {} grants ({:?} per term), {} refused, {} without a reply, \
             {} error replies, {} grants unconfirmed by WAIT 1; {} acknowledged grants lost \
             ({} of them confirmed by WAIT 1), {} split-brain grants, {} pairs of holders at \
             once from different terms; the resource refused {} writes \
             under an older term's grant, {} from stalled holders and {} because a restarted \
             stale master's grant had written a higher token",
            counts.requests,
            counts.grants,
            self.grants_per_term,
            counts.refusals,
            counts.unknown,
            counts.errors,
            counts.unconfirmed,
            self.lost,
            self.lost_confirmed,
            self.split_brain_grants,
            self.cross_term_overlaps,
            self.refused_stale_term,
            self.refused_stalled,
            self.refused_by_stale_master
        );
    }

    #[track_caller]
    pub fn assert_clean(&self) {
        assert!(
            self.violations.is_empty(),
            "{} violation(s):\n{}",
            self.violations.len(),
            self.violations
                .iter()
                .take(40)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// The term a grant belongs to: the latest term of its server that had
/// begun when the grant was acknowledged.
fn term_of(g: &Grant, terms: &[Term]) -> Option<usize> {
    terms
        .iter()
        .enumerate()
        .filter(|(_, t)| t.port == g.id.port && t.from_ms <= g.acked_ms + SLACK_MS)
        .map(|(i, _)| i)
        .next_back()
}

/// Checks the whole history against what fencing promises:
/// - tokens never repeat, and every token of a later term is above every
///   token of an earlier one (the old master's grants during a split brain
///   included);
/// - within one term, no two holders of a key overlap, and tokens increase
///   in grant order;
/// - a grant a `WAIT 1` confirmed is never lost to a later term;
/// - the resource refuses only writes under an older term's grant or from a
///   holder stalled past its lease, never one from the newest term because
///   of an older one.
pub fn check(h: &History, terms: &[Term]) -> Report {
    let mut r = Report::default();
    let mut by_term: BTreeMap<usize, Vec<&Grant>> = BTreeMap::new();
    for g in &h.grants {
        match term_of(g, terms) {
            Some(t) => by_term.entry(t).or_default().push(g),
            None => r.violations.push(format!(
                "a grant from port {} at {} which was no master then: {g:?}",
                g.id.port, g.acked_ms
            )),
        }
    }
    for (t, gs) in &by_term {
        r.grants_per_term.insert(*t, gs.len());
    }
    let term_map: HashMap<GrantId, usize> = by_term
        .iter()
        .flat_map(|(t, gs)| gs.iter().map(move |g| (g.id, *t)))
        .collect();

    // Tokens never repeat. A holder that asks again for a key it still
    // holds (its RELEASE got no reply, or the new master received its
    // grant) is given its own token back: a repeat, not a new grant, left
    // out of the token checks below.
    let mut seen: HashMap<i64, (usize, usize)> = HashMap::new();
    let mut repeats: HashSet<(u16, i64, i64)> = HashSet::new();
    let mut in_order: Vec<&Grant> = h.grants.iter().collect();
    in_order.sort_by_key(|g| g.acked_ms);
    for g in in_order {
        match seen.insert(g.id.token, (g.key, g.thread)) {
            None => {}
            Some(prev) if prev == (g.key, g.thread) => {
                repeats.insert((g.id.port, g.id.token, g.acked_ms));
            }
            Some(prev) => r.violations.push(format!(
                "token {} issued twice: (key, client) {prev:?} and {:?}",
                g.id.token,
                (g.key, g.thread)
            )),
        }
    }
    let is_repeat = |g: &Grant| repeats.contains(&(g.id.port, g.id.token, g.acked_ms));

    // Later terms' tokens are above every earlier term's. A stale term's
    // are above its own server's earlier terms' (its file); the real
    // master's are not compared with a stale one's.
    let max_of = |gs: &[&Grant]| {
        gs.iter()
            .filter(|g| !is_repeat(g))
            .map(|g| g.id.token)
            .max()
            .unwrap_or(0)
    };
    let mut max_before = 0i64;
    for (t, gs) in &by_term {
        let min = gs
            .iter()
            // A grant given back to a holder that asked again may carry a
            // token an earlier term issued (its first reply was lost).
            .filter(|g| !is_repeat(g) && g.granted_from_ms >= terms[*t].from_ms)
            .map(|g| g.id.token)
            .min()
            .unwrap_or(i64::MAX);
        let (floor, whose) = if terms[*t].stale {
            let own = by_term
                .range(..*t)
                .filter(|(p, _)| terms[**p].port == terms[*t].port)
                .map(|(_, gs)| max_of(gs))
                .max()
                .unwrap_or(0);
            (own, "its own server's earlier term")
        } else {
            (max_before, "an earlier term")
        };
        if min <= floor {
            r.violations.push(format!(
                "term {t} (port {}) issued token {min}, not above token {floor} of {whose}",
                terms[*t].port
            ));
        }
        if !terms[*t].stale {
            max_before = max_before.max(max_of(gs));
        }
        // Split brain: grants of this term after the next term began.
        if terms[*t].stale {
            r.split_brain_grants += gs.len();
        } else if let Some(next) = terms.get(t + 1) {
            r.split_brain_grants += gs.iter().filter(|g| g.sent_ms > next.from_ms).count();
        }
    }

    // Per key: overlaps, pair by pair among grants close in time.
    let mut per_key: BTreeMap<usize, Vec<(&Grant, usize)>> = BTreeMap::new();
    for g in &h.grants {
        if let Some(t) = term_map.get(&g.id) {
            per_key.entry(g.key).or_default().push((g, *t));
        }
    }
    for (key, mut gs) in per_key {
        gs.sort_by_key(|(g, _)| g.acked_ms);
        for (i, (a, ta)) in gs.iter().enumerate() {
            for (b, tb) in gs.iter().skip(i + 1) {
                if b.acked_ms + SLACK_MS >= a.believed_until() {
                    break; // sorted by reply: no later one overlaps a
                }
                if (b.id.token, b.thread) == (a.id.token, a.thread)
                    || a.acked_ms + SLACK_MS >= b.believed_until()
                {
                    continue; // one lease, or no overlap
                }
                if ta != tb && (terms[*ta].stale || terms[*tb].stale) {
                    continue; // a split brain with a restarted stale master
                }
                // b was granted while a's holder believed it held the key.
                if ta == tb {
                    r.violations.push(format!(
                        "key {key}: two holders at once within term {ta}: {a:?} and {b:?}"
                    ));
                    continue;
                }
                r.cross_term_overlaps += 1;
                let (old, t_old, new, t_new) = if ta < tb {
                    (a, ta, b, tb)
                } else {
                    (b, tb, a, ta)
                };
                let before_failover = terms
                    .get(t_old + 1)
                    .is_none_or(|next| old.acked_ms < next.from_ms);
                if before_failover && old.confirmed {
                    r.violations.push(format!(
                        "key {key}: a grant WAIT 1 confirmed was forgotten by term {t_new}: \
                         {old:?}, then {new:?}"
                    ));
                }
            }
        }
    }

    // Within a term, tokens increase in grant order: a grant requested after
    // another was acknowledged has a higher token.
    for (t, gs) in &by_term {
        let gs: Vec<&Grant> = gs.iter().copied().filter(|g| !is_repeat(g)).collect();
        let mut by_ack: Vec<&Grant> = gs.clone();
        by_ack.sort_by_key(|g| g.acked_ms);
        let mut by_sent: Vec<&Grant> = gs.clone();
        by_sent.sort_by_key(|g| g.granted_from_ms);
        let mut j = 0;
        let mut max_acked: Option<&Grant> = None;
        for g in by_sent {
            while j < by_ack.len() && by_ack[j].acked_ms + SLACK_MS < g.granted_from_ms {
                if max_acked.is_none_or(|m| by_ack[j].id.token > m.id.token) {
                    max_acked = Some(by_ack[j]);
                }
                j += 1;
            }
            if let Some(m) = max_acked {
                if g.id.token <= m.id.token && g.id != m.id {
                    r.violations.push(format!(
                        "term {t}: {g:?} was requested after {m:?} was granted, \
                         with a token not above it"
                    ));
                }
            }
        }
    }

    // Lost at each failover: the previous term's grants acknowledged before
    // it stopped, with tokens above what the new master had received.
    for (t, term) in terms.iter().enumerate() {
        let (Some(inherited), false) = (term.inherited, term.stale) else {
            continue;
        };
        let Some(prev) = (0..t).rev().find(|p| !terms[*p].stale) else {
            continue;
        };
        for g in by_term.get(&prev).into_iter().flatten() {
            if g.acked_ms < term.from_ms && g.id.token > inherited && !is_repeat(g) {
                r.lost += 1;
                if g.confirmed {
                    r.lost_confirmed += 1;
                    r.violations.push(format!(
                        "a grant WAIT 1 confirmed was lost at the failover to port {} \
                         (which had received tokens up to {inherited}): {g:?}",
                        term.port
                    ));
                }
            }
        }
    }

    for f in &h.refusals {
        let (Some(tw), Some(to)) = (term_map.get(&f.writer), term_map.get(&f.over)) else {
            continue;
        };
        if f.stalled {
            r.refused_stalled += 1;
        } else if terms[*to].stale && tw != to {
            r.refused_by_stale_master += 1;
        } else if tw < to || terms[*tw].stale {
            r.refused_stale_term += 1;
        } else {
            r.violations.push(format!(
                "key {}: the resource refused a write under {:?} (term {tw}) because of \
                 {:?} (term {to}): a holder in its lease was fenced off",
                f.key, f.writer, f.over
            ));
        }
    }
    r
}
