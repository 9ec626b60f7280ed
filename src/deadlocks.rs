//! Deadlock detection in the server: before a request waits, would waiting
//! close a cycle of waits back to its own owner? The search is the core's
//! (`lock_core::deadlock`); this file shows it the server's state: the
//! waiting requests (`waiting`) and the holders of their keys (read from the
//! keys, in whatever database each is).
//!
//! Its cost is paid only by a request about to block, and bounded by
//! [`SEARCH_LIMIT`] steps; past it the request waits as usual (counted in
//! `INFO lock` as `deadlock_searches_cut`).

use std::collections::HashMap;

use redis_module::Context;

use crate::bindings;
use crate::clock;
use crate::ffi::{self, DbKey, Str};
use crate::keys::LockKey;
use crate::stats;
use crate::waiting;
use lock_core::deadlock::{self, Search, WaitGraph};
use lock_core::{Lock, Owner, Request};

/// The most steps (owners expanded plus dependencies listed) one search
/// takes: about a millisecond of work at worst (docs/benchmarks.md, section 7).
pub const SEARCH_LIMIT: usize = 500;

/// The server's waits as the core's search sees them.
struct Waits<'a> {
    ctx: &'a Context,
    now: u64,
    /// Each key's lock as read once in this search (many requests wait on
    /// one key); empty when free or not a lock.
    locks: HashMap<DbKey, Lock>,
}

impl Waits<'_> {
    /// The owners keeping `request` waiting on `key`, `queued` those queued
    /// ahead of it.
    fn blockers(&mut self, key: &DbKey, request: &Request, queued: Vec<Owner>) -> Vec<Owner> {
        if !self.locks.contains_key(key) {
            let lock = self.read(key);
            self.locks.insert(key.clone(), lock);
        }
        match self.locks.get(key) {
            Some(lock) => deadlock::blockers(lock, queued, request, self.now),
            None => queued,
        }
    }

    fn read(&self, key: &DbKey) -> Lock {
        if !ffi::select_db(self.ctx, key.0) {
            return Lock::default();
        }
        let name = ffi::name(self.ctx, &key.1);
        let read = LockKey::open(self.ctx, Str::from(&name), false)
            .map(|k| k.lock().map(|l| l.map(|l| Lock::clone(&l))));
        match read {
            // A closed connection's holders keep nobody waiting.
            Ok(Ok(Some(lock))) => bindings::without_closed(key, &lock, self.now).unwrap_or(lock),
            _ => Lock::default(),
        }
    }
}

impl WaitGraph for Waits<'_> {
    fn waits_for(&mut self, owner: &[u8]) -> Vec<Owner> {
        let mut out: Vec<Owner> = Vec::new();
        for (key, request, queued) in waiting::waits_of(owner) {
            out.extend(self.blockers(&key, &request, queued));
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// Whether `request`, about to wait on `keys` (in the current database),
/// would close a cycle of waits. A search cut short says no.
pub fn would_deadlock(ctx: &Context, keys: &[DbKey], request: &Request) -> bool {
    let home = ffi::selected_db(ctx);
    let mut waits = Waits {
        ctx,
        now: clock::now_ms(),
        locks: HashMap::new(),
    };
    let mut first: Vec<Owner> = Vec::new();
    for key in keys {
        let queued = waiting::queued_ahead_of(key, request);
        first.extend(waits.blockers(key, request, queued));
    }
    first.sort_unstable();
    first.dedup();
    let verdict = deadlock::search(&request.owner, first, &mut waits, SEARCH_LIMIT);
    ffi::select_db(ctx, home);
    match verdict {
        Search::Cycle => {
            stats::DEADLOCKS.incr();
            true
        }
        Search::Cut => {
            stats::DEADLOCK_SEARCHES_CUT.incr();
            false
        }
        Search::Clear => false,
    }
}
