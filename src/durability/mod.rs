//! What outlives a command: the data type's RDB and AOF callbacks
//! (`persistence`), replicated effects applied (`apply`, `LOCK.SYNC`), and the
//! server's events (keyspace, flush, role, clients) that change locks.

pub mod apply;
pub mod events;
pub mod persistence;
