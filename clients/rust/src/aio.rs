//! The tokio API: the same [`Lock`] and [`Guard`] as the blocking one, with
//! `.await`. Each holder's connection is a connection of its own (made with
//! no response timeout: a waiting reply comes only when the lock frees),
//! and one keepalive task per held connection renews it.
//!
//! Release with [`Guard::release`]`.await`; a guard dropped unreleased is
//! released by a task spawned on the current runtime.

use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;
use tokio::sync::Mutex;

use crate::{fresh_owner, holders, millis, tokens, Error, HolderInfo, Kind, Options, Target};

pub struct Lock {
    state: Arc<State>,
}

#[must_use = "release the guard with .release().await"]
pub struct Guard {
    state: Arc<State>,
    released: bool,
}

/// A holder's connection: to the server, or to the cluster.
#[derive(Clone)]
enum Conn {
    Server(MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    /// A connection of the holder's own, whose replies are never cut short
    /// (a waiting reply comes when the lock frees).
    async fn open(target: &Target) -> redis::RedisResult<Conn> {
        match target {
            Target::Server(c) => {
                let config = AsyncConnectionConfig::new().set_response_timeout(None);
                Ok(Conn::Server(
                    c.get_multiplexed_async_connection_with_config(&config)
                        .await?,
                ))
            }
            Target::Cluster(c) => {
                // The cluster client takes only a finite response timeout.
                let config = redis::cluster::ClusterConfig::new()
                    .set_response_timeout(Duration::from_secs(365 * 24 * 3600));
                Ok(Conn::Cluster(
                    c.get_async_connection_with_config(config).await?,
                ))
            }
        }
    }

    async fn query(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        match self {
            Conn::Server(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
        }
    }
}

struct State {
    client: Target,
    kind: Kind,
    owner: StdMutex<String>,
    opts: StdMutex<Options>,
    held: Mutex<Held>,
}

struct Held {
    conn: Option<Conn>,
    bound: bool,
    guards: u32,
    tokens: Vec<i64>,
    lost: Option<String>,
    valid_until: Instant,
    /// The keepalive task runs.
    keeping: bool,
}

fn std_lock<T>(m: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn query(held: &mut Held, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
    match held.conn.as_mut() {
        Some(conn) => conn.query(cmd).await,
        None => Err(redis::RedisError::from(std::io::Error::other(
            "the holder's connection is closed",
        ))),
    }
}

impl Lock {
    fn new(client: Target, kind: Kind) -> Lock {
        Lock {
            state: Arc::new(State {
                client,
                kind,
                owner: StdMutex::new(fresh_owner()),
                opts: StdMutex::new(Options::default()),
                held: Mutex::new(Held {
                    conn: None,
                    bound: false,
                    guards: 0,
                    tokens: Vec::new(),
                    lost: None,
                    valid_until: Instant::now(),
                    keeping: false,
                }),
            }),
        }
    }

    pub fn exclusive(client: impl Into<Target>, key: impl Into<String>) -> Lock {
        Lock::new(client.into(), Kind::Exclusive(key.into()))
    }

    pub fn reentrant(client: impl Into<Target>, key: impl Into<String>) -> Lock {
        Lock::new(client.into(), Kind::Reentrant(key.into()))
    }

    pub fn read(client: impl Into<Target>, key: impl Into<String>) -> Lock {
        Lock::new(client.into(), Kind::Read(key.into()))
    }

    pub fn write(client: impl Into<Target>, key: impl Into<String>) -> Lock {
        Lock::new(client.into(), Kind::Reentrant(key.into()))
    }

    pub fn semaphore(client: impl Into<Target>, key: impl Into<String>, limit: u32) -> Lock {
        Lock::new(client.into(), Kind::Semaphore(key.into(), limit))
    }

    pub fn multi<K: Into<String>>(
        client: impl Into<Target>,
        keys: impl IntoIterator<Item = K>,
    ) -> Lock {
        Lock::new(
            client.into(),
            Kind::Multi(keys.into_iter().map(Into::into).collect()),
        )
    }

    pub fn ttl(self, ttl: Duration) -> Lock {
        std_lock(&self.state.opts).ttl = ttl;
        self
    }

    pub fn wait(self, wait: Option<Duration>) -> Lock {
        std_lock(&self.state.opts).wait = wait;
        self
    }

    pub fn owner(self, owner: impl Into<String>) -> Lock {
        *std_lock(&self.state.owner) = owner.into();
        self
    }

    pub fn bind(self, bind: bool) -> Lock {
        std_lock(&self.state.opts).bind = bind;
        self
    }

    pub fn keys(&self) -> Vec<String> {
        self.state.kind.keys()
    }

    pub fn owner_id(&self) -> String {
        std_lock(&self.state.owner).clone()
    }

    /// As the blocking [`crate::Lock::acquire`]. Cancelling the future (a
    /// `select!`, a timeout) closes the connection the request waited on,
    /// which frees a grant it may have got meanwhile (bound); an unbound
    /// one ends with its lease.
    pub async fn acquire(&self) -> Result<Option<Guard>, Error> {
        let s = &self.state;
        let opts = std_lock(&s.opts).clone();
        let owner = std_lock(&s.owner).clone();
        let mut held = s.held.lock().await;
        if held.conn.is_none() {
            held.conn = Some(Conn::open(&s.client).await?);
            // A cluster connection is the client's to route: no BIND.
            held.bound = opts.bind && matches!(s.client, Target::Server(_));
        }
        let sent = Instant::now();
        let first = held.guards == 0;
        let reply = {
            // Dropped while waiting (cancelled): the connection goes with it.
            let mut on_cancel = ConnOnCancel(Some(&mut *held));
            let h = on_cancel
                .0
                .as_deref_mut()
                .ok_or_else(|| Error::Redis(closed()))?;
            let cmd = s.kind.acquire(&opts, &owner, h.bound);
            let mut reply = query(h, &cmd).await;
            if first
                && h.bound
                && matches!(&reply, Err(e) if e.to_string().contains("syntax error"))
            {
                h.bound = false;
                reply = query(h, &s.kind.acquire(&opts, &owner, false)).await;
            }
            on_cancel.0 = None; // answered: nothing to undo
            reply
        };
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
                    held.conn = None;
                }
                return Err(e.into());
            }
        };
        let Some(tokens) = tokens(reply)? else {
            if first {
                held.conn = None;
            }
            return Ok(None);
        };
        held.tokens = tokens;
        held.guards += 1;
        held.lost = None;
        held.valid_until = sent + opts.ttl;
        if !held.keeping {
            held.keeping = true;
            tokio::spawn(keep(Arc::clone(s)));
        }
        Ok(Some(Guard {
            state: Arc::clone(s),
            released: false,
        }))
    }

    pub async fn locked(&self) -> Result<bool, Error> {
        Ok(self.info().await?.is_some())
    }

    pub async fn owned(&self) -> Result<bool, Error> {
        let owner = self.owner_id();
        Ok(self
            .info()
            .await?
            .is_some_and(|h| h.iter().any(|(o, ..)| *o == owner)))
    }

    async fn info(&self) -> Result<Option<Vec<HolderInfo>>, Error> {
        let key = self
            .state
            .kind
            .keys()
            .into_iter()
            .next()
            .unwrap_or_default();
        let mut conn = Conn::open(&self.state.client).await?;
        let reply = conn.query(redis::cmd("LOCK.INFO").arg(key)).await?;
        Ok(holders(reply))
    }
}

fn closed() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::other("the holder's connection is closed"))
}

/// Closes the holder's connection if the acquire's future is dropped while
/// it waits (so a bound grant made meanwhile is freed at once).
struct ConnOnCancel<'a>(Option<&'a mut Held>);

impl Drop for ConnOnCancel<'_> {
    fn drop(&mut self) {
        if let Some(held) = self.0.take() {
            if held.guards == 0 {
                held.conn = None;
            }
        }
    }
}

/// One keepalive per held connection: renews at a third of the ttl until
/// no guard is left or the lease is lost.
async fn keep(state: Arc<State>) {
    loop {
        let ttl = std_lock(&state.opts).ttl;
        let tick = ttl / 3;
        tokio::time::sleep(tick).await;
        let owner = std_lock(&state.owner).clone();
        let mut held = state.held.lock().await;
        if held.guards == 0 || held.lost.is_some() {
            held.keeping = false;
            return;
        }
        let sent = Instant::now();
        let limit = tick.max(Duration::from_millis(100));
        let result: redis::RedisResult<bool> = if held.bound {
            let mut cmd = redis::cmd("LOCK.KEEPALIVE");
            cmd.arg(millis(ttl));
            match tokio::time::timeout(limit, query(&mut held, &cmd)).await {
                Ok(r) => r.and_then(|v| {
                    let n: i64 = redis::from_redis_value(v)?;
                    Ok(n >= i64::try_from(state.kind.keys().len()).unwrap_or(i64::MAX))
                }),
                Err(_) => Err(redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "keepalive timed out",
                ))),
            }
        } else {
            if held.conn.is_none() {
                held.conn = Conn::open(&state.client).await.ok();
            }
            let mut ok = Ok(true);
            for key in state.kind.keys() {
                let mut cmd = redis::cmd("LOCK.RENEW");
                cmd.arg(key).arg(&owner).arg(millis(ttl));
                match tokio::time::timeout(limit, query(&mut held, &cmd)).await {
                    Ok(Ok(redis::Value::Int(1))) => {}
                    Ok(Ok(_)) => {
                        ok = Ok(false);
                        break;
                    }
                    Ok(Err(e)) => {
                        ok = Err(e);
                        break;
                    }
                    Err(_) => {
                        ok = Err(redis::RedisError::from(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "renewal timed out",
                        )));
                        break;
                    }
                }
            }
            ok
        };
        match result {
            Ok(true) => held.valid_until = sent + ttl,
            Ok(false) => {
                held.lost = Some(if held.bound {
                    "LOCK.KEEPALIVE renewed fewer locks than held: released, expired or deleted"
                        .into()
                } else {
                    "LOCK.RENEW answered 0: the lease expired or the key was deleted".into()
                });
                held.keeping = false;
                return;
            }
            Err(e) if held.bound => {
                held.lost = Some(format!("the connection the lock was bound to failed ({e})"));
                held.conn = None;
                held.keeping = false;
                return;
            }
            Err(e) => {
                held.conn = None;
                if Instant::now() >= held.valid_until {
                    held.lost = Some(format!("renewals failed until the lease ran out ({e})"));
                    held.keeping = false;
                    return;
                }
            }
        }
    }
}

impl Guard {
    pub async fn token(&self) -> i64 {
        self.state
            .held
            .lock()
            .await
            .tokens
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
    }

    pub async fn tokens(&self) -> Vec<i64> {
        self.state.held.lock().await.tokens.clone()
    }

    pub async fn is_bound(&self) -> bool {
        self.state.held.lock().await.bound
    }

    pub async fn is_lost(&self) -> bool {
        let held = self.state.held.lock().await;
        held.lost.is_some() || Instant::now() >= held.valid_until
    }

    pub async fn check(&self) -> Result<(), Error> {
        let held = self.state.held.lock().await;
        if held.lost.is_some() || Instant::now() >= held.valid_until {
            return Err(lost_error(&self.state, &held));
        }
        Ok(())
    }

    pub async fn extend(&self, ttl: Duration) -> Result<(), Error> {
        let s = &self.state;
        let owner = std_lock(&s.owner).clone();
        let mut held = s.held.lock().await;
        let sent = Instant::now();
        for key in s.kind.keys() {
            let mut cmd = redis::cmd("LOCK.RENEW");
            cmd.arg(key).arg(&owner).arg(millis(ttl));
            if query(&mut held, &cmd).await? != redis::Value::Int(1) {
                held.lost =
                    Some("LOCK.RENEW answered 0: the lease expired or the key was deleted".into());
                return Err(lost_error(s, &held));
            }
        }
        std_lock(&s.opts).ttl = ttl;
        held.valid_until = sent + ttl;
        Ok(())
    }

    pub async fn release(mut self) -> Result<(), Error> {
        self.released = true;
        end(&self.state).await
    }
}

fn lost_error(state: &State, held: &Held) -> Error {
    Error::LeaseLost {
        keys: state.kind.keys(),
        token: held.tokens.iter().copied().max().unwrap_or(0),
        why: held
            .lost
            .clone()
            .unwrap_or_else(|| "its ttl ran out without a successful renewal".into()),
    }
}

async fn end(state: &State) -> Result<(), Error> {
    let owner = std_lock(&state.owner).clone();
    let mut held = state.held.lock().await;
    if held.guards == 0 {
        return Ok(());
    }
    held.guards -= 1;
    let last = held.guards == 0;
    if !(last || state.kind.counted()) {
        return Ok(());
    }
    let mut gone = false;
    let mut all_released = false;
    for key in state.kind.keys() {
        let mut cmd = redis::cmd("LOCK.RELEASE");
        cmd.arg(key).arg(&owner);
        match query(&mut held, &cmd).await {
            Ok(redis::Value::Nil) => gone = true,
            Ok(redis::Value::Int(1)) => all_released = true,
            Ok(_) => {}
            Err(e) => {
                held.guards = 0;
                held.conn = None;
                if held.lost.is_some() {
                    return Err(lost_error(state, &held));
                }
                return Err(e.into());
            }
        }
    }
    if gone || all_released {
        held.guards = 0;
    }
    if gone {
        held.lost
            .get_or_insert_with(|| "LOCK.RELEASE answered nil: the lock was no longer ours".into());
        held.conn = None;
        return Err(lost_error(state, &held));
    }
    Ok(())
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let state = Arc::clone(&self.state);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = end(&state).await;
            });
        }
    }
}
