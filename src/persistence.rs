//! The lock data type and its persistence callbacks: RDB save/load (versioned),
//! AOF rewrite, memory usage, digest, free, and the token counter saved
//! beside the keys (aux data) so it outlives them.
//!
//! Encoding version 2, per key:
//! `mode (0 exclusive, 1 shared, 2 semaphore)`, for a semaphore its `limit`,
//! `count`, then `count` times `owner (string)`, `holds`, `token`,
//! `deadline (unix ms)`, all unsigned. Version 1 (written by 0.2 and
//! earlier) is the same without semaphores; it still loads.
//! Aux data (before the keys): `last token issued`.
//!
//! A short or corrupt read returns an error (never a panic): Redis then
//! refuses the file or the RESTORE payload.

use std::os::raw::{c_int, c_void};

use redis_module::native_types::RedisType;
use redis_module::{raw, RedisString};

use crate::bindings;
use crate::clock;
use crate::fencing;
use crate::ffi::api;
use crate::guard::callback as guard;
use crate::log;
use crate::replication;
use crate::stats;
use crate::timers;
use crate::waiting;
use lock_core::{Holder, Kind, Lock, Mode, Tokens};

/// The encoding version this build writes; it reads every version up to it.
pub const ENCODING_VERSION: i32 = 2;

pub static LOCK_TYPE: RedisType = RedisType::new(
    "redislock",
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: Some(aux_load),
        aux_save: Some(aux_save),
        aux_save2: None,
        aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as c_int,
        free_effort: None,
        unlink: None,
        // COPY would duplicate holders and their tokens: refused.
        copy: None,
        defrag: Some(defrag),
        copy2: None,
        free_effort2: None,
        mem_usage2: Some(mem_usage2),
        unlink2: Some(unlink2),
    },
);

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guard("rdb_save", (), || {
        // SAFETY: Redis hands back a value of this type: a `Lock` we stored.
        let Some(lock) = (unsafe { value.cast::<Lock>().as_ref() }) else {
            return;
        };
        raw::save_unsigned(rdb, lock.mode().code());
        if let Some(limit) = lock.limit() {
            raw::save_unsigned(rdb, u64::from(limit));
        }
        raw::save_unsigned(rdb, lock.holders().len() as u64);
        for h in lock.holders() {
            raw::save_slice(rdb, &h.owner);
            raw::save_unsigned(rdb, u64::from(h.holds));
            raw::save_unsigned(rdb, h.token);
            raw::save_unsigned(rdb, h.deadline);
        }
    })
}

fn load_lock(rdb: *mut raw::RedisModuleIO, encver: c_int) -> Option<Lock> {
    let mode = Mode::from_code(raw::load_unsigned(rdb).ok()?)?;
    let kind = match mode {
        // Version 1 has no semaphores.
        Mode::Semaphore if encver < 2 => return None,
        Mode::Semaphore => Kind::Semaphore(u32::try_from(raw::load_unsigned(rdb).ok()?).ok()?),
        mode => mode.into(),
    };
    let count = raw::load_unsigned(rdb).ok()?;
    // Never trust a count for an allocation: a corrupt one would abort.
    let mut holders = Vec::with_capacity(usize::try_from(count.min(64)).ok()?);
    for _ in 0..count {
        let owner: Box<[u8]> = raw::load_string_buffer(rdb).ok()?.as_ref().into();
        let holds = u32::try_from(raw::load_unsigned(rdb).ok()?).ok()?;
        let token = raw::load_unsigned(rdb).ok()?;
        let deadline = raw::load_unsigned(rdb).ok()?;
        holders.push(Holder {
            owner,
            holds,
            // Not in the file: hold times count from the load.
            since: lock_core::since(clock::now_ms()),
            token,
            deadline,
        });
    }
    // Tokens no server can have issued (zero, past the horizon, two
    // holders with one) are refused, on this path as on the AOF's.
    let now = clock::now_ms();
    if !holders.iter().all(|h| Tokens::plausible(h.token, now)) {
        return None;
    }
    let lock = Lock::from_holders(kind, holders).ok()?;
    if lock.is_empty() {
        return None;
    }
    for h in lock.holders() {
        fencing::observe(h.token);
    }
    Some(lock)
}

unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard("rdb_load", std::ptr::null_mut(), || {
        if !(1..=ENCODING_VERSION).contains(&encver) {
            log::warning(&format!(
                "lock: cannot load encoding version {encver} (this build reads 1 to {ENCODING_VERSION})"
            ));
            return std::ptr::null_mut();
        }
        match load_lock(rdb, encver) {
            Some(lock) => {
                stats::value(1, lock.census());
                index_loaded(rdb, &lock);
                Box::into_raw(Box::new(lock)).cast::<c_void>()
            }
            None => {
                log::warning("lock: refused a corrupt or short lock value");
                std::ptr::null_mut()
            }
        }
    })
}

unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guard("aof_rewrite", (), || {
        // SAFETY: as in rdb_save.
        let Some(lock) = (unsafe { value.cast::<Lock>().as_ref() }) else {
            return;
        };
        // The same effect replication sends: one `LOCK.SYNC key SET ...` per holder.
        let mode = lock.mode().c_name().as_ptr();
        for h in lock.holders() {
            let [holds, token, deadline] = replication::numbers(h);
            let (sync, set) = (replication::SYNC_COMMAND.as_ptr(), c"SET".as_ptr());
            match lock.limit() {
                None => api!(RedisModule_EmitAOF(
                    aof,
                    sync,
                    replication::SET_FORMAT.as_ptr(),
                    key,
                    set,
                    h.owner.as_ptr(),
                    h.owner.len(),
                    mode,
                    holds,
                    token,
                    deadline
                )),
                Some(limit) => api!(RedisModule_EmitAOF(
                    aof,
                    sync,
                    replication::SET_LIMIT_FORMAT.as_ptr(),
                    key,
                    set,
                    h.owner.as_ptr(),
                    h.owner.len(),
                    mode,
                    holds,
                    token,
                    deadline,
                    std::ffi::c_longlong::from(limit)
                )),
            };
        }
    })
}

unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    guard("mem_usage", 0, || {
        // SAFETY: as in rdb_save.
        unsafe { value.cast::<Lock>().as_ref() }.map_or(0, Lock::memory_usage)
    })
}

/// `MEMORY USAGE`: the value, plus the bindings (`BIND`) of its holders,
/// which live beside it in the module's memory.
unsafe extern "C" fn mem_usage2(
    ctx: *mut raw::RedisModuleKeyOptCtx,
    value: *const c_void,
    _sample_size: usize,
) -> usize {
    guard("mem_usage", 0, || {
        // SAFETY: as in rdb_save.
        let own = unsafe { value.cast::<Lock>().as_ref() }.map_or(0, Lock::memory_usage);
        let key = api!(RedisModule_GetKeyNameFromOptCtx(ctx)).unwrap_or(std::ptr::null());
        let db = api!(RedisModule_GetDbIdFromOptCtx(ctx));
        let bound = match (key.is_null(), db) {
            (false, Some(db)) => {
                bindings::memory_of(&(db, RedisString::string_as_slice(key).to_vec()))
            }
            _ => 0,
        };
        own + bound
    })
}

/// Active defragmentation (servers built with Redis's jemalloc): the value
/// and every block it owns move where the server's allocator wants them.
unsafe extern "C" fn defrag(
    ctx: *mut raw::RedisModuleDefragCtx,
    _key: *mut raw::RedisModuleString,
    value: *mut *mut c_void,
) -> c_int {
    guard("defrag", 0, || {
        // SAFETY: Redis passes the slot holding this key's value.
        let Some(slot) = (unsafe { value.as_mut() }) else {
            return 0;
        };
        let moved = api!(RedisModule_DefragAlloc(ctx, *slot)).unwrap_or(std::ptr::null_mut());
        if !moved.is_null() {
            *slot = moved;
        }
        // SAFETY: the slot holds our `Box<Lock>` (moved whole if it moved).
        if let Some(lock) = unsafe { (*slot).cast::<Lock>().as_mut() } {
            let mut relocate = |block: *mut u8| {
                let moved = api!(RedisModule_DefragAlloc(ctx, block.cast()))?;
                (!moved.is_null()).then_some(moved.cast::<u8>())
            };
            // SAFETY: RM_DefragAlloc copies a block of the module's heap
            // (Redis's allocator) whole, frees the old one and returns the
            // new one, or NULL when it leaves it.
            unsafe { lock.relocate(&mut relocate) };
        }
        0
    })
}

unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guard("digest", (), || {
        // SAFETY: as in rdb_save.
        let Some(lock) = (unsafe { value.cast::<Lock>().as_ref() }) else {
            return;
        };
        let n = |v: u64| crate::ffi::int(v);
        api!(RedisModule_DigestAddLongLong(md, n(lock.mode().code())));
        if let Some(limit) = lock.limit() {
            api!(RedisModule_DigestAddLongLong(md, i64::from(limit)));
        }
        for h in lock.holders() {
            api!(RedisModule_DigestAddStringBuffer(
                md,
                h.owner.as_ptr().cast_mut().cast(),
                h.owner.len()
            ));
            api!(RedisModule_DigestAddLongLong(md, n(u64::from(h.holds))));
            api!(RedisModule_DigestAddLongLong(md, n(h.token)));
            api!(RedisModule_DigestAddLongLong(md, n(h.deadline)));
        }
        api!(RedisModule_DigestEndSequence(md));
    })
}

unsafe extern "C" fn free(value: *mut c_void) {
    guard("free", (), || {
        if !value.is_null() {
            // SAFETY: a value of this type is a `Box<Lock>` we created.
            let lock = unsafe { Box::from_raw(value.cast::<Lock>()) };
            stats::value(-1, lock.census());
        }
    })
}

unsafe extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, when: c_int) {
    guard("aux_save", (), || {
        if when == raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
            raw::save_unsigned(rdb, fencing::to_save());
        }
    })
}

unsafe extern "C" fn aux_load(rdb: *mut raw::RedisModuleIO, encver: c_int, when: c_int) -> c_int {
    guard("aux_load", raw::REDISMODULE_ERR as c_int, || {
        if when != raw::REDISMODULE_AUX_BEFORE_RDB as c_int
            || !(1..=ENCODING_VERSION).contains(&encver)
        {
            return raw::REDISMODULE_ERR as c_int;
        }
        match raw::load_unsigned(rdb) {
            // 0: a counter that never issued anything.
            Ok(last) if last == 0 || Tokens::plausible(last, clock::now_ms()) => {
                fencing::observe(last);
                raw::REDISMODULE_OK as c_int
            }
            Ok(last) => {
                log::warning(&format!(
                    "lock: refused a saved token counter no server can have reached ({last})"
                ));
                raw::REDISMODULE_ERR as c_int
            }
            Err(_) => raw::REDISMODULE_ERR as c_int,
        }
    })
}

/// A lock value is leaving its key, whatever removes it (`events::unlinked`).
unsafe extern "C" fn unlink2(ctx: *mut raw::RedisModuleKeyOptCtx, value: *const c_void) {
    guard("unlink", (), || {
        // SAFETY: as in rdb_save.
        let Some(lock) = (unsafe { value.cast::<Lock>().as_ref() }) else {
            return;
        };
        let key = api!(RedisModule_GetKeyNameFromOptCtx(ctx)).unwrap_or(std::ptr::null());
        let Some(db) = api!(RedisModule_GetDbIdFromOptCtx(ctx)) else {
            return;
        };
        if !key.is_null() {
            unlinked(db, RedisString::string_as_slice(key), lock);
        }
    })
}

/// A lock value is leaving key `key` of database `db` (the type's unlink).
fn unlinked(db: i32, key: &[u8], lock: &Lock) {
    let now = clock::now_ms();
    if !lock.is_empty() && !lock.is_held(now) {
        // Every lease had run out: Redis is expiring it (or a DEL, a write
        // over it, removes what was left). A RENAME or MOVE that follows
        // takes this back (`moved_away`).
        timers::expired(db, key, lock.holders().len());
        for h in lock.holders() {
            stats::HOLD_TIME.record(u64::from(h.held_ms(h.deadline)));
        }
    }
    if waiting::is_waited_on(&(db, key.to_vec())) {
        timers::schedule(db, key, Some(now));
    }
}

/// A loaded lock whose readers expire apart is visited at its earliest
/// deadline, as a command would have arranged (start-up, DEBUG RELOAD, a
/// replica's full sync; a RESTORE is refreshed by its keyspace event).
fn index_loaded(rdb: *mut raw::RedisModuleIO, lock: &Lock) {
    let Some(at) = lock.sweep_at() else {
        return;
    };
    let key = api!(RedisModule_GetKeyNameFromIO(rdb)).unwrap_or(std::ptr::null());
    let db = api!(RedisModule_GetDbIdFromIO(rdb));
    if let (false, Some(db)) = (key.is_null(), db) {
        timers::schedule_earlier(db, RedisString::string_as_slice(key), Some(at));
    }
}
