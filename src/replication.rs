//! Replication and the AOF: every change is sent as its effect, the exact
//! state of each changed holder with its absolute deadline, through the
//! internal command
//!
//! ```text
//! LOCK.SYNC key SET owner exclusive|shared holds token deadline-unix-ms
//! LOCK.SYNC key SET owner semaphore holds token deadline-unix-ms limit
//! LOCK.SYNC key DROP owner
//! ```
//!
//! so a replica or an AOF replay never recomputes anything from its own clock.
//! Drops go first: a replica never holds two modes at once, even midway. This
//! file writes effects; `sync` applies them.

use std::ffi::{c_longlong, CStr};

use redis_module::{Context, RedisString};

use crate::ffi::api;
use lock_core::{Changes, Holder, Lock};

pub const SYNC_COMMAND: &CStr = c"LOCK.SYNC";

/// `LOCK.SYNC key SET owner mode holds token deadline`, as `RedisModule_Replicate`
/// and `RedisModule_EmitAOF` format their arguments.
pub const SET_FORMAT: &CStr = c"scbclll";
/// A semaphore holder's `SET`, its limit last.
pub const SET_LIMIT_FORMAT: &CStr = c"scbcllll";
/// `LOCK.SYNC key DROP owner`.
pub const DROP_FORMAT: &CStr = c"scb";

/// A holder's numbers as the `l` (long long) arguments of a `SET` effect.
pub fn numbers(holder: &Holder) -> [c_longlong; 3] {
    let n = |v: u64| c_longlong::try_from(v).unwrap_or(c_longlong::MAX);
    [
        n(u64::from(holder.holds)),
        n(holder.token),
        n(holder.deadline),
    ]
}

/// Sends the effect of one transition to replicas and the AOF, straight
/// through `RedisModule_Replicate` (no argument strings are built).
pub fn replicate(ctx: &Context, key: &RedisString, lock: &Lock, changes: &Changes) {
    let c = ctx.ctx;
    for owner in changes.owners() {
        if lock.holder(owner).is_none() {
            api!(RedisModule_Replicate(
                c,
                SYNC_COMMAND.as_ptr(),
                DROP_FORMAT.as_ptr(),
                key.inner,
                c"DROP".as_ptr(),
                owner.as_ptr(),
                owner.len()
            ));
        }
    }
    for owner in changes.owners() {
        if let Some(holder) = lock.holder(owner) {
            let [holds, token, deadline] = numbers(holder);
            let mode = lock.mode().c_name().as_ptr();
            let (set, owner) = (c"SET".as_ptr(), owner.as_ref());
            match lock.limit() {
                None => api!(RedisModule_Replicate(
                    c,
                    SYNC_COMMAND.as_ptr(),
                    SET_FORMAT.as_ptr(),
                    key.inner,
                    set,
                    owner.as_ptr(),
                    owner.len(),
                    mode,
                    holds,
                    token,
                    deadline
                )),
                Some(limit) => api!(RedisModule_Replicate(
                    c,
                    SYNC_COMMAND.as_ptr(),
                    SET_LIMIT_FORMAT.as_ptr(),
                    key.inner,
                    set,
                    owner.as_ptr(),
                    owner.len(),
                    mode,
                    holds,
                    token,
                    deadline,
                    c_longlong::from(limit)
                )),
            };
        }
    }
}
