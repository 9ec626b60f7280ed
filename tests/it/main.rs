//! The integration tests, one binary: one link against the dependencies,
//! the harness (`tests/common/`) compiled once, a module per area. Run one
//! area with `cargo test --test it AREA::` (e.g. `cargo test --test it
//! bind::`). The long runs (`soak`, the `sentinel` chaos, the `live_fuzz`
//! at length) are `#[ignore]`d here and started by their `make` targets.

#[path = "../common/mod.rs"]
mod common;

mod bind;
mod bind_closed;
mod bind_lease;
mod clients;
mod cluster;
mod commands;
mod cycles;
mod deadlock;
mod docs;
mod ecosystem;
mod faults;
mod fencing;
mod flush;
mod forged;
mod go_package;
mod guard;
mod holder_wait;
mod holders;
mod jepsen;
mod keyspace;
mod layers;
mod live_fuzz;
mod log_flood;
mod macquire;
mod metadata;
mod packages;
mod persistence;
mod prometheus;
mod python_package;
mod references;
mod release_token;
mod replication;
mod rust_package;
mod semaphore;
mod sentinel;
mod session;
mod setup;
mod soak;
mod waiting;
