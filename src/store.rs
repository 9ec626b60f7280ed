//! Reading and writing a lock key: open it, run a core transition, then write
//! back exactly what changed (value, key expiry, deletion, replication).

use std::ffi::CStr;

use redis_module::{Context, RedisString};

use crate::bindings;
use crate::clock;
use crate::errors::LockError;
use crate::fencing;
use crate::ffi::{self, api};
use crate::keys::LockKey;
use crate::replication;
use crate::stats;
use crate::timers;
use crate::txn::Txn;
use crate::waiting;
use lock_core::{Changes, Lock};

/// Runs a core transition on the lock at `name`, replicates its effect and
/// writes the key back. A key of another type is `WRONGTYPE` and runs nothing.
pub fn update<R>(
    ctx: &Context,
    name: &RedisString,
    op: impl FnOnce(&mut Txn) -> R,
) -> Result<R, LockError> {
    let (result, visit, events) = write_back(ctx, name, |lock| {
        let mut changes = Changes::default();
        let now = clock::now_ms();
        clock::check_steps(now);
        let mut tokens = fencing::for_transaction(now);
        let start = tokens;
        let mut txn = Txn {
            lock,
            tokens: &mut tokens,
            changes: &mut changes,
            now,
            events: Vec::new(),
        };
        let result = op(&mut txn);
        let pending = waiting::answer_waiters(ctx, name, &mut txn);
        let visit = next_visit(txn.lock, &pending);
        let mut events = txn.events;
        fencing::issued(&start, &tokens);
        if changes.expired() > 0 {
            stats::EXPIRED_LEASES.add(changes.expired());
            events.insert(0, c"lock.expired");
        }
        if !changes.is_empty() {
            forget_bindings(ctx, name, lock, &changes);
            replication::replicate(ctx, name, lock, &changes);
        }
        Ok(((result, visit, events), !changes.is_empty()))
    })?;
    for (key, leases) in timers::take_expired(ffi::selected_db(ctx)) {
        announce_expired(ctx, &key, leases);
    }
    for event in events {
        notify(ctx, event, name);
    }
    if visit.is_some() || timers::any() {
        let (db, key) = ffi::db_key(ctx, name.as_slice());
        timers::schedule(db, &key, visit);
    }
    Ok(result)
}

/// Holders that left in this transaction take their `BIND` with them.
fn forget_bindings(ctx: &Context, name: &RedisString, lock: &Lock, changes: &Changes) {
    if bindings::count() == 0 {
        return;
    }
    let key = ffi::db_key(ctx, name.as_slice());
    for owner in changes.owners() {
        if lock.holder(owner).is_none() {
            bindings::forget(&key, owner);
        }
    }
}

/// When this lock must next be looked at without anyone asking: at its
/// earliest deadline if requests wait for it, or if it is shared and some
/// reader expires before the key does; at the first WAIT deadline of its
/// waiters. Otherwise Redis's own key expiry is all it needs.
fn next_visit(lock: &Lock, pending: &waiting::Pending) -> Option<u64> {
    let expiry = match pending.waiting {
        true => lock.earliest_deadline(),
        false => lock.sweep_at(),
    };
    match (expiry, pending.next_timeout) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Opens `name`, runs `op` on its lock (empty when the key does not exist)
/// and, when `op` reports a change, stores, re-expires or deletes the key:
/// an emptied lock is deleted, and the key expires with its last holder.
pub fn write_back<R>(
    ctx: &Context,
    name: &RedisString,
    op: impl FnOnce(&mut Lock) -> Result<(R, bool), LockError>,
) -> Result<R, LockError> {
    let mut key = LockKey::open(ctx, name, true)?;
    let stored = key.lock()?;
    let existed = stored.is_some();
    let mut fresh = Lock::default();
    let lock = stored.unwrap_or(&mut fresh);
    let before = lock.census();
    let (result, changed) = op(lock)?;
    if !changed {
        return Ok(result);
    }
    stats::holders(-1, before);
    stats::holders(1, lock.census());
    match lock.latest_deadline() {
        None if existed => key.delete(),
        None => {}
        Some(deadline) => {
            if !existed {
                key.store(fresh)?;
                stats::value(1, (0, 0));
            }
            key.expire_at(deadline);
        }
    }
    Ok(result)
}

/// Counts the leases of a lock Redis expired (all of them had run out) and
/// fires `lock.expired` in the context's database; a replica, which hears of
/// the removal as a DEL from its master, only counts.
pub fn announce_expired(ctx: &Context, key: &[u8], leases: usize) {
    stats::EXPIRED_LEASES.add(leases);
    if !ctx.get_flags().contains(redis_module::ContextFlags::SLAVE) {
        notify(ctx, c"lock.expired", &ffi::name(ctx, key));
    }
}

/// Fires a module keyspace event (`notify-keyspace-events` class `d`), e.g.
/// `__keyevent@0__:lock.acquire`.
pub fn notify(ctx: &Context, event: &CStr, key: &RedisString) {
    let class =
        std::ffi::c_int::try_from(redis_module::raw::REDISMODULE_NOTIFY_MODULE).unwrap_or(0);
    api!(RedisModule_NotifyKeyspaceEvent(
        ctx.ctx,
        class,
        event.as_ptr(),
        key.inner
    ));
}
