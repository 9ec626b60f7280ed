//! The blocking API: [`Lock`] (one holder identity: owner, kind, keys, its
//! connection) and [`Guard`] (one acquisition, released on drop).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use crate::{fresh_owner, holders, millis, tokens, Error, HolderInfo, Kind, Options, Target};

/// A lock of one kind on its keys, held by one owner. Acquire it with
/// [`Lock::acquire`]; each grant is a [`Guard`].
///
/// Guards count: the lock is held while any guard of it lives. A reentrant
/// lock or a read lock adds a hold in the server per acquire and removes one
/// per guard released; the other kinds are held once (a repeat acquire
/// renews) and released when their last guard is.
pub struct Lock {
    state: Arc<State>,
}

/// One acquisition. Hand [`Guard::token`] to the resource you write to;
/// [`Guard::release`] it (or drop it) when done.
#[must_use = "the lock is released when the guard is dropped"]
pub struct Guard {
    state: Arc<State>,
    released: bool,
}

/// A holder's connection: to the server, or to the cluster.
enum Conn {
    Server(redis::Connection),
    Cluster(Box<redis::cluster::ClusterConnection>),
}

impl Conn {
    fn open(target: &Target) -> redis::RedisResult<Conn> {
        match target {
            Target::Server(c) => c.get_connection().map(Conn::Server),
            Target::Cluster(c) => c.get_connection().map(|c| Conn::Cluster(Box::new(c))),
        }
    }

    fn query(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        match self {
            Conn::Server(c) => cmd.query(c),
            Conn::Cluster(c) => cmd.query(&mut **c),
        }
    }

    fn set_read_timeout(&self, t: Option<Duration>) -> redis::RedisResult<()> {
        match self {
            Conn::Server(c) => c.set_read_timeout(t),
            Conn::Cluster(c) => c.set_read_timeout(t),
        }
    }
}

struct State {
    client: Target,
    kind: Kind,
    owner: Mutex<String>,
    opts: Mutex<Options>,
    held: Mutex<Held>,
    /// In the keeper's list (once, whatever the guards).
    scheduled: AtomicBool,
}

struct Held {
    /// The holder's own connection: the acquire waits on it, the lock is
    /// bound to it (`BIND`), the keepalive and the release go over it.
    conn: Option<Conn>,
    bound: bool,
    /// Guards alive.
    guards: u32,
    tokens: Vec<i64>,
    lost: Option<String>,
    /// A lower bound of the server's deadline (the lease began after we asked).
    valid_until: Instant,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Lock {
    fn new(client: Target, kind: Kind) -> Lock {
        Lock {
            state: Arc::new(State {
                client,
                kind,
                owner: Mutex::new(fresh_owner()),
                opts: Mutex::new(Options::default()),
                held: Mutex::new(Held {
                    conn: None,
                    bound: false,
                    guards: 0,
                    tokens: Vec::new(),
                    lost: None,
                    valid_until: Instant::now(),
                }),
                scheduled: AtomicBool::new(false),
            }),
        }
    }

    /// An exclusive lock (`LOCK.ACQUIRE`).
    pub fn exclusive(client: impl Into<Target>, key: impl Into<String>) -> Lock {
        Lock::new(client.into(), Kind::Exclusive(key.into()))
    }

    /// A reentrant exclusive lock (`LOCK.RACQUIRE`), as Redisson's `RLock`.
    pub fn reentrant(client: impl Into<Target>, key: impl Into<String>) -> Lock {
        Lock::new(client.into(), Kind::Reentrant(key.into()))
    }

    /// The read side of a read-write lock (`LOCK.READ`): shared.
    pub fn read(client: impl Into<Target>, key: impl Into<String>) -> Lock {
        Lock::new(client.into(), Kind::Read(key.into()))
    }

    /// The write side of a read-write lock: exclusive and reentrant
    /// (`LOCK.RACQUIRE`), with writer preference.
    pub fn write(client: impl Into<Target>, key: impl Into<String>) -> Lock {
        Lock::new(client.into(), Kind::Reentrant(key.into()))
    }

    /// One permit of a semaphore of `limit` permits (`LOCK.SEMAPHORE`).
    pub fn semaphore(client: impl Into<Target>, key: impl Into<String>, limit: u32) -> Lock {
        Lock::new(client.into(), Kind::Semaphore(key.into(), limit))
    }

    /// Every key or none (`LOCK.MACQUIRE`); [`Guard::tokens`] per key.
    pub fn multi<K: Into<String>>(
        client: impl Into<Target>,
        keys: impl IntoIterator<Item = K>,
    ) -> Lock {
        Lock::new(
            client.into(),
            Kind::Multi(keys.into_iter().map(Into::into).collect()),
        )
    }

    /// The lease (default 30 s), renewed while held.
    pub fn ttl(self, ttl: Duration) -> Lock {
        lock(&self.state.opts).ttl = ttl;
        self
    }

    /// How long to wait in the server (default 10 s); `None` or zero: do
    /// not wait; `Duration::MAX`: without limit.
    pub fn wait(self, wait: Option<Duration>) -> Lock {
        lock(&self.state.opts).wait = wait;
        self
    }

    /// A fresh UUID by default; a stable id only if you mean it.
    pub fn owner(self, owner: impl Into<String>) -> Lock {
        *lock(&self.state.owner) = owner.into();
        self
    }

    /// `BIND` (default): the server frees the lock when the holder's
    /// connection closes. `false`: a lease renewed with `LOCK.RENEW`.
    pub fn bind(self, bind: bool) -> Lock {
        lock(&self.state.opts).bind = bind;
        self
    }

    pub fn keys(&self) -> Vec<String> {
        self.state.kind.keys()
    }

    pub fn owner_id(&self) -> String {
        lock(&self.state.owner).clone()
    }

    /// Asks for the lock, waiting in the server as configured: a guard, or
    /// `None` when the wait ran out. [`Error::Deadlock`] when waiting would
    /// close a cycle of waits.
    pub fn acquire(&self) -> Result<Option<Guard>, Error> {
        let s = &self.state;
        let opts = lock(&s.opts).clone();
        let owner = lock(&s.owner).clone();
        let mut held = lock(&s.held);
        if held.conn.is_none() {
            let conn = Conn::open(&s.client)?;
            // The reply comes when the lock is granted or the wait runs out.
            conn.set_read_timeout(None)?;
            held.conn = Some(conn);
            // A cluster connection is the client's to route: no BIND.
            held.bound = opts.bind && matches!(s.client, Target::Server(_));
        }
        let sent = Instant::now();
        let first = held.guards == 0;
        let cmd = s.kind.acquire(&opts, &owner, held.bound);
        let mut reply = query(&mut held, &cmd);
        if first && held.bound && matches!(&reply, Err(e) if e.to_string().contains("syntax error"))
        {
            // A server without BIND: a lease renewed with LOCK.RENEW.
            held.bound = false;
            reply = query(&mut held, &s.kind.acquire(&opts, &owner, false));
        }
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
                    // It may have been granted as we stopped listening: a
                    // bound grant ends when the connection closes (now); an
                    // unbound one is given back.
                    held.conn = None;
                    if first && !held.bound {
                        release_quietly(&s.client, &s.kind, &owner);
                    }
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
        drop(held);
        if !s.scheduled.swap(true, Ordering::SeqCst) {
            keeper().add(Arc::downgrade(s), Instant::now() + opts.ttl / 3);
        }
        Ok(Some(Guard {
            state: Arc::clone(s),
            released: false,
        }))
    }

    /// Whether anyone holds the (first) key.
    pub fn locked(&self) -> Result<bool, Error> {
        Ok(self.info()?.is_some())
    }

    /// Whether this owner holds the (first) key, as the server says.
    pub fn owned(&self) -> Result<bool, Error> {
        let owner = self.owner_id();
        Ok(self
            .info()?
            .is_some_and(|h| h.iter().any(|(o, ..)| *o == owner)))
    }

    fn info(&self) -> Result<Option<Vec<HolderInfo>>, Error> {
        let key = self
            .state
            .kind
            .keys()
            .into_iter()
            .next()
            .unwrap_or_default();
        let mut conn = Conn::open(&self.state.client)?;
        let reply = conn.query(redis::cmd("LOCK.INFO").arg(key))?;
        Ok(holders(reply))
    }
}

fn query(held: &mut Held, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
    match held.conn.as_mut() {
        Some(conn) => conn.query(cmd),
        None => Err(redis::RedisError::from(std::io::Error::other(
            "the holder's connection is closed",
        ))),
    }
}

fn release_quietly(client: &Target, kind: &Kind, owner: &str) {
    if let Ok(mut c) = Conn::open(client) {
        for key in kind.keys() {
            let _ = c.query(redis::cmd("LOCK.RELEASE").arg(key).arg(owner));
        }
    }
}

impl Guard {
    /// The fencing token (a multi-key lock: the highest of [`Guard::tokens`]).
    pub fn token(&self) -> i64 {
        lock(&self.state.held)
            .tokens
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
    }

    /// The tokens per key, in key order.
    pub fn tokens(&self) -> Vec<i64> {
        lock(&self.state.held).tokens.clone()
    }

    /// Whether the lock is bound to the holder's connection (`BIND`).
    pub fn is_bound(&self) -> bool {
        lock(&self.state.held).bound
    }

    /// True once the lease is known lost, or may have run out.
    pub fn is_lost(&self) -> bool {
        let held = lock(&self.state.held);
        held.lost.is_some() || Instant::now() >= held.valid_until
    }

    /// `Err(LeaseLost)` if the lease is gone: call it before a protected write.
    pub fn check(&self) -> Result<(), Error> {
        if self.is_lost() {
            return Err(self.lost_error(&lock(&self.state.held)));
        }
        Ok(())
    }

    /// Sets the lease to `ttl` from now; later renewals use it too.
    pub fn extend(&self, ttl: Duration) -> Result<(), Error> {
        let s = &self.state;
        let owner = lock(&s.owner).clone();
        let mut held = lock(&s.held);
        let sent = Instant::now();
        for key in s.kind.keys() {
            let mut cmd = redis::cmd("LOCK.RENEW");
            cmd.arg(key).arg(&owner).arg(millis(ttl));
            let renewed = query(&mut held, &cmd)?;
            if renewed != redis::Value::Int(1) {
                held.lost =
                    Some("LOCK.RENEW answered 0: the lease expired or the key was deleted".into());
                return Err(self.lost_error(&held));
            }
        }
        lock(&s.opts).ttl = ttl;
        held.valid_until = sent + ttl;
        Ok(())
    }

    /// Releases this guard's hold (the lock itself once no guard is left,
    /// or per guard for counted kinds). `Err(LeaseLost)` if the lock was no
    /// longer ours.
    pub fn release(mut self) -> Result<(), Error> {
        self.end()
    }

    fn lost_error(&self, held: &Held) -> Error {
        Error::LeaseLost {
            keys: self.state.kind.keys(),
            token: held.tokens.iter().copied().max().unwrap_or(0),
            why: held
                .lost
                .clone()
                .unwrap_or_else(|| "its ttl ran out without a successful renewal".into()),
        }
    }

    fn end(&mut self) -> Result<(), Error> {
        if std::mem::replace(&mut self.released, true) {
            return Ok(());
        }
        let s = &self.state;
        let owner = lock(&s.owner).clone();
        let mut held = lock(&s.held);
        if held.guards == 0 {
            return Ok(());
        }
        held.guards -= 1;
        let last = held.guards == 0;
        if !(last || s.kind.counted()) {
            return Ok(());
        }
        let mut gone = false;
        let mut all_released = false;
        for key in s.kind.keys() {
            let mut cmd = redis::cmd("LOCK.RELEASE");
            cmd.arg(key).arg(&owner);
            match query(&mut held, &cmd) {
                Ok(redis::Value::Nil) => gone = true,
                Ok(redis::Value::Int(1)) => all_released = true,
                Ok(_) => {}
                Err(e) => {
                    held.guards = 0;
                    held.conn = None; // closing it frees a bound lock
                    if held.lost.is_some() {
                        return Err(self.lost_error(&held));
                    }
                    return Err(e.into());
                }
            }
        }
        if gone || all_released {
            held.guards = 0;
        }
        if gone {
            held.lost.get_or_insert_with(|| {
                "LOCK.RELEASE answered nil: the lock was no longer ours".into()
            });
            held.conn = None;
            return Err(self.lost_error(&held));
        }
        Ok(())
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.end();
    }
}

impl State {
    /// The keeper's tick: renew, or find the lease lost. When to renew next
    /// (`None`: stop).
    fn renew(&self) -> Option<Instant> {
        let ttl = lock(&self.opts).ttl;
        let owner = lock(&self.owner).clone();
        let mut held = lock(&self.held);
        if held.guards == 0 || held.lost.is_some() {
            return None;
        }
        let tick = ttl / 3;
        if held.conn.is_none() && !held.bound {
            held.conn = Conn::open(&self.client).ok();
        }
        if let Some(conn) = held.conn.as_ref() {
            let _ = conn.set_read_timeout(Some(tick.max(Duration::from_millis(100))));
        }
        let sent = Instant::now();
        let result: redis::RedisResult<bool> = if held.bound {
            let mut cmd = redis::cmd("LOCK.KEEPALIVE");
            cmd.arg(millis(ttl));
            query(&mut held, &cmd).and_then(|v| {
                let n: i64 = redis::from_redis_value(v)?;
                Ok(n >= i64::try_from(self.kind.keys().len()).unwrap_or(i64::MAX))
            })
        } else {
            let mut ok = Ok(true);
            for key in self.kind.keys() {
                let mut cmd = redis::cmd("LOCK.RENEW");
                cmd.arg(key).arg(&owner).arg(millis(ttl));
                match query(&mut held, &cmd) {
                    Ok(redis::Value::Int(1)) => {}
                    Ok(_) => {
                        ok = Ok(false);
                        break;
                    }
                    Err(e) => {
                        ok = Err(e);
                        break;
                    }
                }
            }
            ok
        };
        if let Some(conn) = held.conn.as_ref() {
            let _ = conn.set_read_timeout(None);
        }
        match result {
            Ok(true) => {
                held.valid_until = sent + ttl;
                Some(Instant::now() + tick)
            }
            Ok(false) => {
                held.lost = Some(if held.bound {
                    "LOCK.KEEPALIVE renewed fewer locks than held: released, expired or deleted"
                        .into()
                } else {
                    "LOCK.RENEW answered 0: the lease expired or the key was deleted".into()
                });
                None
            }
            Err(e) if held.bound => {
                held.lost = Some(format!("the connection the lock was bound to failed ({e})"));
                held.conn = None;
                None
            }
            Err(e) => {
                held.conn = None;
                if Instant::now() >= held.valid_until {
                    held.lost = Some(format!("renewals failed until the lease ran out ({e})"));
                    return None;
                }
                Some(Instant::now() + tick.min(Duration::from_secs(1)))
            }
        }
    }
}

/// One thread for every holder of the process: renews each at a third of
/// its ttl. Holders are weak: a lock dropped leaves it.
struct Keeper {
    due: Mutex<Vec<(Weak<State>, Instant)>>,
    wake: Condvar,
}

fn keeper() -> &'static Keeper {
    static KEEPER: OnceLock<&'static Keeper> = OnceLock::new();
    KEEPER.get_or_init(|| {
        let k: &'static Keeper = Box::leak(Box::new(Keeper {
            due: Mutex::new(Vec::new()),
            wake: Condvar::new(),
        }));
        let _ = thread::Builder::new()
            .name("redis-native-lock-keeper".into())
            .spawn(move || k.run());
        k
    })
}

impl Keeper {
    fn add(&self, state: Weak<State>, at: Instant) {
        lock(&self.due).push((state, at));
        self.wake.notify_one();
    }

    fn run(&self) {
        loop {
            let ready: Vec<Arc<State>> = {
                let mut due = lock(&self.due);
                due.retain(|(w, _)| w.strong_count() > 0);
                let now = Instant::now();
                match due.iter().map(|(_, at)| *at).min() {
                    None => {
                        let _ = self.wake.wait_timeout(due, Duration::from_secs(60));
                        continue;
                    }
                    Some(first) if first > now => {
                        let _ = self.wake.wait_timeout(due, first - now);
                        continue;
                    }
                    Some(_) => {}
                }
                let (ready, later): (Vec<_>, Vec<_>) = std::mem::take(&mut *due)
                    .into_iter()
                    .partition(|(_, at)| *at <= now);
                *due = later;
                ready.into_iter().filter_map(|(w, _)| w.upgrade()).collect()
            };
            for state in ready {
                match state.renew() {
                    Some(next) => lock(&self.due).push((Arc::downgrade(&state), next)),
                    None => {
                        state.scheduled.store(false, Ordering::SeqCst);
                        // Acquired again meanwhile: keep renewing.
                        let again = {
                            let held = lock(&state.held);
                            held.guards > 0 && held.lost.is_none()
                        };
                        if again && !state.scheduled.swap(true, Ordering::SeqCst) {
                            let tick = lock(&state.opts).ttl / 3;
                            lock(&self.due).push((Arc::downgrade(&state), Instant::now() + tick));
                        }
                    }
                }
            }
        }
    }
}
