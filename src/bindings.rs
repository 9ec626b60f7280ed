//! Holders bound to their connection (`BIND`): which connection holds which
//! grant, so that a closing connection releases all of them, and
//! `LOCK.KEEPALIVE` renews them.
//!
//! A binding is `(db, key, owner) -> (client id, token)`, indexed both ways.
//! It lives in this server's memory only: it is not saved or replicated, and
//! a restart or a promotion forgets it (the holders keep their lease).
//!
//! A binding is dropped when its holder's last hold is released or its lease
//! runs out through a lock command or the timer (`transitions::update` reports the
//! owners that left); a holder that leaves by other means (DEL, FLUSH*,
//! Redis's expiry of the key) leaves a stale binding, found and dropped at
//! the connection's next `LOCK.KEEPALIVE` or at its close: every use checks
//! the holder's token first, so a stale binding never touches another grant.
//! RENAME, MOVE and SWAPDB carry bindings to the lock's new place.
//!
//! A connection that closes is marked closed here at once, in O(1) (its
//! bindings stay indexed by key, each naming the closed client): from then
//! on every transaction on a key ends the key's holders bound to a closed
//! connection before anything else (`transitions`), LOCK.INFO and the deadlock
//! search leave them out, and INFO does not count them. The timer ends the
//! rest later, a share per tick. [`pending`] (one atomic) says whether any
//! such holder is left, so a server with none pays nothing.

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use crate::ffi::DbKey;
use lock_core::{Census, Changes, Lock, Mode, Owner};

/// A client id (`CLIENT ID`).
pub type ClientId = u64;

/// A holder whose connection closed, to end at a later tick.
#[derive(Debug)]
pub struct Detached {
    pub key: DbKey,
    pub owner: Owner,
    pub client: ClientId,
}

/// One bound grant: where, whose, and which grant (its token).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bound {
    pub key: DbKey,
    pub owner: Owner,
    pub token: u64,
}

/// A binding as indexed by key: its connection, its grant, the lock's mode
/// (for INFO's count of holders by mode).
#[derive(Clone, Copy, Debug)]
struct Entry {
    client: ClientId,
    token: u64,
    mode: Mode,
}

/// A connection's bindings, in order (`LOCK.KEEPALIVE` pages through them
/// across event-loop turns), and how many of them are in each mode.
#[derive(Default)]
struct Client {
    keys: BTreeSet<(DbKey, Owner)>,
    census: Census,
}

#[derive(Default)]
struct Registry {
    by_key: HashMap<DbKey, HashMap<Owner, Entry>>,
    by_client: HashMap<ClientId, Client>,
    /// Closed connections with bindings not yet ended, and how many.
    closed: HashMap<ClientId, usize>,
    /// The holders of closed connections not yet ended, by mode.
    closed_census: Census,
}

impl Registry {
    /// The entry `(key, owner)` left the index by key: out of its
    /// connection's set, or out of what a closed connection has pending.
    fn unlist(&mut self, key: &DbKey, owner: &Owner, e: Entry) {
        if let Some(left) = self.closed.get_mut(&e.client) {
            *left = left.saturating_sub(1);
            if *left == 0 {
                self.closed.remove(&e.client);
            }
            self.closed_census.sub(e.mode, 1);
            PENDING.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        if let Some(c) = self.by_client.get_mut(&e.client) {
            c.keys.remove(&(key.clone(), owner.clone()));
            c.census.sub(e.mode, 1);
            if c.keys.is_empty() {
                self.by_client.remove(&e.client);
            }
        }
    }
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);
/// How many bindings exist: the cheap check on every transition.
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// Bytes held by bindings (keys and owners twice, plus entries), for INFO.
static BYTES: AtomicUsize = AtomicUsize::new(0);
/// How many bindings belong to closed connections and are not ended yet:
/// the cheap check before a transaction looks for them.
static PENDING: AtomicUsize = AtomicUsize::new(0);

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Approximate bytes of one binding: both index entries with their copies
/// of the key and the owner.
fn cost(key: &DbKey, owner: &[u8]) -> usize {
    const ENTRIES: usize = 2 * (std::mem::size_of::<DbKey>() + std::mem::size_of::<Owner>())
        + std::mem::size_of::<Entry>()
        + 32;
    ENTRIES + 2 * (key.name.len() + owner.len())
}

/// How many holders are bound now, counting those of closed connections
/// not yet ended ([`pending`]).
pub fn count() -> usize {
    COUNT.load(Ordering::Relaxed)
}

/// How many bound holders belong to connections that closed and are not
/// ended yet (they hold nothing: the next transaction on their key ends them).
pub fn pending() -> usize {
    PENDING.load(Ordering::Relaxed)
}

/// [`pending`] by mode, as `Lock::census`.
/// Never waits for the registry (INFO also runs while a crash report is
/// written): zeros when it is busy.
pub fn pending_census() -> Census {
    if pending() == 0 {
        return Census::ZERO;
    }
    REGISTRY
        .try_lock()
        .map_or(Census::ZERO, |r| r.closed_census)
}

/// The holders of `key` bound to a connection that closed: owner, the
/// connection, and the grant's token.
pub fn closed_on(key: &DbKey) -> Vec<(Owner, ClientId, u64)> {
    if pending() == 0 {
        return Vec::new();
    }
    let r = registry();
    let Some(owners) = r.by_key.get(key) else {
        return Vec::new();
    };
    owners
        .iter()
        .filter(|(_, e)| r.closed.contains_key(&e.client))
        .map(|(o, e)| (o.clone(), e.client, e.token))
        .collect()
}

/// A copy of `lock` (at `key`) as the next transaction on it will see it:
/// without the holders of connections that closed; `None` when it has none.
/// For the readers that must not write: LOCK.INFO, the deadlock search, a
/// multi-key request's check.
pub fn without_closed(key: &DbKey, lock: &Lock, now: u64) -> Option<Lock> {
    let gone = closed_on(key);
    if gone.is_empty() {
        return None;
    }
    let mut copy = lock.clone();
    let mut changes = Changes::default();
    for (owner, _, token) in gone {
        copy.release_all(&owner, token, now, &mut changes);
    }
    Some(copy)
}

/// Bytes the bindings occupy (estimate).
pub fn memory() -> usize {
    BYTES.load(Ordering::Relaxed)
}

/// Bytes the bindings of the holders of `key` take.
pub fn memory_of(key: &DbKey) -> usize {
    if count() == 0 {
        return 0;
    }
    registry()
        .by_key
        .get(key)
        .map_or(0, |owners| owners.keys().map(|o| cost(key, o)).sum())
}

/// Binds a grant (in a lock of `mode`) to `client`, moving it from any
/// earlier connection.
pub fn bind(client: ClientId, key: DbKey, owner: &[u8], token: u64, mode: Mode) {
    let mut r = registry();
    let owner: Owner = owner.into();
    let entry = Entry {
        client,
        token,
        mode,
    };
    let previous = r
        .by_key
        .entry(key.clone())
        .or_default()
        .insert(owner.clone(), entry);
    match previous {
        Some(old) if old.client == client => {
            if old.mode != mode {
                if let Some(c) = r.by_client.get_mut(&client) {
                    c.census.sub(old.mode, 1);
                    c.census.add(mode, 1);
                }
            }
            return;
        }
        Some(old) => r.unlist(&key, &owner, old),
        None => {
            COUNT.fetch_add(1, Ordering::Relaxed);
            BYTES.fetch_add(cost(&key, &owner), Ordering::Relaxed);
        }
    }
    let c = r.by_client.entry(client).or_default();
    c.keys.insert((key, owner));
    c.census.add(mode, 1);
}

/// The holder `owner` of `key` is gone: its binding too.
pub fn forget(key: &DbKey, owner: &[u8]) {
    if count() == 0 {
        return;
    }
    let mut r = registry();
    let Some(owners) = r.by_key.get_mut(key) else {
        return;
    };
    let Some(entry) = owners.remove(owner) else {
        return;
    };
    if owners.is_empty() {
        r.by_key.remove(key);
    }
    r.unlist(key, &owner.into(), entry);
    COUNT.fetch_sub(1, Ordering::Relaxed);
    BYTES.fetch_sub(cost(key, owner), Ordering::Relaxed);
}

/// Up to `n` grants bound to `client`, in order, after `after` (from the
/// first when `None`): a page of them, so that a connection with many is
/// gone through a share at a time, each share copying only its own.
pub fn page_of_client(client: ClientId, after: Option<&(DbKey, Owner)>, n: usize) -> Vec<Bound> {
    if count() == 0 {
        return Vec::new();
    }
    let r = registry();
    let Some(c) = r.by_client.get(&client) else {
        return Vec::new();
    };
    let from = after.map_or(Unbounded, Excluded);
    c.keys
        .range((from, Unbounded))
        .filter_map(|(key, owner)| {
            let e = r.by_key.get(key)?.get(owner)?;
            Some(Bound {
                key: key.clone(),
                owner: owner.clone(),
                token: e.token,
            })
        })
        .take(n)
        .collect()
}

/// The connection `client` closed: its holders hold nothing from now on
/// (the connection is marked closed, in O(1) whatever their number, and
/// [`pending`] counts them); the list of them, for the timer to end those
/// no command ends first ([`take`], a share per tick).
pub fn detach_client(client: ClientId) -> Vec<Detached> {
    if count() == 0 {
        return Vec::new();
    }
    let mut r = registry();
    let Some(c) = r.by_client.remove(&client) else {
        return Vec::new();
    };
    let n = c.keys.len();
    r.closed.insert(client, n);
    r.closed_census.add_all(c.census);
    PENDING.fetch_add(n, Ordering::Relaxed);
    drop(r);
    c.keys
        .into_iter()
        .map(|(key, owner)| Detached { key, owner, client })
        .collect()
}

/// Ends the binding of `owner` on `key` if it still belongs to `client` (a
/// repeat with `BIND` may have moved it to another connection meanwhile);
/// the bound grant's token.
pub fn take(key: &DbKey, owner: &[u8], client: ClientId) -> Option<u64> {
    let mut r = registry();
    let owners = r.by_key.get_mut(key)?;
    let entry = *owners.get(owner)?;
    if entry.client != client {
        return None;
    }
    owners.remove(owner);
    if owners.is_empty() {
        r.by_key.remove(key);
    }
    r.unlist(key, &owner.into(), entry);
    COUNT.fetch_sub(1, Ordering::Relaxed);
    BYTES.fetch_sub(cost(key, owner), Ordering::Relaxed);
    Some(entry.token)
}

/// RENAME or MOVE carried the lock at `from` to `to` with its holders.
pub fn moved(from: &DbKey, to: &DbKey) {
    if count() == 0 {
        return;
    }
    // What was bound at the destination went with the value RENAME replaced.
    let replaced: Vec<Owner> = registry()
        .by_key
        .get(to)
        .map(|owners| owners.keys().cloned().collect())
        .unwrap_or_default();
    for owner in replaced {
        forget(to, &owner);
    }
    let mut r = registry();
    let Some(owners) = r.by_key.remove(from) else {
        return;
    };
    for (owner, e) in &owners {
        BYTES.fetch_sub(cost(from, owner), Ordering::Relaxed);
        BYTES.fetch_add(cost(to, owner), Ordering::Relaxed);
        if let Some(c) = r.by_client.get_mut(&e.client) {
            c.keys.remove(&(from.clone(), owner.clone()));
            c.keys.insert((to.clone(), owner.clone()));
        }
    }
    r.by_key.insert(to.clone(), owners);
}

/// SWAPDB: bindings follow their keys.
pub fn swap_dbs(a: i32, b: i32) {
    if count() == 0 {
        return;
    }
    let swap = |db: i32| match db {
        d if d == a => b,
        d if d == b => a,
        d => d,
    };
    let mut r = registry();
    let r = &mut *r;
    r.by_key = std::mem::take(&mut r.by_key)
        .into_iter()
        .map(|(DbKey { db, name }, owners)| (DbKey { db: swap(db), name }, owners))
        .collect();
    for c in r.by_client.values_mut() {
        c.keys = std::mem::take(&mut c.keys)
            .into_iter()
            .map(|(DbKey { db, name }, owner)| (DbKey { db: swap(db), name }, owner))
            .collect();
    }
}

/// FLUSHDB / FLUSHALL (`db` -1): the bindings of what was flushed go.
pub fn flushed(db: i32) {
    if count() == 0 {
        return;
    }
    let gone: Vec<(DbKey, Owner)> = registry()
        .by_key
        .iter()
        .filter(|(k, _)| db == -1 || k.db == db)
        .flat_map(|(key, owners)| owners.keys().map(|o| (key.clone(), o.clone())))
        .collect();
    for (key, owner) in gone {
        forget(&key, &owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The connection `client` closed: its bindings, taken out of the registry
    /// in one go (the server uses [`detach_client`] and [`take`]).
    fn take_client(client: ClientId) -> Vec<Bound> {
        detach_client(client)
            .into_iter()
            .filter_map(|d| {
                let token = take(&d.key, &d.owner, d.client)?;
                Some(Bound {
                    key: d.key,
                    owner: d.owner,
                    token,
                })
            })
            .collect()
    }

    fn key(db: i32, k: &str) -> DbKey {
        DbKey::new(db, k.as_bytes())
    }

    /// A census's counts in `Mode::ALL` order.
    fn counts(c: Census) -> Vec<usize> {
        c.iter().map(|(_, n)| n).collect()
    }

    // One test: the registry is a process-wide static.
    #[test]
    fn bind_move_forget_rename_swap_and_take() {
        bind(1, key(0, "a"), b"o", 10, Mode::Exclusive);
        bind(1, key(0, "b"), b"o", 11, Mode::Exclusive);
        bind(2, key(0, "c"), b"p", 12, Mode::Exclusive);
        assert_eq!(count(), 3);
        assert!(memory() > 0);
        // A repeat with BIND from another connection moves the binding.
        bind(2, key(0, "a"), b"o", 10, Mode::Exclusive);
        assert_eq!(count(), 3);
        assert_eq!(page_of_client(1, None, usize::MAX).len(), 1);
        assert_eq!(page_of_client(2, None, usize::MAX).len(), 2);
        forget(&key(0, "b"), b"o");
        assert!(page_of_client(1, None, usize::MAX).is_empty());
        bind(7, key(3, "a2"), b"q", 13, Mode::Exclusive);
        moved(&key(0, "a"), &key(3, "a2"));
        assert!(
            page_of_client(7, None, usize::MAX).is_empty(),
            "replaced by the RENAME"
        );
        swap_dbs(3, 4);
        let mut held: Vec<_> = take_client(2)
            .into_iter()
            .map(|b| (b.key, b.token))
            .collect();
        held.sort();
        assert_eq!(held, vec![(key(0, "c"), 12), (key(4, "a2"), 10)]);
        assert_eq!(count(), 0);
        assert_eq!(memory(), 0);
        bind(5, key(2, "x"), b"o", 1, Mode::Exclusive);
        bind(5, key(3, "y"), b"o", 2, Mode::Exclusive);
        flushed(2);
        assert_eq!(page_of_client(5, None, usize::MAX).len(), 1);
        flushed(-1);
        assert_eq!(count(), 0);

        // A closed connection: its holders are pending at once, whatever
        // ends them (a command's take, a forget, the timer's take).
        bind(8, key(0, "p"), b"o", 20, Mode::Exclusive);
        bind(8, key(0, "q"), b"o", 21, Mode::Shared);
        bind(8, key(0, "r"), b"o", 22, Mode::Semaphore);
        bind(9, key(0, "p"), b"z", 23, Mode::Exclusive);
        assert_eq!(pending(), 0);
        assert_eq!(detach_client(8).len(), 3);
        assert_eq!(pending(), 3);
        assert_eq!(counts(pending_census()), [1, 1, 1]);
        assert_eq!(
            closed_on(&key(0, "p")),
            vec![(b"o".as_slice().into(), 8, 20)]
        );
        assert_eq!(take(&key(0, "p"), b"o", 8), Some(20));
        assert!(closed_on(&key(0, "p")).is_empty(), "z's connection is open");
        forget(&key(0, "q"), b"o");
        assert_eq!(counts(pending_census()), [0, 0, 1]);
        // A repeat with BIND elsewhere (after its end) takes it off the list.
        bind(9, key(0, "r"), b"o", 24, Mode::Semaphore);
        assert_eq!(pending(), 0);
        assert_eq!(pending_census(), Census::ZERO);
        assert_eq!(take(&key(0, "r"), b"o", 8), None, "bound to 9 now");
        assert_eq!(page_of_client(9, None, usize::MAX).len(), 2);
        // Paged in order, one at a time, each page after the last.
        let first = page_of_client(9, None, 1);
        let at = |b: &[Bound]| (b[0].key.clone(), b[0].owner.clone());
        let second = page_of_client(9, Some(&at(&first)), 1);
        assert_eq!(second.len(), 1);
        assert!(at(&first) < at(&second));
        assert!(page_of_client(9, Some(&at(&second)), 1).is_empty());
        flushed(-1);
        assert_eq!(count(), 0);
    }
}
