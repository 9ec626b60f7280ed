//! A lock helper for the redis-lock module, with the `redis` crate (sync API).
//!
//! ```ignore
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let opts = Options { ttl: Duration::from_secs(30), wait: Some(Duration::from_secs(10)), ..Options::default() };
//! with_lock(&client, "orders:42", &opts, |lease| {
//!     do_the_work();
//!     lease.check()?;                               // Err(LeaseLost) if the lease ran out
//!     storage.write(data, lease.token())            // the fencing token
//! })??;
//! ```
//!
//! - Acquires with `LOCK.ACQUIRE key owner ttl WAIT ms BIND` on a connection
//!   of its own: the client waits inside the server (no polling) and gets a
//!   fencing token, or [`LockError::NotAcquired`]. `BIND` ties the lock to that
//!   connection: if this process dies, the server frees the lock the moment
//!   the connection closes, not at the end of the lease.
//! - One keepalive on that connection (`LOCK.KEEPALIVE ttl` every ttl/3, a
//!   thread) renews it while the work runs; it answers how many locks it
//!   renewed, so a lock released or deleted behind our back shows as 0. It is
//!   stopped (its thread joined, a renewal in flight finished) *before* the
//!   release, so no renewal outlives the unlock. The connection is the
//!   lease's alone and closes with it, so it never carries a bound lock to
//!   anyone else.
//! - `bind: false` (or a server that refuses `BIND`): a lease watchdog with
//!   `LOCK.RENEW` on a connection of its own instead; the owner is fresh for
//!   each acquisition, so even a late renewal could not extend somebody
//!   else's lock.
//! - [`Lease::release`] releases; if the lease is dropped instead (an early
//!   return, `?`, a panic), `Drop` stops the watchdog and releases.
//! - A lost lease (a renewal answered 0, the release answered nil) is seen at
//!   once by [`Lease::is_lost`] / [`Lease::check`], and `release` returns
//!   [`LockError::LeaseLost`]: what the work did after that point was
//!   protected only by the fencing token.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How to acquire.
#[derive(Clone, Debug)]
pub struct Options {
    /// The lease, renewed by the watchdog while the lock is held.
    pub ttl: Duration,
    /// How long to wait in the server: `None` does not wait, `Some(ZERO)`
    /// waits without limit.
    pub wait: Option<Duration>,
    /// A fresh unique id by default; a stable one only if you mean it.
    pub owner: Option<String>,
    /// Tie the lock to its connection (`BIND`: freed at once if this process
    /// dies) with one keepalive; `false`: a lease watchdog instead.
    pub bind: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ttl: Duration::from_secs(30),
            wait: Some(Duration::from_secs(10)),
            owner: None,
            bind: true,
        }
    }
}

#[derive(Debug)]
pub enum LockError {
    /// Not granted within the wait.
    NotAcquired { key: String },
    /// The lease ended before the work did.
    LeaseLost {
        key: String,
        token: i64,
        why: String,
    },
    /// The server or the connection failed.
    Redis(redis::RedisError),
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::NotAcquired { key } => write!(f, "{key:?} not acquired within the wait"),
            LockError::LeaseLost { key, token, why } => {
                write!(f, "lease on {key:?} (token {token}) lost: {why}")
            }
            LockError::Redis(e) => write!(f, "redis: {e}"),
        }
    }
}

impl std::error::Error for LockError {}

impl From<redis::RedisError> for LockError {
    fn from(e: redis::RedisError) -> Self {
        LockError::Redis(e)
    }
}

/// What the holder and its watchdog share.
struct Shared {
    /// Why the lease was lost, once it is.
    lost: Mutex<Option<String>>,
    /// A lower bound of the server's deadline (the lease began after we asked).
    valid_until: Mutex<Instant>,
}

impl Shared {
    fn lose(&self, why: &str) {
        let mut lost = self.lost.lock().unwrap_or_else(PoisonError::into_inner);
        lost.get_or_insert_with(|| why.to_string());
    }

    fn why(&self) -> Option<String> {
        self.lost
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn valid_until(&self) -> Instant {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A held lock. Release it with [`Lease::release`]; dropping it releases too.
pub struct Lease {
    key: String,
    owner: String,
    token: i64,
    /// The lease's own connection (the lock is bound to it with `BIND`),
    /// shared with the keepalive thread.
    conn: Arc<Mutex<redis::Connection>>,
    bound: bool,
    shared: Arc<Shared>,
    watchdog: Option<(mpsc::Sender<()>, thread::JoinHandle<()>)>,
    ended: bool,
}

/// Acquires `key`, waiting in the server as `opts.wait` says, and starts the
/// watchdog.
pub fn acquire(client: &redis::Client, key: &str, opts: &Options) -> Result<Lease, LockError> {
    let owner = opts.owner.clone().unwrap_or_else(fresh_owner);
    let mut conn = client.get_connection()?;
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    cmd.arg(key).arg(&owner).arg(millis(opts.ttl));
    if let Some(wait) = opts.wait {
        cmd.arg("WAIT").arg(millis(wait));
        // The reply comes when the lock is granted or the wait runs out.
        let limit = (!wait.is_zero()).then(|| wait + Duration::from_secs(10));
        conn.set_read_timeout(limit)?;
    }
    let sent = Instant::now();
    let mut bound = opts.bind;
    let mut reply: redis::RedisResult<Option<i64>> = if bound {
        cmd.clone().arg("BIND").query(&mut conn)
    } else {
        cmd.query(&mut conn)
    };
    if bound && matches!(&reply, Err(e) if e.to_string().contains("syntax error")) {
        // A server without BIND: the lease watchdog.
        bound = false;
        reply = cmd.query(&mut conn);
    }
    let token: Option<i64> = match reply {
        Ok(token) => token,
        // A bound grant made as we stopped listening ends when `conn`
        // closes, on return; an unbound one is given back below.
        Err(e) if bound => return Err(e.into()),
        Err(e) => {
            if e.is_io_error() || e.is_timeout() {
                // It may have been granted as we stopped listening: give it back.
                let _ = client.get_connection().and_then(|mut c| {
                    redis::cmd("LOCK.RELEASE")
                        .arg(key)
                        .arg(&owner)
                        .query::<Option<i64>>(&mut c)
                });
            }
            return Err(e.into());
        }
    };
    let Some(token) = token else {
        return Err(LockError::NotAcquired {
            key: key.to_string(),
        });
    };
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let shared = Arc::new(Shared {
        lost: Mutex::new(None),
        valid_until: Mutex::new(sent + opts.ttl),
    });
    let conn = Arc::new(Mutex::new(conn));
    let (stop, stopped) = mpsc::channel();
    let handle = {
        let renewal = match bound {
            true => Renewal::Keepalive(conn.clone()),
            false => Renewal::Renew(client.clone(), key.to_string(), owner.clone()),
        };
        let (shared, ttl) = (shared.clone(), opts.ttl);
        thread::Builder::new()
            .name(format!("lock-keepalive:{key}"))
            .spawn(move || watchdog(renewal, ttl, &shared, &stopped))
            .map_err(redis::RedisError::from)?
    };
    Ok(Lease {
        key: key.to_string(),
        owner,
        token,
        conn,
        bound,
        shared,
        watchdog: Some((stop, handle)),
        ended: false,
    })
}

/// Runs `work` holding `key`; returns what it returns, or why it could not
/// hold the lock throughout. A panic in `work` releases the lock (Drop).
pub fn with_lock<T>(
    client: &redis::Client,
    key: &str,
    opts: &Options,
    work: impl FnOnce(&Lease) -> T,
) -> Result<T, LockError> {
    let lease = acquire(client, key, opts)?;
    let out = work(&lease);
    lease.release()?;
    Ok(out)
}

impl Lease {
    /// The fencing token: hand it to the resource you write to.
    pub fn token(&self) -> i64 {
        self.token
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// Whether the lock is bound to the lease's connection (`BIND`).
    pub fn is_bound(&self) -> bool {
        self.bound
    }

    /// True once the lease is known lost, or may have run out.
    pub fn is_lost(&self) -> bool {
        self.shared.why().is_some() || Instant::now() >= self.shared.valid_until()
    }

    /// `Err(LeaseLost)` if the lease is gone: call it before a protected write.
    pub fn check(&self) -> Result<(), LockError> {
        if self.is_lost() {
            return Err(self.lost_error());
        }
        Ok(())
    }

    /// Stops the watchdog, then releases. `Err(LeaseLost)` if the lock was no
    /// longer ours.
    pub fn release(mut self) -> Result<(), LockError> {
        self.end()
    }

    fn lost_error(&self) -> LockError {
        LockError::LeaseLost {
            key: self.key.clone(),
            token: self.token,
            why: self
                .shared
                .why()
                .unwrap_or_else(|| "its ttl ran out without a successful renewal".into()),
        }
    }

    fn end(&mut self) -> Result<(), LockError> {
        if std::mem::replace(&mut self.ended, true) {
            return Ok(());
        }
        if let Some((stop, handle)) = self.watchdog.take() {
            drop(stop); // wakes the watchdog at once
            let _ = handle.join();
        }
        let released: Option<i64> = {
            let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
            match redis::cmd("LOCK.RELEASE")
                .arg(&self.key)
                .arg(&self.owner)
                .query(&mut *conn)
            {
                Ok(released) => released,
                // Already known lost (its bound connection died): say that.
                Err(_) if self.shared.why().is_some() => None,
                Err(e) => return Err(e.into()),
            }
        };
        if released.is_none() {
            self.shared
                .lose("LOCK.RELEASE answered nil: the lock was no longer ours");
            return Err(self.lost_error());
        }
        Ok(())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let _ = self.end();
    }
}

/// How the lease is renewed.
enum Renewal {
    /// `LOCK.KEEPALIVE` on the connection the lock is bound to.
    Keepalive(Arc<Mutex<redis::Connection>>),
    /// `LOCK.RENEW key owner` on a connection of the watchdog's own.
    Renew(redis::Client, String, String),
}

/// Renews every ttl/3 until `stop` is dropped, or the lease is lost.
fn watchdog(renewal: Renewal, ttl: Duration, shared: &Shared, stop: &mpsc::Receiver<()>) {
    let interval = ttl / 3;
    let mut own: Option<redis::Connection> = None;
    loop {
        match stop.recv_timeout(interval) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return, // the holder is releasing
        }
        let sent = Instant::now();
        let renewed = match &renewal {
            Renewal::Keepalive(conn) => {
                let mut conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
                redis::cmd("LOCK.KEEPALIVE")
                    .arg(millis(ttl))
                    .query::<i64>(&mut *conn)
            }
            Renewal::Renew(client, key, owner) => {
                connected(client, &mut own, interval).and_then(|c| {
                    redis::cmd("LOCK.RENEW")
                        .arg(key)
                        .arg(owner)
                        .arg(millis(ttl))
                        .query::<i64>(c)
                })
            }
        };
        let bound = matches!(renewal, Renewal::Keepalive(_));
        match renewed {
            Ok(n) if n >= 1 => {
                *shared
                    .valid_until
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = sent + ttl;
            }
            Ok(_) if bound => {
                shared.lose(
                    "LOCK.KEEPALIVE renewed nothing: the lock was released, expired or deleted",
                );
                return;
            }
            Ok(_) => {
                shared.lose("LOCK.RENEW answered 0: the lease expired or the key was deleted");
                return;
            }
            Err(e) if bound => {
                // The bound connection failed: the server freed the lock.
                shared.lose(&format!(
                    "the connection the lock was bound to failed ({e})"
                ));
                return;
            }
            Err(e) => {
                // Transient: reconnect and try again at the next tick, unless
                // the lease may have run out meanwhile.
                own = None;
                if Instant::now() >= shared.valid_until() {
                    shared.lose(&format!("renewal failed until the ttl ran out ({e})"));
                    return;
                }
            }
        }
    }
}

fn connected<'a>(
    client: &redis::Client,
    conn: &'a mut Option<redis::Connection>,
    timeout: Duration,
) -> redis::RedisResult<&'a mut redis::Connection> {
    if conn.is_none() {
        let c = client.get_connection_with_timeout(timeout)?;
        c.set_read_timeout(Some(timeout))?;
        *conn = Some(c);
    }
    conn.as_mut()
        .ok_or_else(|| redis::RedisError::from(std::io::Error::other("no connection")))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A unique owner id (random, process id, counter); a UUID does as well.
fn fresh_owner() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = RandomState::new().build_hasher();
    h.write_u128(nanos);
    h.write_u64(n);
    format!("{:016x}-{}-{n}", h.finish(), std::process::id())
}
