//! The `INFO lock` section: what is held and waited for now (gauges), and
//! counters since the server started or `CONFIG RESETSTAT` (`stats`).

use std::ffi::{c_int, CStr};
use std::sync::atomic::Ordering;

use redis_module::{raw, Context, Status};

use crate::durability::events;
use crate::redis::catch;
use crate::redis::ffi::{self, api};
use crate::state::bindings;
use crate::state::keys;
use crate::state::sessions;
use crate::state::stats;
use crate::state::timers;
use crate::state::waiting;
use crate::time::clock;
use crate::time::fencing;

/// Makes `INFO lock` (and `INFO everything`) show this section.
pub fn register(ctx: &Context) -> Status {
    match api!(RedisModule_RegisterInfoFunc(ctx.ctx, Some(info))) {
        Some(status) if status == raw::REDISMODULE_OK as c_int => Status::Ok,
        _ => Status::Err,
    }
}

/// The `INFO lock` section.
extern "C" fn info(ctx: *mut raw::RedisModuleInfoCtx, for_crash_report: c_int) {
    catch::callback("INFO", (), || {
        if for_crash_report == 0 {
            stats::follow_resetstat(events::own_ctx());
            // A step since the last look is counted before it is shown.
            clock::check_steps(clock::now_ms());
        }
        api!(RedisModule_InfoAddSection(ctx, c"".as_ptr().cast_mut()));
        let add = |name: &CStr, value: i64| {
            api!(RedisModule_InfoAddFieldLongLong(
                ctx,
                name.as_ptr().cast_mut(),
                value
            ));
        };
        if for_crash_report == 0 {
            // Bindings of holders a DEL or an expiry took go first.
            sessions::settle();
        }
        add(c"keys", stats::lock_keys());
        // Holders by mode (`holders_<mode>`); the holders of closed
        // connections not yet ended hold nothing.
        for (mode, gone) in bindings::pending_census().iter() {
            let held = stats::holders_in(mode).saturating_sub(ffi::int(gone));
            add(mode.row().gauge, held.max(0));
        }
        let count = |n: usize| ffi::int(n);
        let fields: [(&CStr, i64); 23] = [
            // Never blocks (INFO also runs while a crash report is written,
            // when a lock may be held): -1 when the count is not available.
            (c"waiters", waiting::total().map_or(-1, count)),
            (c"timer_keys", timers::len().map_or(-1, count)),
            (c"grants", ffi::int(stats::GRANTS.get())),
            (
                c"grants_after_wait",
                ffi::int(stats::GRANTS_AFTER_WAIT.get()),
            ),
            (c"refusals", ffi::int(stats::REFUSALS.get())),
            (c"waits", ffi::int(stats::WAITS.get())),
            (c"wait_timeouts", ffi::int(stats::WAIT_TIMEOUTS.get())),
            (c"grants_sliced", ffi::int(stats::GRANTS_SLICED.get())),
            (c"expired_leases", ffi::int(stats::EXPIRED_LEASES.get())),
            (
                c"releases_not_held",
                ffi::int(stats::RELEASES_NOT_HELD.get()),
            ),
            (c"last_token", ffi::int(fencing::last())),
            (
                c"bound_holders",
                count(bindings::count().saturating_sub(bindings::pending())),
            ),
            (c"bindings_memory", count(bindings::memory())),
            (c"sessions", count(sessions::count())),
            (
                c"releases_on_disconnect",
                ffi::int(stats::RELEASES_ON_DISCONNECT.get()),
            ),
            (c"deadlocks", ffi::int(stats::DEADLOCKS.get())),
            (
                c"deadlock_searches_cut",
                ffi::int(stats::DEADLOCK_SEARCHES_CUT.get()),
            ),
            (
                c"deadlock_searches_sliced",
                ffi::int(stats::DEADLOCK_SEARCHES_SLICED.get()),
            ),
            (
                c"clock_steps_forward",
                ffi::int(clock::STEPS_FORWARD.load(Ordering::Relaxed)),
            ),
            (
                c"clock_steps_back",
                ffi::int(clock::STEPS_BACK.load(Ordering::Relaxed)),
            ),
            (
                c"loaded_state_fixed",
                ffi::int(stats::LOADED_STATE_FIXED.get()),
            ),
            (c"name_lookups", ffi::int(stats::NAME_LOOKUPS.get())),
            (c"name_filter_memory", count(keys::filter_memory())),
        ];
        for (name, value) in fields {
            add(name, value);
        }
        // Distributions: count, sum and cumulative buckets (`le`, ms).
        let histograms: [(&stats::Histogram, [&CStr; 7]); 2] = [
            (
                &stats::WAIT_TIME,
                [
                    c"wait_ms_count",
                    c"wait_ms_sum",
                    c"wait_ms_le_1",
                    c"wait_ms_le_10",
                    c"wait_ms_le_100",
                    c"wait_ms_le_1000",
                    c"wait_ms_le_10000",
                ],
            ),
            (
                &stats::HOLD_TIME,
                [
                    c"hold_ms_count",
                    c"hold_ms_sum",
                    c"hold_ms_le_1",
                    c"hold_ms_le_10",
                    c"hold_ms_le_100",
                    c"hold_ms_le_1000",
                    c"hold_ms_le_10000",
                ],
            ),
        ];
        for (h, [count, sum, le @ ..]) in histograms {
            let (n, total, buckets) = h.cumulative();
            add(count, ffi::int(n));
            add(sum, ffi::int(total));
            for (name, value) in le.iter().zip(buckets) {
                add(name, ffi::int(value));
            }
        }
    })
}
