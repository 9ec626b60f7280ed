//! A lock key's state in the shell: its storage (`keys`), one transaction
//! (`txn`) and the transitions that commit it, the wait queues, the bindings of
//! holders to connections, the deadlock check, the timers and their visits,
//! and the counters `INFO lock` shows.

pub mod bindings;
pub mod deadlocks;
pub mod keys;
pub mod sessions;
pub mod stats;
pub mod timers;
pub mod transitions;
pub mod txn;
pub mod visits;
pub mod waiting;
