//! The numbers behind `INFO lock` (shown by `info`): gauges of what is held
//! now, and counters since the server started or `CONFIG RESETSTAT`.
//!
//! Gauges of stored state (keys, holders by mode) move with every write of a
//! lock value, its load and its free (which Redis may run on a background
//! thread, hence atomics). Holders whose lease expired but whom no command or
//! timer has dropped yet still count.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, AtomicU64, Ordering};
use std::sync::Mutex;

use redis_module::raw;

use lock_core::{Census, Mode};

use crate::redis::catch;
use crate::redis::ffi::api;
use crate::redis::log;
use crate::redis::shared;
use crate::state::keys;
use crate::time::clock;

pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }

    pub fn add(&self, n: usize) {
        look_soon();
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

/// The bucket bounds, ms (the core's: a lock's hold times summed up,
/// `lock_core::lock::Held`, are in these buckets).
pub const BUCKETS_MS: [u64; 5] = lock_core::lock::HELD_BOUNDS_MS;

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

    /// Many durations at once, summed up by the core (a lock whose every
    /// lease ran out: no walk of its holders when it keeps them so).
    pub fn record_all(&self, held: &lock_core::lock::Held) {
        self.count
            .add(usize::try_from(held.count).unwrap_or(usize::MAX));
        self.sum_ms
            .add(usize::try_from(held.sum_ms).unwrap_or(usize::MAX));
        for (b, n) in self.buckets.iter().zip(held.buckets) {
            b.add(usize::try_from(n).unwrap_or(usize::MAX));
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
fn counters() -> [&'static Counter; 14] {
    [
        &GRANTS_SLICED,
        &LOADED_STATE_FIXED,
        &NAME_LOOKUPS,
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

/// `CONFIG RESETSTAT` resets Redis's own stats and fires no module event
/// (nor does anything else a module can hear without taxing every command).
/// Redis's command stats count every call of the module's internal command
/// (`LOCK.SYNC`), and so does the module (`spec::internal_calls`): between
/// two looks Redis's count grows by at least the module's, unless it was
/// reset. Every look ends with a call of the module's own (a no-op: the
/// command refuses a call that is not the master's stream), so that there is
/// always something a reset takes away: a reset is seen at the next look
/// however many calls follow it, the first one after start-up included (the
/// module looks once at load).
///
/// Looks: at every `INFO lock` (the only reader of the counters), before
/// the first change of a counter after ten quiet seconds, and every second
/// from then until the counters stood still for ten seconds (one timer):
/// what a counter counted between a reset and the look that sees it (at
/// most a second's changes) is reset with the rest. A server whose counters
/// do not move runs nothing.
static SEEN: Mutex<(u64, u64)> = Mutex::new((0, 0));

/// A load took lock state in another form than its file's: logged (at most
/// a line a second of each `kind`, with its count), counted.
pub fn fixed_at_load(kind: &log::Throttled, detail: &str) {
    kind.warn(detail);
    LOADED_STATE_FIXED.incr();
}

/// Redis's count of `LOCK.SYNC` calls (its `INFO commandstats`), `None` when
/// it cannot be read.
fn server_internal_calls(ctx: *mut raw::RedisModuleCtx) -> Option<u64> {
    let info = api!(RedisModule_GetServerInfo(ctx, c"commandstats".as_ptr()))?;
    if info.is_null() {
        return None;
    }
    let field = api!(RedisModule_ServerInfoGetFieldC(
        info,
        c"cmdstat_lock.sync".as_ptr()
    ))
    .unwrap_or(std::ptr::null());
    // Absent: never called since the last reset.
    let calls = match field.is_null() {
        true => Some(0),
        // SAFETY: a NUL-terminated string owned by `info`, read before it is freed.
        false => unsafe { CStr::from_ptr(field) }
            .to_bytes()
            .split(|b| *b == b',')
            .find_map(|kv| kv.strip_prefix(b"calls="))
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok()),
    };
    api!(RedisModule_FreeServerInfo(ctx, info));
    calls
}

/// One call of the internal command, refused (it changes nothing, is not
/// replicated, and is not an error reply Redis counts: `RedisModule_Call`'s
/// replies are the module's), so that Redis's count has one call a reset
/// would take away.
fn mark(ctx: *mut raw::RedisModuleCtx) {
    let empty = c"".as_ptr();
    let reply = api!(RedisModule_Call(
        ctx,
        c"lock.sync".as_ptr(),
        c"ccc".as_ptr(),
        empty,
        empty,
        empty
    ));
    if let Some(reply) = reply.filter(|r| !r.is_null()) {
        api!(RedisModule_FreeCallReply(reply));
    }
}

/// Looks whether Redis reset its stats since the last look, and resets the
/// counters if so (at `INFO lock`, and once at load). `ctx`: a context of
/// the module's own.
pub fn follow_resetstat(ctx: *mut raw::RedisModuleCtx) {
    if ctx.is_null() {
        return;
    }
    OWN_CTX.store(ctx, Ordering::Relaxed);
    CHANGED.store(false, Ordering::Relaxed);
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    let (server_then, ours_then) = *seen;
    let Some(server) = server_internal_calls(ctx) else {
        return;
    };
    let ours = crate::redis::spec::internal_calls();
    if server < server_then.saturating_add(ours.saturating_sub(ours_then)) {
        for c in counters() {
            c.reset();
        }
        WAIT_TIME.reset();
        HOLD_TIME.reset();
        clock::reset_steps();
    }
    mark(ctx);
    // Redis counts the module's own call as the module does (every server
    // the module supports; tests/it/ecosystem.rs).
    let after = crate::redis::spec::internal_calls();
    *seen = (server.saturating_add(after.saturating_sub(ours)), after);
}

/// The module's own context (the last one a look was given), for the timer.
static OWN_CTX: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());
/// Whether a look is planned (a counter moved less than a second ago).
static LOOK_PLANNED: AtomicBool = AtomicBool::new(false);
/// Whether a counter moved since the last look.
static CHANGED: AtomicBool = AtomicBool::new(false);
/// Looks in a row that found no counter moved; the timer stops after
/// [`QUIET_LOOKS_KEPT`] of them.
static QUIET_LOOKS: AtomicU64 = AtomicU64::new(0);
const QUIET_LOOKS_KEPT: u64 = 10;
const LOOK_AFTER_MS: i64 = 1_000;

/// A counter is about to move. The first change after ten quiet seconds
/// looks first (a reset before it is seen before it counts), and plans a
/// look a second later, which plans the next until counters stood still for
/// ten looks: under load, even with pauses, the looks are the timer's, none
/// in a command. Changes
/// meanwhile cost two atomic loads. (Counters move on Redis's main thread
/// only; gauges, which a free on a background thread moves, plan nothing.)
#[inline]
fn look_soon() {
    #[cold]
    #[inline(never)]
    fn look_and_plan() {
        let ctx = OWN_CTX.load(Ordering::Relaxed);
        if ctx.is_null() {
            LOOK_PLANNED.store(false, Ordering::Relaxed);
            return;
        }
        // Not in the middle of a load (a value's load callback counts what
        // it fixed): the timer looks after it.
        let flags = api!(RedisModule_GetContextFlags(ctx)).unwrap_or(0);
        if u32::try_from(flags).unwrap_or(0) & raw::REDISMODULE_CTX_FLAGS_LOADING == 0 {
            follow_resetstat(ctx);
        }
        plan(ctx);
    }
    if !LOOK_PLANNED.load(Ordering::Relaxed) && !LOOK_PLANNED.swap(true, Ordering::Relaxed) {
        look_and_plan();
    }
    if !CHANGED.load(Ordering::Relaxed) {
        CHANGED.store(true, Ordering::Relaxed);
    }
}

/// A look a second from now ([`LOOK_PLANNED`] is set).
fn plan(ctx: *mut raw::RedisModuleCtx) {
    let planned = api!(RedisModule_CreateTimer(
        ctx,
        LOOK_AFTER_MS,
        Some(on_look),
        std::ptr::null_mut()
    ));
    if planned.is_none() {
        LOOK_PLANNED.store(false, Ordering::Relaxed);
    }
}

extern "C" fn on_look(_raw_ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    catch::callback("the RESETSTAT look", (), || {
        let ctx = OWN_CTX.load(Ordering::Relaxed);
        follow_resetstat(ctx);
        // Counters moved since the last look, or did not for a few looks
        // only: the next in a second (a pause in a steady load then costs
        // its next command no look); after that, nothing.
        let quiet = match CHANGED.swap(false, Ordering::Relaxed) {
            true => 0,
            false => QUIET_LOOKS.load(Ordering::Relaxed) + 1,
        };
        QUIET_LOOKS.store(quiet, Ordering::Relaxed);
        match quiet < QUIET_LOOKS_KEPT {
            true => plan(ctx),
            false => LOOK_PLANNED.store(false, Ordering::Relaxed),
        }
    })
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
/// Visits of a queue whose answers went on at the next turn (10,000
/// readers granted together: sliced on a time budget).
pub static GRANTS_SLICED: Counter = Counter::new();
/// RELEASE by an owner holding nothing (never held, expired, someone else's).
pub static RELEASES_NOT_HELD: Counter = Counter::new();
/// Lock state a load took in another form than the file's (a saved counter
/// or a deadline clamped, a key's lock no server can have made dropped):
/// each is also logged.
pub static LOADED_STATE_FIXED: Counter = Counter::new();
/// Keys the keyspace callback opened to see whether they hold a lock (the
/// name filter said "maybe": locks, and names it could not tell apart).
pub static NAME_LOOKUPS: Counter = Counter::new();

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
    let before = KEYS.fetch_add(sign, Ordering::Relaxed);
    if (before == 0 || before + sign == 0) && shared::on_main_thread() {
        // (A count may fall to 0 on the thread that frees a flushed
        // database's values: `keys::NO_LOCKS` allows for it.)
        keys::locks_exist(before + sign > 0);
    }
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
