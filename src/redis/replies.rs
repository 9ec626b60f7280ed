//! Replies and event names shared by a command and a waiter answered later.

use std::ffi::CStr;
use std::mem::ManuallyDrop;

use std::os::raw::c_int;

use lock_core::{Attempt, Kind, Mode};
use redis_module::{Context, RedisResult, RedisValue};

use crate::redis::errors::LockError;
use crate::redis::ffi::{self, call};

/// Sends a command's reply: a token or a count, and nil, straight through
/// the module API (the commonest replies); anything else through
/// `redis_module`'s `Context::reply`.
pub fn send(ctx: &Context, result: RedisResult) -> c_int {
    // An integer or nil owns nothing: no drop glue runs for them. Anything
    // else is handed over whole (and dropped) by `Context::reply`.
    let result = ManuallyDrop::new(result);
    match *result {
        Ok(RedisValue::Integer(n)) => {
            call!(RedisModule_ReplyWithLongLong(ctx.ctx, n))
        }
        Ok(RedisValue::Null) => call!(RedisModule_ReplyWithNull(ctx.ctx)),
        _ => send_other(ctx, ManuallyDrop::into_inner(result)),
    }
}

/// Any other reply (an error, an array, a string): out of line, so the
/// commonest replies' code stays small.
#[inline(never)]
fn send_other(ctx: &Context, result: RedisResult) -> c_int {
    ctx.reply(result) as c_int
}

/// The keyspace event of a grant.
pub fn event_of(kind: Kind) -> &'static CStr {
    kind.event()
}

/// The keyspace event of each key a `LOCK.MACQUIRE` grants.
pub const MULTI_EVENT: &CStr = c"lock.macquire";

/// The reply to a decided grant request (a waiter's too).
pub fn answer(attempt: Attempt) -> RedisResult {
    match attempt {
        // Tokens never exceed i64::MAX (lock_core::tokens::MAX_TOKEN).
        Attempt::Granted(token) => Ok(RedisValue::Integer(ffi::int(token))),
        Attempt::Busy => Ok(RedisValue::Null),
        refused => Err(error_of(refused).unwrap_or(LockError::Internal).into()),
    }
}

/// The error a refused request is answered with; `None` for a grant or a
/// plain "busy" (nil).
pub fn error_of(attempt: Attempt) -> Option<LockError> {
    Some(match attempt {
        Attempt::Granted(_) | Attempt::Busy => return None,
        Attempt::Conflict(Mode::Exclusive) => LockError::HeldExclusive,
        // A semaphore's holder asking for a lock is WrongKind, never this.
        Attempt::Conflict(_) => LockError::HeldShared,
        Attempt::TooManyHolds => LockError::TooManyHolds,
        Attempt::TokensExhausted => LockError::TokensExhausted,
        Attempt::WrongKind(Mode::Semaphore) => LockError::IsSemaphore,
        Attempt::WrongKind(_) => LockError::NotSemaphore,
        Attempt::OtherLimit(limit) => LockError::OtherLimit(limit),
        Attempt::TooLarge => LockError::TooLarge,
        Attempt::TooManyHolders(max) => LockError::TooManyHolders(max),
    })
}
