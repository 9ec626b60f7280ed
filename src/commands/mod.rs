//! The commands: their syntax (`args`), the lock commands (`lock`),
//! `LOCK.GUARD` (`guard`) and the `INFO lock` section (`info_section`).

pub mod args;
pub mod guard;
pub mod info_section;
pub mod lock;
pub mod session;
