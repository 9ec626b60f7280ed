//! libFuzzer target: the pure lock core (`lock-core`) driven by operations
//! decoded from the fuzz input (grants, releases, renewals, WAIT queues,
//! timeouts, visits, replicated SET/DROP effects, clock jumps forward and
//! backward), every invariant checked after every step.
//!
//! The decoder (`lock-core/model/src/op.rs`) and the one checker
//! (`lock-core/model/src/check.rs`, which the property tests use too) live
//! in the dev crate `lock-model`, shared with the bounded run inside
//! `cargo test` (`lock-core/tests/fuzz.rs`); neither needs Redis nor the
//! module's FFI.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    lock_model::fuzz::run(data);
});
