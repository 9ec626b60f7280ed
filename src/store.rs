//! Reading and writing a lock key: open it, run a core transition, then write
//! back exactly what changed (value, key expiry, deletion, replication).

use redis_module::{Context, RedisString};

use crate::clock;
use crate::core::{Changes, Lock, Tokens};
use crate::errors::LockError;
use crate::fencing;
use crate::keys::LockKey;
use crate::replication;

/// What a transition sees: the lock (empty when the key does not exist), the
/// token counter, the change list to fill and the time.
pub struct Txn<'a> {
    pub lock: &'a mut Lock,
    pub tokens: &'a mut Tokens,
    pub changes: &'a mut Changes,
    pub now: u64,
}

/// Runs a core transition on the lock at `name`, replicates its effect and
/// writes the key back. A key of another type is `WRONGTYPE` and runs nothing.
pub fn update<R>(
    ctx: &Context,
    name: &RedisString,
    op: impl FnOnce(&mut Txn) -> R,
) -> Result<R, LockError> {
    modify(ctx, name, |lock| {
        let mut changes = Changes::default();
        let result = op(&mut Txn {
            lock,
            tokens: &mut fencing::counter(),
            changes: &mut changes,
            now: clock::now_ms(),
        });
        if !changes.is_empty() {
            replication::replicate(ctx, name, lock, &changes);
        }
        Ok((result, !changes.is_empty()))
    })
}

/// Opens `name`, runs `op` on its lock (empty when the key does not exist)
/// and, when `op` reports a change, stores, re-expires or deletes the key:
/// an emptied lock is deleted, and the key expires with its last holder.
pub fn modify<R>(
    ctx: &Context,
    name: &RedisString,
    op: impl FnOnce(&mut Lock) -> Result<(R, bool), LockError>,
) -> Result<R, LockError> {
    let mut key = LockKey::open(ctx, name, true)?;
    let stored = key.lock()?;
    let existed = stored.is_some();
    let mut fresh = Lock::default();
    let lock = stored.unwrap_or(&mut fresh);
    let (result, changed) = op(lock)?;
    if !changed {
        return Ok(result);
    }
    match lock.latest_deadline() {
        None if existed => key.delete(),
        None => {}
        Some(deadline) => {
            if !existed {
                key.store(fresh)?;
            }
            key.expire_at(deadline);
        }
    }
    Ok(result)
}
