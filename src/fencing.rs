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

/// Jumps the counter ahead (`Tokens::jump`) by the configured margin
/// (`lock.clock-skew-ms`): at load, after loading a file (RDB, AOF, a
/// replica's full sync) and when this server becomes a master.
///
/// Why: the counter follows `now_ms * 1000` and issues fewer than 1000 tokens
/// per ms, so tokens issued after the last one saved or replicated are at
/// most `margin * 1000` above it (while a jump keeps the counter ahead of the
/// clock) or at most about `t * 1000` at wall time `t`. A server starting
/// again, or a replica taking over, whose clock is less than `margin` behind
/// the one that issued them starts above both: past what it knows by the
/// margin, and past its own clock by the margin.
pub fn jump_ahead(now_ms: u64, margin_ms: u64) {
    counter().jump(now_ms, margin_ms);
}
