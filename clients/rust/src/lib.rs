//! Locks for the redis-lock Redis module, on the `redis` crate: blocking
//! ([`Lock`]) and tokio ([`aio::Lock`]), one API shape for every kind.
//!
//! ```no_run
//! # fn main() -> Result<(), redis_native_lock::Error> {
//! use redis_native_lock::Lock;
//! use std::time::Duration;
//!
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let mut lock = Lock::exclusive(&client, "orders:42")
//!     .ttl(Duration::from_secs(30))
//!     .wait(Some(Duration::from_secs(10))); // no .wait(): do not wait
//! if let Some(guard) = lock.acquire()? {
//!     guard.check()?;                             // Err(LeaseLost) if the lease is gone
//!     // storage.write(data, guard.token())       // the fencing token
//!     guard.release()?;                           // dropping the guard releases too
//! }
//! # Ok(()) }
//! ```
//!
//! The kinds: [`Lock::exclusive`] (`LOCK.ACQUIRE`), [`Lock::reentrant`]
//! (`LOCK.RACQUIRE`: [`Guard::reacquire`] adds a hold, each guard released
//! removes one), [`Lock::read`] and [`Lock::write`] (a read-write lock:
//! `LOCK.READ` and a reentrant `LOCK.RACQUIRE` on the same key),
//! [`Lock::semaphore`] (`LOCK.SEMAPHORE`: one permit of `limit`),
//! [`Lock::multi`] (`LOCK.MACQUIRE`: every key or none; [`Guard::tokens`]
//! per key). Keys and owners are bytes (`impl AsRef<[u8]>`).
//!
//! # Writes only while held
//!
//! [`Guard::call`] runs a command in the server if and only if the grant
//! still holds the lock, as one atomic step (`LOCK.GUARD key owner TOKEN
//! token CALL ...`): fencing for data in the same Redis. Once the lease is
//! gone (expired, freed, retaken, or granted again to the same owner name
//! under another token) nothing runs and it is [`Error::LeaseLost`]. A
//! multi-key lock guards on its first key, [`Guard::call_on`] on another.
//!
//! # One holder, one object: the types keep it so
//!
//! A [`Lock`] is one holder (one owner id in the server). Two acquires
//! through one object would be the same owner, which the server answers as
//! a repeat (`LOCK.ACQUIRE` gives the same token back): both callers would
//! be "inside" at once. So [`Lock::acquire`] takes `&mut self` and the
//! [`Guard`] it returns borrows the `Lock` mutably until it is released or
//! dropped: one acquisition at a time per object, checked by the compiler.
//! Threads that contend for a lock each make their own `Lock` (or share one
//! behind a `std::sync::Mutex`, whose guard then spans the acquisition).
//!
//! Sharing one `Lock` between threads and acquiring through it does not
//! compile:
//!
//! ```compile_fail
//! use redis_native_lock::Lock;
//! use std::sync::Arc;
//!
//! let client = redis::Client::open("redis://127.0.0.1:6379/").unwrap();
//! let lock = Arc::new(Lock::exclusive(&client, "k"));
//! let shared = Arc::clone(&lock);
//! std::thread::spawn(move || shared.acquire()); // cannot borrow an Arc's content as mutable
//! ```
//!
//! Nor does holding two guards of one `Lock` at once (a reentrant lock adds
//! a hold with [`Guard::reacquire`], nested in the first guard):
//!
//! ```compile_fail
//! use redis_native_lock::Lock;
//!
//! let client = redis::Client::open("redis://127.0.0.1:6379/").unwrap();
//! let mut lock = Lock::exclusive(&client, "k");
//! let first = lock.acquire().unwrap();
//! let second = lock.acquire().unwrap(); // `lock` is still borrowed by `first`
//! drop(first);
//! ```
//!
//! What does compile: a lock per thread, or one behind a mutex.
//!
//! ```no_run
//! use redis_native_lock::Lock;
//! use std::sync::{Arc, Mutex};
//!
//! let client = redis::Client::open("redis://127.0.0.1:6379/").unwrap();
//! let shared = Arc::new(Mutex::new(Lock::exclusive(&client, "k")));
//! let worker = {
//!     let (shared, client) = (Arc::clone(&shared), client.clone());
//!     std::thread::spawn(move || {
//!         let mut own = Lock::exclusive(&client, "k"); // its own holder
//!         let _g = own.acquire();
//!         let mut lock = shared.lock().unwrap();      // or the shared one, held
//!         let _h = lock.acquire();                    // while the mutex is
//!     })
//! };
//! worker.join().unwrap();
//! ```
//!
//! A [`Guard`] is `Send` (move it to the thread that does the work) and
//! `Sync` (its methods only read, or renew under its own lock).
//!
//! # Connections, timeouts, renewals
//!
//! Each holder has a connection of its own, opened by the `Lock` with a
//! connect timeout and read/write timeouts ([`Lock::timeout`], 2 s by
//! default): an acquire's reply may take the wait plus that, every other
//! reply that, and never longer than what is left of the lease. The
//! acquire goes with `BIND` by default, so the server frees the lock the
//! moment this process or its connection dies. Each held `Lock` has its
//! own watchdog (a thread; a task in tokio) that sends `LOCK.KEEPALIVE` at
//! a third of the ttl (with `bind(false)`, or a server without `BIND`,
//! `LOCK.RENEW`): a stalled server stalls only the locks held on it. A
//! renewal that cannot finish before the lease ends marks the lease lost:
//! [`Guard::is_lost`] turns true for good, [`Guard::check`] and the release
//! return [`Error::LeaseLost`], and [`Lock::on_lost`]'s callback is called.
//! A key deleted or overwritten (`WRONGTYPE`) is a lost lease too, never a
//! raw server error. `DEADLOCK` replies are [`Error::Deadlock`]. A bound
//! lock's loss (its key deleted, overwritten or freed, its connection
//! killed, the server killed or restarted) is told at once through a
//! watcher per server (a subscriber and an observer: see the README), each
//! cause in its own words. The release and every renewal go with the
//! grant's token (`TOKEN`): a guard whose grant ended never releases or
//! renews a later grant to the same owner name.
//!
//! # Sessions
//!
//! A [`Session`] (tokio: [`aio::Session`]) is one lease (`LOCK.SESSION`)
//! that many locks share: [`Lock::session`] grants a lock with `SESSION
//! id` and without `BIND`, and the session's keeper (one thread per
//! `Session`) renews them all with one `LOCK.SESSION KEEPALIVE` per server,
//! reconnecting after a failure until the session's deadline: a killed
//! connection loses nothing. A session that ends marks every lock on it
//! lost, each told once; [`Session::close`] (and dropping it) releases them.
//!
//! # fork
//!
//! `fork` without `exec` is not supported: the watchdogs are threads (or
//! tasks) of the parent, and a child shares the parent's sockets. A `Lock`
//! remembers the process that made it: in another process its acquire
//! returns [`Error::Forked`] and its guards neither send nor close anything
//! (the parent's lock is left to the parent).
//!
//! # Durable grants
//!
//! [`Lock::replicas`] sends `WAIT n timeout` right after each grant and
//! renewal on the connection that carried it: a grant fewer replicas
//! acknowledged is released ([`Error::NotDurable`]) or, with
//! [`Lock::allow_not_durable`], kept with [`Guard::durable`] `Some(false)`;
//! a renewal fewer acknowledged calls [`Lock::on_not_durable`].
//!
//! RedLock over independent servers: [`redlock`].

use std::fmt;
use std::time::Duration;

pub mod aio;
mod api;
mod blocking;
mod commands;
mod holding;
pub mod redlock;
mod session;
mod watch;

pub use blocking::{Guard, Lock, Session};
pub use redis;

/// What a lock talks to: a server (`redis::Client`) or a cluster
/// (`redis::cluster::ClusterClient`). In a cluster, keys of a multi-key lock
/// must share a hash slot, and leases are renewed with `LOCK.RENEW` through
/// the cluster connection (no `BIND`: a holder's connection there is one per
/// node, routed by the client).
#[derive(Clone)]
pub enum Target {
    Server(redis::Client),
    Cluster(Box<redis::cluster::ClusterClient>),
}

impl From<&redis::Client> for Target {
    fn from(c: &redis::Client) -> Target {
        Target::Server(c.clone())
    }
}

impl From<&redis::cluster::ClusterClient> for Target {
    fn from(c: &redis::cluster::ClusterClient) -> Target {
        Target::Cluster(Box::new(c.clone()))
    }
}

/// What can go wrong.
#[derive(Debug)]
pub enum Error {
    /// Waiting would have closed a cycle of lock waits: nothing changed.
    /// Release what you hold and retry.
    Deadlock(String),
    /// The lease ended (or may have ended) before the holder let go: what
    /// was done after that was protected only by the fencing token.
    LeaseLost {
        keys: Vec<Vec<u8>>,
        token: i64,
        why: String,
    },
    /// Not granted within the wait.
    NotAcquired { keys: Vec<Vec<u8>> },
    /// A request that makes no sense, refused before anything was sent:
    /// no key, a repeated key, a semaphore of 0 permits, a zero ttl, an
    /// empty owner.
    Invalid(String),
    /// The `Lock` was made in another process (a `fork` without `exec`).
    Forked,
    /// Fewer replicas than [`Lock::replicas`] asked for acknowledged a
    /// grant (`WAIT`) within its timeout: the grant was released (unless
    /// [`Lock::allow_not_durable`]). Also what [`Lock::on_not_durable`] gets
    /// for a renewal not acknowledged (the lease is kept).
    NotDurable {
        keys: Vec<Vec<u8>>,
        token: i64,
        /// How many replicas acknowledged (`WAIT`'s reply).
        acknowledged: i64,
        /// How many were asked for.
        replicas: u32,
    },
    /// The server or the connection failed (a timeout included), or the
    /// server refused the request.
    Redis(redis::RedisError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Deadlock(e) => write!(f, "{e}"),
            Error::LeaseLost { keys, token, why } => {
                write!(f, "lease on {} (token {token}) lost: {why}", show(keys))
            }
            Error::NotAcquired { keys } => write!(f, "{} not acquired within the wait", show(keys)),
            Error::Invalid(why) => write!(f, "invalid lock request: {why}"),
            Error::Forked => write!(
                f,
                "this lock was made in another process: fork without exec is not supported"
            ),
            Error::NotDurable {
                keys,
                token,
                acknowledged,
                replicas,
            } => write!(
                f,
                "{} (token {token}) acknowledged by {acknowledged} of {replicas} replicas within the timeout: a failover may lose it",
                show(keys)
            ),
            Error::Redis(e) => write!(f, "redis: {e}"),
        }
    }
}

fn show(keys: &[Vec<u8>]) -> String {
    let names: Vec<String> = keys
        .iter()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    format!("{names:?}")
}

impl std::error::Error for Error {}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        if e.code() == Some("DEADLOCK") {
            return Error::Deadlock(e.to_string());
        }
        Error::Redis(e)
    }
}

/// A server error that says the holder's key is no longer its lock.
pub(crate) fn gone_error(e: &redis::RedisError) -> bool {
    e.code() == Some("WRONGTYPE")
}

/// Which lock, on which keys.
#[derive(Clone, Debug)]
pub(crate) enum Kind {
    Exclusive(Vec<u8>),
    Reentrant(Vec<u8>),
    Read(Vec<u8>),
    Semaphore(Vec<u8>, u32),
    Multi(Vec<Vec<u8>>),
}

/// The most keys `LOCK.MACQUIRE` takes.
const MAX_KEYS: usize = 1000;
/// The most permits `LOCK.SEMAPHORE` takes.
const MAX_LIMIT: u32 = 1_000_000;

impl Kind {
    pub(crate) fn keys(&self) -> Vec<Vec<u8>> {
        match self {
            Kind::Exclusive(k) | Kind::Reentrant(k) | Kind::Read(k) | Kind::Semaphore(k, _) => {
                vec![k.clone()]
            }
            Kind::Multi(keys) => keys.clone(),
        }
    }

    /// Whether each acquire adds a hold (released one at a time).
    pub(crate) fn counted(&self) -> bool {
        matches!(self, Kind::Reentrant(_) | Kind::Read(_))
    }

    /// Nonsense refused before anything is sent.
    pub(crate) fn check(&self, o: &Options, owner: &[u8]) -> Result<(), Error> {
        let bad = |why: &str| Err(Error::Invalid(why.to_string()));
        match self {
            Kind::Multi(keys) if keys.is_empty() => return bad("a multi-key lock with no key"),
            Kind::Multi(keys) if keys.len() > MAX_KEYS => {
                return bad("a multi-key lock takes at most 1000 keys")
            }
            Kind::Multi(keys) => {
                let mut sorted: Vec<&Vec<u8>> = keys.iter().collect();
                sorted.sort();
                if sorted.windows(2).any(|w| w[0] == w[1]) {
                    return bad("a multi-key lock with a key repeated");
                }
            }
            Kind::Semaphore(_, limit) if *limit == 0 || *limit > MAX_LIMIT => {
                return bad("a semaphore's limit is from 1 to 1000000")
            }
            _ => {}
        }
        if owner.is_empty() {
            return bad("an empty owner");
        }
        if o.ttl < Duration::from_millis(1) {
            return bad("a ttl under 1 ms");
        }
        if o.timeout.is_zero() {
            return bad("a zero timeout");
        }
        Ok(())
    }
}

/// How to acquire: lease, wait, binding, timeouts.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub ttl: Duration,
    /// `None` or zero: do not wait; `Duration::MAX`: without limit.
    pub wait: Option<Duration>,
    pub bind: bool,
    /// Connect timeout, and the longest any reply may take beyond a wait.
    pub timeout: Duration,
    /// `WAIT replicas replicas_timeout` after each grant and renewal (0: none).
    pub replicas: u32,
    pub replicas_timeout: Duration,
    /// Keep a grant fewer replicas acknowledged (flagged) instead of releasing it.
    pub allow_not_durable: bool,
    /// Granted in this session (`SESSION id`, no `BIND`, no watchdog).
    pub session: Option<session::Link>,
}

/// The connect and reply timeout when none is given.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

impl Default for Options {
    fn default() -> Self {
        Options {
            ttl: Duration::from_secs(30),
            wait: None,
            bind: true,
            timeout: DEFAULT_TIMEOUT,
            replicas: 0,
            replicas_timeout: Duration::from_secs(1),
            allow_not_durable: false,
            session: None,
        }
    }
}

impl Options {
    /// How long the acquire's reply may take: the wait, plus the timeout;
    /// `None` for a wait without limit.
    pub(crate) fn acquire_timeout(&self) -> Option<Duration> {
        match self.wait {
            Some(w) if w == Duration::MAX => None,
            Some(w) => Some(w.saturating_add(self.timeout)),
            None => Some(self.timeout),
        }
    }
}

/// A cluster connection routes `WAIT` (no key) anywhere: refused there.
pub(crate) fn check_replicas(o: &Options, client: &Target) -> Result<(), Error> {
    if o.replicas > 0 && matches!(client, Target::Cluster(_)) {
        return Err(Error::Invalid(
            "replicas on a cluster client (WAIT cannot follow the grant on its connection)".into(),
        ));
    }
    Ok(())
}

/// The next renewal's delay: a third of the ttl.
pub(crate) fn tick(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(1))
}

/// A reply or an I/O timeout: never zero (a zero socket timeout is an error).
pub(crate) fn limit(timeout: Duration, left: Duration) -> Duration {
    timeout.min(left).max(Duration::from_millis(1))
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn fresh_owner() -> Vec<u8> {
    uuid::Uuid::new_v4().to_string().into_bytes()
}

pub(crate) fn timed_out(what: &str) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, what))
}

pub(crate) fn closed() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::other("the holder's connection is closed"))
}

/// Why a lease is lost: each cause its own words.
pub(crate) const RENEWED_FEWER: &str =
    "LOCK.KEEPALIVE renewed fewer locks than held: released, expired, deleted or overwritten";
pub(crate) const RENEW_ZERO: &str =
    "LOCK.RENEW under this grant's token answered 0: the lease expired, the key was deleted, or the owner name was granted again";
pub(crate) const RAN_OUT: &str = "its ttl ran out without a successful renewal";
pub(crate) const RELEASE_NIL: &str =
    "LOCK.RELEASE under this grant's token answered nil: the grant had ended (released elsewhere, expired, deleted, or the owner name granted again)";
pub(crate) const WRONGTYPE: &str = "the key is no longer a lock (WRONGTYPE): overwritten";
pub(crate) const FREED: &str =
    "the key was deleted or the lock freed (released elsewhere or expired): LOCK.INFO finds it free";
pub(crate) const REGRANTED: &str =
    "the owner name holds the lock under a newer grant: this grant had ended";
pub(crate) const TAKEN: &str = "the lock was freed and another owner holds it now";
/// `extend` of a lock in a session: refused, nothing sent.
pub(crate) const IN_SESSION: &str =
    "a lock in a session has the session's lease: extend refused (the session's keeper renews it; set the Session's ttl)";
/// The bound connection failed: the server frees a lock bound to it.
pub(crate) fn bound_failed(e: &redis::RedisError) -> String {
    format!("the connection the lock was bound to failed or was closed, which frees the lock ({e})")
}

/// A failure of the connection itself (not a reply of the server's).
pub(crate) fn io_failure(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped()
}

/// A callback told when a lease is found lost, with the `LeaseLost` error.
pub type OnLost = std::sync::Arc<dyn Fn(&Error) + Send + Sync>;
