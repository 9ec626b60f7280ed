//! The pure core: lock state, wait-queue order and fencing tokens.
//!
//! Plain Rust with no FFI and no clock: time is always an argument (`now`,
//! unix milliseconds), so every transition is tested without a server.

pub mod lock;
pub mod queue;
pub mod tokens;

#[cfg(test)]
pub mod fuzz_ops;
#[cfg(test)]
mod model_tests;

pub use lock::{Attempt, Changes, Holder, Invalid, Kind, Lock, Mode, Owner, Release, Request};
pub use queue::Queue;
pub use tokens::Tokens;
