//! Waiting inside the server (`WAIT ms`). Placeholder until blocking lands:
//! no queue yet, so a WAIT request is an immediate try.

use redis_module::{Context, RedisResult, RedisString, RedisValue};

use crate::core::Request;

pub fn has_waiters(_ctx: &Context, _key: &RedisString) -> bool {
    false
}

pub fn waiters(_ctx: &Context, _key: &RedisString) -> usize {
    0
}

pub fn can_block(_ctx: &Context) -> bool {
    false
}

pub fn block(_ctx: &Context, _key: RedisString, _request: Request, _ms: u64) -> RedisResult {
    Ok(RedisValue::Null)
}
