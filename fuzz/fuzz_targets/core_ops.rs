//! libFuzzer target: the pure lock core (`src/core`) driven by operations
//! decoded from the fuzz input (grants, releases, renewals, WAIT queues,
//! timeouts, visits, replicated SET/DROP effects, clock jumps forward and
//! backward), every invariant checked after every step.
//!
//! The decoder and the checks live in `src/core/fuzz_ops.rs`, shared with the
//! bounded run inside `cargo test` (`core_fuzz_bounded`); the core's files are
//! included by path, so this crate needs neither Redis nor the module's FFI.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../src/core"]
#[allow(dead_code, unused_imports)]
mod lockcore {
    pub mod fuzz_ops;
    pub mod lock;
    pub mod queue;
    pub mod tokens;
}

fuzz_target!(|data: &[u8]| {
    lockcore::fuzz_ops::run(data);
});
