//! The server's fencing-token counter (the rule is `lock_core::tokens`).
//!
//! Two numbers: the last token issued or seen (in a file, from a master),
//! which `INFO lock` shows as `lock_last_token`, and a floor that the
//! skew-margin jumps raise. A transaction issues from a copy floored by both
//! and by the clock (`now_ms * 1000`, a hybrid clock), and only a token it
//! really issues moves the counter: a refused request or a release changes
//! nothing here.

use std::sync::atomic::{AtomicU64, Ordering};

use lock_core::Tokens;

/// The last token issued or seen (`INFO lock` reads it without waiting for
/// anything, even in a crash report). Only Redis's main thread (and a fork's
/// single thread) writes either number: plain atomics, no lock.
static LAST: AtomicU64 = AtomicU64::new(0);
/// The next token is above this (skew-margin jumps).
static FLOOR: AtomicU64 = AtomicU64::new(0);

/// The counter a transaction at `now_ms` issues from: above everything issued
/// or seen, above the jumps' floor and at or above `now_ms * 1000`. Give it
/// back with [`issued`].
pub fn for_transaction(now_ms: u64) -> Tokens {
    let mut t = Tokens::starting_after(LAST.load(Ordering::Relaxed));
    t.observe(FLOOR.load(Ordering::Relaxed));
    t.observe(Tokens::from_clock(now_ms).last());
    t
}

/// What a transaction did with the counter from [`for_transaction`]: if it
/// issued tokens, the last one is now the last issued.
pub fn issued(start: &Tokens, after: &Tokens) {
    if after.last() > start.last() {
        observe(after.last());
    }
}

/// A token seen in a file or from the master.
pub fn observe(token: u64) {
    let mut t = Tokens::starting_after(0);
    t.observe(token);
    // A load sees a new highest token rarely (keys come in hash order):
    // a plain read first spares every other key a locked update.
    if t.last() > LAST.load(Ordering::Relaxed) {
        LAST.fetch_max(t.last(), Ordering::Relaxed);
    }
}

/// The last token issued or seen.
pub fn last() -> u64 {
    LAST.load(Ordering::Relaxed)
}

/// What the RDB keeps: everything the next token must be above.
pub fn to_save() -> u64 {
    LAST.load(Ordering::Relaxed)
        .max(FLOOR.load(Ordering::Relaxed))
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
    let mut t = Tokens::starting_after(to_save());
    t.jump(now_ms, margin_ms);
    FLOOR.fetch_max(t.last(), Ordering::Relaxed);
}
