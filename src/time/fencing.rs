//! The server's fencing-token counter (the rule is `lock_core::tokens`).
//!
//! Two numbers: the last token issued or seen (in a file, from a master),
//! which `INFO lock` shows as `lock_last_token`, and a floor that the
//! skew-margin jumps raise. A transaction issues from a copy floored by both
//! and by the clock (`now_ms * 1000`, a hybrid clock), and only a token it
//! really issues moves the counter: a refused request or a release changes
//! nothing here.
//!
//! A jump is owed only where tokens may have been issued that this server
//! never saw: at start-up (an earlier run's grants after its last save) and
//! at a promotion after something arrived from a master (its grants not yet
//! received). A reload of the server's own save (`DEBUG RELOAD`), a replica's
//! full sync and a promotion with nothing received owe none. A jump starts
//! from the last token issued or seen and the clock, never from the floor an
//! earlier jump left, so jumps never compound where nothing new arrived.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use lock_core::Tokens;

/// The last token issued or seen (`INFO lock` reads it without waiting for
/// anything, even in a crash report). Only Redis's main thread (and a fork's
/// single thread) writes either number: plain atomics, no lock.
static LAST: AtomicU64 = AtomicU64::new(0);
/// The next token is above this (skew-margin jumps, a reloaded save).
static FLOOR: AtomicU64 = AtomicU64::new(0);
/// The server is starting: its first loads are of an earlier run's files.
/// Ends at the event loop's first turn, which comes after the start-up load.
static STARTING: AtomicBool = AtomicBool::new(true);
/// Something came from a master since the last jump.
static RECEIVED: AtomicBool = AtomicBool::new(false);

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

/// Raises the floor to `token` without counting it as seen (the saved
/// counter of a running server's reload of its own file): the next token
/// is above it, and no later jump starts from it.
pub fn raise_floor(token: u64) {
    let mut t = Tokens::starting_after(0);
    t.observe(token);
    FLOOR.fetch_max(t.last(), Ordering::Relaxed);
}

/// Whether the server is still starting (its loads are start-up loads).
pub fn starting() -> bool {
    STARTING.load(Ordering::Relaxed)
}

/// The server is serving: loads from now on are reloads or full syncs.
pub fn started() {
    STARTING.store(false, Ordering::Relaxed);
}

/// Tokens came from a master (its stream, a full sync): a promotion owes a
/// jump past what it may have issued after them.
pub fn received() {
    RECEIVED.store(true, Ordering::Relaxed);
}

/// A load ended: the start-up load owes a jump (an earlier run's unsaved
/// grants); a replica's full sync is something received; a running
/// master's reload of its own file owes nothing.
pub fn loaded(replica: bool, now_ms: u64, margin_ms: u64) {
    if starting() {
        jump_ahead(now_ms, margin_ms);
    } else if replica {
        received();
    }
}

/// This server became a master: a jump is owed if anything came from a
/// master since the last one.
pub fn promoted(now_ms: u64, margin_ms: u64) {
    if RECEIVED.load(Ordering::Relaxed) {
        jump_ahead(now_ms, margin_ms);
    }
}

/// Jumps the floor ahead (`Tokens::jump`) by the configured margin
/// (`lock.clock-skew-ms`), from the last token issued or seen and the clock:
/// at module load, after the start-up load and at a promotion that owes it.
///
/// Why: the counter follows `now_ms * 1000` and issues fewer than 1000 tokens
/// per ms, so tokens issued after the last one saved or replicated are at
/// most `margin * 1000` above it (while a jump keeps the counter ahead of the
/// clock) or at most about `t * 1000` at wall time `t`. A server starting
/// again, or a replica taking over, whose clock is less than `margin` behind
/// the one that issued them starts above both: past what it knows by the
/// margin, and past its own clock by the margin.
pub fn jump_ahead(now_ms: u64, margin_ms: u64) {
    let mut t = Tokens::starting_after(LAST.load(Ordering::Relaxed));
    t.jump(now_ms, margin_ms);
    FLOOR.fetch_max(t.last(), Ordering::Relaxed);
    RECEIVED.store(false, Ordering::Relaxed);
}
