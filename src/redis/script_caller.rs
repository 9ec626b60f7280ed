//! Which connection runs the script now: `LOCK.KEEPALIVE` inside `EVAL` or
//! `FCALL` renews the holders bound to that connection, but the module API
//! gives a command called from a script only the script's own client.
//!
//! A command filter (`RM_RegisterCommandFilter`) sees every command before
//! it runs, with its sender (`RM_CommandFilterGetClientId`, Redis 7.2+ and
//! Valkey): it remembers the last connection that sent a command. A script
//! runs right after its `EVAL`/`FCALL` (or the `EXEC` of a MULTI that
//! queued it) was filtered; the only commands filtered in between come from
//! clients that have no connection: the script's own (`redis.call`), and
//! the temporary clients of other modules' `RM_Call` (this module's own
//! are not filtered, `REDISMODULE_CMDFILTER_NOSELF`). So inside a script
//! the last connection seen is the one running it, as the name check of
//! earlier versions gave (the last sender of a script call or an `EXEC`).
//!
//! Except while the server runs clients' commands in the middle of
//! another (`processEventsWhileBlocked`: a script past
//! `busy-reply-threshold`, another module's `RM_Yield`, loading): there
//! other connections' commands are filtered (and answered `BUSY`) while
//! the script still runs, so the filter falls back to the name check:
//! only a script call or an `EXEC` is remembered, as before. A command
//! postponed by `CLIENT PAUSE` is filtered when it arrives and run later
//! without a filter: a script call postponed so is attributed to the last
//! connection seen before it runs (the name check attributed it to the
//! last script call or `EXEC` seen; neither is exact there).
//!
//! The filter costs every command a call, so it is registered only while
//! some holder is bound ([`follow`]: from the first binding to the event
//! loop's turn after the last one ended): a server without bound holders
//! pays nothing. Its own work on a command is a few loads and a store: the
//! server's `ProcessingEventsWhileBlocked` (its address found once, by
//! `dlsym`), the sender from the filter context, its connection and its id
//! (the layout checked at the filter's first call against
//! `RM_CommandFilterGetClientId` and `RM_GetClientInfoById`; on a server
//! laid out otherwise, or without that symbol, the name check through the
//! API instead). On Redis 7.0, which has no way to name a filtered
//! command's sender, [`caller`] is `None` and `LOCK.KEEPALIVE` in a script
//! is an error reply rather than a silent 0.

use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use redis_module::raw;

use crate::redis::ffi::{self, api};

/// The registered filter, if any.
static FILTER: AtomicPtr<raw::RedisModuleCommandFilter> = AtomicPtr::new(std::ptr::null_mut());

/// The last connection seen sending a command (0: none).
static CALLER: AtomicU64 = AtomicU64::new(0);

/// Whether the filter reads the sender in place: not known yet (its first
/// call looks), yes, or no (the name check through the API).
static MODE: AtomicU8 = AtomicU8::new(MODE_UNKNOWN);
const MODE_UNKNOWN: u8 = 0;
const MODE_IN_PLACE: u8 = 1;
const MODE_BY_CALL: u8 = 2;

/// What the filter's fast path reads first: 0 lets it take the sender in
/// place. It points at [`CLOSED`] until the layout was checked
/// ([`MODE_IN_PLACE`]), then at the server's `ProcessingEventsWhileBlocked`
/// (non-zero while other clients' commands run in the middle of one).
static GATE: AtomicPtr<c_int> = AtomicPtr::new(std::ptr::addr_of!(CLOSED).cast_mut());

/// The gate while the sender is not read in place.
static CLOSED: c_int = 1;

/// Where the sender's connection is in the server's `client`, in bytes
/// ([`learn`]): after its id and flags on Redis 7.2 to 8.x and Valkey up
/// to 8.x, right after its id on Valkey 9.
static CONN_AT: AtomicUsize = AtomicUsize::new(16);

/// The start of the filter context as Redis 7.2 to 8.x and Valkey lay it
/// out (module.c, `RedisModuleCommandFilterCtx`): the arguments, their
/// room, their count, then the sender; read in place only once its first
/// call found the sender there ([`learn`]).
#[repr(C)]
struct FilterCtx {
    argv: *const *mut raw::RedisModuleString,
    argv_len: c_int,
    argc: c_int,
    client: *const u8,
}

/// The sender's id: the first field of the server's `client` (server.h).
///
/// # Safety
///
/// `c` is a live `client`.
#[inline(always)]
unsafe fn id_of(c: *const u8) -> u64 {
    unsafe { c.cast::<u64>().read() }
}

/// The `n`th pointer-sized field from `at` bytes into `p`.
///
/// # Safety
///
/// Those bytes are inside a live object.
#[inline(always)]
unsafe fn word(p: *const u8, at: usize) -> *const u8 {
    unsafe { p.add(at).cast::<*const u8>().read() }
}

extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

/// The server's `ProcessingEventsWhileBlocked` (networking.c, an `int`
/// the server exports: it is linked `-rdynamic`), if found.
fn events_while_blocked() -> *mut c_int {
    // SAFETY: a lookup by a NUL-terminated name in the global scope
    // (RTLD_DEFAULT, the null handle on Linux); nothing is called.
    unsafe {
        dlsym(
            std::ptr::null_mut(),
            c"ProcessingEventsWhileBlocked".as_ptr(),
        )
    }
    .cast()
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

/// The filter's first call: whether the sender read in place is the API's
/// (the same id) and where its connection is, checked: a connection
/// exactly when the server knows the client by its id (only connections
/// are in its clients' index), and one whose `private_data` (connection.h
/// `connection`: at 32 bytes, after its type, state, last error, socket,
/// flags, references and vector count) is the client; and the server's
/// `ProcessingEventsWhileBlocked` found. Valkey 9's `client` is told
/// apart by its arguments and their count at 32 and 40 bytes (the same as
/// the filter context's), its connection then at 8.
#[cold]
fn learn(fctx: *mut raw::RedisModuleCommandFilterCtx) -> u8 {
    let gate = events_while_blocked();
    let Some(id) = api!(RedisModule_CommandFilterGetClientId(fctx)) else {
        return MODE_BY_CALL;
    };
    if gate.is_null() {
        return MODE_BY_CALL;
    }
    let known = api!(RedisModule_GetClientInfoById(std::ptr::null_mut(), id))
        .is_some_and(|r| r == raw::REDISMODULE_OK as c_int);
    // SAFETY: every server with `RM_CommandFilterGetClientId` (the only
    // ones the filter is registered on) keeps the sender's address at
    // offset 16 of the context (the API reads it there); the client's
    // first six words are inside it on each of them; the connection is
    // read only when it is a connection's (the server knows the client by
    // its id), its sixth word inside it.
    let conn_at = unsafe {
        let f = fctx.cast::<FilterCtx>().cast_const();
        let c = (*f).client;
        if c.is_null() || id_of(c) != id {
            return MODE_BY_CALL;
        }
        let valkey9 = word(c, 32).cast::<*mut raw::RedisModuleString>() == (*f).argv
            && c.add(40).cast::<c_int>().read() == (*f).argc;
        let conn_at: usize = if valkey9 { 8 } else { 16 };
        let conn = word(c, conn_at);
        let same = match (known, conn.is_null()) {
            (true, false) => word(conn, 32) == c,
            (false, true) => true,
            _ => false,
        };
        if !same {
            return MODE_BY_CALL;
        }
        conn_at
    };
    CONN_AT.store(conn_at, Ordering::Relaxed);
    GATE.store(gate, Ordering::Relaxed);
    MODE_IN_PLACE
}

extern "C" fn on_command(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    // No panic can happen here (no indexing, no unwrap); nothing to catch.
    // Every command of every client comes here while some holder is bound:
    // three loads to find its sender, one to find its connection, and the
    // sender's id stored if it has one.
    // SAFETY: the gate is `CLOSED` or the server's live `int`.
    if unsafe { *GATE.load(Ordering::Relaxed) } != 0 {
        return on_command_slow(fctx);
    }
    // SAFETY: the gate is open only once the layout was seen to be the
    // API's (`learn`); the server passes a live context whose sender is
    // the live client that sent the command.
    unsafe {
        let c = (*fctx.cast::<FilterCtx>().cast_const()).client;
        if !word(c, CONN_AT.load(Ordering::Relaxed)).is_null() {
            CALLER.store(id_of(c), Ordering::Relaxed);
        }
    }
}

/// [`on_command`] while the gate is closed: its first call (which looks
/// whether the sender can be read in place), a server laid out otherwise,
/// or one running other clients' commands in the middle of one: the name
/// check, through the API.
#[cold]
#[inline(never)]
fn on_command_slow(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    if fctx.is_null() {
        return;
    }
    if MODE.load(Ordering::Relaxed) == MODE_UNKNOWN {
        let mode = learn(fctx);
        MODE.store(mode, Ordering::Relaxed);
        if mode == MODE_IN_PLACE {
            // The gate just opened (or is the server's, open or not): this
            // command as the next ones.
            return on_command(fctx);
        }
    }
    let arg = api!(RedisModule_CommandFilterArgGet(fctx, 0)).unwrap_or_default();
    if arg.is_null() {
        return;
    }
    if runs_scripts(ffi::name_of(arg)) {
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
