//! Dev-only: the one reference model of `lock-core` ([`model`]) and the fuzz
//! runner that checks the core against it ([`fuzz`]). Used by lock-core's
//! tests (`lock-core/tests/`) and by the cargo-fuzz target (`fuzz/`); never
//! by the module. Test code: a broken invariant panics, with the step and
//! the reason.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::too_many_lines
)]

pub mod fuzz;
pub mod model;
