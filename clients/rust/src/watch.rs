//! The watcher: one per server (address and user) in a process, shared by
//! the blocking and the tokio API. A thread with a RESP2 connection of its
//! own subscribed to `__redis__:invalidate`; each bound holder's connection
//! runs `CLIENT TRACKING ON REDIRECT <watcher id> NOLOOP` once and reads its
//! keys with `LOCK.INFO`, so the server tells the watcher when one of them
//! changes (a DEL, a SET over it, expiry, FLUSH*, anything from another
//! connection). The watcher only tells the holder's watchdog to check (a
//! flag and a wake-up): it never waits on a holder's connection, and its
//! read, which blocks (it is a subscriber), holds up nothing else.
//!
//! Opened by the first bound holder on the server; the last one to leave
//! publishes on the watcher's own channel, and the watcher, woken, closes.

use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::thread;
use std::time::Duration;

const INVALIDATE: &str = "__redis__:invalidate";

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
    lock(&w.holders).insert(id, holder);
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
    lock(&w.holders).insert(id, holder.clone());
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
    let me = Arc::new(Watcher {
        id: conn_id,
        wake: format!("__redis-native-lock__:watcher:{conn_id}"),
        holders: Mutex::new(HashMap::new()),
    });
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
        if let (Some(changed), false) = (&invalidation, holders.is_empty()) {
            drop(reg);
            for h in holders {
                let hit = match changed {
                    None => true,
                    Some(keys) => h.keys().iter().any(|k| keys.contains(k)),
                };
                if hit {
                    h.told();
                }
            }
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
