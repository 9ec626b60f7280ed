//! Deadlock detection in the server: before a request waits, would waiting
//! close a cycle of waits back to its own owner? The search is the core's
//! (`lock_core::deadlock`); this file shows it the server's state: the
//! waiting requests and their places (`waiting`) and the holders of their
//! keys (read from the keys, in whatever database each is, once a search).
//!
//! Most requests need no search at all: a cycle back to an owner needs
//! somebody waiting for it, and nobody can while it holds no key that has
//! a queue and has no request waiting anywhere (`waiting::may_be_waited_for`,
//! one look-up): a new worker queueing for a hot key, or at the top of a
//! chain, is answered at once however many wait. Otherwise the search is
//! complete and linear in the wait graph (every cycle is found, however
//! long; nothing is cut), and its cost is paid only by a request about to
//! block.

use std::collections::HashMap;

use redis_module::Context;

use crate::redis::ffi::{self, DbKey, Str};
use crate::state::bindings;
use crate::state::keys::LockKey;
use crate::state::stats;
use crate::state::waiting;
use crate::time::clock;
use lock_core::deadlock::{self, Search, WaitGraph};
use lock_core::{Kind, Lock, Owner, Request};

/// The server's waits as the core's search sees them.
struct Waits<'a> {
    ctx: &'a Context,
    now: u64,
    /// Each key's lock as read once in this search (many requests wait on
    /// one key); empty when free or not a lock.
    locks: HashMap<DbKey, Lock>,
}

impl Waits<'_> {
    /// `key`'s lock, read at its first use in this search.
    fn lock(&mut self, key: &DbKey) -> &Lock {
        let (ctx, now) = (self.ctx, self.now);
        self.locks
            .entry(key.clone())
            .or_insert_with(|| read(ctx, key, now))
    }
}

fn read(ctx: &Context, key: &DbKey, now: u64) -> Lock {
    if !ffi::select_db(ctx, key.db) {
        return Lock::default();
    }
    let name = ffi::name(ctx, &key.name);
    let read = LockKey::open(ctx, Str::from(&name), false)
        .map(|k| k.lock().map(|l| l.map(|l| Lock::clone(&l))));
    match read {
        // A closed connection's holders keep nobody waiting.
        Ok(Ok(Some(lock))) => {
            bindings::without_closed(key.db, &key.name, &lock, now).unwrap_or(lock)
        }
        _ => Lock::default(),
    }
}

impl WaitGraph for Waits<'_> {
    type Key = DbKey;

    fn requests_of(&mut self, owner: &[u8]) -> Vec<(DbKey, u64, Kind)> {
        waiting::requests_of(owner)
    }

    fn holds(&mut self, key: &DbKey, owner: &[u8]) -> bool {
        let now = self.now;
        self.lock(key).live(now).any(|h| *h.owner == *owner)
    }

    fn waited_keys_held(&mut self, owner: &[u8]) -> Vec<DbKey> {
        waiting::waited_keys_held(owner)
    }

    fn admits(&mut self, key: &DbKey, kind: Kind) -> bool {
        let now = self.now;
        self.lock(key).admits(kind, now)
    }

    fn holders(&mut self, key: &DbKey) -> Vec<Owner> {
        let now = self.now;
        self.lock(key)
            .live(now)
            .map(|h| Owner::from(h.owner))
            .collect()
    }

    fn queued(&mut self, key: &DbKey, from: u64, to: u64) -> Vec<(Owner, Kind)> {
        waiting::queued(key, from, to)
    }
}

/// Whether `request`, about to wait on `keys`, would close a cycle of
/// waits (answered `DEADLOCK`, counted in `INFO lock`).
pub fn would_deadlock(ctx: &Context, keys: &[DbKey], request: &Request) -> bool {
    if !waiting::may_be_waited_for(&request.owner) {
        return false;
    }
    let mut waits = Waits {
        ctx,
        now: clock::now_ms(),
        locks: HashMap::new(),
    };
    let at: Vec<(DbKey, u64)> = keys
        .iter()
        .map(|k| (k.clone(), waiting::end_of(k)))
        .collect();
    let verdict = ffi::keeping_db(ctx, || {
        deadlock::search(&request.owner, request.kind, &at, &mut waits)
    });
    match verdict {
        Search::Cycle => {
            stats::DEADLOCKS.incr();
            true
        }
        Search::Clear => false,
    }
}
