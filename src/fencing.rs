//! The server's fencing-token counter (the rule is `lock_core::tokens`).
//!
//! Two numbers: the last token issued or seen (in a file, from a master),
//! which `INFO lock` shows as `lock_last_token`, and a floor that the
//! skew-margin jumps raise. A transaction issues from a copy floored by both
//! and by the clock (`now_ms * 1000`, a hybrid clock), and only a token it
//! really issues moves the counter: a refused request or a release changes
//! nothing here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use lock_core::Tokens;

struct Counter {
    /// Issued or seen.
    tokens: Tokens,
    /// The next token is above this (skew-margin jumps).
    floor: u64,
}

static COUNTER: LazyLock<Mutex<Counter>> = LazyLock::new(|| {
    Mutex::new(Counter {
        tokens: Tokens::starting_after(0),
        floor: 0,
    })
});

/// `tokens.last()`, readable without the lock (INFO, even in a crash report).
static LAST: AtomicU64 = AtomicU64::new(0);

/// Only Redis's main thread (and a fork's single thread) uses it.
fn counter() -> MutexGuard<'static, Counter> {
    COUNTER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Counter {
    fn set_last(&mut self, tokens: Tokens) {
        self.tokens = tokens;
        LAST.store(tokens.last(), Ordering::Relaxed);
    }
}

/// The counter a transaction at `now_ms` issues from: above everything issued
/// or seen, above the jumps' floor and at or above `now_ms * 1000`. Give it
/// back with [`issued`].
pub fn for_transaction(now_ms: u64) -> Tokens {
    let c = counter();
    let mut t = c.tokens;
    t.observe(c.floor);
    t.observe(Tokens::from_clock(now_ms).last());
    t
}

/// What a transaction did with the counter from [`for_transaction`]: if it
/// issued tokens, the last one is now the last issued.
pub fn issued(start: &Tokens, after: &Tokens) {
    if after.last() > start.last() {
        let mut c = counter();
        let mut t = c.tokens;
        t.observe(after.last());
        c.set_last(t);
    }
}

/// A token seen in a file or from the master.
pub fn observe(token: u64) {
    let mut c = counter();
    let mut t = c.tokens;
    t.observe(token);
    c.set_last(t);
}

/// The last token issued or seen.
pub fn last() -> u64 {
    LAST.load(Ordering::Relaxed)
}

/// What the RDB keeps: everything the next token must be above.
pub fn to_save() -> u64 {
    let c = counter();
    c.tokens.last().max(c.floor)
}

/// Jumps the floor ahead (`Tokens::jump`) by the configured margin
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
    let mut c = counter();
    let mut t = Tokens::starting_after(c.tokens.last().max(c.floor));
    t.jump(now_ms, margin_ms);
    c.floor = c.floor.max(t.last());
}
