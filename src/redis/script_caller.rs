//! Which connection runs the script now: `LOCK.KEEPALIVE` inside `EVAL` or
//! `FCALL` renews the holders bound to that connection, but the module API
//! gives a command called from a script only the script's own client.
//!
//! The server keeps that connection where it runs commands from:
//! `server.current_client`, "the client that triggered the command
//! execution" (Redis 7.0 to 8.2 and Valkey, `server.h`). It is the
//! connection whose `EVAL`, `FCALL` or `EXEC` runs now, set when its
//! command runs (so also for a command postponed by `CLIENT PAUSE` and run
//! later), while a script's own commands and other modules' `RM_Call`s run
//! as clients of their own, which it never holds; between commands
//! (timers, the event loop) it is null. `server` is the server's global,
//! exported by its executable (both link with `-rdynamic`), its size in
//! the symbol table ([`ffi::server_global`]).
//!
//! The field's place differs by version and build, so it is learnt, and
//! checked, from a command a connection sends itself ([`learn`], at its
//! first `BIND`: nothing can be renewed in a script before a binding):
//! its client, as the command's context holds it ([`ffi::ctx_client`]), is
//! both the connection the server lists under the command's client id
//! (`RM_GetClientInfoById`: not a script's, a module's or the AOF's
//! client) and the server's current client; the first word of the global
//! that holds it is that field (it comes before every other client field:
//! `executing_client` right after it on Redis 7.2+ and Valkey, the primary
//! link's further on); the client's first word is its id (`client.id`),
//! checked against `RM_GetClientId`. A script's caller is then one load
//! and its id one more ([`caller`]), with nothing for any other command
//! of any client: no command filter (which, before issue 39.3's end,
//! remembered the last sender of a script call at the cost of a call on
//! every command of every client while a holder was bound, and could not
//! be exact for a script call postponed by `CLIENT PAUSE`).
//!
//! Where the field cannot be learnt (the global not exported, or never
//! holding a connection's own client), [`caller`] says so and
//! `LOCK.KEEPALIVE` in a script is an error reply rather than a silent 0.

use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use redis_module::raw;

use crate::redis::ffi::{self, api};

/// `server.current_client`'s address, once learnt ([`learn`]); null
/// before.
static FIELD: AtomicPtr<*const u64> = AtomicPtr::new(std::ptr::null_mut());

/// Whether learning is over for good: the field learnt, or the server's
/// global not to be found (then never looked for again).
static SETTLED: AtomicBool = AtomicBool::new(false);

/// The field was not learnt: this server does not name a script's caller
/// to the module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unknown;

/// Learns where the server keeps its current client from `ctx`, a command
/// a connection may have sent itself (not from a script: the caller checks
/// the context's flags; not through `LOCK.GUARD`); nothing once learnt,
/// or when `ctx`'s client is not such a connection (another module's
/// `RM_Call`, the AOF's client: learnt at a later one).
pub fn learn(ctx: *mut raw::RedisModuleCtx) {
    if SETTLED.load(Ordering::Relaxed) {
        return;
    }
    learn_now(ctx);
}

#[cold]
#[inline(never)]
fn learn_now(ctx: *mut raw::RedisModuleCtx) {
    let Some((server, words)) = ffi::server_global() else {
        SETTLED.store(true, Ordering::Relaxed);
        crate::redis::log::warning(
            "lock: the server does not export its state: LOCK.KEEPALIVE in a script is an error reply",
        );
        return;
    };
    let id = match api!(RedisModule_GetClientId(ctx)) {
        Some(id) if id != 0 => id,
        _ => return,
    };
    // A connection the server lists (a script's, a module's or the AOF's
    // client is not listed).
    let listed = api!(RedisModule_GetClientInfoById(std::ptr::null_mut(), id));
    if listed != Some(raw::REDISMODULE_OK as std::os::raw::c_int) {
        return;
    }
    let client = ffi::ctx_client(ctx);
    if client.is_null() || client.align_offset(8) != 0 {
        return;
    }
    // SAFETY: `words` words from `server`, the global's size in the
    // symbol table; read as plain words, nothing dereferenced.
    let at = (0..words).find(|&i| unsafe { server.add(i).read() } == client as u64);
    let Some(at) = at else {
        return;
    };
    // SAFETY: `client` is held both by the command's context and by the
    // server's global: the live client running this command, whose first
    // word is its id on every server this module supports (checked here).
    if unsafe { client.read() } != id {
        return;
    }
    // SAFETY: inside the global, as above.
    let field = unsafe { server.add(at) }.cast_mut().cast::<*const u64>();
    FIELD.store(field, Ordering::Relaxed);
    SETTLED.store(true, Ordering::Relaxed);
}

/// The connection running the script that calls the command of `ctx` now
/// (`None`: no connection's command runs it, as a script a timer runs);
/// [`Unknown`] when this server does not tell.
pub fn caller(ctx: *mut raw::RedisModuleCtx) -> Result<Option<u64>, Unknown> {
    let field = FIELD.load(Ordering::Relaxed);
    if field.is_null() {
        return Err(Unknown);
    }
    // SAFETY: the field learnt inside the server's global: a client's
    // address or null, read on the thread that runs commands.
    let client = unsafe { field.read() };
    if client.is_null() {
        return Ok(None);
    }
    if client == ffi::ctx_client(ctx) {
        // The script's own client: the field learnt is not the caller's
        // (never seen on a supported server). Say so rather than name the
        // script's client.
        FIELD.store(std::ptr::null_mut(), Ordering::Relaxed);
        crate::redis::log::warning(
            "lock: the server's current client is the script's own: LOCK.KEEPALIVE in a script is an error reply",
        );
        return Err(Unknown);
    }
    // SAFETY: a live client of the server (it frees a client only after
    // clearing this field of it); its first word is its id (checked at
    // `learn`).
    Ok(Some(unsafe { client.read() }))
}
