//! No panic may reach Redis: a panic unwinding into redis-server aborts it and
//! loses every unsaved key. Every entry point Redis calls (commands, type
//! callbacks, timers, event handlers) runs inside one of these guards.

use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::{Context, RedisResult, RedisString};

use crate::errors::LockError;
use crate::log;

type Handler = fn(&Context, Vec<RedisString>) -> RedisResult;

/// A command handler whose panic becomes an error reply.
pub fn command(
    name: &'static str,
    handler: Handler,
) -> impl Fn(&Context, Vec<RedisString>) -> RedisResult {
    move |ctx, args| {
        catch_unwind(AssertUnwindSafe(|| handler(ctx, args))).unwrap_or_else(|_| {
            log::warning(&format!("lock: panic caught in {name}"));
            Err(LockError::Internal.into())
        })
    }
}

/// A callback body whose panic is logged and turned into `fallback`.
pub fn callback<T>(what: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| {
        log::warning(&format!("lock: panic caught in {what}"));
        fallback
    })
}
