//! Module settings, through the module config API (Redis 7.0+): set as
//! `loadmodule` arguments (`loadmodule libredis_lock.so max-ttl 60000`), as
//! `lock.<name> value` lines in redis.conf, or with `CONFIG SET lock.<name>`;
//! read with `CONFIG GET lock.*`. Bounds are checked by Redis.

use std::ffi::{c_char, c_int, c_longlong, c_void, CStr};
use std::sync::atomic::{AtomicI64, Ordering};

use redis_module::{raw, Context, RedisString, Status};

use crate::redis::catch;
use crate::redis::ffi::api;
use crate::redis::log;

/// One numeric setting.
pub struct Setting {
    /// The name after `lock.`.
    pub name: &'static CStr,
    pub min: i64,
    pub max: i64,
    value: AtomicI64,
    /// For the tests only: left out of `CONFIG GET lock.*` (read by its
    /// full name) and of docs/commands.md's table.
    hidden: bool,
}

impl Setting {
    const fn new(name: &'static CStr, default: i64, min: i64, max: i64) -> Setting {
        Setting {
            name,
            min,
            max,
            value: AtomicI64::new(default),
            hidden: false,
        }
    }

    /// A setting for the tests only ([`Setting::hidden`]).
    const fn testing(name: &'static CStr, default: i64, min: i64, max: i64) -> Setting {
        Setting {
            hidden: true,
            ..Setting::new(name, default, min, max)
        }
    }

    pub fn get(&self) -> i64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// The longest lease a grant or renewal may ask for, in ms (default 30 days).
pub static MAX_TTL: Setting = Setting::new(c"max-ttl", 30 * 24 * 3600 * 1000, 1, 3_153_600_000_000);

/// The most requests that may wait for one key; a WAIT beyond it is refused
/// with an error (0: nobody may wait).
pub static MAX_WAITERS: Setting = Setting::new(c"max-waiters", 10_000, 0, 1_000_000_000);

/// How far (ms) a server's wall clock may be behind another's, or behind its
/// own earlier run, without a fencing token ever repeating or going back: at
/// start-up and at promotion the token counter jumps this far ahead.
pub static CLOCK_SKEW: Setting = Setting::new(c"clock-skew-ms", 60_000, 0, 86_400_000);

/// The most holders one lock may have (readers, a semaphore's permits): a
/// grant that would add one more is refused with an error, and so is a
/// RESTORE of a lock with more. Every operation on a key costs time linear
/// in its holders at worst; this keeps each one short.
pub static MAX_HOLDERS: Setting = Setting::new(
    c"max-holders",
    lock_core::lock::DEFAULT_MAX_HOLDERS as i64,
    1,
    1_000_000,
);

/// `lock.max-sessions`: the most sessions (`LOCK.SESSION OPEN`) a server
/// holds at once; an OPEN past it is refused.
pub static MAX_SESSIONS: Setting = Setting::new(c"max-sessions", 100_000, 0, 100_000_000);

/// `lock.debug-grants-per-slice`, for the tests only: a visit of a queue
/// also ends its slice after this many answers (0: the time budget alone,
/// `waiting`'s), and so does a slice of a key's waiters answered an error
/// (`waiting::fail_all`), so that slicing is seen at any speed.
pub static DEBUG_GRANTS_PER_SLICE: Setting =
    Setting::testing(c"debug-grants-per-slice", 0, 0, 1_000_000);

const SETTINGS: [&Setting; 6] = [
    &MAX_TTL,
    &MAX_WAITERS,
    &CLOCK_SKEW,
    &MAX_HOLDERS,
    &MAX_SESSIONS,
    &DEBUG_GRANTS_PER_SLICE,
];

pub fn max_ttl_ms() -> i64 {
    MAX_TTL.get()
}

pub fn clock_skew_ms() -> u64 {
    u64::try_from(CLOCK_SKEW.get()).unwrap_or(0)
}

/// The bounds on a lease's deadline at `now` (unix ms): the latest a grant
/// can set (`now + lock.max-ttl`), and the latest a payload, a file or the
/// stream may carry (that plus `lock.clock-skew-ms`: a server whose clock
/// is ahead may have set it). `RESTORE` refuses past the second; a load
/// clamps to the first.
pub fn deadline_bounds(now: u64) -> (u64, u64) {
    let latest = now.saturating_add(u64::try_from(max_ttl_ms()).unwrap_or(u64::MAX));
    (latest, latest.saturating_add(clock_skew_ms()))
}

pub fn max_waiters() -> usize {
    usize::try_from(MAX_WAITERS.get()).unwrap_or(0)
}

/// The most holders one lock may have (`lock.max-holders`): what a load
/// or a RESTORE checks a lock's holder count against. Grants read the
/// core's copy ([`lock_core::max_holders`]), kept equal to this by every
/// change of the setting.
pub fn max_sessions() -> usize {
    usize::try_from(MAX_SESSIONS.get()).unwrap_or(0)
}

/// [`DEBUG_GRANTS_PER_SLICE`]: 0 when off.
pub fn debug_grants_per_slice() -> usize {
    usize::try_from(DEBUG_GRANTS_PER_SLICE.get()).unwrap_or(0)
}

pub fn max_holders() -> usize {
    usize::try_from(MAX_HOLDERS.get()).unwrap_or(1)
}

impl Setting {
    /// Stores a new value, and passes it on to the core where it reads it.
    fn store(&self, value: i64) {
        self.value.store(value, Ordering::Relaxed);
        if std::ptr::eq(self, &MAX_HOLDERS) {
            lock_core::set_max_holders(usize::try_from(value).unwrap_or(1));
        }
    }
}

extern "C" fn get(_name: *const c_char, privdata: *mut c_void) -> c_longlong {
    catch::callback("CONFIG GET", 0, || {
        // SAFETY: privdata is one of the static settings above.
        unsafe { privdata.cast::<Setting>().as_ref() }.map_or(0, Setting::get)
    })
}

extern "C" fn set(
    _name: *const c_char,
    value: c_longlong,
    privdata: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    catch::callback("CONFIG SET", raw::REDISMODULE_ERR as c_int, || {
        // SAFETY: as in `get`. Redis has checked the bounds.
        if let Some(setting) = unsafe { privdata.cast::<Setting>().as_ref() } {
            setting.store(value);
        }
        raw::REDISMODULE_OK as c_int
    })
}

/// Reads `name value` pairs given to `loadmodule`; an unknown name or a value
/// that is not an integer in range fails the load, with the reason logged.
fn defaults_from_args(args: &[RedisString]) -> Result<(), String> {
    let mut it = args.iter();
    while let Some(name) = it.next() {
        let setting = SETTINGS
            .iter()
            .find(|s| s.name.to_bytes().eq_ignore_ascii_case(name.as_slice()))
            .ok_or_else(|| format!("unknown module argument '{}'", log::quoted(name.as_slice())))?;
        let value = it
            .next()
            .ok_or_else(|| format!("'{}' needs a value", log::quoted(name.as_slice())))?
            .parse_integer()
            .ok()
            .filter(|v| (setting.min..=setting.max).contains(v))
            .ok_or_else(|| {
                format!(
                    "'{}' must be an integer from {} to {}",
                    log::quoted(name.as_slice()),
                    setting.min,
                    setting.max
                )
            })?;
        setting.store(value);
    }
    Ok(())
}

/// Registers every setting (defaults from the `loadmodule` arguments), then
/// applies `lock.*` lines of the config file.
pub fn register(ctx: &Context, args: &[RedisString]) -> Status {
    if let Err(e) = defaults_from_args(args) {
        log::warning(&format!("lock: {e}"));
        return Status::Err;
    }
    // SAFETY: reads a function pointer RedisModule_Init filled (or left None).
    if unsafe { raw::RedisModule_RegisterNumericConfig }.is_none() {
        // Before Redis 7.0: the settings keep their defaults.
        return Status::Ok;
    }
    for setting in SETTINGS {
        let status = api!(RedisModule_RegisterNumericConfig(
            ctx.ctx,
            setting.name.as_ptr(),
            setting.get(),
            match setting.hidden {
                true => raw::REDISMODULE_CONFIG_HIDDEN,
                false => raw::REDISMODULE_CONFIG_DEFAULT,
            },
            setting.min,
            setting.max,
            Some(get),
            Some(set),
            None,
            std::ptr::from_ref(setting).cast_mut().cast::<c_void>()
        ));
        if status != Some(raw::REDISMODULE_OK as c_int) {
            log::warning(&format!(
                "lock: could not register the setting {}",
                setting.name.to_string_lossy()
            ));
            return Status::Err;
        }
    }
    let status = match api!(RedisModule_LoadConfigs(ctx.ctx)) {
        Some(status) if status != raw::REDISMODULE_OK as c_int => Status::Err,
        _ => Status::Ok,
    };
    // The core's copy of the limit, whatever set it (argument, file).
    lock_core::set_max_holders(max_holders());
    status
}
