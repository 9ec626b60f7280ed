//! libFuzzer target: the pure lock core (`lock-core`) driven by operations
//! decoded from the fuzz input (grants, releases, renewals, WAIT queues,
//! timeouts, visits, replicated SET/DROP effects, clock jumps forward and
//! backward), every invariant checked after every step.
//!
//! The decoder and the checks live in `lock-core/src/fuzz_ops.rs`, shared
//! with the bounded run inside `cargo test` (`core_fuzz_bounded`); the
//! `lock-core` crate needs neither Redis nor the module's FFI.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    lock_core::fuzz_ops::run(data);
});
