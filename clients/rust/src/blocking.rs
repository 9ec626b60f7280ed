//! The blocking API: [`Lock`] (one holder identity: owner, kind, keys, its
//! connection) and [`Guard`] (one acquisition, released on drop).

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use redis::FromRedisValue;

use crate::commands::{self, Guarded, Release, Released, Renew};
use crate::conn::Conn;
use crate::holding::{tell, After, Holding, Reacquired};
use crate::session::{self, Follower};
use crate::watch::{self, Watched};
use crate::{
    bound_failed, closed, fresh_owner, gone_error, io_failure, limit, tick, Error, Kind, Options,
    Target, WRONGTYPE,
};

/// A lock of one kind on its keys, held by one owner. Acquire it with
/// [`Lock::acquire`] (`&mut self`: one acquisition at a time per object);
/// the grant is a [`Guard`] that borrows the lock until it is released.
pub struct Lock {
    shared: Arc<Shared>,
    opts: Options,
}

/// One acquisition. Hand [`Guard::token`] to the resource you write to;
/// [`Guard::release`] it (or drop it) when done.
#[must_use = "the lock is released when the guard is dropped"]
pub struct Guard<'a> {
    lock: &'a mut Lock,
    generation: u64,
    done: bool,
}

/// A session (`LOCK.SESSION`): one lease that many locks share, renewed
/// by one `LOCK.SESSION KEEPALIVE` per server at a third of its ttl (a
/// keeper thread per `Session`, reconnecting after a failure until the
/// session's deadline), that survives the client's reconnects. Locks join
/// it with [`Lock::session`]: granted with `SESSION id` and without `BIND`,
/// no watchdog of their own. Opened lazily on the first lock's server (per
/// node in a cluster). When it ends (a keepalive answered 0, a grant
/// answered `NOSESSION`, or its deadline passed with no keepalive
/// acknowledged: told at the deadline) every lock on it is lost, each told
/// once ([`Lock::on_lost`], then [`Session::on_lost`]); a later lock opens a
/// new session. [`Session::close`] (and dropping the `Session`) ends its
/// locks at once, released (not lost: no callback).
pub struct Session {
    core: Arc<session::Core>,
}

impl Session {
    /// A session for locks on `client`'s server (or cluster); nothing is
    /// sent until a lock needs it.
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

    /// The connect timeout and the longest a keeper's reply may take
    /// (default 2 s; never past the session's deadline).
    pub fn timeout(self, timeout: Duration) -> Self {
        self.core.set_timeout(timeout);
        self
    }

    /// Called once per lock on the session when the session ends (after
    /// the lock's own [`Lock::on_lost`]), with that lock's
    /// [`Error::LeaseLost`]; on the keeper's thread (or the acquire's).
    pub fn on_lost(self, f: impl Fn(&Error) + Send + Sync + 'static) -> Self {
        self.core.set_on_lost(Arc::new(f));
        self
    }

    /// The sessions open now, as (node, id): the node is "" on a single
    /// server, "host:port" in a cluster.
    pub fn ids(&self) -> Vec<(String, i64)> {
        self.core.ids()
    }

    /// `LOCK.SESSION CLOSE` on every node it opened: its locks end at once
    /// in the server (waiters are granted) and here (released: `is_lost()`
    /// true, no callback, their release sends nothing and is `Ok`). How
    /// many holders ended, as the servers say. A lock acquired later opens
    /// a new session.
    pub fn close(&self) -> Result<i64, Error> {
        self.core.close()
    }
}

impl Drop for Session {
    /// Closes it, best effort (each node's reply within the timeout).
    fn drop(&mut self) {
        let _ = self.core.drop_session();
    }
}

/// What a `Lock` shares with its watchdog thread.
struct Shared {
    client: Target,
    kind: Kind,
    /// The process that made the lock.
    pid: u32,
    /// The holder's connection: the acquire waits on it, the lock is bound
    /// to it (`BIND`), the renewals and the release go over it. Held across
    /// I/O, always with a timeout.
    conn: Mutex<Option<Conn>>,
    /// Never held across I/O: what a guard reads answers at once.
    status: Mutex<Holding>,
    /// Wakes the watchdog (a release, a new ttl).
    wake: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
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
                status: Mutex::new(Holding::new(&opts)),
                wake: Condvar::new(),
            }),
            opts,
        }
    }

    crate::api::lock_builder!(lock);

    /// Holds in `session`: granted with `SESSION id` (no `BIND`), renewed
    /// only by the session's keeper ([`Guard::extend`] is refused), lost when
    /// the session ends; it survives its connections being killed.
    pub fn session(mut self, session: &Session) -> Self {
        self.opts.session = Some(session::Link(Arc::clone(&session.core)));
        self
    }

    /// Asks for the lock, waiting in the server as configured (by default
    /// not at all): a guard, or `None` when refused or the wait ran out.
    /// [`Error::Deadlock`] when waiting would close a cycle of waits.
    pub fn acquire(&mut self) -> Result<Option<Guard<'_>>, Error> {
        let s = Arc::clone(&self.shared);
        if s.pid != std::process::id() {
            return Err(Error::Forked);
        }
        {
            // A guard forgotten (mem::forget) left its hold: end it first.
            let leaked = lock(&s.status).holds > 0;
            if leaked {
                let generation = lock(&s.status).generation;
                let _ = end(&s, generation, true);
            }
        }
        let opts = self.opts.clone();
        let owner = lock(&s.status).owner.clone();
        s.kind.check(&opts, &owner)?;
        crate::check_replicas(&opts, &s.client)?;
        // In a session: its id on the key's node (opened the first time).
        let first = s.kind.keys().into_iter().next().unwrap_or_default();
        let mut session = match &opts.session {
            Some(link) => Some(link.0.ensure(&s.client, &first)?),
            None => None,
        };
        let mut slot = lock(&s.conn);
        let mut bound = opts.bind && matches!(s.client, Target::Server(_)) && session.is_none();
        let started = Instant::now();
        let reused = slot.is_some();
        let mut conn = match slot.take() {
            Some(c) => c,
            None => Conn::open(&s.client, opts.timeout)?,
        };
        let sent = Instant::now();
        // One deadline for connecting and the reply.
        let reply_timeout = opts
            .acquire_timeout()
            .map(|t| limit(t, t.saturating_sub(started.elapsed())));
        let id = session.as_ref().map(|(_, id)| *id);
        let mut reply = conn
            .timeouts(reply_timeout)
            .and_then(|()| conn.query(&commands::acquire(&s.kind, &opts, &owner, bound, id)));
        if id.is_some() && reused && matches!(&reply, Err(e) if io_failure(e) && !e.is_timeout()) {
            // A session lock outlives its connection: one that died while
            // idle (killed: it ran nothing) is replaced.
            conn = Conn::open(&s.client, opts.timeout)?;
            reply = conn
                .timeouts(reply_timeout)
                .and_then(|()| conn.query(&commands::acquire(&s.kind, &opts, &owner, false, id)));
        }
        if bound && matches!(&reply, Err(e) if e.to_string().contains("syntax error")) {
            // A server without BIND: a lease renewed with LOCK.RENEW.
            bound = false;
            reply = conn.query(&commands::acquire(&s.kind, &opts, &owner, false, None));
        }
        if let (Some(link), Some((node, id))) = (&opts.session, &session) {
            if matches!(&reply, Err(e) if commands::no_session(e)) {
                // The session ended (or, in a cluster, the slot moved): once
                // more, in a session opened anew.
                link.0.refused(node, *id);
                match link.0.ensure(&s.client, &first) {
                    Ok(again) => {
                        let id = Some(again.1);
                        session = Some(again);
                        reply = conn.query(&commands::acquire(&s.kind, &opts, &owner, false, id));
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
                    // It may have been granted as we stopped listening: a
                    // bound grant ends as the connection closes (now); an
                    // unbound one is given back.
                    drop(conn);
                    if !bound {
                        release_quietly(&s.client, &s.kind, &owner, opts.timeout);
                    }
                } else {
                    *slot = Some(conn);
                }
                return Err(e.into());
            }
        };
        let _ = conn.timeouts(Some(opts.timeout));
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
            ) {
                Ok(n) if n >= i64::from(opts.replicas) => durable = Some(true),
                Ok(_) if opts.allow_not_durable => durable = Some(false),
                Ok(n) => {
                    // Given back on the same connection (one hold: a first grant).
                    let given_back =
                        release_keys(&mut slot, &s.kind, &owner, &tokens, opts.timeout, false);
                    if given_back.is_err() {
                        *slot = None; // closing it frees a bound grant
                        if !bound {
                            release_quietly(&s.client, &s.kind, &owner, opts.timeout);
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
                        release_quietly(&s.client, &s.kind, &owner, opts.timeout);
                    }
                    return Err(e.into());
                }
            }
        }
        let generation = {
            let mut st = lock(&s.status);
            st.generation += 1;
            st.ttl = opts.ttl;
            st.timeout = opts.timeout;
            st.bound = bound;
            st.holds = 1;
            st.tokens = tokens;
            st.lost = None;
            st.valid_until = sent + opts.ttl;
            st.next_renewal = granted + tick(opts.ttl);
            // The watchdog's first work: the watcher, and a read of the keys.
            st.verify = bound;
            st.replicas = opts.replicas;
            st.replicas_timeout = opts.replicas_timeout;
            st.durable = durable;
            st.session = session.as_ref().map(|(_, id)| *id);
            st.released = false;
            st.generation
        };
        drop(slot);
        if let (Some(link), Some((node, id))) = (&opts.session, &session) {
            // No watchdog: the session's keeper is its one renewal.
            follow(&s, &link.0, node, *id, generation);
            return Ok(Some(Guard {
                lock: self,
                generation,
                done: false,
            }));
        }
        let watched = Arc::clone(&s);
        let spawned = thread::Builder::new()
            .name("redis-native-lock-watchdog".into())
            .spawn(move || watchdog(&watched, generation));
        // (the watchdog joins the watcher: `verify`)
        if let Err(e) = spawned {
            let _ = end(&s, generation, true);
            return Err(Error::Redis(redis::RedisError::from(e)));
        }
        Ok(Some(Guard {
            lock: self,
            generation,
            done: false,
        }))
    }

    /// Whether anyone holds the (first) key.
    pub fn locked(&self) -> Result<bool, Error> {
        Ok(commands::holders(self.info()?).is_some())
    }

    /// Whether this owner holds the (first) key, as the server says.
    pub fn owned(&self) -> Result<bool, Error> {
        Ok(commands::held_by(self.info()?, &self.owner_id(), None))
    }

    /// `LOCK.INFO` of the (first) key, on a connection of its own.
    fn info(&self) -> Result<redis::Value, Error> {
        let key = self
            .shared
            .kind
            .keys()
            .into_iter()
            .next()
            .unwrap_or_default();
        let started = Instant::now();
        let t = self.opts.timeout;
        let mut conn = Conn::open(&self.shared.client, t)?;
        conn.timeouts(Some(limit(t, t.saturating_sub(started.elapsed()))))?;
        Ok(conn.query(&commands::info(&key))?)
    }
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
        lock(&self.status).session_renewed(generation, until)
    }

    fn ended(&self, generation: u64, why: &str) -> Option<(Option<crate::OnLost>, Error)> {
        lock(&self.status).session_ended(&self.kind, generation, why)
    }

    fn closed(&self, generation: u64) {
        lock(&self.status).session_closed(generation, session::CLOSED);
    }
}

fn release_quietly(client: &Target, kind: &Kind, owner: &[u8], timeout: Duration) {
    if let Ok(mut c) = Conn::open(client, timeout) {
        for key in kind.keys() {
            let _ = c.query(&commands::release(&key, owner, None));
        }
    }
}

impl Guard<'_> {
    fn shared(&self) -> &Shared {
        &self.lock.shared
    }

    /// The lock this guard holds (read-only while the guard lives).
    pub fn lock(&self) -> &Lock {
        self.lock
    }

    /// Whether this guard's grant (its owner, under its token) still holds
    /// the (first) key, as the server says: false once the owner name holds
    /// it under a later grant.
    pub fn owned(&self) -> Result<bool, Error> {
        let (owner, token) = {
            let st = lock(&self.shared().status);
            (st.owner.clone(), st.tokens.first().copied())
        };
        Ok(commands::held_by(self.lock.info()?, &owner, token))
    }

    crate::api::guard_reads!(lock);

    /// Runs `cmd` in the server if and only if this guard's acquisition
    /// still holds the lock there, as one atomic step (`LOCK.GUARD key
    /// owner TOKEN token CALL …`, under this grant's token): fencing for
    /// data that lives in the same Redis. The reply is the command's, as
    /// `T` (its error replies are [`Error::Redis`], as a direct call's).
    /// Not held any more (expired, released, freed, taken by someone else,
    /// a later grant to the same owner name): nothing runs and it is
    /// [`Error::LeaseLost`], for good, as [`Guard::check`] then says; a
    /// lease already known lost sends nothing. A multi-key lock guards on
    /// its first key ([`Guard::call_on`] names another).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redis_native_lock::Error> {
    /// # let client = redis::Client::open("redis://127.0.0.1:6379/")?;
    /// let mut lock = redis_native_lock::Lock::exclusive(&client, "job:1:lock");
    /// if let Some(guard) = lock.acquire()? {
    ///     let () = guard.call(redis::cmd("SET").arg("job:1").arg("done"))?;
    ///     let n: i64 = guard.call(redis::cmd("INCR").arg("job:1:runs"))?;
    /// #   let _ = n;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn call<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, Error> {
        self.guarded(None, cmd)
    }

    /// [`Guard::call`] guarded on `key`, one of the lock's keys (a
    /// multi-key lock's: the command runs iff that key is still held, under
    /// its own token). A key not of the lock: [`Error::Invalid`].
    pub fn call_on<T: FromRedisValue>(
        &self,
        key: impl AsRef<[u8]>,
        cmd: &redis::Cmd,
    ) -> Result<T, Error> {
        self.guarded(Some(key.as_ref()), cmd)
    }

    fn guarded<T: FromRedisValue>(&self, key: Option<&[u8]>, cmd: &redis::Cmd) -> Result<T, Error> {
        self.check()?;
        let s = self.shared();
        let mut slot = lock(&s.conn);
        let (guard, bound, timeout, left) = {
            let st = lock(&s.status);
            let guard = commands::guard(&s.kind, &st.tokens, &st.owner, key, cmd)?;
            let left = st.valid_until.saturating_duration_since(Instant::now());
            (guard, st.bound, st.timeout, left)
        };
        if slot.is_none() && !bound {
            // Unbound (a session lock's connection killed): a new one.
            *slot = Conn::open(&s.client, limit(timeout, left)).ok();
        }
        let Some(conn) = slot.as_mut() else {
            return Err(Error::Redis(closed()));
        };
        let reply = conn
            .timeouts(Some(limit(timeout, left)))
            .and_then(|()| conn.query(&guard));
        let _ = conn.timeouts(Some(timeout));
        match commands::guarded(reply) {
            Ok(Guarded::Ran(v)) => Ok(v),
            Ok(Guarded::NotHeld) => {
                drop(slot);
                let (err, news) = lock(&s.status).not_held(&s.kind, self.generation);
                tell(news);
                Err(err)
            }
            Err(e) => {
                if io_failure(&e) {
                    // A reply may still come: the connection is done for
                    // (closing it frees a bound lock).
                    *slot = None;
                    drop(slot);
                    if bound {
                        let news = lock(&s.status).set_lost(&s.kind, &bound_failed(&e));
                        tell(news);
                    }
                }
                Err(e.into())
            }
        }
    }

    /// Sets the lease to `ttl` from now; later renewals use it too.
    pub fn extend(&self, ttl: Duration) -> Result<(), Error> {
        let s = self.shared();
        if ttl < Duration::from_millis(1) {
            return Err(Error::Invalid("a ttl under 1 ms".into()));
        }
        if lock(&s.status).session.is_some() {
            return Err(Error::Invalid(crate::IN_SESSION.into()));
        }
        self.check()?;
        let mut slot = lock(&s.conn);
        let (owner, tokens, timeout, left) = {
            let st = lock(&s.status);
            let left = st.valid_until.saturating_duration_since(Instant::now());
            (st.owner.clone(), st.tokens.clone(), st.timeout, left)
        };
        let sent = Instant::now();
        let result = renew_keys(
            &mut slot,
            &s.kind,
            &owner,
            &tokens,
            ttl,
            limit(timeout, left),
        );
        let (replicas, wait) = {
            let st = lock(&s.status);
            (st.replicas, st.replicas_timeout)
        };
        let acks = (replicas > 0 && matches!(result, Ok(None)))
            .then(|| wait_acks(&mut slot, replicas, wait, timeout));
        let mut st = lock(&s.status);
        if !st.current(self.generation) {
            return Err(st.lost_error(&s.kind));
        }
        let (after, result) = st.after_extend(&s.kind, result, ttl, sent, acks);
        drop(st);
        apply(s, slot, after);
        result
    }

    /// Adds a hold (a reentrant or read lock: one more `LOCK.RELEASE` to
    /// give it back) or, for the other kinds, renews: a guard nested in this
    /// one. `Err(LeaseLost)` if the lease is gone (nothing is sent).
    pub fn reacquire(&mut self) -> Result<Option<Guard<'_>>, Error> {
        self.check()?;
        let s = Arc::clone(&self.lock.shared);
        let opts = self.lock.opts.clone();
        let mut slot = lock(&s.conn);
        let (owner, bound, timeout, left, session) = {
            let st = lock(&s.status);
            let left = st.valid_until.saturating_duration_since(Instant::now());
            (st.owner.clone(), st.bound, st.timeout, left, st.session)
        };
        if slot.is_none() && !bound {
            // Unbound (a session lock's connection killed): a new one.
            *slot = Conn::open(&s.client, limit(timeout, left)).ok();
        }
        let Some(conn) = slot.as_mut() else {
            return Err(Error::Redis(closed()));
        };
        let sent = Instant::now();
        let reply = conn
            .timeouts(Some(limit(timeout, left)))
            .and_then(|()| conn.query(&commands::acquire(&s.kind, &opts, &owner, bound, session)));
        let _ = conn.timeouts(Some(timeout));
        let reply = match reply {
            Ok(r) => commands::tokens(r),
            Err(e) if gone_error(&e) => {
                let news = lock(&s.status).set_lost(&s.kind, WRONGTYPE);
                tell(news);
                return Err(lock(&s.status).lost_error(&s.kind));
            }
            Err(e) => {
                if io_failure(&e) {
                    *slot = None;
                    let why = if bound {
                        bound_failed(&e)
                    } else {
                        format!("the holder's connection failed ({e})")
                    };
                    let news = lock(&s.status).set_lost(&s.kind, &why);
                    tell(news);
                }
                return Err(e.into());
            }
        };
        let reacquired = lock(&s.status).reacquired(&s.kind, reply?, sent);
        match reacquired {
            Reacquired::Held => {
                s.wake.notify_all();
                drop(slot);
                Ok(Some(Guard {
                    generation: self.generation,
                    lock: &mut *self.lock,
                    done: false,
                }))
            }
            Reacquired::Stale(other, news) => {
                // The request took a hold of a new grant (the owner name was
                // free, or granted again): given back under its token.
                let _ = release_keys(&mut slot, &s.kind, &owner, &other, timeout, false);
                drop(slot);
                tell(news);
                Err(lock(&s.status).lost_error(&s.kind))
            }
            Reacquired::Refused => Ok(None),
        }
    }

    /// Releases this guard's hold (the lock itself once no guard is left,
    /// or per guard for counted kinds). `Err(LeaseLost)` if the lock was no
    /// longer ours.
    pub fn release(mut self) -> Result<(), Error> {
        self.done = true;
        end(&self.lock.shared, self.generation, false)
    }
}

/// Ends one guard. `all`: every hold at once (a leaked guard).
fn end(s: &Shared, generation: u64, all: bool) -> Result<(), Error> {
    if s.pid != std::process::id() {
        // A forked child: the socket is the parent's. Leave it be.
        std::mem::forget(lock(&s.conn).take());
        return Ok(());
    }
    // Waits for a renewal in flight: no renewal follows the release.
    let mut slot = lock(&s.conn);
    let (owner, tokens, timeout, left, send, in_session) = {
        let mut st = lock(&s.status);
        if !st.current(generation) {
            return Ok(());
        }
        // Closed with its session: released already.
        st.holds = if all || st.released { 0 } else { st.holds - 1 };
        let last = st.holds == 0;
        if last {
            s.wake.notify_all();
        }
        let left = st.valid_until.saturating_duration_since(Instant::now());
        let send = !st.released && (all || last || s.kind.counted());
        let in_session = st.session.is_some();
        (
            st.owner.clone(),
            st.tokens.clone(),
            st.timeout,
            left,
            send,
            in_session,
        )
    };
    let mut news = None;
    let mut result = Ok(());
    if send {
        let timeout = limit(timeout, left.max(Duration::from_millis(50)));
        let mut outcome = release_keys(&mut slot, &s.kind, &owner, &tokens, timeout, all);
        if in_session && matches!(&outcome, Err(e) if io_failure(e)) {
            // A session lock outlives its connection (killed, closed): the
            // release goes on a new one (a killed connection ran nothing).
            *slot = Conn::open(&s.client, timeout).ok();
            outcome = release_keys(&mut slot, &s.kind, &owner, &tokens, timeout, all);
        }
        let (after, r) = lock(&s.status).after_release(&s.kind, outcome);
        result = r;
        if after.close {
            *slot = None;
        }
        if after.wake {
            s.wake.notify_all();
        }
        news = after.news;
    }
    let mut st = lock(&s.status);
    if st.holds == 0 {
        s.wake.notify_all();
        if st.bound {
            let timeout = st.timeout;
            drop(st);
            leave(s, &mut slot, timeout);
            st = lock(&s.status);
        }
    }
    if result.is_ok() && st.lost.is_some() && !st.released {
        result = Err(st.lost_error(&s.kind));
    }
    drop(slot);
    if st.holds == 0 && st.generation == generation {
        // The next acquisition gets a fresh owner unless one was given.
        st.generation += 1;
        if !st.fixed {
            st.owner = fresh_owner();
        }
    }
    drop(st);
    tell(news);
    result
}

/// `LOCK.RELEASE` of the grant (owner, under its `tokens`) on every key.
fn release_keys(
    slot: &mut Option<Conn>,
    kind: &Kind,
    owner: &[u8],
    tokens: &[i64],
    timeout: Duration,
    all: bool,
) -> redis::RedisResult<Released> {
    let conn = slot.as_mut().ok_or_else(closed)?;
    conn.timeouts(Some(timeout))?;
    conn.run(Release::new(kind, owner, tokens, all))
}

/// `WAIT replicas wait` on the holder's connection (a reply may take `wait`
/// plus `timeout`): how many replicas acknowledged what it sent before.
fn wait_acks(
    slot: &mut Option<Conn>,
    replicas: u32,
    wait: Duration,
    timeout: Duration,
) -> redis::RedisResult<i64> {
    let conn = slot.as_mut().ok_or_else(closed)?;
    conn.timeouts(Some(timeout.saturating_add(wait)))?;
    let n = commands::acknowledged(conn.query(&commands::wait_replicas(replicas, wait)));
    let _ = conn.timeouts(Some(timeout));
    n
}

/// `LOCK.RENEW` of the grant on every key: `None` when renewed, else why
/// the lease is lost.
fn renew_keys(
    slot: &mut Option<Conn>,
    kind: &Kind,
    owner: &[u8],
    tokens: &[i64],
    ttl: Duration,
    timeout: Duration,
) -> redis::RedisResult<Option<&'static str>> {
    let conn = slot.as_mut().ok_or_else(closed)?;
    conn.timeouts(Some(timeout))?;
    conn.run(Renew::new(kind, owner, tokens, ttl))
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if !std::mem::replace(&mut self.done, true) {
            let _ = end(&self.lock.shared, self.generation, false);
        }
    }
}

/// One watchdog thread per held lock: renews at a third of the ttl until
/// the acquisition ends or the lease is lost. Each waits only on its own
/// connection, never longer than the lease has left.
fn watchdog(s: &Arc<Shared>, generation: u64) {
    loop {
        {
            let mut st = lock(&s.status);
            loop {
                if !st.current(generation) || st.lost.is_some() {
                    return;
                }
                let now = Instant::now();
                if now >= st.next_renewal || st.verify {
                    break;
                }
                let wait = st.next_renewal - now;
                st = s
                    .wake
                    .wait_timeout(st, wait)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        }
        // The watcher (opened if need be) before the connection is taken.
        let (bound, timeout) = {
            let st = lock(&s.status);
            (st.bound, st.timeout)
        };
        if bound {
            join(s, timeout);
        }
        if bound && !lock(&s.status).current(generation) {
            // Released meanwhile: the release may have left the watcher before we joined.
            leave(s, &mut None, timeout);
            return;
        }
        let mut slot = lock(&s.conn);
        let (owner, tokens, ttl, timeout, bound, left, renew) = {
            let mut st = lock(&s.status);
            if !st.current(generation) || st.lost.is_some() {
                return;
            }
            let renew = Instant::now() >= st.next_renewal;
            if !renew && !st.verify {
                continue; // extended meanwhile
            }
            st.verify = false;
            let news = st.check_lost(&s.kind);
            if news.is_some() || st.lost.is_some() {
                drop(st);
                drop(slot);
                tell(news);
                return;
            }
            let left = st.valid_until.saturating_duration_since(Instant::now());
            let (owner, tokens) = (st.owner.clone(), st.tokens.clone());
            (owner, tokens, st.ttl, st.timeout, st.bound, left, renew)
        };
        let io = limit(timeout, left);
        if slot.is_none() && !bound {
            *slot = Conn::open(&s.client, io).ok();
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
        } else {
            renew_keys(&mut slot, &s.kind, &owner, &tokens, ttl, io)
        };
        let (replicas, wait) = {
            let st = lock(&s.status);
            (st.replicas, st.replicas_timeout)
        };
        // WAIT on the renewal's connection (after LOCK.KEEPALIVE or LOCK.RENEW): covers it.
        let acks = (renew && replicas > 0 && matches!(result, Ok(None)))
            .then(|| wait_acks(&mut slot, replicas, wait, timeout));
        let mut st = lock(&s.status);
        if !st.current(generation) {
            return;
        }
        let after = st.after_pass(&s.kind, result, renew, sent, acks);
        drop(st);
        let over = after.news.is_some();
        apply(s, slot, after);
        if over {
            return;
        }
    }
}

/// Applies a decision of [`Holding`]'s: closes the holder's connection
/// (which frees a bound lock), wakes the watchdog, then tells, outside the
/// locks.
fn apply(s: &Shared, mut slot: MutexGuard<'_, Option<Conn>>, after: After) {
    if after.close {
        *slot = None;
    }
    if after.wake {
        s.wake.notify_all();
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
        lock(&self.status).verify = true;
        self.wake.notify_all();
    }
}

/// Joins the watcher of the lock's server (opened if need be).
fn join(s: &Arc<Shared>, timeout: Duration) {
    let Target::Server(c) = &s.client else {
        return;
    };
    let weak: Weak<dyn Watched> = Arc::downgrade(&(Arc::clone(s) as Arc<dyn Watched>));
    watch::join(c, watch::id_of::<Shared>(s), weak, timeout);
}

/// The lock no longer needs the watcher; the last one wakes it to close,
/// with a PUBLISH on the lock's connection (or one of its own).
fn leave(s: &Shared, slot: &mut Option<Conn>, timeout: Duration) {
    let Target::Server(c) = &s.client else {
        return;
    };
    let Some(channel) = watch::leave(c, watch::id_of(s)) else {
        return;
    };
    let publish = commands::publish(&channel);
    if let Some(conn) = slot.as_mut() {
        if conn.timeouts(Some(timeout)).is_ok() && conn.query(&publish).is_ok() {
            return;
        }
    }
    let target = s.client.clone();
    let _ = thread::Builder::new()
        .name("redis-native-lock-watcher-close".into())
        .spawn(move || {
            if let Ok(mut conn) = Conn::open(&target, timeout) {
                let _ = conn.query(&publish);
            }
        });
}

/// On the bound connection, in one round trip: `LOCK.KEEPALIVE` (when
/// `renew`) and a read of each key. `None` while the grant (owner,
/// `tokens`) holds them all, else why not; `Err` when the connection failed.
fn sync(
    slot: &mut Option<Conn>,
    kind: &Kind,
    owner: &[u8],
    tokens: &[i64],
    renew: Option<Duration>,
    timeout: Duration,
) -> redis::RedisResult<Option<&'static str>> {
    let conn = slot.as_mut().ok_or_else(closed)?;
    conn.timeouts(Some(timeout))?;
    match conn.query_pipe(&commands::sync_pipe(kind, renew)) {
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
