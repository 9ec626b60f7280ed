//! The boundary with Redis: the module API without panics (`ffi`), the Rust heap on
//! Redis's allocator (`alloc`), the log, every entry point's panic catch
//! (`catch`), state the callbacks share, the module's CONFIG settings, replies
//! and error texts, the effects sent to replicas and the AOF
//! (`replication`), what a command is (`spec`) and its metadata, and
//! databases' homes for the tables kept by key (`homes`).

#[cfg_attr(test, allow(dead_code))]
pub mod alloc;
pub mod catch;
pub mod config;
pub mod errors;
pub mod ffi;
pub mod homes;
pub mod log;
pub mod metadata;
pub mod replication;
pub mod replies;
pub mod script_caller;
pub mod shared;
pub mod spec;
