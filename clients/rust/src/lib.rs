//! Locks for the redis-lock Redis module, on the `redis` crate: blocking
//! ([`Lock`]) and tokio ([`aio::Lock`]), one API shape for every kind.
//!
//! ```no_run
//! # fn main() -> Result<(), redis_native_lock::Error> {
//! use redis_native_lock::Lock;
//! use std::time::Duration;
//!
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let lock = Lock::exclusive(&client, "orders:42").ttl(Duration::from_secs(30));
//! if let Some(guard) = lock.acquire()? {          // waits in the server (10 s by default)
//!     guard.check()?;                             // Err(LeaseLost) if the lease is gone
//!     // storage.write(data, guard.token())       // the fencing token
//!     guard.release()?;                           // dropping the guard releases too
//! }
//! # Ok(()) }
//! ```
//!
//! The kinds: [`Lock::exclusive`] (`LOCK.ACQUIRE`), [`Lock::reentrant`]
//! (`LOCK.RACQUIRE`: each acquire adds a hold, each guard released removes
//! one), [`Lock::read`] and [`Lock::write`] (a read-write lock: `LOCK.READ`
//! and a reentrant `LOCK.RACQUIRE` on the same key), [`Lock::semaphore`]
//! (`LOCK.SEMAPHORE`: one permit of `limit`), [`Lock::multi`]
//! (`LOCK.MACQUIRE`: every key or none; [`Guard::tokens`] per key).
//!
//! Each holder has a connection of its own, opened by the `Lock`: the
//! acquire waits there (no read timeout: the reply comes when the lock
//! frees), with `BIND` by default, so the server frees the lock the moment
//! this process or its connection dies. One keepalive per connection
//! (`LOCK.KEEPALIVE` at a third of the ttl; blocking: one thread for the
//! whole process; tokio: one task per held connection) renews it; with
//! `bind(false)`, or a server without `BIND`, `LOCK.RENEW` does. A lost
//! lease is seen at once by [`Guard::is_lost`] / [`Guard::check`] and the
//! release returns [`Error::LeaseLost`]. `DEADLOCK` replies are
//! [`Error::Deadlock`]. RedLock over independent servers: [`redlock`].

use std::fmt;
use std::time::Duration;

pub mod aio;
mod blocking;
pub mod redlock;

pub use blocking::{Guard, Lock};
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
    /// The lease ended before the holder let go: what was done after that
    /// was protected only by the fencing token.
    LeaseLost {
        keys: Vec<String>,
        token: i64,
        why: String,
    },
    /// Not granted within the wait (the `with_*` helpers).
    NotAcquired { keys: Vec<String> },
    /// The server or the connection failed, or refused the request.
    Redis(redis::RedisError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Deadlock(e) => write!(f, "{e}"),
            Error::LeaseLost { keys, token, why } => {
                write!(f, "lease on {keys:?} (token {token}) lost: {why}")
            }
            Error::NotAcquired { keys } => write!(f, "{keys:?} not acquired within the wait"),
            Error::Redis(e) => write!(f, "redis: {e}"),
        }
    }
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

/// Which lock, on which keys.
#[derive(Clone, Debug)]
pub(crate) enum Kind {
    Exclusive(String),
    Reentrant(String),
    Read(String),
    Semaphore(String, u32),
    Multi(Vec<String>),
}

impl Kind {
    pub(crate) fn keys(&self) -> Vec<String> {
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

    pub(crate) fn acquire(&self, o: &Options, owner: &str, bind: bool) -> redis::Cmd {
        let mut cmd = match self {
            Kind::Exclusive(k) => cmd("LOCK.ACQUIRE", k),
            Kind::Reentrant(k) => cmd("LOCK.RACQUIRE", k),
            Kind::Read(k) => cmd("LOCK.READ", k),
            Kind::Semaphore(k, limit) => {
                let mut c = cmd("LOCK.SEMAPHORE", k);
                c.arg(*limit);
                c
            }
            Kind::Multi(keys) => {
                let mut c = redis::cmd("LOCK.MACQUIRE");
                c.arg(keys.len()).arg(keys);
                c
            }
        };
        cmd.arg(owner).arg(millis(o.ttl));
        match o.wait {
            None => {}
            Some(w) if w.is_zero() => {}
            Some(w) if w == Duration::MAX => {
                cmd.arg("WAIT").arg(0);
            }
            Some(w) => {
                cmd.arg("WAIT").arg(millis(w).max(1));
            }
        }
        if bind {
            cmd.arg("BIND");
        }
        cmd
    }
}

fn cmd(name: &str, key: &str) -> redis::Cmd {
    let mut c = redis::cmd(name);
    c.arg(key);
    c
}

/// How to acquire: lease, wait, owner, binding.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub ttl: Duration,
    /// `None` or zero: do not wait; `Duration::MAX`: without limit.
    pub wait: Option<Duration>,
    pub bind: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ttl: Duration::from_secs(30),
            wait: Some(Duration::from_secs(10)),
            bind: true,
        }
    }
}

/// Tokens from an acquire's reply: one for a single key, one per key for
/// `LOCK.MACQUIRE`; `None` when not granted.
pub(crate) fn tokens(reply: redis::Value) -> redis::RedisResult<Option<Vec<i64>>> {
    use redis::Value;
    match reply {
        Value::Nil => Ok(None),
        Value::Int(t) => Ok(Some(vec![t])),
        Value::Array(items) => items
            .into_iter()
            .map(redis::from_redis_value::<i64>)
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
            .map_err(Into::into),
        other => Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected reply to a lock request",
            format!("{other:?}"),
        ))),
    }
}

/// One holder as `LOCK.INFO` shows it: owner, holds, ttl-ms-left, token.
pub(crate) type HolderInfo = (String, i64, i64, i64);

/// `LOCK.INFO`'s holders; `None` when free. Either protocol.
pub(crate) fn holders(reply: redis::Value) -> Option<Vec<HolderInfo>> {
    use redis::Value;
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Nil => return None,
        Value::Array(items) => {
            let mut it = items.into_iter();
            let mut out = Vec::new();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.push((k, v));
            }
            out
        }
        Value::Map(m) => m,
        _ => return None,
    };
    for (k, v) in pairs {
        let name: String = redis::from_redis_value(k).unwrap_or_default();
        if name == "holders" {
            let list: Vec<HolderInfo> = redis::from_redis_value(v).unwrap_or_default();
            return Some(list);
        }
    }
    Some(Vec::new())
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn fresh_owner() -> String {
    uuid::Uuid::new_v4().to_string()
}
