//! The watcher: one per server (address and user) in a process, shared by
//! the blocking and the tokio API. A thread with a RESP2 connection of its
//! own subscribed to `__redis__:invalidate`, and an observer thread with a
//! second connection whose client tracking is redirected to the first
//! (`CLIENT TRACKING ON REDIRECT <watcher id>`) and which reads every bound
//! holder's keys with `LOCK.INFO`. So the server tells the watcher when one
//! of them changes, from any connection: a DEL, a SET over it, FLUSH*, a
//! release elsewhere, and the server freeing the lock because the holder's
//! bound connection closed (`CLIENT KILL`, the server's idle `timeout`),
//! which the holder's own connection, idle between renewals, would not
//! notice (its own tracking ends with it). On each invalidation the
//! observer reads the keys again (tracking them again), then tells their
//! holders' watchdogs to check on their own connections (a flag and a
//! wake-up): the cause is found there. A watcher whose connection fails
//! (the server killed or restarted) tells every holder. The holder's own
//! renewals change its keys too: each is followed by one such check. The
//! watcher never waits on a holder's connection; its read, which blocks (it
//! is a subscriber), holds up nothing else; the observer pings its
//! connection when idle, so a dead one is noticed.
//!
//! Opened by the first bound holder on the server; the last one to leave
//! publishes on the watcher's own channel, and the watcher, woken, closes.

use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::thread;
use std::time::Duration;

const INVALIDATE: &str = "__redis__:invalidate";
/// The observer pings its connection after this long without a read.
const PING_EVERY: Duration = Duration::from_secs(5);

/// Keys for the observer to read before telling their holders (`None`:
/// every holder's).
type Changed = Option<Vec<Vec<u8>>>;

/// A holder the watcher tells.
pub(crate) trait Watched: Send + Sync {
    /// The holder's keys (as sent to the server).
    fn keys(&self) -> Vec<Vec<u8>>;
    /// A key of the holder changed, or the watcher went away: check now.
    fn told(&self);
}

struct Watcher {
    id: i64,
    /// Publishing here wakes the watcher to see whether it is still needed.
    wake: String,
    /// The holders tracked through it, by address.
    holders: Mutex<HashMap<usize, Weak<dyn Watched>>>,
    /// To the observer thread (it ends when this is dropped).
    observe: Mutex<mpsc::Sender<Changed>>,
}

impl Watcher {
    /// Registers a holder; the observer tracks its keys, then tells it.
    fn add(&self, id: usize, holder: &Weak<dyn Watched>) {
        let keys = holder.upgrade().map(|h| h.keys());
        lock(&self.holders).insert(id, holder.clone());
        if let Some(keys) = keys {
            let _ = lock(&self.observe).send(Some(keys));
        }
    }
}

type Registry = HashMap<String, Arc<Watcher>>;

static WATCHERS: Mutex<Option<Registry>> = Mutex::new(None);

fn registry() -> MutexGuard<'static, Option<Registry>> {
    WATCHERS.lock().unwrap_or_else(PoisonError::into_inner)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The server a client connects to, as the watchers are keyed.
fn server_of(client: &redis::Client) -> String {
    let info = client.get_connection_info();
    format!(
        "{:?}/{}",
        info.addr(),
        info.redis_settings().username().unwrap_or("")
    )
}

/// The holder's identity for the watcher.
pub(crate) fn id_of<T>(holder: &T) -> usize {
    holder as *const T as *const () as usize
}

/// Registers `holder` with the watcher of `client`'s server, opening one
/// (within `timeout`) if there is none; the watcher's client id, or `None`
/// when the server cannot have one (no SUBSCRIBE or CLIENT ID permission, a
/// server gone): the renewals still notice a loss.
pub(crate) fn join(
    client: &redis::Client,
    id: usize,
    holder: Weak<dyn Watched>,
    timeout: Duration,
) -> Option<i64> {
    if let Some(w) = try_join(client, id, &holder) {
        return Some(w);
    }
    let server = server_of(client);
    // Opened outside the registry's lock: a slow server holds up no one else.
    let (tx, rx) = mpsc::channel();
    let c = client.clone();
    let spawned = thread::Builder::new()
        .name("redis-native-lock-watcher".into())
        .spawn(move || run(&c, timeout, &tx));
    spawned.ok()?;
    let (w, registered) = rx.recv_timeout(timeout).ok()??;
    let mut reg = registry();
    let map = reg.get_or_insert_with(HashMap::new);
    let w = match map.get(&server) {
        // Another holder opened one meanwhile: ours closes.
        Some(other) => Arc::clone(other),
        None => {
            map.insert(server, Arc::clone(&w));
            let _ = registered.send(());
            w
        }
    };
    w.add(id, &holder);
    Some(w.id)
}

/// As [`join`] when the server's watcher is open; `None` (nothing done)
/// when it is not. Never waits on the network.
pub(crate) fn try_join(
    client: &redis::Client,
    id: usize,
    holder: &Weak<dyn Watched>,
) -> Option<i64> {
    let reg = registry();
    let w = reg.as_ref()?.get(&server_of(client))?;
    w.add(id, holder);
    Some(w.id)
}

/// `holder` no longer needs the watcher of `client`'s server; the last one
/// gets the channel to publish on so that the watcher closes.
pub(crate) fn leave(client: &redis::Client, id: usize) -> Option<String> {
    let reg = registry();
    let w = reg.as_ref()?.get(&server_of(client))?;
    let mut hs = lock(&w.holders);
    let was = hs.remove(&id).is_some();
    hs.retain(|_, h| h.strong_count() > 0);
    (was && hs.is_empty()).then(|| w.wake.clone())
}

/// The watcher thread: opens the connection, says its id, then reads.
type Ready = Option<(Arc<Watcher>, mpsc::Sender<()>)>;

fn run(client: &redis::Client, timeout: Duration, ready: &mpsc::Sender<Ready>) {
    let opened = (|| -> redis::RedisResult<(redis::Connection, i64)> {
        let info = client.get_connection_info().clone();
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP2);
        let c = redis::Client::open(info.set_redis_settings(settings))?;
        let mut conn = c.get_connection_with_timeout(timeout)?;
        conn.set_read_timeout(Some(timeout))?;
        conn.set_write_timeout(Some(timeout))?;
        let id: i64 = crate::commands::client_id().query(&mut conn)?;
        Ok((conn, id))
    })();
    let Ok((mut conn, conn_id)) = opened else {
        let _ = ready.send(None);
        return;
    };
    // The observer: its reads are tracked, the invalidations sent to us.
    let observer = (|| -> redis::RedisResult<redis::Connection> {
        let mut obs = client.get_connection_with_timeout(timeout)?;
        obs.set_read_timeout(Some(timeout))?;
        obs.set_write_timeout(Some(timeout))?;
        crate::commands::tracking(conn_id).query::<()>(&mut obs)?;
        Ok(obs)
    })();
    let Ok(observer) = observer else {
        let _ = ready.send(None);
        return;
    };
    let (observe, changes) = mpsc::channel();
    let me = Arc::new(Watcher {
        id: conn_id,
        wake: format!("__redis-native-lock__:watcher:{conn_id}"),
        holders: Mutex::new(HashMap::new()),
        observe: Mutex::new(observe),
    });
    let weak = Arc::downgrade(&me);
    let obs_client = client.clone();
    if thread::Builder::new()
        .name("redis-native-lock-observer".into())
        .spawn(move || run_observer(&obs_client, observer, &weak, &changes, timeout))
        .is_err()
    {
        let _ = ready.send(None);
        return;
    }
    let mut pubsub = conn.as_pubsub();
    if pubsub
        .subscribe(vec![INVALIDATE, me.wake.as_str()])
        .is_err()
        || pubsub.set_read_timeout(None).is_err()
    {
        let _ = ready.send(None);
        return;
    }
    let (registered, confirmed) = mpsc::channel();
    if ready.send(Some((Arc::clone(&me), registered))).is_err() || confirmed.recv().is_err() {
        // Given up on (the joiner's timeout), or another watcher was there first.
        let _ = pubsub.set_read_timeout(Some(timeout));
        return;
    }
    loop {
        let msg = pubsub.get_message();
        let invalidation = match &msg {
            Ok(m) if m.get_channel_name() == INVALIDATE => {
                // An array of keys; nil: every key (FLUSHALL, FLUSHDB).
                Some(m.get_payload::<Option<Vec<Vec<u8>>>>().ok().flatten())
            }
            _ => None,
        };
        let mut reg = registry();
        let holders: Vec<Arc<dyn Watched>> = {
            let mut hs = lock(&me.holders);
            hs.retain(|_, h| h.strong_count() > 0);
            hs.values().filter_map(Weak::upgrade).collect()
        };
        if let (Some(changed), false) = (invalidation, holders.is_empty()) {
            drop(reg);
            // Tracked again by the observer, which then tells the holders.
            let _ = lock(&me.observe).send(changed);
            continue;
        }
        if msg.is_ok() && !holders.is_empty() {
            continue; // woken, but a holder came back meanwhile
        }
        // Gone, or no longer needed: out of the registry; every holder left
        // (a failure) checks now, and tracks through a new watcher.
        if let Some(r) = reg.as_mut() {
            r.retain(|_, w| !Arc::ptr_eq(w, &me));
        }
        lock(&me.holders).clear();
        drop(reg);
        for h in holders {
            h.told();
        }
        let _ = pubsub.set_read_timeout(Some(timeout));
        return;
    }
}

/// The observer thread: reads the keys it is sent with `LOCK.INFO` (which
/// tracks them: the next change is pushed to the watcher), then tells their
/// holders; pings when idle. Its connection failing ends the watcher: out
/// of the registry, every holder told (each joins a new one), and the
/// subscriber woken to close.
fn run_observer(
    client: &redis::Client,
    mut conn: redis::Connection,
    watcher: &Weak<Watcher>,
    changes: &mpsc::Receiver<Changed>,
    timeout: Duration,
) {
    loop {
        let ok = match changes.recv_timeout(PING_EVERY) {
            Ok(first) => {
                // What else is queued: one pass for all.
                let mut all = false;
                let mut keys = Vec::new();
                for c in std::iter::once(first).chain(changes.try_iter()) {
                    match c {
                        None => all = true,
                        Some(ks) => keys.extend(ks),
                    }
                }
                let Some(w) = watcher.upgrade() else { return };
                let holders: Vec<Arc<dyn Watched>> = lock(&w.holders)
                    .values()
                    .filter_map(Weak::upgrade)
                    .collect();
                let told: Vec<Arc<dyn Watched>> = holders
                    .into_iter()
                    .filter(|h| all || h.keys().iter().any(|k| keys.contains(k)))
                    .collect();
                let mut reads = redis::pipe();
                let mut seen = Vec::new();
                for k in told.iter().flat_map(|h| h.keys()) {
                    if !seen.contains(&k) {
                        reads.add_command(crate::commands::info(&k));
                        seen.push(k);
                    }
                }
                // A key's WRONGTYPE is a reply like another: the holder finds it.
                let ok = seen.is_empty()
                    || reads
                        .ignore_errors()
                        .query::<Vec<redis::Value>>(&mut conn)
                        .is_ok();
                for h in told {
                    h.told();
                }
                ok
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                redis::cmd("PING").query::<()>(&mut conn).is_ok()
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        if !ok {
            break;
        }
    }
    let Some(w) = watcher.upgrade() else { return };
    let holders: Vec<Arc<dyn Watched>> = {
        let mut reg = registry();
        if let Some(r) = reg.as_mut() {
            r.retain(|_, other| !Arc::ptr_eq(other, &w));
        }
        let mut hs = lock(&w.holders);
        let all = hs.values().filter_map(Weak::upgrade).collect();
        hs.clear();
        all
    };
    for h in holders {
        h.told();
    }
    if let Ok(mut c) = client.get_connection_with_timeout(timeout) {
        let _ = crate::commands::publish(&w.wake).query::<()>(&mut c);
    }
}
