//! The pure core of redis-lock: lock state, wait-queue order and fencing
//! tokens.
//!
//! Plain Rust with no FFI and no clock: time is always an argument (`now`,
//! unix milliseconds), so every transition is tested without a server. This
//! crate does not depend on `redis-module`: the compiler, not a convention,
//! keeps it pure.

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

mod block;
pub mod chunked;
pub mod deadlock;
pub mod effect;
pub mod hash;
pub mod lease;
pub mod lock;
mod mode;
pub mod queue;
pub mod shards;
pub mod tokens;

pub use block::{set_free_elsewhere, Garbage, HolderRef};
pub use lock::{
    max_holders, set_max_holders, since, Applied, Aside, Ask, Attempt, Changes, Ended, Holder,
    Invalid, Kind, Loaded, Lock, Owner, Release, Request,
};
pub use mode::{Census, Mode, Row};
pub use queue::{Queue, Settling};
pub use tokens::Tokens;
