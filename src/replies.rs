//! Replies and event names shared by a command and a waiter answered later.

use std::ffi::CStr;

use lock_core::{Attempt, Kind, Mode};
use redis_module::{RedisResult, RedisValue};

use crate::errors::LockError;
use crate::ffi;

/// The keyspace event of a grant.
pub fn event_of(kind: Kind) -> &'static CStr {
    match kind {
        Kind::Acquire => c"lock.acquire",
        Kind::Racquire => c"lock.racquire",
        Kind::Read => c"lock.read",
    }
}

/// The reply to a decided grant request (a waiter's too).
pub fn answer(attempt: Attempt) -> RedisResult {
    match attempt {
        // Tokens never exceed i64::MAX (lock_core::tokens::MAX_TOKEN).
        Attempt::Granted(token) => Ok(RedisValue::Integer(ffi::int(token))),
        Attempt::Busy => Ok(RedisValue::Null),
        Attempt::Conflict(Mode::Shared) => Err(LockError::HeldShared.into()),
        Attempt::Conflict(Mode::Exclusive) => Err(LockError::HeldExclusive.into()),
        Attempt::TooManyHolds => Err(LockError::TooManyHolds.into()),
        Attempt::TokensExhausted => Err(LockError::TokensExhausted.into()),
    }
}
