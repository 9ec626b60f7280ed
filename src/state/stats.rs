//! The numbers behind `INFO lock` (shown by `info`): gauges of what is held
//! now, and counters since the server started or `CONFIG RESETSTAT`.
//!
//! Gauges of stored state (keys, holders by mode) move with every write of a
//! lock value, its load and its free (which Redis may run on a background
//! thread, hence atomics). Holders whose lease expired but whom no command or
//! timer has dropped yet still count.

use std::ffi::CStr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use lock_core::{Census, Mode};

use crate::redis::ffi::api;
use crate::redis::log;
use crate::time::clock;

pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }

    pub fn add(&self, n: usize) {
        self.0
            .fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub fn incr(&self) {
        self.add(1);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    fn reset(&self) {
        self.0.store(0, Ordering::Relaxed);
    }
}

/// A distribution of durations in milliseconds: how many, their sum, and how
/// many fell at or under each of [`BUCKETS_MS`] (cumulative, as Prometheus's
/// `le` buckets; the `+Inf` one is the count). One atomic add per bucket
/// boundary crossed is avoided: each duration adds to one bucket, and
/// [`Histogram::cumulative`] sums them when read.
pub struct Histogram {
    count: Counter,
    sum_ms: Counter,
    /// Durations in (previous bound, bound], and the last one above all.
    buckets: [Counter; 6],
}

/// The bucket bounds, ms.
pub const BUCKETS_MS: [u64; 5] = [1, 10, 100, 1_000, 10_000];

impl Histogram {
    const fn new() -> Histogram {
        Histogram {
            count: Counter::new(),
            sum_ms: Counter::new(),
            buckets: [
                Counter::new(),
                Counter::new(),
                Counter::new(),
                Counter::new(),
                Counter::new(),
                Counter::new(),
            ],
        }
    }

    pub fn record(&self, ms: u64) {
        self.count.incr();
        self.sum_ms.add(usize::try_from(ms).unwrap_or(usize::MAX));
        let i = BUCKETS_MS
            .iter()
            .position(|b| ms <= *b)
            .unwrap_or(BUCKETS_MS.len());
        if let Some(b) = self.buckets.get(i) {
            b.incr();
        }
    }

    /// Count, sum (ms), and how many were at or under each bound.
    pub fn cumulative(&self) -> (u64, u64, [u64; 5]) {
        let mut le = [0; 5];
        let mut running = 0;
        for (slot, b) in le.iter_mut().zip(&self.buckets) {
            running += b.get();
            *slot = running;
        }
        (self.count.get(), self.sum_ms.get(), le)
    }

    fn reset(&self) {
        self.count.reset();
        self.sum_ms.reset();
        for b in &self.buckets {
            b.reset();
        }
    }
}

/// How long granted waiters waited, from `WAIT` to the grant.
pub static WAIT_TIME: Histogram = Histogram::new();
/// How long holders held, from the grant to their release, the end of their
/// lease, or their connection closing (`BIND`).
pub static HOLD_TIME: Histogram = Histogram::new();

/// Every counter `CONFIG RESETSTAT` resets (the gauges are state, not stats).
fn counters() -> [&'static Counter; 12] {
    [
        &LOADED_STATE_FIXED,
        &DEADLOCKS,
        &DEADLOCK_SEARCHES_CUT,
        &DEADLOCK_SEARCHES_SLICED,
        &GRANTS,
        &GRANTS_AFTER_WAIT,
        &REFUSALS,
        &WAITS,
        &WAIT_TIMEOUTS,
        &EXPIRED_LEASES,
        &RELEASES_NOT_HELD,
        &RELEASES_ON_DISCONNECT,
    ]
}

/// Stats of the server's that only grow, except when `CONFIG RESETSTAT` sets
/// them back to 0, as last seen.
const MONOTONIC_STATS: [&CStr; 2] = [c"total_connections_received", c"total_commands_processed"];
static SERVER_STATS_SEEN: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// `CONFIG RESETSTAT` resets Redis's own stats and fires no module event (nor
/// does anything else a module can hear without taxing every command), so
/// the module sees it as the server's own growing stats going down, and
/// resets its counters too. Called from the server's cron (`hz` times a
/// second, never per command): the counters follow within one cron tick. A
/// reset can only be missed on a server so young that both stats climb back
/// past their old values within that tick. `INFO lock`, the only reader of
/// the counters, looks too, so a reset between two reads is always seen.
/// A load took lock state in another form than its file's: logged (at most
/// a line a second of each `kind`, with its count), counted.
pub fn fixed_at_load(kind: &log::Throttled, detail: &str) {
    kind.warn(detail);
    LOADED_STATE_FIXED.incr();
}

/// [`follow_resetstat`] while the server's stats were never seen above 0
/// (a cheap check after that).
pub fn look_until_seen() {
    if SERVER_STATS_SEEN
        .iter()
        .all(|seen| seen.load(Ordering::Relaxed) == 0)
    {
        follow_resetstat();
    }
}

pub fn follow_resetstat() {
    // No context: the caller frees the data (as below).
    let null = std::ptr::null_mut();
    let info = api!(RedisModule_GetServerInfo(null, c"stats".as_ptr())).unwrap_or_default();
    if info.is_null() {
        return;
    }
    let mut went_down = false;
    for (name, seen) in MONOTONIC_STATS.iter().zip(&SERVER_STATS_SEEN) {
        let field =
            api!(RedisModule_ServerInfoGetFieldC(info, name.as_ptr())).unwrap_or(std::ptr::null());
        if field.is_null() {
            continue;
        }
        // SAFETY: a NUL-terminated string owned by `info`, read before it is freed.
        let text = unsafe { CStr::from_ptr(field) };
        if let Some(now) = text.to_str().ok().and_then(|t| t.parse::<u64>().ok()) {
            went_down |= now < seen.swap(now, Ordering::Relaxed);
        }
    }
    api!(RedisModule_FreeServerInfo(null, info));
    if went_down {
        for c in counters() {
            c.reset();
        }
        WAIT_TIME.reset();
        HOLD_TIME.reset();
        clock::reset_steps();
    }
}

/// New holders granted (re-entries and retries not counted).
pub static GRANTS: Counter = Counter::new();
/// Of those, granted to a waiting client.
pub static GRANTS_AFTER_WAIT: Counter = Counter::new();
/// Grant requests answered nil at once (held, or others waiting).
pub static REFUSALS: Counter = Counter::new();
/// Requests that started waiting.
pub static WAITS: Counter = Counter::new();
/// Waiting requests that timed out.
pub static WAIT_TIMEOUTS: Counter = Counter::new();
/// Holders whose lease ended by expiry, not release: the sign of a ttl too short.
pub static EXPIRED_LEASES: Counter = Counter::new();
/// Holders released because the connection they were bound to (`BIND`) closed.
pub static RELEASES_ON_DISCONNECT: Counter = Counter::new();
/// Requests answered `DEADLOCK` instead of waiting.
pub static DEADLOCKS: Counter = Counter::new();
/// Deadlock searches given up (the request waited as any other): each
/// cycle they found was gone once checked, `lock_core::deadlock::RESTARTS`
/// times over (the graph kept changing under them).
pub static DEADLOCK_SEARCHES_CUT: Counter = Counter::new();
/// Deadlock searches that needed more than one slice: their request waited
/// while they went on over the next ticks.
pub static DEADLOCK_SEARCHES_SLICED: Counter = Counter::new();
/// RELEASE by an owner holding nothing (never held, expired, someone else's).
pub static RELEASES_NOT_HELD: Counter = Counter::new();
/// Lock state a load took in another form than the file's (a saved counter
/// or a deadline clamped, a key's lock no server can have made dropped):
/// each is also logged.
pub static LOADED_STATE_FIXED: Counter = Counter::new();

static KEYS: AtomicI64 = AtomicI64::new(0);
/// Holders by mode (a semaphore's: its permits), at each mode's slot.
static HOLDERS: [AtomicI64; Mode::COUNT] = [const { AtomicI64::new(0) }; Mode::COUNT];

fn delta(n: usize) -> i64 {
    crate::redis::ffi::int(n)
}

/// How many lock keys exist (values stored, loaded and not yet freed).
pub fn lock_keys() -> i64 {
    KEYS.load(Ordering::Relaxed)
}

/// A lock value appeared (`+1`) or went (`-1`) with these holders.
pub fn value(sign: i64, census: Census) {
    KEYS.fetch_add(sign, Ordering::Relaxed);
    holders(sign, census);
}

/// Holders added (`+1`) or removed (`-1`) in a stored value, by mode.
pub fn holders(sign: i64, census: Census) {
    for (gauge, (_, n)) in HOLDERS.iter().zip(census.iter()) {
        // Most locks hold one mode: no atomic write for the others.
        if n != 0 {
            gauge.fetch_add(sign * delta(n), Ordering::Relaxed);
        }
    }
}

/// The holders of one mode (a semaphore's: its permits).
pub fn holders_in(mode: Mode) -> i64 {
    HOLDERS
        .get(mode.slot())
        .map_or(0, |g| g.load(Ordering::Relaxed))
}
