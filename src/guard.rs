//! No panic may reach Redis: a panic unwinding into redis-server aborts it and
//! loses every unsaved key. Every entry point Redis calls (commands, type
//! callbacks, timers, event handlers) runs inside one of these guards.

use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::RedisResult;

use crate::errors::LockError;
use crate::log;

/// A command handler's run (`name` is the command's) whose panic becomes
/// an error reply.
pub fn command(name: &std::ffi::CStr, handler: impl FnOnce() -> RedisResult) -> RedisResult {
    catch_unwind(AssertUnwindSafe(handler)).unwrap_or_else(|_| {
        log::warning(&format!("lock: panic caught in {}", name.to_string_lossy()));
        Err(LockError::Internal.into())
    })
}

/// A callback body whose panic is logged and turned into `fallback`.
pub fn callback<T>(what: impl Describe, fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| {
        log::warning(&format!("lock: panic caught in {}", what.describe()));
        fallback
    })
}

/// What a guarded callback is, for the log (made only when a panic is
/// caught).
pub trait Describe {
    fn describe(&self) -> std::borrow::Cow<'_, str>;
}

impl Describe for &str {
    fn describe(&self) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(self)
    }
}

impl Describe for &std::ffi::CStr {
    fn describe(&self) -> std::borrow::Cow<'_, str> {
        self.to_string_lossy()
    }
}
