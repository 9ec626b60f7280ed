//! Replication and the AOF: every change is sent as its effect, the exact
//! state of each changed holder with its absolute deadline, through the
//! internal command
//!
//! ```text
//! LOCK.SYNC key SET owner exclusive|shared holds token deadline-unix-ms
//! LOCK.SYNC key DROP owner
//! ```
//!
//! so a replica or an AOF replay never recomputes anything from its own clock.
//! Drops go first: a replica never holds two modes at once, even midway.

use std::ffi::{c_longlong, CStr};

use redis_module::{Context, ContextFlags, RedisResult, RedisString, RedisValue};

use crate::clock;
use crate::errors::LockError;
use crate::fencing;
use crate::keys::{api, LockKey};
use crate::store;
use crate::timers;
use crate::waiting;
use lock_core::{Changes, Holder, Lock, Mode, Tokens};

pub const SYNC: &CStr = c"LOCK.SYNC";

/// `LOCK.SYNC key SET owner mode holds token deadline`, as `RedisModule_Replicate`
/// and `RedisModule_EmitAOF` format their arguments.
pub const SET_FORMAT: &CStr = c"scbclll";
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

/// The mode as the `c` (C string) argument of a `SET` effect.
pub fn mode_arg(mode: Mode) -> &'static CStr {
    match mode {
        Mode::Exclusive => c"exclusive",
        Mode::Shared => c"shared",
    }
}

/// Sends the effect of one transition to replicas and the AOF, straight
/// through `RedisModule_Replicate` (no argument strings are built).
pub fn replicate(ctx: &Context, key: &RedisString, lock: &Lock, changes: &Changes) {
    let c = ctx.ctx;
    for owner in changes.owners() {
        if lock.holder(owner).is_none() {
            api!(RedisModule_Replicate(
                c,
                SYNC.as_ptr(),
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
            api!(RedisModule_Replicate(
                c,
                SYNC.as_ptr(),
                SET_FORMAT.as_ptr(),
                key.inner,
                c"SET".as_ptr(),
                owner.as_ptr(),
                owner.len(),
                mode_arg(lock.mode()).as_ptr(),
                holds,
                token,
                deadline
            ));
        }
    }
}

enum Effect {
    Set(Mode, Holder),
    Drop(Box<[u8]>),
}

fn parse(args: &[RedisString]) -> Result<(&RedisString, Effect), LockError> {
    let number = |s: &RedisString| -> Result<u64, LockError> {
        let n = s.parse_integer().map_err(|_| LockError::BadState)?;
        u64::try_from(n).map_err(|_| LockError::BadState)
    };
    match args {
        [_, key, op, owner] if op.as_slice().eq_ignore_ascii_case(b"DROP") => {
            Ok((key, Effect::Drop(owner.as_slice().into())))
        }
        [_, key, op, owner, mode, holds, token, deadline]
            if op.as_slice().eq_ignore_ascii_case(b"SET") =>
        {
            let mode = match mode.as_slice() {
                b"exclusive" => Mode::Exclusive,
                b"shared" => Mode::Shared,
                _ => return Err(LockError::BadState),
            };
            let holder = Holder {
                owner: owner.as_slice().into(),
                holds: u32::try_from(number(holds)?).map_err(|_| LockError::BadState)?,
                token: number(token)?,
                deadline: number(deadline)?,
            };
            // As on the RDB path: no token a server cannot have issued.
            if !Tokens::plausible(holder.token, clock::now_ms()) {
                return Err(LockError::BadState);
            }
            Ok((key, Effect::Set(mode, holder)))
        }
        _ => Err(LockError::Syntax),
    }
}

/// `LOCK.SYNC`: applies one replicated effect, exactly, whatever the time and
/// whatever this server held before: the master's stream is authoritative, as
/// it is for Redis's own types (a key of another type is replaced, holders
/// that cannot coexist with the one it sets are dropped).
pub fn sync(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let flags = ctx.get_flags();
    if !flags.intersects(ContextFlags::REPLICATED | ContextFlags::LOADING) {
        return Err(LockError::InternalCommand.into());
    }
    let (name, effect) = parse(&args)?;
    if let Effect::Set(mode, holder) = &effect {
        // Checked before anything is replaced: a bad effect changes nothing.
        Lock::default()
            .put(*mode, holder.clone())
            .map_err(|_| LockError::BadState)?;
        let mut key = LockKey::open(ctx, name, true)?;
        if matches!(key.lock(), Err(LockError::WrongType)) {
            key.delete();
        }
    }
    let sweep = store::modify(ctx, name, |lock| {
        match effect {
            Effect::Set(mode, holder) => {
                let token = holder.token;
                lock.force(mode, holder).map_err(|_| LockError::BadState)?;
                fencing::observe(token);
            }
            Effect::Drop(owner) => {
                lock.remove(&owner);
            }
        }
        Ok((lock.sweep_at(), true))
    })?;
    if sweep.is_some() || timers::any() {
        let (db, key) = waiting::db_key(ctx, name.as_slice());
        timers::schedule(db, &key, sweep);
    }
    // Our own replicas and AOF get the effect as it came.
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}
