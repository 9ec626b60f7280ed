//! Locks freed by something other than a lock command (DEL, UNLINK, RENAME,
//! MOVE, expiry or eviction of the key, a write of another type over it,
//! FLUSHDB, FLUSHALL, SWAPDB): their waiters are woken. Event callbacks must not write, so each affected key is handed to
//! the timer (`timers::schedule` at "now"), which visits it right after.
//! A lock Redis expires is also announced as the module event `lock.expired`.

use std::cell::RefCell;
use std::os::raw::{c_char, c_int, c_void};

use redis_module::{raw, Context, ContextFlags, RedisString, RedisValue, Status};

use crate::clock;
use crate::errors::LockError;
use crate::guard;
use crate::keys::api;
use crate::timers;
use crate::waiting;

/// Subscribes to the keyspace and server events that can free a lock. Every
/// class of keyspace event but the module's own is heard (a `SET` over a lock
/// key is a `string` event), and while nobody waits the callback returns at once.
pub fn subscribe(ctx: &Context) -> Status {
    let keyspace = api!(RedisModule_SubscribeToKeyspaceEvents(
        ctx.ctx,
        raw::REDISMODULE_NOTIFY_ALL & !raw::REDISMODULE_NOTIFY_MODULE,
        Some(on_key_event)
    ));
    let server_event = |id, callback| {
        api!(RedisModule_SubscribeToServerEvent(
            ctx.ctx,
            raw::RedisModuleEvent { id, dataver: 1 },
            Some(callback)
        ))
    };
    let flush = server_event(raw::REDISMODULE_EVENT_FLUSHDB, on_flush);
    let swap = server_event(raw::REDISMODULE_EVENT_SWAPDB, on_swapdb);
    let ok = Some(raw::REDISMODULE_OK as c_int);
    if keyspace == ok && flush == ok && swap == ok {
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
        if !waiting::anyone_waits() {
            return raw::REDISMODULE_OK as c_int;
        }
        let id = waiting::db_key(&ctx, name);
        if waiting::is_waited_on(&id) {
            if migrating_away(&ctx, name) {
                // MIGRATE moved the lock, holders and all, to another node:
                // the waiters retry there (Redis answers them ASK).
                waiting::fail_all(id.0, &id.1, LockError::Migrating);
            } else {
                timers::schedule(&ctx, id.0, &id.1, Some(clock::now_ms()));
            }
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
        wake(&Context::new(raw_ctx), &[db]);
    })
}

/// In a cluster, whether this key's slot is being migrated away from this
/// node (so the key vanished because MIGRATE moved it, not because the lock
/// was freed). Only asked for keys that clients wait for.
fn migrating_away(ctx: &Context, key: &[u8]) -> bool {
    if !ctx.get_flags().contains(ContextFlags::CLUSTER) {
        return false;
    }
    let key = ctx.create_string(key);
    let Ok(RedisValue::Integer(slot)) =
        ctx.call("CLUSTER", &[&RedisString::create(None, "KEYSLOT"), &key])
    else {
        return false;
    };
    let nodes = match ctx.call("CLUSTER", &["NODES"]) {
        Ok(RedisValue::SimpleString(s) | RedisValue::BulkString(s)) => s,
        Ok(RedisValue::StringBuffer(b)) => String::from_utf8_lossy(&b).into_owned(),
        Ok(RedisValue::VerbatimString((_, b))) => String::from_utf8_lossy(&b).into_owned(),
        _ => return false,
    };
    let marker = format!("[{slot}->-");
    nodes
        .lines()
        .any(|line| line.contains("myself") && line.contains(&marker))
}

/// After SWAPDB every waited key of both databases holds another value.
extern "C" fn on_swapdb(
    raw_ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    guard::callback("a swapdb event", (), || {
        // SAFETY: for this event Redis passes a `RedisModuleSwapDbInfo`.
        let Some(info) = (unsafe { data.cast::<raw::RedisModuleSwapDbInfo>().as_ref() }) else {
            return;
        };
        wake(
            &Context::new(raw_ctx),
            &[info.dbnum_first, info.dbnum_second],
        );
    })
}

/// Visits, at once, every key with waiters in these databases (-1: all).
fn wake(ctx: &Context, dbs: &[i32]) {
    let now = clock::now_ms();
    for db in dbs {
        for (db, key) in waiting::keys_with_waiters(*db) {
            timers::schedule(ctx, db, &key, Some(now));
        }
    }
}
