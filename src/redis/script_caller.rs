//! Which connection runs the script now: `LOCK.KEEPALIVE` inside `EVAL` or
//! `FCALL` renews the holders bound to that connection, but the module API
//! gives a command called from a script only the script's own client.
//!
//! A command filter (`RM_RegisterCommandFilter`) sees every command before
//! it runs, with its sender (`RM_CommandFilterGetClientId`, Redis 7.2+ and
//! Valkey): it remembers the last connection that sent a script call
//! (`EVAL`, `EVALSHA`, `FCALL` and their `_RO` forms) or an `EXEC` (a
//! script queued in MULTI runs at its EXEC). Scripts run one at a time,
//! each right after its filter call, so inside a script that connection is
//! the one running it.
//!
//! The filter costs every command a call, so it is registered only while
//! some holder is bound ([`follow`]): a server without bound holders pays
//! nothing. On Redis 7.0, which has no way to name a filtered command's
//! sender, [`caller`] is `None` and `LOCK.KEEPALIVE` in a script is an
//! error reply rather than a silent 0.

use std::os::raw::c_int;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use redis_module::raw;

use crate::redis::ffi::{self, api};

/// The registered filter, if any.
static FILTER: AtomicPtr<raw::RedisModuleCommandFilter> = AtomicPtr::new(std::ptr::null_mut());

/// The last connection seen sending a script call or an EXEC (0: none).
static CALLER: AtomicU64 = AtomicU64::new(0);

/// Whether this server can name a filtered command's sender.
pub fn supported() -> bool {
    // SAFETY: reading an entry RedisModule_Init filled (or left empty).
    unsafe { raw::RedisModule_CommandFilterGetClientId }.is_some()
}

/// Registers the filter (`on`) or unregisters it, through the module's own
/// context `ctx`; nothing when it is already so, or on a server that
/// cannot name the sender.
pub fn follow(ctx: *mut raw::RedisModuleCtx, on: bool) {
    if ctx.is_null() || !supported() {
        return;
    }
    let current = FILTER.load(Ordering::Relaxed);
    match (on, current.is_null()) {
        (true, true) => {
            let flags = c_int::try_from(raw::REDISMODULE_CMDFILTER_NOSELF).unwrap_or(0);
            let filter = api!(RedisModule_RegisterCommandFilter(
                ctx,
                Some(on_command),
                flags
            ))
            .unwrap_or(std::ptr::null_mut());
            FILTER.store(filter, Ordering::Relaxed);
        }
        (false, false) => {
            api!(RedisModule_UnregisterCommandFilter(ctx, current));
            FILTER.store(std::ptr::null_mut(), Ordering::Relaxed);
            CALLER.store(0, Ordering::Relaxed);
        }
        _ => {}
    }
}

/// The connection running the script now, when a script runs and this
/// server can tell.
pub fn caller() -> Option<u64> {
    match FILTER.load(Ordering::Relaxed).is_null() {
        true => None,
        false => Some(CALLER.load(Ordering::Relaxed)).filter(|id| *id != 0),
    }
}

/// Whether `name` starts a script or runs queued commands.
fn runs_scripts(name: &[u8]) -> bool {
    const NAMES: [&[u8]; 7] = [
        b"eval",
        b"evalsha",
        b"eval_ro",
        b"evalsha_ro",
        b"fcall",
        b"fcall_ro",
        b"exec",
    ];
    name.len() <= 10 && NAMES.iter().any(|n| n.eq_ignore_ascii_case(name))
}

extern "C" fn on_command(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    // No panic can happen here (no indexing, no unwrap); nothing to catch.
    // Every command of every client comes here while some holder is bound:
    // the name read in place where the server allows it (`ffi::name_of`),
    // and most names told apart by their length and first byte.
    let Some(arg) = api!(RedisModule_CommandFilterArgGet(fctx, 0)) else {
        return;
    };
    if arg.is_null() {
        return;
    }
    let name = ffi::name_of(arg);
    if !(4..=10).contains(&name.len()) || !matches!(name.first(), Some(b'e' | b'E' | b'f' | b'F')) {
        return;
    }
    if runs_scripts(name) {
        if let Some(id) = api!(RedisModule_CommandFilterGetClientId(fctx)) {
            CALLER.store(id, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_calls_and_exec_are_recognised_whatever_their_case() {
        for name in [
            "EVAL",
            "evalsha",
            "Eval_Ro",
            "EVALSHA_RO",
            "fcall",
            "FCALL_RO",
            "exec",
        ] {
            assert!(runs_scripts(name.as_bytes()), "{name}");
        }
        for name in ["GET", "EVALX", "MULTI", "", "lock.keepalive"] {
            assert!(!runs_scripts(name.as_bytes()), "{name}");
        }
    }
}
