//! redis-lock: native distributed locks for Redis.
//!
//! This file is the table of contents: the module, its data type and its
//! commands, one line each. The lock state machine is the `lock-core` crate
//! (pure Rust, no FFI). The shell around it parses (`args`), runs, commits
//! and writes back (`commands`, `guarded`, `transitions`, `keys`), replicates
//! (`replication`, `apply`), persists (`persistence`), waits (`waiting`),
//! keeps time (`timers`), hears about keys freed by other commands
//! (`events`) and describes itself to Redis (`metadata`, from each command's
//! one declaration: `spec`). Every entry point Redis calls is guarded
//! (`guard`).

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
mod apply;
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
mod guarded;
mod info;
mod keys;
mod log;
mod metadata;
mod module;
mod persistence;
mod replication;
mod replies;
mod shared;
mod spec;
mod stats;
mod timers;
mod transitions;
mod txn;
mod visits;
mod waiting;

use std::os::raw::c_int;

use redis_module::{raw, Context, ContextFlags, ModuleOptions, RedisString, Status};

use crate::persistence::LOCK_TYPE;
use crate::spec::Spec;

// The Rust heap is Redis's (counted in `used_memory`); under `cargo test`,
// where there is no Redis, the system's.
#[cfg(not(test))]
#[global_allocator]
static ALLOCATOR: alloc::RedisHeap = alloc::RedisHeap;

/// The commands, each declared once beside its handler (`spec::command!`).
const COMMANDS: &[Spec] = &[
    commands::ACQUIRE,
    commands::RACQUIRE,
    commands::READ,
    commands::SEMAPHORE,
    commands::MACQUIRE,
    commands::RELEASE,
    commands::RENEW,
    commands::INFO,
    commands::KEEPALIVE,
    guarded::GUARD,
    // Internal: applies one replicated effect (replicas and AOF only).
    apply::SYNC,
];

/// Redis loads the module here.
#[no_mangle]
pub extern "C" fn RedisModule_OnLoad(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    module::load(ctx, argv, argc, COMMANDS, on_load)
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
