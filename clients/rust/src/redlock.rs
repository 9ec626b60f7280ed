//! RedLock over N independent redis-lock servers (blocking and tokio).
//!
//! Ask every server with `LOCK.ACQUIRE key owner ttl` (no `WAIT`: one slow
//! server must not eat the lease), one owner for all; held if a majority
//! granted it and the time spent asking left some validity (ttl - elapsed -
//! drift). Otherwise release everywhere (also where the reply was lost) and
//! retry after a random delay. Each server issues its own fencing token
//! ([`RedLease::tokens`]: server index -> token); they are not comparable
//! across servers. See the project's docs/redlock.md for what it cannot
//! promise.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::commands;
use crate::{fresh_owner, millis};

/// A quorum's grant.
#[derive(Clone, Debug)]
pub struct RedLease {
    pub key: Vec<u8>,
    pub owner: Vec<u8>,
    pub ttl: Duration,
    /// Server index -> its token.
    pub tokens: BTreeMap<usize, i64>,
    valid_until: Instant,
}

impl RedLease {
    /// Validity left on this process's monotonic clock.
    pub fn remaining(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }
}

/// Settings shared by both flavours.
#[derive(Clone, Debug)]
pub struct Settings {
    pub retries: usize,
    pub retry_delay: Duration,
    pub drift_factor: f64,
    /// Connect and reply timeout per server (each server is asked on a
    /// thread or task of its own: a stalled one costs this once, not per
    /// server).
    pub timeout: Duration,
    /// The owner id sent to every server; `None` (default): a fresh UUID
    /// per acquire.
    pub owner: Option<Vec<u8>>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            retries: 3,
            retry_delay: Duration::from_millis(200),
            drift_factor: 0.01,
            timeout: Duration::from_millis(100),
            owner: None,
        }
    }
}

fn outcome(
    key: &[u8],
    owner: &[u8],
    ttl: Duration,
    replies: &[Option<i64>],
    started: Instant,
    quorum: usize,
    drift: f64,
) -> Option<RedLease> {
    let tokens: BTreeMap<usize, i64> = replies
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.map(|t| (i, t)))
        .collect();
    let elapsed = started.elapsed();
    let drift = Duration::from_secs_f64(ttl.as_secs_f64() * drift) + Duration::from_millis(2);
    let validity = ttl.checked_sub(elapsed)?.checked_sub(drift)?;
    (tokens.len() >= quorum && !validity.is_zero()).then(|| RedLease {
        key: key.to_vec(),
        owner: owner.to_vec(),
        ttl,
        tokens,
        valid_until: started + validity,
    })
}

fn jitter(max: Duration) -> Duration {
    let nanos = u64::from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos()),
    );
    let max_ms = millis(max).max(1);
    Duration::from_millis(nanos % max_ms)
}

/// RedLock with blocking connections.
pub struct RedLock {
    servers: Vec<redis::Client>,
    pub settings: Settings,
}

impl RedLock {
    pub fn new(servers: Vec<redis::Client>) -> RedLock {
        RedLock {
            servers,
            settings: Settings::default(),
        }
    }

    fn quorum(&self) -> usize {
        self.servers.len() / 2 + 1
    }

    /// Every server at once, each on a thread of its own.
    fn each(&self, cmd: &redis::Cmd) -> Vec<Option<redis::Value>> {
        let t = self.settings.timeout;
        std::thread::scope(|scope| {
            let asks: Vec<_> = self
                .servers
                .iter()
                .map(|c| {
                    scope.spawn(move || {
                        let mut conn = c.get_connection_with_timeout(t).ok()?;
                        conn.set_read_timeout(Some(t)).ok()?;
                        conn.set_write_timeout(Some(t)).ok()?;
                        cmd.query::<redis::Value>(&mut conn).ok()
                    })
                })
                .collect();
            asks.into_iter().map(|a| a.join().ok().flatten()).collect()
        })
    }

    /// A lease, or `None` when no quorum granted it within the retries
    /// (whatever was granted without a quorum is released first).
    pub fn acquire(&self, key: impl AsRef<[u8]>, ttl: Duration) -> Option<RedLease> {
        let key = key.as_ref();
        let owner = self.settings.owner.clone().unwrap_or_else(fresh_owner);
        for attempt in 0..self.settings.retries.max(1) {
            if attempt > 0 {
                std::thread::sleep(jitter(self.settings.retry_delay));
            }
            let started = Instant::now();
            let cmd = commands::acquire_once(key, &owner, millis(ttl));
            let replies: Vec<Option<i64>> = self
                .each(&cmd)
                .into_iter()
                .map(|r| match r {
                    Some(redis::Value::Int(t)) => Some(t),
                    _ => None,
                })
                .collect();
            let q = self.quorum();
            if let Some(lease) = outcome(
                key,
                &owner,
                ttl,
                &replies,
                started,
                q,
                self.settings.drift_factor,
            ) {
                return Some(lease);
            }
            self.release_owner(key, &owner);
        }
        None
    }

    fn release_owner(&self, key: &[u8], owner: &[u8]) -> usize {
        self.each(&commands::release(key, owner, None))
            .into_iter()
            .filter(|r| matches!(r, Some(redis::Value::Int(_))))
            .count()
    }

    /// Releases on every server; how many released a hold.
    pub fn release(&self, lease: &RedLease) -> usize {
        self.release_owner(&lease.key, &lease.owner)
    }

    /// Renews on every server; true (and the validity reset) if a majority
    /// renewed in time.
    pub fn extend(&self, lease: &mut RedLease, ttl: Duration) -> bool {
        let started = Instant::now();
        let cmd = commands::renew(&lease.key, &lease.owner, millis(ttl), None);
        let renewed: Vec<Option<i64>> = self
            .each(&cmd)
            .into_iter()
            .enumerate()
            .map(|(i, r)| match r {
                Some(redis::Value::Int(1)) => lease.tokens.get(&i).copied(),
                _ => None,
            })
            .collect();
        match outcome(
            &lease.key,
            &lease.owner,
            ttl,
            &renewed,
            started,
            self.quorum(),
            self.settings.drift_factor,
        ) {
            Some(fresh) => {
                lease.ttl = ttl;
                lease.valid_until = fresh.valid_until;
                true
            }
            None => false,
        }
    }
}

/// RedLock with tokio: the servers are asked at once.
pub struct AsyncRedLock {
    servers: Vec<redis::Client>,
    pub settings: Settings,
}

impl AsyncRedLock {
    pub fn new(servers: Vec<redis::Client>) -> AsyncRedLock {
        AsyncRedLock {
            servers,
            settings: Settings::default(),
        }
    }

    async fn each(&self, cmd: &redis::Cmd) -> Vec<Option<redis::Value>> {
        let t = self.settings.timeout;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(t))
            .set_response_timeout(Some(t));
        let mut tasks = Vec::new();
        for c in &self.servers {
            let (c, cmd, config) = (c.clone(), cmd.clone(), config.clone());
            tasks.push(tokio::spawn(async move {
                let mut conn = c
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .ok()?;
                cmd.query_async::<redis::Value>(&mut conn).await.ok()
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.ok().flatten());
        }
        out
    }

    pub async fn acquire(&self, key: impl AsRef<[u8]>, ttl: Duration) -> Option<RedLease> {
        let key = key.as_ref();
        let owner = self.settings.owner.clone().unwrap_or_else(fresh_owner);
        for attempt in 0..self.settings.retries.max(1) {
            if attempt > 0 {
                tokio::time::sleep(jitter(self.settings.retry_delay)).await;
            }
            let started = Instant::now();
            let cmd = commands::acquire_once(key, &owner, millis(ttl));
            let replies: Vec<Option<i64>> = self
                .each(&cmd)
                .await
                .into_iter()
                .map(|r| match r {
                    Some(redis::Value::Int(t)) => Some(t),
                    _ => None,
                })
                .collect();
            let q = self.servers.len() / 2 + 1;
            if let Some(lease) = outcome(
                key,
                &owner,
                ttl,
                &replies,
                started,
                q,
                self.settings.drift_factor,
            ) {
                return Some(lease);
            }
            self.each(&commands::release(key, &owner, None)).await;
        }
        None
    }

    pub async fn release(&self, lease: &RedLease) -> usize {
        self.each(&commands::release(&lease.key, &lease.owner, None))
            .await
            .into_iter()
            .filter(|r| matches!(r, Some(redis::Value::Int(_))))
            .count()
    }

    /// Renews on every server; true (and the validity reset) if a majority
    /// renewed in time.
    pub async fn extend(&self, lease: &mut RedLease, ttl: Duration) -> bool {
        let started = Instant::now();
        let cmd = commands::renew(&lease.key, &lease.owner, millis(ttl), None);
        let renewed: Vec<Option<i64>> = self
            .each(&cmd)
            .await
            .into_iter()
            .enumerate()
            .map(|(i, r)| match r {
                Some(redis::Value::Int(1)) => lease.tokens.get(&i).copied(),
                _ => None,
            })
            .collect();
        match outcome(
            &lease.key,
            &lease.owner,
            ttl,
            &renewed,
            started,
            self.servers.len() / 2 + 1,
            self.settings.drift_factor,
        ) {
            Some(fresh) => {
                lease.ttl = ttl;
                lease.valid_until = fresh.valid_until;
                true
            }
            None => false,
        }
    }
}
