//! Deadlock detection in the server: before a request waits, would waiting
//! close a cycle of waits back to its own owner? The search is the core's
//! (`lock_core::deadlock`); this file shows it the server's state: the
//! waiting requests (`waiting`) and the holders of their keys (read from the
//! keys, in whatever database each is).
//!
//! Its cost is paid only by a request about to block, and bounded by
//! [`SEARCH_LIMIT`] steps; past it the request waits as usual (counted in
//! `INFO lock` as `deadlock_searches_cut`).

use redis_module::Context;

use crate::clock;
use crate::ffi::{self, DbKey};
use crate::keys::LockKey;
use crate::stats;
use crate::waiting;
use lock_core::deadlock::{self, Search, WaitGraph};
use lock_core::{Lock, Owner, Request};

/// The most steps (owners expanded plus dependencies listed) one search
/// takes: about a millisecond of work.
pub const SEARCH_LIMIT: usize = 20_000;

/// The server's waits as the core's search sees them.
struct Waits<'a> {
    ctx: &'a Context,
    now: u64,
}

impl Waits<'_> {
    /// The owners keeping `request` waiting on `key`, `queued` those queued
    /// ahead of it.
    fn blockers(&self, key: &DbKey, request: &Request, queued: Vec<Owner>) -> Vec<Owner> {
        if !ffi::select_db(self.ctx, key.0) {
            return queued;
        }
        let name = ffi::name(self.ctx, &key.1);
        let empty = Lock::default();
        match LockKey::open(self.ctx, &name, false) {
            Ok(mut k) => match k.lock() {
                Ok(Some(lock)) => deadlock::blockers(lock, queued, request, self.now),
                _ => deadlock::blockers(&empty, queued, request, self.now),
            },
            Err(_) => queued,
        }
    }
}

impl WaitGraph for Waits<'_> {
    fn waits_for(&mut self, owner: &[u8]) -> Vec<Owner> {
        let mut out: Vec<Owner> = Vec::new();
        for (key, request, queued) in waiting::waits_of(owner) {
            for o in self.blockers(&key, &request, queued) {
                if !out.contains(&o) {
                    out.push(o);
                }
            }
        }
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
    };
    let mut first: Vec<Owner> = Vec::new();
    for key in keys {
        let queued = waiting::queued_ahead_of(key, request);
        for o in waits.blockers(key, request, queued) {
            if !first.contains(&o) {
                first.push(o);
            }
        }
    }
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
