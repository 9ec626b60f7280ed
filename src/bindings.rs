//! Holders bound to their connection (`BIND`): which connection holds which
//! grant, so that a closing connection releases all of them, and
//! `LOCK.KEEPALIVE` renews them.
//!
//! A binding is `(db, key, owner) -> (client id, token)`, indexed both ways.
//! It lives in this server's memory only: it is not saved or replicated, and
//! a restart or a promotion forgets it (the holders keep their lease).
//!
//! A binding is dropped when its holder's last hold is released or its lease
//! runs out through a lock command or the timer (`store::update` reports the
//! owners that left); a holder that leaves by other means (DEL, FLUSH*,
//! Redis's expiry of the key) leaves a stale binding, found and dropped at
//! the connection's next `LOCK.KEEPALIVE` or at its close: every use checks
//! the holder's token first, so a stale binding never touches another grant.
//! RENAME, MOVE and SWAPDB carry bindings to the lock's new place.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use crate::ffi::DbKey;
use lock_core::Owner;

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

#[derive(Default)]
struct Registry {
    by_key: HashMap<DbKey, HashMap<Owner, (ClientId, u64)>>,
    by_client: HashMap<ClientId, HashSet<(DbKey, Owner)>>,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);
/// How many bindings exist: the cheap check on every transition.
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// Bytes held by bindings (keys and owners twice, plus entries), for INFO.
static BYTES: AtomicUsize = AtomicUsize::new(0);

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Approximate bytes of one binding: both index entries with their copies
/// of the key and the owner.
fn cost(key: &DbKey, owner: &[u8]) -> usize {
    const ENTRIES: usize = 2 * (std::mem::size_of::<DbKey>() + std::mem::size_of::<Owner>())
        + std::mem::size_of::<(ClientId, u64)>()
        + 32;
    ENTRIES + 2 * (key.1.len() + owner.len())
}

/// How many holders are bound now.
pub fn count() -> usize {
    COUNT.load(Ordering::Relaxed)
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

/// Binds a grant to `client`, moving it from any earlier connection.
pub fn bind(client: ClientId, key: DbKey, owner: &[u8], token: u64) {
    let mut r = registry();
    let owner: Owner = owner.into();
    let previous = r
        .by_key
        .entry(key.clone())
        .or_default()
        .insert(owner.clone(), (client, token));
    match previous {
        Some((old, _)) if old == client => return,
        Some((old, _)) => remove_from_client(&mut r, old, &key, &owner),
        None => {
            COUNT.fetch_add(1, Ordering::Relaxed);
            BYTES.fetch_add(cost(&key, &owner), Ordering::Relaxed);
        }
    }
    r.by_client.entry(client).or_default().insert((key, owner));
}

fn remove_from_client(r: &mut Registry, client: ClientId, key: &DbKey, owner: &Owner) {
    if let Some(set) = r.by_client.get_mut(&client) {
        set.remove(&(key.clone(), owner.clone()));
        if set.is_empty() {
            r.by_client.remove(&client);
        }
    }
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
    let Some((client, _)) = owners.remove(owner) else {
        return;
    };
    if owners.is_empty() {
        r.by_key.remove(key);
    }
    remove_from_client(&mut r, client, key, &owner.into());
    COUNT.fetch_sub(1, Ordering::Relaxed);
    BYTES.fetch_sub(cost(key, owner), Ordering::Relaxed);
}

/// Every grant bound to `client`.
pub fn of_client(client: ClientId) -> Vec<Bound> {
    if count() == 0 {
        return Vec::new();
    }
    let r = registry();
    let Some(set) = r.by_client.get(&client) else {
        return Vec::new();
    };
    set.iter()
        .filter_map(|(key, owner)| {
            let (_, token) = r.by_key.get(key)?.get(owner)?;
            Some(Bound {
                key: key.clone(),
                owner: owner.clone(),
                token: *token,
            })
        })
        .collect()
}

/// The connection `client` closed: the holders bound to it, detached from it
/// at once (one map removal, whatever their number); each binding itself is
/// ended later by [`take`], a share per timer tick.
pub fn detach_client(client: ClientId) -> Vec<Detached> {
    if count() == 0 {
        return Vec::new();
    }
    registry()
        .by_client
        .remove(&client)
        .map(|set| {
            set.into_iter()
                .map(|(key, owner)| Detached { key, owner, client })
                .collect()
        })
        .unwrap_or_default()
}

/// Ends the binding of `owner` on `key` if it still belongs to `client` (a
/// repeat with `BIND` may have moved it to another connection meanwhile);
/// the bound grant's token.
pub fn take(key: &DbKey, owner: &[u8], client: ClientId) -> Option<u64> {
    let mut r = registry();
    let owners = r.by_key.get_mut(key)?;
    let (bound_to, token) = *owners.get(owner)?;
    if bound_to != client {
        return None;
    }
    owners.remove(owner);
    if owners.is_empty() {
        r.by_key.remove(key);
    }
    COUNT.fetch_sub(1, Ordering::Relaxed);
    BYTES.fetch_sub(cost(key, owner), Ordering::Relaxed);
    Some(token)
}

/// The connection `client` closed: its bindings, taken out of the registry
/// in one go (tests; the server uses [`detach_client`] and [`take`]).
#[cfg(test)]
pub fn take_client(client: ClientId) -> Vec<Bound> {
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
    for (owner, (client, _)) in &owners {
        BYTES.fetch_sub(cost(from, owner), Ordering::Relaxed);
        BYTES.fetch_add(cost(to, owner), Ordering::Relaxed);
        if let Some(set) = r.by_client.get_mut(client) {
            set.remove(&(from.clone(), owner.clone()));
            set.insert((to.clone(), owner.clone()));
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
        .map(|((db, key), owners)| ((swap(db), key), owners))
        .collect();
    for set in r.by_client.values_mut() {
        *set = std::mem::take(set)
            .into_iter()
            .map(|((db, key), owner)| ((swap(db), key), owner))
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
        .filter(|((d, _), _)| db == -1 || *d == db)
        .flat_map(|(key, owners)| owners.keys().map(|o| (key.clone(), o.clone())))
        .collect();
    for (key, owner) in gone {
        forget(&key, &owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(db: i32, k: &str) -> DbKey {
        (db, k.as_bytes().to_vec())
    }

    // One test: the registry is a process-wide static.
    #[test]
    fn bind_move_forget_rename_swap_and_take() {
        bind(1, key(0, "a"), b"o", 10);
        bind(1, key(0, "b"), b"o", 11);
        bind(2, key(0, "c"), b"p", 12);
        assert_eq!(count(), 3);
        assert!(memory() > 0);
        // A repeat with BIND from another connection moves the binding.
        bind(2, key(0, "a"), b"o", 10);
        assert_eq!(count(), 3);
        assert_eq!(of_client(1).len(), 1);
        assert_eq!(of_client(2).len(), 2);
        forget(&key(0, "b"), b"o");
        assert!(of_client(1).is_empty());
        bind(7, key(3, "a2"), b"q", 13);
        moved(&key(0, "a"), &key(3, "a2"));
        assert!(of_client(7).is_empty(), "replaced by the RENAME");
        swap_dbs(3, 4);
        let mut held: Vec<_> = take_client(2)
            .into_iter()
            .map(|b| (b.key, b.token))
            .collect();
        held.sort();
        assert_eq!(held, vec![(key(0, "c"), 12), (key(4, "a2"), 10)]);
        assert_eq!(count(), 0);
        assert_eq!(memory(), 0);
        bind(5, key(2, "x"), b"o", 1);
        bind(5, key(3, "y"), b"o", 2);
        flushed(2);
        assert_eq!(of_client(5).len(), 1);
        flushed(-1);
        assert_eq!(count(), 0);
    }
}
