//! No panic may reach Redis: a panic unwinding into redis-server aborts it and
//! loses every unsaved key. Every entry point Redis calls (commands, type
//! callbacks, timers, event handlers) runs inside one of these guards.

use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw;

use crate::redis::log;

/// A command's run (`name` is the command's: its handler and its reply),
/// the C status it returns. A panic is logged and becomes the error reply
/// `on_panic` sends, itself caught. One catch for the whole command: a
/// panic while a reply is being written (which nothing in `replies` can
/// cause) would add the error reply after what was written.
#[inline(always)]
pub fn command(
    name: &std::ffi::CStr,
    run: impl FnOnce() -> c_int,
    on_panic: impl FnOnce() -> c_int,
) -> c_int {
    catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|_| panicked(name, on_panic))
}

#[cold]
#[inline(never)]
fn panicked(name: &std::ffi::CStr, on_panic: impl FnOnce() -> c_int) -> c_int {
    log::warning(&format!("lock: panic caught in {}", name.to_string_lossy()));
    callback(name, raw::REDISMODULE_ERR as c_int, on_panic)
}

/// A callback body whose panic is logged and turned into `fallback`.
pub fn callback<T>(what: impl Describe, fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| {
        log::warning(&format!("lock: panic caught in {}", what.describe()));
        fallback
    })
}

/// What a caught callback is, for the log (made only when a panic is
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
