//! redis-lock: native distributed locks for Redis.
//!
//! This file is the table of contents: the module, its data type and its
//! commands, one line each. The lock state machine is the `lock-core` crate
//! (pure Rust, no FFI). The shell around it parses (`args`), runs and writes back
//! (`commands`, `store`, `keys`), replicates (`replication`), persists
//! (`persistence`), waits (`waiting`), keeps time (`timers`), hears about
//! keys freed by other commands (`events`) and describes itself to Redis
//! (`metadata`). Every entry point Redis calls is guarded (`guard`).

#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

#[cfg_attr(test, allow(dead_code))]
mod alloc;
mod args;
mod bindings;
mod clock;
mod commands;
mod config;
mod deadlocks;
mod errors;
mod events;
mod fencing;
mod ffi;
mod guard;
mod info;
mod keys;
mod log;
mod metadata;
mod module;
mod persistence;
mod replication;
mod replies;
mod stats;
mod store;
mod sync;
mod timers;
mod txn;
mod visits;
mod waiting;

use std::os::raw::c_int;

use redis_module::{raw, Context, ContextFlags, ModuleOptions, RedisString, Status};

use crate::module::{command, Command};
use crate::persistence::LOCK_TYPE;

// The Rust heap is Redis's (counted in `used_memory`); under `cargo test`,
// where there is no Redis, the system's.
#[cfg(not(test))]
#[global_allocator]
static ALLOCATOR: alloc::RedisHeap = alloc::RedisHeap;

/// The commands: name, handler, flags, first key, last key, key step. Arity,
/// key specs, ACL categories and COMMAND DOCS are in `metadata`.
const COMMANDS: [Command; 10] = [
    // The grants may block (WAIT): flagged as Redis flags BLPOP, not `fast`.
    command!(
        c"lock.acquire",
        commands::acquire,
        c"write deny-oom blocking",
        1,
        1,
        1
    ),
    command!(
        c"lock.racquire",
        commands::racquire,
        c"write deny-oom blocking",
        1,
        1,
        1
    ),
    command!(
        c"lock.read",
        commands::read,
        c"write deny-oom blocking",
        1,
        1,
        1
    ),
    command!(
        c"lock.semaphore",
        commands::semaphore,
        c"write deny-oom blocking",
        1,
        1,
        1
    ),
    // Its keys are found from numkeys: by its key spec (`metadata`) for
    // COMMAND GETKEYS and ACLs, by the command itself for cluster routing.
    command!(
        c"lock.macquire",
        commands::macquire,
        c"write deny-oom blocking getkeys-api",
        0,
        0,
        0
    ),
    command!(c"lock.release", commands::release, c"write fast", 1, 1, 1),
    command!(c"lock.renew", commands::renew, c"write fast", 1, 1, 1),
    command!(c"lock.info", commands::info, c"readonly fast", 1, 1, 1),
    // Not `fast`: it renews every holder bound to the connection, O(B)
    // (docs/design.md, "Bound locks").
    command!(c"lock.keepalive", commands::keepalive, c"write", 0, 0, 0),
    // Internal: applies one replicated effect (replicas and AOF only).
    command!(c"lock.sync", sync::sync, c"write", 1, 1, 1),
];

/// Redis loads the module here.
#[no_mangle]
pub extern "C" fn RedisModule_OnLoad(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    module::load(ctx, argv, argc, &COMMANDS, on_load)
}

fn on_load(ctx: &Context, args: &[RedisString]) -> Status {
    guard::callback("loading the module", Status::Err, || {
        ctx.set_module_options(ModuleOptions::HANDLE_IO_ERRORS);
        replication::set_replica(ctx.get_flags().contains(ContextFlags::SLAVE));
        keys::set_type(*LOCK_TYPE.raw_type.borrow());
        if !timers::init(ctx) {
            return Status::Err;
        }
        timers::set_handler(visits::tick);
        let steps = [
            config::register(ctx, args),
            metadata::describe(ctx),
            events::subscribe(ctx),
            info::register(ctx),
        ];
        if steps.contains(&Status::Err) {
            return Status::Err;
        }
        // Above every token an earlier run can have issued (its saved
        // counter, loaded next, can only raise this).
        fencing::jump_ahead(clock::now_ms(), config::clock_skew_ms());
        Status::Ok
    })
}
