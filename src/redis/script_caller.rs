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
//! Why by name, and not simply the last connection that sent any command
//! (which would spare reading the name: the scripts' own `redis.call`s and
//! other modules' `RM_Call`s pass the filter too, but from clients without
//! a connection): a command postponed (`CLIENT PAUSE`, `FAILOVER`, a
//! module's yield that holds clients back) passes the filter when it
//! arrives and runs later without passing it again, so any other
//! connection's command meanwhile (a read during `CLIENT PAUSE WRITE`, the
//! `CLIENT UNPAUSE` itself) would become the script's caller; by name,
//! only another script call or `EXEC` does. Likewise while a script past
//! `busy-reply-threshold` runs: other connections' commands pass the
//! filter (then get `BUSY`).
//!
//! The filter costs every command a call, so it is registered only while
//! some holder is bound ([`follow`]: from the first binding to the event
//! loop's turn after the last one ended): a server without bound holders
//! pays nothing. Its own work on a command that runs no script is a few
//! loads: the arguments read from the filter context in place (its layout
//! checked against `RM_CommandFilterArgsCount`/`ArgGet` at its first call,
//! the calls used instead if they differ) and the name's first byte in
//! place (`ffi::Strings::bytes`: the filter registered is the one built for
//! this server's strings, Redis's or Valkey's, inline), `e` or `f` told in
//! one compare; only those read further ([`on_e_or_f`]), and only a name
//! that starts with `ev`, `exe` or `fc` read whole. On Redis 7.0, which has no way to name a filtered command's
//! sender, [`caller`] is `None` and `LOCK.KEEPALIVE` in a script is an
//! error reply rather than a silent 0.

use std::os::raw::c_int;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use redis_module::raw;

use crate::redis::ffi::{self, api};
use crate::redis::shared::MainCell;

/// The registered filter, if any.
static FILTER: AtomicPtr<raw::RedisModuleCommandFilter> = AtomicPtr::new(std::ptr::null_mut());

/// The last connection seen sending a script call or an EXEC (0: none).
static CALLER: AtomicU64 = AtomicU64::new(0);

/// How the filter reads a command's arguments: not known yet (its first
/// call looks), from the filter context in place ([`FilterArgs`]), or
/// through the API. The name's first bytes are read by the reader of this
/// server's strings (`ffi::Strings`: the filter registered is the one
/// built for it).
/// Main thread only (filters run there, or in a thread that holds the
/// server's lock: another module's `RM_Call` from a thread-safe context).
static ARGS: MainCell<u8> = MainCell::new(ARGS_UNKNOWN);
const ARGS_IN_PLACE: u8 = 0;
const ARGS_UNKNOWN: u8 = 1;
const ARGS_BY_CALL: u8 = 2;

/// The start of the filter context as Redis 7.2 to 8.x and Valkey lay it
/// out (module.c, `RedisModuleCommandFilterCtx`: the arguments, their
/// room, their count, then the sender): read in place only once its first
/// call found the same arguments and count as the API's
/// ([`learn_args`]).
#[repr(C)]
struct FilterArgs {
    argv: *const *mut raw::RedisModuleString,
    argv_len: c_int,
    argc: c_int,
}

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
            let on_command: raw::RedisModuleCommandFilterFunc = match ffi::strings() {
                ffi::Layout::Redis => Some(on_command::<ffi::RedisStrings>),
                ffi::Layout::Valkey => Some(on_command::<ffi::ValkeyStrings>),
                ffi::Layout::ByCall => Some(on_command::<ffi::StringsByCall>),
            };
            let filter = api!(RedisModule_RegisterCommandFilter(ctx, on_command, flags))
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

/// Whether `name` starts a script that may write or runs queued commands
/// (`EVAL_RO`, `EVALSHA_RO` and `FCALL_RO` cannot run `LOCK.KEEPALIVE`, a
/// write command, and are still recognised: the caller stays exact).
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

/// The filter's first call: whether the context's fields read in place
/// give what the API gives (the count, the first and the last argument).
#[cold]
fn learn_args(fctx: *mut raw::RedisModuleCommandFilterCtx) -> u8 {
    let by_api = (
        api!(RedisModule_CommandFilterArgsCount(fctx)),
        api!(RedisModule_CommandFilterArgGet(fctx, 0)),
    );
    let (Some(argc), Some(first)) = by_api else {
        return ARGS_BY_CALL;
    };
    if argc < 1 || first.is_null() {
        // Nothing to compare: look again at the next command.
        return ARGS_UNKNOWN;
    }
    let last = api!(RedisModule_CommandFilterArgGet(fctx, argc - 1)).unwrap_or_default();
    // SAFETY: every server with `RM_CommandFilterGetClientId` (the only
    // ones the filter is registered on) starts the context with the
    // argument array's address and keeps the count at offset 12; the
    // array is read only after the count read there was the API's.
    let same = unsafe {
        let f = fctx.cast::<FilterArgs>().cast_const();
        (*f).argc == argc
            && *(*f).argv == first
            && usize::try_from(argc - 1).is_ok_and(|i| *(*f).argv.add(i) == last)
    };
    match same {
        true => ARGS_IN_PLACE,
        false => ARGS_BY_CALL,
    }
}

extern "C" fn on_command<S: ffi::Strings>(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    // No panic can happen here (no indexing, no unwrap); nothing to catch.
    // Every command of every client comes here while some holder is bound:
    // its name's first byte read in place, and only `e...` and `f...`
    // looked at further ([`on_e_or_f`]). (The server passes the context
    // it built on its stack, never null: `moduleCallCommandFilters`.)
    if ARGS.get() != ARGS_IN_PLACE {
        return on_command_by_call(fctx);
    }
    // SAFETY: the layout was seen to be the API's (`learn_args`); the
    // first argument is read only while there is one.
    let f = fctx.cast::<FilterArgs>().cast_const();
    if unsafe { (*f).argc } < 1 {
        return;
    }
    let arg = unsafe { *(*f).argv };
    // SAFETY: `arg` is the live string Redis is about to run; `S` is the
    // reader chosen at load for this server's strings.
    let Some(p) = (unsafe { S::bytes(arg) }) else {
        return runs_script(fctx, arg);
    };
    // `e` or `f`, whatever the case, in one compare. SAFETY: the name's
    // `sds` buffer, NUL-terminated: its first byte is there.
    let first = unsafe { *p } | 0x20;
    if first.wrapping_sub(b'e') <= 1 {
        on_e_or_f(fctx, arg, p, first);
    }
}

/// [`on_command`] for a name that starts with `e` or `f` (`first`,
/// lower-cased): its next bytes, as [`may_run_scripts`] reads them.
#[cold]
#[inline(never)]
fn on_e_or_f(
    fctx: *mut raw::RedisModuleCommandFilterCtx,
    arg: *mut raw::RedisModuleString,
    p: *const u8,
    first: u8,
) {
    // SAFETY: the name's `sds` buffer, NUL-terminated: a byte is read only
    // after the one before it was a letter.
    if e_or_f_may_run_scripts(first, |i| unsafe { *p.add(i) }) {
        runs_script(fctx, arg);
    }
}

/// [`may_run_scripts`] for a name whose first byte, lower-cased, is
/// `first` (`e` or `f`): its next bytes from `at`, read one after the
/// other as there.
#[inline(always)]
fn e_or_f_may_run_scripts(first: u8, at: impl Fn(usize) -> u8) -> bool {
    let at = |i: usize| at(i) | 0x20;
    let second = at(1);
    match first {
        b'f' => second == b'c',
        _ => second == b'v' || (second == b'x' && at(2) == b'e'),
    }
}

/// Whether a command name whose bytes `at` gives (NUL-terminated) may
/// start a script or run queued ones, by its first bytes: `ev...` (EVAL,
/// EVALSHA and their `_RO`), `exe...` (EXEC; not EXPIRE, EXISTS), `fc...`
/// (FCALL, FCALL_RO; not FLUSHDB, FUNCTION). Lower-cased, a NUL reads as
/// a space: a byte is read only after the one before it matched a letter,
/// so none past the name's end.
#[inline(always)]
fn may_run_scripts(at: impl Fn(usize) -> u8) -> bool {
    let at = |i: usize| at(i) | 0x20;
    match at(0) {
        b'e' => match at(1) {
            b'v' => true,
            b'x' => at(2) == b'e',
            _ => false,
        },
        b'f' => at(1) == b'c',
        _ => false,
    }
}

/// [`on_command`] while the context is not read in place: its first call
/// (which looks whether it can be), or a server laid out otherwise; the
/// name through `ffi::name_of`.
#[inline(never)]
extern "C" fn on_command_by_call(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    if ARGS.get() == ARGS_UNKNOWN {
        ARGS.set(learn_args(fctx));
    }
    // (Learnt in place just now: the next calls read so.)
    let arg = api!(RedisModule_CommandFilterArgGet(fctx, 0)).unwrap_or_default();
    if !arg.is_null() {
        runs_script(fctx, arg);
    }
}

/// A command whose name may start a script (or not read by the filter's
/// first look): its sender remembered if it does. The name through
/// `ffi::name_of`, told apart by its length and first bytes first.
#[inline(never)]
fn runs_script(fctx: *mut raw::RedisModuleCommandFilterCtx, arg: *mut raw::RedisModuleString) {
    let name = ffi::name_of(arg);
    if (4..=10).contains(&name.len()) && may_run_scripts(|i| name.get(i).copied().unwrap_or(0)) {
        remember_if_script(fctx, name);
    }
}

fn remember_if_script(fctx: *mut raw::RedisModuleCommandFilterCtx, name: &[u8]) {
    if runs_scripts(name) {
        if let Some(id) = api!(RedisModule_CommandFilterGetClientId(fctx)) {
            CALLER.store(id, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name that starts a script or runs queued commands, in mixed
    /// cases.
    const SCRIPT_CALLS: [&str; 7] = [
        "EVAL",
        "evalsha",
        "Eval_Ro",
        "EVALSHA_RO",
        "fcall",
        "FCALL_RO",
        "exec",
    ];

    #[test]
    fn script_calls_and_exec_are_recognised_whatever_their_case() {
        for name in SCRIPT_CALLS {
            assert!(runs_scripts(name.as_bytes()), "{name}");
        }
        for name in ["GET", "EVALX", "MULTI", "", "lock.keepalive"] {
            assert!(!runs_scripts(name.as_bytes()), "{name}");
        }
    }

    #[test]
    fn the_first_bytes_let_through_every_script_call_and_few_others() {
        let first = |name: &str| {
            let bytes: Vec<u8> = name.bytes().chain([0]).collect();
            may_run_scripts(|i| bytes.get(i).copied().unwrap_or(0xff))
        };
        for name in SCRIPT_CALLS {
            assert!(first(name), "{name}");
        }
        for name in [
            "SET", "EXPIRE", "EXISTS", "EXPIREAT", "FLUSHDB", "FUNCTION", "ECHO", "e", "f", "",
        ] {
            assert!(!first(name), "{name}");
        }
    }

    #[test]
    fn the_filters_split_look_answers_as_the_whole_one() {
        // The first byte in one compare, then the next ones: the same
        // answer as `may_run_scripts` for every name.
        for name in SCRIPT_CALLS.into_iter().chain([
            "SET", "EXPIRE", "EXISTS", "EXPIREAT", "FLUSHDB", "FUNCTION", "ECHO", "GETEX", "DEL",
            "e", "f", "E", "F", "ex", "fc", "ev", "d", "g", "", "\x05", "\x06",
        ]) {
            let bytes: Vec<u8> = name.bytes().chain([0]).collect();
            let at = |i: usize| bytes.get(i).copied().unwrap_or(0xff);
            let first = at(0) | 0x20;
            let split = first.wrapping_sub(b'e') <= 1 && e_or_f_may_run_scripts(first, at);
            assert_eq!(split, may_run_scripts(at), "{name}");
        }
    }
}
