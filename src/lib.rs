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

mod args;
mod bindings;
mod clock;
mod commands;
mod config;
mod errors;
mod events;
mod fencing;
mod ffi;
mod guard;
mod info;
mod keys;
mod log;
mod metadata;
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

use redis_module::{redis_module, Context, ModuleOptions, RedisString, Status};

use crate::guard::command as guarded;
use crate::persistence::LOCK_TYPE;

// Under `cargo test` the Redis allocator does not exist: use the system's.
#[cfg(not(test))]
type Allocator = redis_module::alloc::RedisAlloc;
#[cfg(not(test))]
const ALLOCATOR: Allocator = redis_module::alloc::RedisAlloc;
#[cfg(test)]
type Allocator = std::alloc::System;
#[cfg(test)]
const ALLOCATOR: Allocator = std::alloc::System;

fn on_load(ctx: &Context, args: &[RedisString]) -> Status {
    guard::callback("loading the module", Status::Err, || {
        ctx.set_module_options(ModuleOptions::HANDLE_IO_ERRORS);
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

redis_module! {
    name: "lock",
    version: metadata::MODULE_VERSION,
    allocator: (Allocator, ALLOCATOR),
    data_types: [LOCK_TYPE],
    init: on_load,
    commands: [
        // name, handler, flags, first key, last key, key step, ACL categories.
        // Arity, key specs and COMMAND DOCS are in `metadata`.
        // The grants may block (WAIT): flagged as Redis flags BLPOP, not `fast`.
        ["lock.acquire", guarded("lock.acquire", commands::acquire), "write deny-oom blocking", 1, 1, 1, ""],
        ["lock.racquire", guarded("lock.racquire", commands::racquire), "write deny-oom blocking", 1, 1, 1, ""],
        ["lock.read", guarded("lock.read", commands::read), "write deny-oom blocking", 1, 1, 1, ""],
        ["lock.release", guarded("lock.release", commands::release), "write fast", 1, 1, 1, ""],
        ["lock.renew", guarded("lock.renew", commands::renew), "write fast", 1, 1, 1, ""],
        ["lock.info", guarded("lock.info", commands::info), "readonly fast", 1, 1, 1, ""],
        ["lock.keepalive", guarded("lock.keepalive", commands::keepalive), "write fast", 0, 0, 0, ""],
        // Internal: applies one replicated effect (replicas and AOF only).
        ["lock.sync", guarded("lock.sync", sync::sync), "write", 1, 1, 1, ""],
    ],
}
