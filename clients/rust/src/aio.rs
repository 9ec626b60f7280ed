//! The tokio API: the same [`Lock`] and [`Guard`] as the blocking one, with
//! `.await` on what goes to the server. [`Lock::acquire`] takes `&mut self`
//! and the guard borrows the lock, as in the blocking API. Each holder's
//! connection is a connection of its own (a connect timeout; every reply
//! bounded by the wait plus [`Lock::timeout`], and by the lease left), and
//! one watchdog task per held lock renews it.
//!
//! Release with [`Guard::release`]`.await`; a guard dropped unreleased is
//! released by a task spawned on the current runtime (and before the next
//! acquire of the same `Lock`, whichever comes first).

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, FromRedisValue};
use tokio::sync::{Mutex, Notify};

use crate::commands::{self, Exchange, Guarded, Release, Released, Renew};
use crate::holding::{tell, After, Holding, Reacquired};
use crate::session::{self, Follower};
use crate::watch::{self, Watched};
use crate::{
    bound_failed, closed, fresh_owner, gone_error, io_failure, limit, tick, timed_out, Error, Kind,
    Options, Target, WRONGTYPE,
};

pub struct Lock {
    shared: Arc<Shared>,
    opts: Options,
}

/// As the blocking [`crate::Session`]: one lease for many locks, its keeper
/// a thread of its own (its I/O never blocks the runtime). Close it with
/// [`Session::close`]`.await`; a `Session` dropped unclosed is closed on a
/// thread spawned for it (best effort).
pub struct Session {
    core: Arc<session::Core>,
}

impl Session {
    /// As the blocking [`crate::Session::new`]: nothing is sent yet.
    pub fn new(client: impl Into<Target>) -> Session {
        Session {
            core: session::Core::new(client.into()),
        }
    }

    /// The session's lease (default 30 s), renewed at a third of it.
    pub fn ttl(self, ttl: Duration) -> Self {
        self.core.set_ttl(ttl);
        self
    }

    /// The connect timeout and the longest a keeper's reply may take (default 2 s).
    pub fn timeout(self, timeout: Duration) -> Self {
        self.core.set_timeout(timeout);
        self
    }

    /// Called once per lock on the session when it ends (after the lock's
    /// own `on_lost`), with that lock's [`Error::LeaseLost`].
    pub fn on_lost(self, f: impl Fn(&Error) + Send + Sync + 'static) -> Self {
        self.core.set_on_lost(Arc::new(f));
        self
    }

    /// The sessions open now, as (node, id) ("" on a single server).
    pub fn ids(&self) -> Vec<(String, i64)> {
        self.core.ids()
    }

    /// As the blocking [`crate::Session::close`].
    pub async fn close(&self) -> Result<i64, Error> {
        let core = Arc::clone(&self.core);
        tokio::task::spawn_blocking(move || core.close())
            .await
            .unwrap_or_else(|e| {
                Err(Error::Redis(redis::RedisError::from(
                    std::io::Error::other(e),
                )))
            })
    }
}

impl Drop for Session {
    /// Closes it on a thread of its own (best effort): `close().await` first
    /// to know it is done.
    fn drop(&mut self) {
        let core = Arc::clone(&self.core);
        let _ = std::thread::Builder::new()
            .name("redis-native-lock-session-close".into())
            .spawn(move || core.drop_session());
    }
}

/// The session on `key`'s node: at once if open, else opened off the
/// runtime's threads.
async fn ensure(link: &session::Link, target: &Target, key: &[u8]) -> Result<(String, i64), Error> {
    if link.0.serves(target) {
        if let Some(found) = link.0.cached(key) {
            return Ok(found);
        }
    }
    let (core, target, key) = (Arc::clone(&link.0), target.clone(), key.to_vec());
    tokio::task::spawn_blocking(move || core.ensure(&target, &key))
        .await
        .unwrap_or_else(|e| {
            Err(Error::Redis(redis::RedisError::from(
                std::io::Error::other(e),
            )))
        })
}

/// The lock follows its session from now on; a session ended meanwhile: lost.
fn follow(s: &Arc<Shared>, core: &Arc<session::Core>, node: &str, id: i64, generation: u64) {
    let weak: Weak<dyn Follower> = Arc::downgrade(&(Arc::clone(s) as Arc<dyn Follower>));
    match core.follow(node, id, weak, generation) {
        Some(deadline) => {
            let _ = s.renewed(generation, deadline);
        }
        None => {
            if let Some((own, err)) = s.ended(generation, session::ENDED_DEADLINE) {
                core.tell(own, &err);
            }
        }
    }
}

impl Follower for Shared {
    fn renewed(&self, generation: u64, until: Instant) -> bool {
        std_lock(&self.status).session_renewed(generation, until)
    }

    fn ended(&self, generation: u64, why: &str) -> Option<(Option<crate::OnLost>, Error)> {
        std_lock(&self.status).session_ended(&self.kind, generation, why)
    }

    fn closed(&self, generation: u64) {
        std_lock(&self.status).session_closed(generation, session::CLOSED);
    }
}

#[must_use = "release the guard with .release().await"]
pub struct Guard<'a> {
    lock: &'a mut Lock,
    generation: u64,
    done: bool,
}

/// A holder's connection: to the server, or to the cluster.
#[derive(Clone)]
enum Conn {
    Server(MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

/// Runs `f` for at most `t` (`None`: as long as it takes).
async fn within<T>(
    t: Option<Duration>,
    f: impl Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    match t {
        None => f.await,
        Some(t) => tokio::time::timeout(t, f)
            .await
            .unwrap_or_else(|_| Err(timed_out("no reply within the timeout"))),
    }
}

impl Conn {
    /// A connection of the holder's own: a connect timeout; replies are
    /// bounded per request by [`within`] (a waiting reply may be long).
    async fn open(target: &Target, timeout: Duration) -> redis::RedisResult<Conn> {
        match target {
            Target::Server(c) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(None);
                within(
                    Some(timeout),
                    c.get_multiplexed_async_connection_with_config(&config),
                )
                .await
                .map(Conn::Server)
            }
            Target::Cluster(c) => {
                // The cluster client takes only a finite response timeout.
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(timeout)
                    .set_response_timeout(Duration::from_secs(365 * 24 * 3600));
                within(Some(timeout), c.get_async_connection_with_config(config))
                    .await
                    .map(Conn::Cluster)
            }
        }
    }

    async fn query(
        &mut self,
        cmd: &redis::Cmd,
        t: Option<Duration>,
    ) -> redis::RedisResult<redis::Value> {
        match self {
            Conn::Server(c) => within(t, cmd.query_async(c)).await,
            Conn::Cluster(c) => within(t, cmd.query_async(c)).await,
        }
    }

    async fn query_pipe(
        &mut self,
        p: &redis::Pipeline,
        t: Option<Duration>,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        match self {
            Conn::Server(c) => within(t, p.query_async(c)).await,
            Conn::Cluster(c) => within(t, p.query_async(c)).await,
        }
    }

    /// Sends `e`'s commands one by one (each reply within `t`), each reply
    /// handed back to it.
    async fn run<E: Exchange>(
        &mut self,
        mut e: E,
        t: Option<Duration>,
    ) -> redis::RedisResult<E::Outcome> {
        while let Some(cmd) = e.next() {
            let reply = self.query(cmd, t).await;
            e.reply(reply)?;
        }
        Ok(e.outcome())
    }
}

struct Shared {
    client: Target,
    kind: Kind,
    pid: u32,
    /// Held across I/O (always bounded by a timeout).
    conn: Mutex<Option<Conn>>,
    /// Never held across I/O or an `.await`.
    status: StdMutex<Status>,
}

/// A lock's [`Holding`], and what the tokio API adds to it.
struct Status {
    holding: Holding,
    /// Wakes this acquisition's watchdog.
    wake: Arc<Notify>,
    /// Grants (owner, tokens) whose release a dropped guard left to a
    /// task: sent before anything else goes over the connection.
    pending: Vec<(Vec<u8>, Vec<i64>)>,
}

impl Deref for Status {
    type Target = Holding;
    fn deref(&self) -> &Holding {
        &self.holding
    }
}

impl DerefMut for Status {
    fn deref_mut(&mut self) -> &mut Holding {
        &mut self.holding
    }
}

fn std_lock<T>(m: &StdMutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sends the releases dropped guards left behind.
async fn flush(s: &Shared, slot: &mut Option<Conn>) {
    let (pending, timeout) = {
        let mut st = std_lock(&s.status);
        (std::mem::take(&mut st.pending), st.timeout)
    };
    for (owner, tokens) in pending {
        let Some(conn) = slot.as_mut() else { return };
        for (key, token) in s.kind.keys().iter().zip(tokens) {
            // Under the grant's token: a stale guard frees nothing.
            let release = commands::release(key, &owner, Some(token));
            if conn.query(&release, Some(timeout)).await.is_err() {
                *slot = None; // closing it frees a bound lock
                break;
            }
        }
    }
}

impl Lock {
    fn new(client: Target, kind: Kind) -> Lock {
        let opts = Options::default();
        Lock {
            shared: Arc::new(Shared {
                client,
                kind,
                pid: std::process::id(),
                conn: Mutex::new(None),
                status: StdMutex::new(Status {
                    holding: Holding::new(&opts),
                    wake: Arc::new(Notify::new()),
                    pending: Vec::new(),
                }),
            }),
            opts,
        }
    }

    crate::api::lock_builder!(std_lock);

    /// As the blocking [`crate::Lock::session`]: holds in `session`.
    pub fn session(mut self, session: &Session) -> Self {
        self.opts.session = Some(session::Link(Arc::clone(&session.core)));
        self
    }

    /// As the blocking [`crate::Lock::acquire`]. Cancelling the future (a
    /// `select!`, a timeout) closes the connection the request waited on,
    /// which frees a grant it may have got meanwhile (bound); an unbound
    /// one ends with its lease.
    pub async fn acquire(&mut self) -> Result<Option<Guard<'_>>, Error> {
        let s = Arc::clone(&self.shared);
        if s.pid != std::process::id() {
            return Err(Error::Forked);
        }
        let leaked = {
            let st = std_lock(&s.status);
            (st.holds > 0).then_some(st.generation)
        };
        if let Some(generation) = leaked {
            let _ = end(&s, generation, true).await;
        }
        let opts = self.opts.clone();
        let owner = std_lock(&s.status).owner.clone();
        s.kind.check(&opts, &owner)?;
        crate::check_replicas(&opts, &s.client)?;
        // In a session: its id on the key's node (opened the first time).
        let first = s.kind.keys().into_iter().next().unwrap_or_default();
        let mut session = match &opts.session {
            Some(link) => Some(ensure(link, &s.client, &first).await?),
            None => None,
        };
        let mut slot = s.conn.lock().await;
        flush(&s, &mut slot).await;
        // Taken out while the request waits: a cancelled acquire drops it
        // (closing it frees a grant made meanwhile).
        let started = Instant::now();
        let reused = slot.is_some();
        let mut conn = match slot.take() {
            Some(c) => c,
            None => Conn::open(&s.client, opts.timeout).await?,
        };
        let mut bound = opts.bind && matches!(s.client, Target::Server(_)) && session.is_none();
        let sent = Instant::now();
        // One deadline for connecting and the reply.
        let t = opts
            .acquire_timeout()
            .map(|t| limit(t, t.saturating_sub(started.elapsed())));
        let id = session.as_ref().map(|(_, id)| *id);
        let mut reply = conn
            .query(&commands::acquire(&s.kind, &opts, &owner, bound, id), t)
            .await;
        if id.is_some() && reused && matches!(&reply, Err(e) if io_failure(e) && !e.is_timeout()) {
            // A session lock outlives its connection: one that died while
            // idle (killed: it ran nothing) is replaced.
            conn = Conn::open(&s.client, opts.timeout).await?;
            reply = conn
                .query(&commands::acquire(&s.kind, &opts, &owner, false, id), t)
                .await;
        }
        if bound && matches!(&reply, Err(e) if e.to_string().contains("syntax error")) {
            bound = false;
            reply = conn
                .query(&commands::acquire(&s.kind, &opts, &owner, false, None), t)
                .await;
        }
        if let (Some(link), Some((node, id))) = (&opts.session, &session) {
            if matches!(&reply, Err(e) if commands::no_session(e)) {
                // The session ended (or, in a cluster, the slot moved): once
                // more, in a session opened anew.
                link.0.refused(node, *id);
                match ensure(link, &s.client, &first).await {
                    Ok(again) => {
                        let id = Some(again.1);
                        session = Some(again);
                        let cmd = commands::acquire(&s.kind, &opts, &owner, false, id);
                        reply = conn.query(&cmd, t).await;
                    }
                    Err(e) => {
                        *slot = Some(conn);
                        return Err(e);
                    }
                }
            }
        }
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                if io_failure(&e) {
                    drop(conn);
                    if !bound {
                        release_quietly(&s.client, &s.kind, &owner, opts.timeout).await;
                    }
                } else {
                    *slot = Some(conn);
                }
                return Err(e.into());
            }
        };
        *slot = Some(conn);
        let Some(tokens) = commands::tokens(reply)? else {
            return Ok(None);
        };
        // The renewals count from the grant, not from after its `WAIT`.
        let granted = Instant::now();
        let mut durable = None;
        if opts.replicas > 0 {
            // On the grant's connection: WAIT covers it.
            match wait_acks(
                &mut slot,
                opts.replicas,
                opts.replicas_timeout,
                opts.timeout,
            )
            .await
            {
                Ok(n) if n >= i64::from(opts.replicas) => durable = Some(true),
                Ok(_) if opts.allow_not_durable => durable = Some(false),
                Ok(n) => {
                    // Given back on the same connection (one hold: a first grant).
                    if release_keys(&mut slot, &s.kind, &owner, &tokens, opts.timeout, false)
                        .await
                        .is_err()
                    {
                        *slot = None; // closing it frees a bound grant
                        if !bound {
                            release_quietly(&s.client, &s.kind, &owner, opts.timeout).await;
                        }
                    }
                    return Err(Error::NotDurable {
                        keys: s.kind.keys(),
                        token: tokens.iter().copied().max().unwrap_or(0),
                        acknowledged: n,
                        replicas: opts.replicas,
                    });
                }
                Err(e) => {
                    *slot = None;
                    if !bound {
                        release_quietly(&s.client, &s.kind, &owner, opts.timeout).await;
                    }
                    return Err(e.into());
                }
            }
        }
        let (generation, wake) = {
            let mut st = std_lock(&s.status);
            st.generation += 1;
            st.ttl = opts.ttl;
            st.timeout = opts.timeout;
            st.bound = bound;
            st.holds = 1;
            st.tokens = tokens;
            st.lost = None;
            st.valid_until = sent + opts.ttl;
            st.next_renewal = granted + tick(opts.ttl);
            st.wake = Arc::new(Notify::new());
            // The watchdog's first work: tracking, and a read of the keys.
            st.verify = bound;
            st.replicas = opts.replicas;
            st.replicas_timeout = opts.replicas_timeout;
            st.durable = durable;
            st.session = session.as_ref().map(|(_, id)| *id);
            st.released = false;
            (st.generation, Arc::clone(&st.wake))
        };
        drop(slot);
        if let (Some(link), Some((node, id))) = (&opts.session, &session) {
            // No watchdog: the session's keeper is its one renewal.
            follow(&s, &link.0, node, *id, generation);
        } else {
            tokio::spawn(watchdog(Arc::clone(&s), generation, wake));
        }
        Ok(Some(Guard {
            lock: self,
            generation,
            done: false,
        }))
    }

    pub async fn locked(&self) -> Result<bool, Error> {
        Ok(commands::holders(self.info().await?).is_some())
    }

    pub async fn owned(&self) -> Result<bool, Error> {
        Ok(commands::held_by(
            self.info().await?,
            &self.owner_id(),
            None,
        ))
    }

    /// `LOCK.INFO` of the (first) key, on a connection of its own.
    async fn info(&self) -> Result<redis::Value, Error> {
        let key = self
            .shared
            .kind
            .keys()
            .into_iter()
            .next()
            .unwrap_or_default();
        let t = self.opts.timeout;
        let started = Instant::now();
        let mut conn = Conn::open(&self.shared.client, t).await?;
        let left = limit(t, t.saturating_sub(started.elapsed()));
        Ok(conn.query(&commands::info(&key), Some(left)).await?)
    }
}

async fn release_quietly(client: &Target, kind: &Kind, owner: &[u8], timeout: Duration) {
    if let Ok(mut c) = Conn::open(client, timeout).await {
        for key in kind.keys() {
            let _ = c
                .query(&commands::release(&key, owner, None), Some(timeout))
                .await;
        }
    }
}

/// One watchdog task per held lock: renews at a third of the ttl until the
/// acquisition ends or the lease is lost.
async fn watchdog(s: Arc<Shared>, generation: u64, wake: Arc<Notify>) {
    loop {
        loop {
            let (next, verify) = {
                let st = std_lock(&s.status);
                if !st.current(generation) || st.lost.is_some() {
                    return;
                }
                (st.next_renewal, st.verify)
            };
            if Instant::now() >= next || verify {
                break;
            }
            // Woken by a release or an extend, else at the next renewal.
            let _ = tokio::time::timeout_at(next.into(), wake.notified()).await;
        }
        // The watcher (opened if need be) before the connection is taken.
        let (bound, timeout) = {
            let st = std_lock(&s.status);
            (st.bound, st.timeout)
        };
        if bound {
            join(&s, timeout).await;
        }
        if bound && !std_lock(&s.status).current(generation) {
            // Released meanwhile: the release may have left the watcher before we joined.
            leave(&s, &mut None, timeout).await;
            return;
        }
        let mut slot = s.conn.lock().await;
        let (owner, tokens, ttl, timeout, bound, left, renew) = {
            let mut st = std_lock(&s.status);
            if !st.current(generation) || st.lost.is_some() {
                return;
            }
            let renew = Instant::now() >= st.next_renewal;
            if !renew && !st.verify {
                continue;
            }
            st.verify = false;
            let news = st.check_lost(&s.kind);
            if news.is_some() {
                drop(st);
                tell(news);
                return;
            }
            let left = st.valid_until.saturating_duration_since(Instant::now());
            let (owner, tokens) = (st.owner.clone(), st.tokens.clone());
            (owner, tokens, st.ttl, st.timeout, st.bound, left, renew)
        };
        let io = limit(timeout, left);
        if slot.is_none() && !bound {
            *slot = Conn::open(&s.client, io).await.ok();
        }
        let sent = Instant::now();
        let result = if bound {
            sync(
                &mut slot,
                &s.kind,
                &owner,
                &tokens,
                renew.then_some(ttl),
                io,
            )
            .await
        } else {
            renew_keys(&mut slot, &s.kind, &owner, &tokens, ttl, io).await
        };
        let (replicas, wait) = {
            let st = std_lock(&s.status);
            (st.replicas, st.replicas_timeout)
        };
        // WAIT on the renewal's connection (after LOCK.KEEPALIVE or LOCK.RENEW): covers it.
        let acks = if renew && replicas > 0 && matches!(result, Ok(None)) {
            Some(wait_acks(&mut slot, replicas, wait, timeout).await)
        } else {
            None
        };
        let after = {
            let mut st = std_lock(&s.status);
            if !st.current(generation) {
                return;
            }
            st.after_pass(&s.kind, result, renew, sent, acks)
        };
        let over = after.news.is_some();
        apply(&s, slot, after);
        if over {
            return;
        }
    }
}

/// Applies a decision of [`Holding`]'s: closes the holder's connection
/// (which frees a bound lock), wakes the watchdog, then tells, outside the
/// locks.
fn apply(s: &Shared, mut slot: tokio::sync::MutexGuard<'_, Option<Conn>>, after: After) {
    if after.close {
        *slot = None;
    }
    if after.wake {
        std_lock(&s.status).wake.notify_one();
    }
    drop(slot);
    tell(after.notice);
    tell(after.news);
}

impl Watched for Shared {
    fn keys(&self) -> Vec<Vec<u8>> {
        self.kind.keys()
    }

    fn told(&self) {
        let mut st = std_lock(&self.status);
        st.verify = true;
        st.wake.notify_one();
    }
}

/// Joins the watcher of the lock's server (opened if need be, off the
/// runtime's threads: opening waits on the network).
async fn join(s: &Arc<Shared>, timeout: Duration) {
    let Target::Server(c) = &s.client else {
        return;
    };
    let weak: Weak<dyn Watched> = Arc::downgrade(&(Arc::clone(s) as Arc<dyn Watched>));
    let id = watch::id_of::<Shared>(s);
    if watch::try_join(c, id, &weak).is_some() {
        return;
    }
    let c = c.clone();
    let _ = tokio::task::spawn_blocking(move || watch::join(&c, id, weak, timeout)).await;
}

/// The lock no longer needs the watcher; the last one wakes it to close,
/// with a PUBLISH on the lock's connection (or one of its own).
async fn leave(s: &Shared, slot: &mut Option<Conn>, timeout: Duration) {
    let Target::Server(c) = &s.client else {
        return;
    };
    let Some(channel) = watch::leave(c, watch::id_of(s)) else {
        return;
    };
    let publish = commands::publish(&channel);
    if let Some(conn) = slot.as_mut() {
        if conn.query(&publish, Some(timeout)).await.is_ok() {
            return;
        }
    }
    if let Ok(mut conn) = Conn::open(&s.client, timeout).await {
        let _ = conn.query(&publish, Some(timeout)).await;
    }
}

/// As the blocking API's: `LOCK.KEEPALIVE` (when `renew`) and a read of
/// each key, in one round trip. `None` while the grant holds them all.
async fn sync(
    slot: &mut Option<Conn>,
    kind: &Kind,
    owner: &[u8],
    tokens: &[i64],
    renew: Option<Duration>,
    timeout: Duration,
) -> redis::RedisResult<Option<&'static str>> {
    let conn = slot.as_mut().ok_or_else(closed)?;
    match conn
        .query_pipe(&commands::sync_pipe(kind, renew), Some(timeout))
        .await
    {
        Ok(replies) => Ok(commands::judge(
            kind,
            owner,
            tokens,
            renew.is_some(),
            replies,
        )),
        Err(e) if gone_error(&e) => Ok(Some(WRONGTYPE)),
        Err(e) => Err(e),
    }
}

async fn renew_keys(
    slot: &mut Option<Conn>,
    kind: &Kind,
    owner: &[u8],
    tokens: &[i64],
    ttl: Duration,
    timeout: Duration,
) -> redis::RedisResult<Option<&'static str>> {
    let conn = slot.as_mut().ok_or_else(closed)?;
    conn.run(Renew::new(kind, owner, tokens, ttl), Some(timeout))
        .await
}

/// `WAIT replicas wait` on the holder's connection (a reply may take `wait`
/// plus `timeout`): how many replicas acknowledged what it sent before.
async fn wait_acks(
    slot: &mut Option<Conn>,
    replicas: u32,
    wait: Duration,
    timeout: Duration,
) -> redis::RedisResult<i64> {
    let conn = slot.as_mut().ok_or_else(closed)?;
    commands::acknowledged(
        conn.query(
            &commands::wait_replicas(replicas, wait),
            Some(timeout.saturating_add(wait)),
        )
        .await,
    )
}

async fn release_keys(
    slot: &mut Option<Conn>,
    kind: &Kind,
    owner: &[u8],
    tokens: &[i64],
    timeout: Duration,
    all: bool,
) -> redis::RedisResult<Released> {
    let conn = slot.as_mut().ok_or_else(closed)?;
    conn.run(Release::new(kind, owner, tokens, all), Some(timeout))
        .await
}

/// The bookkeeping of ending one guard, done at once (also from `Drop`):
/// whether a `LOCK.RELEASE` must go, and for which grant (owner, tokens).
fn unhold(s: &Shared, generation: u64, all: bool) -> Option<(Vec<u8>, Vec<i64>)> {
    let mut st = std_lock(&s.status);
    if !st.current(generation) {
        return None;
    }
    // Closed with its session: released already.
    st.holds = if all || st.released { 0 } else { st.holds - 1 };
    let last = st.holds == 0;
    if last {
        st.wake.notify_one();
    }
    (!st.released && (all || last || s.kind.counted()))
        .then(|| (st.owner.clone(), st.tokens.clone()))
}

/// After the last hold: the next acquisition, a fresh owner unless fixed.
fn finish(s: &Shared, generation: u64) {
    let mut st = std_lock(&s.status);
    if st.holds == 0 && st.generation == generation {
        st.generation += 1;
        st.wake.notify_one();
        if !st.fixed {
            st.owner = fresh_owner();
        }
    }
}

async fn end(s: &Shared, generation: u64, all: bool) -> Result<(), Error> {
    // Waits for a renewal in flight: no renewal follows the release.
    let mut slot = s.conn.lock().await;
    flush(s, &mut slot).await;
    let send = unhold(s, generation, all);
    let mut news = None;
    let mut result = Ok(());
    if let Some((owner, tokens)) = send {
        let (timeout, left) = {
            let st = std_lock(&s.status);
            (
                st.timeout,
                st.valid_until.saturating_duration_since(Instant::now()),
            )
        };
        let timeout = limit(timeout, left.max(Duration::from_millis(50)));
        let mut outcome = release_keys(&mut slot, &s.kind, &owner, &tokens, timeout, all).await;
        let in_session = std_lock(&s.status).session.is_some();
        if in_session && matches!(&outcome, Err(e) if io_failure(e)) {
            // A session lock outlives its connection: the release goes on
            // a new one (a killed connection ran nothing).
            *slot = Conn::open(&s.client, timeout).await.ok();
            outcome = release_keys(&mut slot, &s.kind, &owner, &tokens, timeout, all).await;
        }
        let (after, r) = std_lock(&s.status).after_release(&s.kind, outcome);
        result = r;
        if after.close {
            *slot = None;
        }
        if after.wake {
            std_lock(&s.status).wake.notify_one();
        }
        news = after.news;
    }
    let (last, timeout) = {
        let st = std_lock(&s.status);
        if result.is_ok() && st.lost.is_some() && !st.released {
            result = Err(st.lost_error(&s.kind));
        }
        (st.holds == 0 && st.bound, st.timeout)
    };
    if last {
        leave(s, &mut slot, timeout).await;
    }
    drop(slot);
    finish(s, generation);
    tell(news);
    result
}

impl Guard<'_> {
    fn shared(&self) -> &Shared {
        &self.lock.shared
    }

    /// The lock this guard holds (read-only while the guard lives).
    pub fn lock(&self) -> &Lock {
        self.lock
    }

    /// As the blocking [`crate::Guard::owned`]: this grant, under its token.
    pub async fn owned(&self) -> Result<bool, Error> {
        let (owner, token) = {
            let st = std_lock(&self.shared().status);
            (st.owner.clone(), st.tokens.first().copied())
        };
        Ok(commands::held_by(self.lock.info().await?, &owner, token))
    }

    crate::api::guard_reads!(std_lock);

    /// As the blocking [`crate::Guard::call`]: `cmd` runs iff this
    /// acquisition still holds the lock, as one atomic step, else
    /// [`Error::LeaseLost`] and nothing ran. Calls from several tasks on one
    /// guard are pipelined on the holder's connection.
    pub async fn call<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, Error> {
        self.guarded(None, cmd).await
    }

    /// As the blocking [`crate::Guard::call_on`]: guarded on `key`, one of
    /// the lock's keys.
    pub async fn call_on<T: FromRedisValue>(
        &self,
        key: impl AsRef<[u8]>,
        cmd: &redis::Cmd,
    ) -> Result<T, Error> {
        self.guarded(Some(key.as_ref()), cmd).await
    }

    async fn guarded<T: FromRedisValue>(
        &self,
        key: Option<&[u8]>,
        cmd: &redis::Cmd,
    ) -> Result<T, Error> {
        self.check()?;
        let s = self.shared();
        let (guard, bound, timeout, left) = {
            let st = std_lock(&s.status);
            let guard = commands::guard(&s.kind, &st.tokens, &st.owner, key, cmd)?;
            let left = st.valid_until.saturating_duration_since(Instant::now());
            (guard, st.bound, st.timeout, left)
        };
        // A clone of the multiplexed connection: the watchdog and other
        // calls are not kept waiting behind this one.
        let conn = {
            let mut slot = s.conn.lock().await;
            if slot.is_none() && !bound {
                // Unbound (a session lock's connection killed): a new one.
                *slot = Conn::open(&s.client, limit(timeout, left)).await.ok();
            }
            slot.clone()
        };
        let Some(mut conn) = conn else {
            return Err(Error::Redis(closed()));
        };
        let reply = conn.query(&guard, Some(limit(timeout, left))).await;
        match commands::guarded(reply) {
            Ok(Guarded::Ran(v)) => Ok(v),
            Ok(Guarded::NotHeld) => {
                let (err, news) = std_lock(&s.status).not_held(&s.kind, self.generation);
                tell(news);
                Err(err)
            }
            Err(e) => {
                if io_failure(&e) && !e.is_timeout() {
                    // The connection failed (a timeout leaves a multiplexed
                    // one usable): closing it frees a bound lock.
                    *s.conn.lock().await = None;
                    if bound {
                        let news = std_lock(&s.status).set_lost(&s.kind, &bound_failed(&e));
                        tell(news);
                    }
                }
                Err(e.into())
            }
        }
    }

    pub async fn extend(&self, ttl: Duration) -> Result<(), Error> {
        let s = self.shared();
        if ttl < Duration::from_millis(1) {
            return Err(Error::Invalid("a ttl under 1 ms".into()));
        }
        if std_lock(&s.status).session.is_some() {
            return Err(Error::Invalid(crate::IN_SESSION.into()));
        }
        self.check()?;
        let mut slot = s.conn.lock().await;
        let (owner, tokens, timeout, left) = {
            let st = std_lock(&s.status);
            let left = st.valid_until.saturating_duration_since(Instant::now());
            (st.owner.clone(), st.tokens.clone(), st.timeout, left)
        };
        let sent = Instant::now();
        let io = limit(timeout, left);
        let result = renew_keys(&mut slot, &s.kind, &owner, &tokens, ttl, io).await;
        let (replicas, wait) = {
            let st = std_lock(&s.status);
            (st.replicas, st.replicas_timeout)
        };
        let acks = if replicas > 0 && matches!(result, Ok(None)) {
            Some(wait_acks(&mut slot, replicas, wait, timeout).await)
        } else {
            None
        };
        let (after, result) = {
            let mut st = std_lock(&s.status);
            if !st.current(self.generation) {
                return Err(st.lost_error(&s.kind));
            }
            st.after_extend(&s.kind, result, ttl, sent, acks)
        };
        apply(s, slot, after);
        result
    }

    /// As the blocking [`crate::Guard::reacquire`].
    pub async fn reacquire(&mut self) -> Result<Option<Guard<'_>>, Error> {
        self.check()?;
        let s = Arc::clone(&self.lock.shared);
        let opts = self.lock.opts.clone();
        let mut slot = s.conn.lock().await;
        let (owner, bound, timeout, left, session) = {
            let st = std_lock(&s.status);
            let left = st.valid_until.saturating_duration_since(Instant::now());
            (st.owner.clone(), st.bound, st.timeout, left, st.session)
        };
        if slot.is_none() && !bound {
            *slot = Conn::open(&s.client, limit(timeout, left)).await.ok();
        }
        let Some(conn) = slot.as_mut() else {
            return Err(Error::Redis(closed()));
        };
        let sent = Instant::now();
        let reply = conn
            .query(
                &commands::acquire(&s.kind, &opts, &owner, bound, session),
                Some(limit(timeout, left)),
            )
            .await;
        let reply = match reply {
            Ok(r) => commands::tokens(r),
            Err(e) if gone_error(&e) => {
                let news = std_lock(&s.status).set_lost(&s.kind, WRONGTYPE);
                tell(news);
                return Err(std_lock(&s.status).lost_error(&s.kind));
            }
            Err(e) => {
                if io_failure(&e) {
                    *slot = None;
                    let why = if bound {
                        bound_failed(&e)
                    } else {
                        format!("the holder's connection failed ({e})")
                    };
                    let news = std_lock(&s.status).set_lost(&s.kind, &why);
                    tell(news);
                }
                return Err(e.into());
            }
        };
        let reacquired = std_lock(&s.status).reacquired(&s.kind, reply?, sent);
        match reacquired {
            Reacquired::Held => {
                std_lock(&s.status).wake.notify_one();
                drop(slot);
                Ok(Some(Guard {
                    generation: self.generation,
                    lock: &mut *self.lock,
                    done: false,
                }))
            }
            Reacquired::Stale(other, news) => {
                // The request took a hold of a new grant: given back under
                // its token.
                let _ = release_keys(&mut slot, &s.kind, &owner, &other, timeout, false).await;
                drop(slot);
                tell(news);
                Err(std_lock(&s.status).lost_error(&s.kind))
            }
            Reacquired::Refused => Ok(None),
        }
    }

    pub async fn release(mut self) -> Result<(), Error> {
        self.done = true;
        end(&self.lock.shared, self.generation, false).await
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let s = Arc::clone(&self.lock.shared);
        if s.pid != std::process::id() {
            return;
        }
        let Some(grant) = unhold(&s, self.generation, false) else {
            // Nothing to send (a hold of several, or closed with its
            // session): the acquisition ends with its last hold.
            finish(&s, self.generation);
            return;
        };
        std_lock(&s.status).pending.push(grant);
        let generation = self.generation;
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let mut slot = s.conn.lock().await;
                flush(&s, &mut slot).await;
                let (last, timeout) = {
                    let st = std_lock(&s.status);
                    (st.holds == 0 && st.bound, st.timeout)
                };
                if last {
                    leave(&s, &mut slot, timeout).await;
                }
                drop(slot);
                finish(&s, generation);
            });
        } else {
            // No runtime to send it on: close the connection (a bound lock
            // is freed; an unbound one ends with its lease).
            if let Ok(mut slot) = s.conn.try_lock() {
                *slot = None;
            }
            if let Target::Server(c) = &s.client {
                // No runtime to publish on: the watcher closes when it next hears something.
                let _ = watch::leave(c, watch::id_of::<Shared>(&s));
            }
            std_lock(&s.status).pending.clear();
            finish(&s, generation);
        }
    }
}
