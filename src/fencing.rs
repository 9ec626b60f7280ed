//! The server's fencing-token counter (see `core::tokens` for the rule).

use std::sync::{LazyLock, Mutex, MutexGuard};

use crate::clock;
use crate::core::Tokens;

static TOKENS: LazyLock<Mutex<Tokens>> =
    LazyLock::new(|| Mutex::new(Tokens::from_clock(clock::now_ms())));

/// The counter. Only Redis's main thread (and a fork's single thread) uses it.
pub fn counter() -> MutexGuard<'static, Tokens> {
    TOKENS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
