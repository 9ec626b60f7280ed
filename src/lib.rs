//! redis-lock: native distributed locks for Redis.
//!
//! This file is the table of contents: the layers, the commands one line
//! each, and the load. The lock state machine is the `lock-core` crate (pure
//! Rust, no FFI). The shell around it is five folders, lowest first, each
//! using only those before it (docs/design.md, "Layers"): `redis` (the
//! boundary: the module API, the heap, the log, the panic catch around
//! every entry point), `time` (the clock, the fencing counter), `state` (a
//! lock key's storage, transitions, waiting, bindings, deadlocks, timers),
//! `durability` (RDB, AOF, replicated effects applied, server events) and
//! `commands` (syntax, the lock commands, `LOCK.GUARD`, `INFO lock`).

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

// The folders, one per layer (lowest first: redis, time, state,
// durability, commands; docs/design.md, "Layers"), and the registration.
// The commands: syntax, the lock commands, `LOCK.GUARD`, `INFO lock`.
mod commands;
// What outlives a command: RDB and AOF, replicated effects applied,
// keyspace events from the rest of the server.
mod durability;
// Registration: commands, metadata and the data type, at load.
mod module;
// The boundary with Redis: its API without panics, its heap, log,
// configuration, replies, effects sent to replicas, and what a command is.
mod redis;
// A lock key's state in the shell: storage, transitions, waiting,
// bindings, deadlocks, timers and their visits, counters.
mod state;
// Time and tokens: the clock and the fencing counter.
mod time;

use std::os::raw::c_int;

use redis_module::{raw, Context, ContextFlags, ModuleOptions, RedisString, Status};

use crate::commands::guard;
use crate::commands::info_section;
use crate::commands::lock;
use crate::commands::session;
use crate::durability::apply;
use crate::durability::events;
use crate::durability::persistence::LOCK_TYPE;
use crate::redis::catch;
use crate::redis::config;
use crate::redis::log;
use crate::redis::replication;
use crate::redis::shared;
use crate::redis::spec::Spec;
use crate::state::keys;
use crate::state::stats;
use crate::state::timers;
use crate::state::visits;
use crate::time::clock;
use crate::time::fencing;

// The Rust heap is Redis's (counted in `used_memory`); under `cargo test`,
// where there is no Redis, the system's.
#[cfg(not(test))]
#[global_allocator]
static ALLOCATOR: crate::redis::alloc::RedisHeap = crate::redis::alloc::RedisHeap;

/// The commands, each declared once beside its handler (`spec::command!`).
const COMMANDS: &[Spec] = &[
    lock::ACQUIRE,
    lock::RACQUIRE,
    lock::READ,
    lock::SEMAPHORE,
    lock::MACQUIRE,
    lock::RELEASE,
    lock::RENEW,
    lock::INFO,
    lock::KEEPALIVE,
    guard::GUARD,
    // The container first, then its subcommands.
    session::SESSION,
    session::OPEN,
    session::KEEPALIVE,
    session::CLOSE,
    session::INFO,
    session::SYNC,
    session::LEASE_SYNC,
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
    catch::callback("loading the module", Status::Err, || {
        shared::main_thread_is_this();
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
            info_section::register(ctx),
        ];
        if steps.contains(&Status::Err) {
            return Status::Err;
        }
        events::start(ctx);
        log::init(events::own_ctx());
        // What a `CONFIG RESETSTAT` takes away from now on, and where the
        // wall clock stands (`INFO lock` and the timer look again).
        stats::follow_resetstat(events::own_ctx());
        clock::check_steps(clock::now_ms());
        // Above every token an earlier run can have issued (its saved
        // counter, loaded next, can only raise this).
        fencing::jump_ahead(clock::now_ms(), config::clock_skew_ms());
        Status::Ok
    })
}
