//! Loading the module into Redis: `RedisModule_OnLoad` (in `lib`) calls
//! [`load`] with the command table. Written here rather than with the
//! `redis_module!` macro: the macro also registers global defrag callbacks,
//! and on every server without them (Redis before 8, Valkey) logs a warning
//! at each start although the module asked for nothing of the kind.

use std::ffi::CString;
use std::os::raw::c_int;

use redis_module::{raw, Context, RedisString, Status};

use crate::durability::persistence::LOCK_TYPE;
use crate::redis::catch;
use crate::redis::ffi::{self, api};
use crate::redis::log;
use crate::redis::metadata;
use crate::redis::spec::Spec;

/// Registers the module, its data type and its commands, then runs `init`.
/// Nothing here allocates before `RedisModule_Init`: the Rust heap is
/// Redis's, reachable only after it.
pub fn load(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    commands: &[Spec],
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
    catch::callback("loading the module", ERR, || {
        if register(ctx, commands).is_none() {
            return ERR;
        }
        let context = Context::new(ctx);
        let args = redis_module::decode_args(ctx, argv, argc);
        match init(&context, &args) {
            Status::Ok => raw::REDISMODULE_OK as c_int,
            Status::Err => ERR,
        }
    })
}

/// The data type, then each command, registered and described; `None` when
/// Redis refuses one.
fn register(ctx: *mut raw::RedisModuleCtx, commands: &[Spec]) -> Option<()> {
    // Every entry `ffi::call!` calls unchecked must be there.
    if let Some(missing) = ffi::required_api_missing() {
        log::warning(&format!(
            "lock: this server lacks {missing}, which the module needs: not loaded"
        ));
        return None;
    }
    LOCK_TYPE.create_data_type(ctx).ok()?;
    // A large block's memory let go of is freed off the event loop.
    lock_core::set_free_elsewhere(crate::redis::alloc::free_elsewhere);
    for c in commands {
        let flags = CString::new(c.flags()).ok()?;
        let (first, last, step) = c.keys.positions();
        let created = match c.container_of() {
            // `container|sub`: a subcommand of the container registered
            // before it.
            Some((container, sub)) => {
                let container = CString::new(container).ok()?;
                let sub = CString::new(sub).ok()?;
                let parent = api!(RedisModule_GetCommand(ctx, container.as_ptr()))
                    .filter(|p| !p.is_null())?;
                api!(RedisModule_CreateSubcommand(
                    parent,
                    sub.as_ptr(),
                    Some(c.entry),
                    flags.as_ptr(),
                    first,
                    last,
                    step
                ))
            }
            // A container (some command is named `its-name|...`): Redis
            // runs its subcommands, never it.
            None if commands.iter().any(|s| s.is_subcommand_of(c)) => {
                api!(RedisModule_CreateCommand(
                    ctx,
                    c.name.as_ptr(),
                    None,
                    c"".as_ptr(),
                    0,
                    0,
                    0
                ))
            }
            None => api!(RedisModule_CreateCommand(
                ctx,
                c.name.as_ptr(),
                Some(c.entry),
                flags.as_ptr(),
                first,
                last,
                step
            )),
        };
        if created != Some(raw::REDISMODULE_OK as c_int) {
            log::warning(&format!(
                "lock: Redis refused the command {}",
                c.name.to_string_lossy()
            ));
            return None;
        }
    }
    match metadata::describe(&Context::new(ctx), commands) {
        Status::Ok => Some(()),
        Status::Err => None,
    }
}
