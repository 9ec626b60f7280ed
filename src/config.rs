//! Module settings.

use std::sync::atomic::{AtomicI64, Ordering};

/// The default longest lease: 30 days, in milliseconds (inclusive).
pub const DEFAULT_MAX_TTL_MS: i64 = 30 * 24 * 3600 * 1000;

static MAX_TTL_MS: AtomicI64 = AtomicI64::new(DEFAULT_MAX_TTL_MS);

/// The longest lease a grant or renewal may ask for.
pub fn max_ttl_ms() -> i64 {
    MAX_TTL_MS.load(Ordering::Relaxed)
}
