//! Loading the module into Redis: `RedisModule_OnLoad` (in `lib`) calls
//! [`load`] with the command table. Written here rather than with the
//! `redis_module!` macro: the macro also registers global defrag callbacks,
//! and on every server without them (Redis before 8, Valkey) logs a warning
//! at each start although the module asked for nothing of the kind.

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::{raw, Context, RedisResult, RedisString, Status};

use crate::errors::LockError;
use crate::ffi::{self, api, Argv};
use crate::guard;
use crate::log;
use crate::metadata;
use crate::persistence::LOCK_TYPE;
use crate::replies;

/// The C entry point of one command (made by `command!` in `lib`).
pub type Entry =
    extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;

/// One row of the command table.
pub struct Command {
    pub name: &'static CStr,
    pub entry: Entry,
    pub flags: &'static CStr,
    pub first_key: c_int,
    pub last_key: c_int,
    pub key_step: c_int,
}

/// A command handler: its arguments as Redis passed them (nothing copied).
pub type Handler = fn(&Context, Argv<'_>) -> RedisResult;

/// Runs `handler` for one call of command `name`, guarded, and replies (in
/// line in each command's entry point: one call fewer a command).
#[inline(always)]
pub fn run(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    name: &'static CStr,
    handler: Handler,
) -> c_int {
    // Reading the arguments and writing the reply are inside the guard too:
    // nothing of the call runs outside one.
    let context = Context::new(ctx);
    guard::command(
        name,
        || {
            // SAFETY: what Redis passed to this command.
            let args = unsafe { Argv::from_raw(argv, argc) };
            replies::send(&context, handler(&context, args))
        },
        || replies::send(&context, Err(LockError::Internal.into())),
    )
}

/// Makes the C entry point of a command handler: `command!("lock.x",
/// handler, "flags", first_key, last_key, key_step)`.
macro_rules! command {
    ($name:literal, $handler:path, $flags:literal, $first:literal, $last:literal, $step:literal) => {{
        extern "C" fn entry(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::os::raw::c_int,
        ) -> std::os::raw::c_int {
            $crate::module::run(ctx, argv, argc, $name, $handler)
        }
        $crate::module::Command {
            name: $name,
            entry,
            flags: $flags,
            first_key: $first,
            last_key: $last,
            key_step: $step,
        }
    }};
}
pub(crate) use command;

/// Registers the module, its data type and its commands, then runs `init`.
/// Nothing here allocates before `RedisModule_Init`: the Rust heap is
/// Redis's, reachable only after it.
pub fn load(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    commands: &[Command],
    init: fn(&Context, &[RedisString]) -> Status,
) -> c_int {
    const ERR: c_int = raw::REDISMODULE_ERR as c_int;
    // SAFETY: the context Redis passed to RedisModule_OnLoad; a static name.
    let status = unsafe {
        raw::Export_RedisModule_Init(
            ctx,
            c"lock".as_ptr(),
            metadata::MODULE_VERSION,
            raw::REDISMODULE_APIVER_1 as c_int,
        )
    };
    if status == ERR {
        return ERR;
    }
    // From here on the heap is Redis's, and a panic is caught like anywhere
    // else.
    guard::callback("loading the module", ERR, || {
        register(ctx, argv, argc, commands, init)
    })
}

fn register(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    commands: &[Command],
    init: fn(&Context, &[RedisString]) -> Status,
) -> c_int {
    const ERR: c_int = raw::REDISMODULE_ERR as c_int;
    // Every entry `ffi::call!` calls unchecked must be there.
    if let Some(missing) = ffi::required_api_missing() {
        log::warning(&format!(
            "lock: this server lacks {missing}, which the module needs: not loaded"
        ));
        return ERR;
    }
    if LOCK_TYPE.create_data_type(ctx).is_err() {
        return ERR;
    }
    for c in commands {
        let created = api!(RedisModule_CreateCommand(
            ctx,
            c.name.as_ptr(),
            Some(c.entry),
            c.flags.as_ptr(),
            c.first_key,
            c.last_key,
            c.key_step
        ));
        if created != Some(raw::REDISMODULE_OK as c_int) {
            return ERR;
        }
    }
    let context = Context::new(ctx);
    let args = redis_module::decode_args(ctx, argv, argc);
    match init(&context, &args) {
        Status::Ok => raw::REDISMODULE_OK as c_int,
        Status::Err => ERR,
    }
}
