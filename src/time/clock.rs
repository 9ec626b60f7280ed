//! The server's clock: unix milliseconds, the same clock Redis uses for key
//! expiry. Leases are absolute deadlines on it.
//!
//! A wall clock can be stepped (an NTP correction, an operator, a VM
//! restored from a snapshot). [`check_steps`] compares how far it moved with
//! how far the monotonic clock moved since the last look (at load, every
//! timer tick and `INFO lock`; nothing periodic): a step of more than a second either
//! way is logged and counted (`INFO lock`), never silent. A
//! step forward ends at once every lease it passed; a step back lengthens
//! every lease by as much. Fencing tokens stay unique and increasing either
//! way (`fencing`).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::redis::log;

/// Unix milliseconds from the server: the time its own key expiry uses, so
/// that a lease and its key's TTL end together, inside a transaction too.
/// Redis 7.2+ and Valkey keep a cached time for that (`RM_CachedMicroseconds`,
/// taken before each command and event-loop turn); Redis 7.0 reads the clock
/// (`RM_Milliseconds`). Outside a server (unit tests), the system clock.
///
/// Asking the server rather than the C library also keeps the module on the
/// server's clock where the server loads modules with `RTLD_DEEPBIND`
/// (Valkey, Redis 7.2+): there the module's own libc calls would bypass an
/// interposed clock the server itself uses.
pub fn now_ms() -> u64 {
    // SAFETY: Redis API entries filled by RedisModule_Init; no arguments.
    let cached = unsafe { redis_module::raw::RedisModule_CachedMicroseconds };
    if let Some(us) = cached.map(|f| unsafe { f() }) {
        return u64::try_from(us / 1000).unwrap_or(0);
    }
    // SAFETY: as above.
    let read = unsafe { redis_module::raw::RedisModule_Milliseconds };
    if let Some(ms) = read.map(|f| unsafe { f() }) {
        return u64::try_from(ms).unwrap_or(0);
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The clock as the load under way started (0: no load): values loaded
/// from a file take their time from it, one clock read per load instead
/// of one per key (on Redis 7.0, where each read is a system call's worth).
static LOAD_STARTED: AtomicU64 = AtomicU64::new(0);

/// A load (RDB, AOF, a replica's full sync) starts now, or ended (`false`).
pub fn loading(started: bool) {
    let at = if started { now_ms().max(1) } else { 0 };
    LOAD_STARTED.store(at, Ordering::Relaxed);
}

/// Whether a load (RDB, AOF, a replica's full sync) is under way: a value
/// read now comes from a file or a master, not from a `RESTORE`.
pub fn is_loading() -> bool {
    LOAD_STARTED.load(Ordering::Relaxed) != 0
}

/// The time for a value being loaded: the load's start while a load is
/// under way (a file's tokens were issued before it; a holder's hold time
/// counts from it), otherwise now (`RESTORE`).
pub fn load_time() -> u64 {
    match LOAD_STARTED.load(Ordering::Relaxed) {
        0 => now_ms(),
        started => started,
    }
}

/// A step smaller than this is noise (scheduling, a slow event loop).
const STEP_MS: i64 = 1_000;

static STARTED: OnceLock<Instant> = OnceLock::new();
/// Wall clock minus monotonic clock at the last look (ms); `i64::MIN`: never looked.
static SKEW: AtomicI64 = AtomicI64::new(i64::MIN);
/// Steps seen, forward and back.
pub static STEPS_FORWARD: AtomicU64 = AtomicU64::new(0);
pub static STEPS_BACK: AtomicU64 = AtomicU64::new(0);

/// `CONFIG RESETSTAT`: the step counters start again from 0.
pub fn reset_steps() {
    STEPS_FORWARD.store(0, Ordering::Relaxed);
    STEPS_BACK.store(0, Ordering::Relaxed);
}

/// Looks whether the wall clock `now` (ms) was stepped since the last look.
pub fn check_steps(now: u64) {
    let mono = STARTED.get_or_init(Instant::now).elapsed().as_millis();
    let skew = crate::redis::ffi::int(now).saturating_sub(crate::redis::ffi::int(mono));
    let before = SKEW.swap(skew, Ordering::Relaxed);
    if before == i64::MIN {
        return;
    }
    let step = skew.saturating_sub(before);
    if step > STEP_MS {
        STEPS_FORWARD.fetch_add(1, Ordering::Relaxed);
        log::warning(&format!(
            "lock: the wall clock stepped forward by {step} ms: every lease whose deadline it passed has ended"
        ));
    } else if step < -STEP_MS {
        STEPS_BACK.fetch_add(1, Ordering::Relaxed);
        log::warning(&format!(
            "lock: the wall clock stepped back by {} ms: every lease is that much longer; fencing tokens keep increasing",
            step.unsigned_abs()
        ));
    }
}

/// The module's share of one turn of the event loop (a tick of its timer):
/// the work a tick does (visits, timeouts answered, deadlock searches going
/// on) stops when it is spent, and what is left goes on at the next tick,
/// after Redis has served its clients once.
pub const TURN: std::time::Duration = std::time::Duration::from_micros(800);

/// When the current tick's share ends, in nanoseconds after [`monotonic`]'s
/// origin; `u64::MAX` outside a tick.
static TURN_ENDS: AtomicU64 = AtomicU64::new(u64::MAX);

/// Nanoseconds on the monotonic clock since the first call.
pub fn monotonic() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The CPU time this thread has used, in nanoseconds (the main thread's:
/// what the module's own work costs, whatever the machine's load steals
/// from it in wall time); 0 where it cannot be read.
pub fn thread_cpu_ns() -> u64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: std::os::raw::c_int, t: *mut Timespec) -> std::os::raw::c_int;
    }
    /// `CLOCK_THREAD_CPUTIME_ID` (Linux).
    const THREAD_CPU: std::os::raw::c_int = 3;
    if !cfg!(target_os = "linux") {
        return 0;
    }
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `t` is a valid, writable timespec of the C layout (64-bit
    // Linux); the call writes it and nothing else.
    if unsafe { clock_gettime(THREAD_CPU, &mut t) } != 0 {
        return 0;
    }
    u64::try_from(t.sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(t.nsec).unwrap_or(0))
}

/// Runs a tick's work with its share of the turn ([`TURN`]); after it (a
/// panic included), nothing is in a tick.
pub fn turn<T>(work: impl FnOnce() -> T) -> T {
    struct Ends;
    impl Drop for Ends {
        fn drop(&mut self) {
            TURN_ENDS.store(u64::MAX, Ordering::Relaxed);
        }
    }
    let share = u64::try_from(TURN.as_nanos()).unwrap_or(u64::MAX);
    TURN_ENDS.store(monotonic().saturating_add(share), Ordering::Relaxed);
    let _ends = Ends;
    work()
}

/// Whether the code runs in a tick ([`turn`]).
pub fn in_turn() -> bool {
    TURN_ENDS.load(Ordering::Relaxed) != u64::MAX
}

/// Whether the tick's share of the turn is spent (never outside a tick).
pub fn turn_over() -> bool {
    let ends = TURN_ENDS.load(Ordering::Relaxed);
    ends != u64::MAX && monotonic() >= ends
}
