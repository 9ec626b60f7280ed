//! One module timer for every lock.
//!
//! A deadline-ordered index (`BTreeSet<(when, db, key)>`, plus a map from key
//! to its entry) lists the keys that must be looked at when a time comes:
//! a key with waiters, at its earliest holder deadline (so a waiter is granted
//! the moment a lease expires, not when Redis's lazy or active expiry gets
//! round to it); a shared lock whose readers expire at different times, at its
//! earliest deadline (so dead readers leave memory, LOCK.INFO and replicas);
//! and a key whose lock something else freed (DEL, FLUSH*, RENAME ...), at
//! once. Exactly one Redis timer is armed, for the earliest entry. Cost per
//! indexed key: one set entry and one map entry, O(log n) to move; keys that
//! need no visit (an exclusive lock nobody waits for) are not indexed at all.
//!
//! When the timer fires, each due key is visited through `store::update` with
//! no transition of its own: expired holders are dropped (and the drop
//! replicated), waiters are granted, and the key is indexed again if needed.
//! An entry that no longer matches its key is harmless: the visit finds
//! nothing to do.

use std::collections::{BTreeSet, HashMap};
use std::os::raw::{c_int, c_void};
use std::sync::{LazyLock, Mutex, MutexGuard};

use redis_module::{raw, Context, ContextFlags};

use crate::clock;
use crate::errors::LockError;
use crate::guard;
use crate::keys::api;
use crate::store;

/// A key in one database.
pub type DbKey = (i32, Vec<u8>);

#[derive(Default)]
struct Index {
    by_time: BTreeSet<(u64, i32, Vec<u8>)>,
    by_key: HashMap<DbKey, u64>,
    /// The armed Redis timer and when it fires.
    armed: Option<(raw::RedisModuleTimerID, u64)>,
}

static INDEX: LazyLock<Mutex<Index>> = LazyLock::new(Mutex::default);

fn index() -> MutexGuard<'static, Index> {
    INDEX.lock().unwrap_or_else(|p| p.into_inner())
}

/// How many keys are indexed.
pub fn len() -> usize {
    index().by_key.len()
}

/// Whether any key is indexed (so a change may have to unindex one).
pub fn any() -> bool {
    !index().by_key.is_empty()
}

/// Visit `key` at `when` (unix ms), or never (`None`). Replaces any earlier plan.
pub fn schedule(ctx: &Context, db: i32, key: &[u8], when: Option<u64>) {
    let mut index = index();
    let id = (db, key.to_vec());
    let old = match when {
        Some(at) => index.by_key.insert(id, at),
        None => index.by_key.remove(&id),
    };
    if old == when {
        return;
    }
    if let Some(old) = old {
        index.by_time.remove(&(old, db, key.to_vec()));
    }
    if let Some(at) = when {
        index.by_time.insert((at, db, key.to_vec()));
    }
    arm(ctx, &mut index);
}

/// Visit `key` at `when` unless a visit is already planned before it.
pub fn schedule_earlier(ctx: &Context, db: i32, key: &[u8], when: Option<u64>) {
    let Some(when) = when else {
        return;
    };
    let planned = index().by_key.get(&(db, key.to_vec())).copied();
    if planned.is_none_or(|at| when < at) {
        schedule(ctx, db, key, Some(when));
    }
}

/// Keeps exactly one Redis timer armed, for the earliest entry.
fn arm(ctx: &Context, index: &mut Index) {
    arm_not_before(ctx, index, 0);
}

/// As `arm`, but the timer fires no sooner than `not_before` (unix ms).
fn arm_not_before(ctx: &Context, index: &mut Index, not_before: u64) {
    let first = index
        .by_time
        .first()
        .map(|(at, _, _)| (*at).max(not_before));
    match (index.armed, first) {
        (Some((_, armed_at)), Some(at)) if armed_at <= at => return,
        (None, None) => return,
        _ => {}
    }
    if let Some((id, _)) = index.armed.take() {
        let mut data: *mut c_void = std::ptr::null_mut();
        api!(RedisModule_StopTimer(ctx.ctx, id, &mut data));
    }
    if let Some(at) = first {
        let delay = at.saturating_sub(clock::now_ms());
        let delay = i64::try_from(delay).unwrap_or(i64::MAX);
        let id = api!(RedisModule_CreateTimer(
            ctx.ctx,
            delay,
            Some(on_timer),
            std::ptr::null_mut()
        ));
        index.armed = id.map(|id| (id, at));
    }
}

/// Takes every entry due at `now` out of the index.
fn take_due(now: u64) -> Vec<DbKey> {
    let mut index = index();
    index.armed = None;
    let mut due = Vec::new();
    while let Some((at, db, key)) = index.by_time.first().cloned() {
        if at > now {
            break;
        }
        index.by_time.remove(&(at, db, key.clone()));
        index.by_key.remove(&(db, key.clone()));
        due.push((db, key));
    }
    due
}

/// How long to wait before looking again while Redis pauses writes.
const PAUSED_RETRY_MS: u64 = 10;

extern "C" fn on_timer(raw_ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard::callback("the lock timer", (), || {
        let ctx = Context::new(raw_ctx);
        if writes_paused() {
            // CLIENT PAUSE WRITE, FAILOVER, CLUSTER FAILOVER: Redis neither
            // deletes expired keys nor accepts writes or replication now, and
            // a write here aborts the server. Keep every entry; look again soon.
            let mut index = index();
            index.armed = None;
            let retry = clock::now_ms().saturating_add(PAUSED_RETRY_MS);
            arm_not_before(&ctx, &mut index, retry);
            return;
        }
        let replica = ctx.get_flags().contains(ContextFlags::SLAVE);
        for (db, key) in take_due(clock::now_ms()) {
            if replica {
                // Demoted while clients waited (a server that keeps them
                // blocked across the role change, as Valkey does): a replica
                // must not write, so they are told to go to the master.
                crate::waiting::fail_all(db, &key, LockError::Replica);
            } else {
                visit(&ctx, db, &key);
            }
        }
        arm(&ctx, &mut index());
    });
}

/// Whether Redis pauses writes (and with them expiry and replication).
fn writes_paused() -> bool {
    api!(RedisModule_AvoidReplicaTraffic()).is_some_and(|paused| paused != 0)
}

/// Looks at one key: drops expired holders, grants waiters, re-indexes it.
fn visit(ctx: &Context, db: i32, key: &[u8]) {
    if api!(RedisModule_SelectDb(ctx.ctx, db)) != Some(raw::REDISMODULE_OK as c_int) {
        return;
    }
    let name = ctx.create_string(key);
    if let Err(e) = store::update(ctx, &name, |txn| txn.lock.purge(txn.now, txn.changes)) {
        crate::waiting::fail_all(db, key, e);
    }
}
