//! The server's fencing-token counter (see `core::tokens` for the rule).

use std::sync::{LazyLock, Mutex, MutexGuard};

use crate::clock;
use lock_core::Tokens;

static TOKENS: LazyLock<Mutex<Tokens>> =
    LazyLock::new(|| Mutex::new(Tokens::from_clock(clock::now_ms())));

/// Keeps every new token at or above `now_ms * 1000` (a hybrid clock). A
/// promoted replica then issues tokens above those its old master granted in
/// its last moments but never replicated, and a slot's new master issues
/// tokens above those its old master gave to locks released before the
/// slot moved: both hold as long as servers issue fewer than a thousand
/// tokens per millisecond on average and their clocks roughly agree.
pub fn follow_clock(tokens: &mut Tokens, now_ms: u64) {
    tokens.observe(Tokens::from_clock(now_ms).last());
}

/// The counter. Only Redis's main thread (and a fork's single thread) uses it.
pub fn counter() -> MutexGuard<'static, Tokens> {
    TOKENS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
