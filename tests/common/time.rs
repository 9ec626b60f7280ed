//! Time: the wall clock in ms, polling until a condition holds, sleeping.

use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The current wall-clock time in unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Polls `f` every few ms until it returns true; panics with `what` after `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    loop {
        if f() {
            return;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        thread::sleep(Duration::from_millis(5));
    }
}

pub fn sleep_ms(ms: u64) {
    thread::sleep(Duration::from_millis(ms));
}
