//! Locks freed by something other than a lock command (DEL, UNLINK, RENAME,
//! MOVE, expiry or eviction of the key, FLUSHDB, FLUSHALL): their waiters are
//! woken. Event callbacks must not write, so each affected key is handed to
//! the timer (`timers::schedule` at "now"), which visits it right after.
//! A lock Redis expires is also announced as the module event `lock.expired`.

use std::cell::RefCell;
use std::os::raw::{c_char, c_int, c_void};

use redis_module::{raw, Context, RedisString, Status};

use crate::clock;
use crate::guard;
use crate::keys::api;
use crate::timers;
use crate::waiting;

/// Subscribes to the keyspace and flush events that can free a lock.
pub fn subscribe(ctx: &Context) -> Status {
    let types = raw::REDISMODULE_NOTIFY_GENERIC
        | raw::REDISMODULE_NOTIFY_EXPIRED
        | raw::REDISMODULE_NOTIFY_EVICTED;
    let keyspace = api!(RedisModule_SubscribeToKeyspaceEvents(
        ctx.ctx,
        types,
        Some(on_key_event)
    ));
    let flush = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_FLUSHDB,
        dataver: 1,
    };
    let server = api!(RedisModule_SubscribeToServerEvent(
        ctx.ctx,
        flush,
        Some(on_flush)
    ));
    let ok = Some(raw::REDISMODULE_OK as c_int);
    if keyspace == ok && server == ok {
        Status::Ok
    } else {
        Status::Err
    }
}

thread_local! {
    /// The lock key Redis is deleting because every lease in it expired.
    static EXPIRING: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// Called by the type's unlink callback when Redis removes a lock whose
/// leases all ran out; the `expired` event that follows announces it.
pub fn expiring(key: &[u8]) {
    EXPIRING.with(|e| *e.borrow_mut() = Some(key.to_vec()));
}

extern "C" fn on_key_event(
    raw_ctx: *mut raw::RedisModuleCtx,
    class: c_int,
    _event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    guard::callback("a keyspace event", raw::REDISMODULE_OK as c_int, || {
        let ctx = Context::new(raw_ctx);
        let name = RedisString::string_as_slice(key);
        if class == raw::REDISMODULE_NOTIFY_EXPIRED {
            let expired_lock = EXPIRING.with(|e| e.borrow_mut().take_if(|k| k.as_slice() == name));
            if expired_lock.is_some() {
                api!(RedisModule_NotifyKeyspaceEvent(
                    raw_ctx,
                    raw::REDISMODULE_NOTIFY_MODULE,
                    c"lock.expired".as_ptr(),
                    key
                ));
            }
        }
        let id = waiting::db_key(&ctx, name);
        if waiting::is_waited_on(&id) {
            timers::schedule(&ctx, id.0, &id.1, Some(clock::now_ms()));
        }
        raw::REDISMODULE_OK as c_int
    })
}

extern "C" fn on_flush(
    raw_ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    guard::callback("a flush event", (), || {
        if subevent != raw::REDISMODULE_SUBEVENT_FLUSHDB_END {
            return;
        }
        // SAFETY: for this event Redis passes a `RedisModuleFlushInfo`.
        let db =
            unsafe { data.cast::<raw::RedisModuleFlushInfo>().as_ref() }.map_or(-1, |i| i.dbnum);
        let ctx = Context::new(raw_ctx);
        let now = clock::now_ms();
        for (db, key) in waiting::keys_with_waiters(db) {
            timers::schedule(&ctx, db, &key, Some(now));
        }
    })
}
