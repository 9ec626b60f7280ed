//! The bottom layer: calling the Redis module API without panicking, and the
//! few conversions every layer needs. Imports nothing from the crate.

use std::os::raw::c_int;

use redis_module::{raw, Context, RedisString};

/// Calls a Redis module API entry, or yields `None` when the server lacks it.
///
/// Every use passes handles that are alive for the call, and pointers into
/// memory the caller owns for the call's duration. Contexts, keys and IOs are
/// the ones Redis passed to the callback that makes the call. A
/// blocked-client handle is different: it outlives any callback and stays
/// valid only until the module's one `RM_UnblockClient` on it; the waiting
/// registry (`waiting.rs`) hands each handle out exactly once (`take`), and
/// only the holder of a taken handle calls `RM_UnblockClient`, so no call
/// uses a handle after that.
macro_rules! api {
    ($f:ident($($arg:expr),* $(,)?)) => {
        // SAFETY: the entry was filled by RedisModule_Init (or is None); the
        // arguments are live handles and buffers, as the macro's doc says
        // (blocked-client handles: alive until their one RM_UnblockClient).
        match unsafe { redis_module::raw::$f } {
            Some(f) => Some(unsafe { f($($arg),*) }),
            None => None,
        }
    };
}
pub(crate) use api;

/// A key in one database.
pub type DbKey = (i32, Vec<u8>);

/// The calling client's database.
pub fn selected_db(ctx: &Context) -> i32 {
    api!(RedisModule_GetSelectedDb(ctx.ctx)).unwrap_or(0)
}

/// `key` in the calling client's database.
pub fn db_key(ctx: &Context, key: &[u8]) -> DbKey {
    (selected_db(ctx), key.to_vec())
}

/// Selects database `db` for the context's client; false when Redis refuses.
pub fn select_db(ctx: &Context, db: i32) -> bool {
    api!(RedisModule_SelectDb(ctx.ctx, db)) == Some(raw::REDISMODULE_OK as c_int)
}

/// A key name as a module string, binary-safe (NUL bytes included), freed on drop.
pub fn name(ctx: &Context, key: &[u8]) -> RedisString {
    RedisString::create_from_slice(ctx.ctx, key)
}

/// A count or a token as a reply integer: saturating at `i64::MAX`.
pub fn int(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}
