//! The lock data type and its persistence callbacks: RDB save/load (versioned),
//! AOF rewrite, memory usage, digest, free, and the token counter saved
//! beside the keys (aux data) so it outlives them.
//!
//! Encoding version 3, per key: one string, the lock's block as it is in
//! memory (`lock_core::block`: its kind, and each holder's token, deadline,
//! holds and owner), read back into the block it becomes without a copy
//! and checked whole before it is used. Version 2 (0.2, with semaphores):
//! `mode (0 exclusive, 1 shared, 2 semaphore)`, for a semaphore its `limit`,
//! `count`, then `count` times `owner (string)`, `holds`, `token`,
//! `deadline (unix ms)`, all unsigned; version 1 (0.1) the same without
//! semaphores. Both still load.
//! Encoding version 4 (0.4, sessions): version 3's string, then `n` and `n`
//! times `session id`, `its deadline at the save (unix ms; 0: ended)`,
//! unsigned, one for each session its holders follow (a holder following
//! a session keeps the session's id in its deadline:
//! `lock_core::lock::session_deadline`). A load keeps the holders on their
//! session (the aux data brought the sessions first); a RESTORE (DUMP,
//! MIGRATE) gives each the session's deadline at the dump as its own lease,
//! and so does a load whose sessions lack that one (logged, counted).
//! Aux data (before the keys): `last token issued`; from version 4 then
//! `n` and `n` times `session id`, `deadline (unix ms)`; from version 5
//! then `m` and `m` times `token`, `lease`, `deadline (unix ms)`: the
//! holders that follow a connection lease (`BIND`, `lock_core::lease`),
//! each with its deadline as read at the save (loaded as its own: exact,
//! the lease's next KEEPALIVE covers it as it would have). Version 5's keys
//! are version 4's (a follower is listed among its lock's sessions, its id
//! its token).
//!
//! A short or corrupt read returns an error (never a panic): Redis then
//! refuses the file or the RESTORE payload.

use std::os::raw::{c_int, c_void};

use redis_module::native_types::RedisType;
use redis_module::{raw, RedisString};
use std::os::raw::c_char;

use crate::durability::events;
use crate::redis::catch::callback as guard;
use crate::redis::config;
use crate::redis::ffi::api;
use crate::redis::ffi::DbKey;
use crate::redis::log;
use crate::redis::replication;
use crate::state::bindings;
use crate::state::keys;
use crate::state::sessions;
use crate::state::stats;
use crate::time::clock;
use crate::time::fencing;
use lock_core::{Holder, Kind, Loaded, Lock, Mode, Tokens};

/// The encoding version this build writes; it reads every version up to it.
pub const ENCODING_VERSION: i32 = 5;

/// The lock whose block Redis holds at `value`, read in place (never freed
/// here).
///
/// # Safety
///
/// `value` is null or a value of this type (a block from `Lock::into_raw`),
/// alive for the borrow.
unsafe fn borrowed(value: *const c_void) -> std::mem::ManuallyDrop<Lock> {
    // SAFETY: the caller's promise; ManuallyDrop: the block stays Redis's.
    std::mem::ManuallyDrop::new(unsafe { Lock::from_raw(value.cast_mut().cast()) })
}

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
        // SAFETY: Redis hands back a value of this type.
        let lock = unsafe { borrowed(value) };
        let saved = lock.saved();
        api!(RedisModule_SaveStringBuffer(
            rdb,
            saved.as_ptr().cast::<c_char>(),
            saved.len()
        ));
        let followed = lock.sessions();
        raw::save_unsigned(rdb, followed.len() as u64);
        sessions::with_deadlines(|deadline_of| {
            for id in followed {
                raw::save_unsigned(rdb, id);
                raw::save_unsigned(rdb, deadline_of(id).unwrap_or(0));
            }
        });
    })
}

/// Encoding 3: the block's bytes, read into memory Redis allocates for them
/// (with the module heap's allocator: the lock takes them over). `None`:
/// the file or payload could not be read.
fn load_block(rdb: *mut raw::RedisModuleIO) -> Option<Vec<u8>> {
    let mut len = 0usize;
    let buf = api!(RedisModule_LoadStringBuffer(rdb, &mut len))?;
    if buf.is_null() {
        return None;
    }
    if len == 0 {
        // Read, and empty: no lock (`Lock::from_saved` says why).
        api!(RedisModule_Free(buf.cast()));
        return Some(Vec::new());
    }
    // SAFETY: Redis allocated `len` bytes for the string with its allocator,
    // the one the module's heap uses (`RM_Alloc` / `RM_Free`): the vector
    // owns them now, and frees them the way the heap frees everything.
    Some(unsafe { Vec::from_raw_parts(buf.cast::<u8>(), len, len) })
}

/// Encodings 1 and 2: field by field. The outer `None`: the file could not
/// be read; the inner one: what it says is no lock.
fn load_fields(rdb: *mut raw::RedisModuleIO, encver: c_int, now: u64) -> Option<Option<Lock>> {
    let mode = raw::load_unsigned(rdb).ok()?;
    let limit = match Mode::from_code(mode) {
        Some(Mode::Semaphore) if encver >= 2 => Some(raw::load_unsigned(rdb).ok()?),
        _ => None,
    };
    let count = raw::load_unsigned(rdb).ok()?;
    // Never trust a count for an allocation: a corrupt one would abort.
    let mut holders = Vec::with_capacity(usize::try_from(count.min(64)).ok()?);
    for _ in 0..count {
        let owner: Box<[u8]> = raw::load_string_buffer(rdb).ok()?.as_ref().into();
        let holds = raw::load_unsigned(rdb).ok()?;
        let token = raw::load_unsigned(rdb).ok()?;
        let deadline = raw::load_unsigned(rdb).ok()?;
        holders.push((owner, holds, token, deadline));
    }
    let kind = match (Mode::from_code(mode), limit) {
        // Version 1 has no semaphores.
        (Some(Mode::Semaphore), None) | (None, _) => return Some(None),
        (Some(Mode::Semaphore), Some(limit)) => match u32::try_from(limit) {
            Ok(limit) => Kind::Semaphore(limit),
            Err(_) => return Some(None),
        },
        (Some(mode), _) => match Kind::of(mode, None) {
            Some(kind) => kind,
            None => return Some(None),
        },
    };
    let holders: Option<Vec<Holder>> = holders
        .into_iter()
        .map(|(owner, holds, token, deadline)| {
            Some(Holder {
                owner,
                holds: u32::try_from(holds).ok()?,
                // Not in the file: hold times count from the load.
                since: lock_core::since(now),
                token,
                deadline,
            })
        })
        .collect();
    Some(holders.and_then(|h| Lock::from_holders(kind, h).ok()))
}

/// Why a lock read whole is one no server can have made: `None` when it
/// is within every bound. A `RESTORE` (`loading` false) is held to the
/// bounds a server's own grants keep: tokens up to the horizon, at most
/// `lock.max-holders` holders, leases up to `lock.max-ttl` (plus the skew
/// margin, for a payload from a server whose clock is ahead); a load, to a
/// day more of tokens (tokens issued since a `RESTORE` accepted its own
/// still load), keeps a lock past the holder limit, and clamps deadlines
/// past the bound rather than refuse them.
fn out_of_bounds(loaded: &mut Loaded, now: u64, loading: bool) -> Option<String> {
    let highest = loaded.highest_token;
    let tokens_ok = match loading {
        true => Tokens::loadable(highest, now),
        false => Tokens::plausible(highest, now),
    };
    if !tokens_ok {
        return Some(format!(
            "a token no server can have issued ({highest}, horizon {})",
            Tokens::horizon(now)
        ));
    }
    let (holders, max) = (loaded.lock.holder_count(), config::max_holders());
    // (Past it only by holders expired at `now`, saved between two slices
    // of a purge: they go at its first visit. A walk, as the load's.)
    if holders > max && loaded.lock.live(now).count() > max {
        if !loading {
            return Some(format!("{holders} holders, past lock.max-holders ({max})"));
        }
        // Kept: dropping holders would let others in while they believe
        // they hold it. Every operation on it is linear; grants wait until
        // it is back under the limit.
        stats::fixed_at_load(
            &log::LOAD_CROWDED,
            &format!("{holders} holders, lock.max-holders is {max}"),
        );
    }
    let (latest, limit) = config::deadline_bounds(now);
    if loaded.latest_deadline > limit {
        if !loading {
            return Some(format!(
                "a lease past lock.max-ttl (deadline {}, at most {limit})",
                loaded.latest_deadline
            ));
        }
        let n = loaded.lock.clamp_deadlines(latest);
        loaded.latest_deadline = latest;
        loaded.sweep_at = loaded.lock.sweep_at();
        stats::fixed_at_load(
            &log::LOAD_CLAMPED,
            &format!("{n} lease(s) of a lock now ending at {latest}"),
        );
    }
    None
}

/// What a load keeps in place of a key's lock that no server can have
/// made: a lock whose one holder's lease ended long ago, so that nobody
/// holds it and its key goes at its first visit. Refusing it instead would
/// fail the whole load, and every other key with it.
fn dropped(now: u64) -> Option<Loaded> {
    let ended = Holder {
        owner: b"(dropped at load)".as_slice().into(),
        holds: 1,
        since: lock_core::since(now),
        token: 1,
        deadline: 0,
    };
    let mut loaded = Lock::from_holders(Kind::Racquire, vec![ended])
        .ok()?
        .loaded();
    loaded.sweep_at = Some(now);
    Some(loaded)
}

fn load_lock(rdb: *mut raw::RedisModuleIO, encver: c_int) -> Option<Loaded> {
    // During a load, the clock as the load started (one read per load, not
    // per key); for a RESTORE, now.
    let now = clock::load_time();
    let loading = clock::is_loading();
    let read = match encver {
        // A RESTORE past the holder limit is refused from the block's
        // count, before its holders are walked.
        3..=5 => {
            let block = load_block(rdb)?;
            // Read whatever the block holds: the stream goes on after it.
            let at_save = match encver {
                4 | 5 => followed_at_save(rdb)?,
                _ => Vec::new(),
            };
            match loading {
                true => Lock::from_saved(block, now),
                false => Lock::from_saved_within(block, now, config::max_holders()),
            }
            .map_err(|e| format!("{e:?}"))
            .and_then(|loaded| on_sessions(loaded, &at_save, loading))
        }
        _ => load_fields(rdb, encver, now)?
            .map(Lock::loaded)
            .ok_or_else(|| "a malformed lock".to_string()),
    };
    let why = match read {
        Ok(mut loaded) => match out_of_bounds(&mut loaded, now, loading) {
            None => {
                // The counter goes past the highest token.
                fencing::observe(loaded.highest_token);
                return Some(loaded);
            }
            Some(why) => why,
        },
        Err(why) => why,
    };
    if !loading {
        // RESTORE: refused with an error, nothing changed.
        log::RESTORE_REFUSED.warn(&why);
        return None;
    }
    stats::fixed_at_load(&log::LOAD_DROPPED, &why);
    dropped(now)
}

/// Encoding 4's sessions after the block: `(id, deadline at the save)`.
fn followed_at_save(rdb: *mut raw::RedisModuleIO) -> Option<Vec<(u64, u64)>> {
    let n = raw::load_unsigned(rdb).ok()?;
    let mut all = Vec::with_capacity(usize::try_from(n.min(64)).ok()?);
    for _ in 0..n {
        let id = raw::load_unsigned(rdb).ok()?;
        let deadline = raw::load_unsigned(rdb).ok()?;
        all.push((id, deadline));
    }
    Some(all)
}

/// The session holders of a lock read whole: at a load, those whose
/// session this server has stay on it; the others (every one, for a
/// RESTORE) take the session's deadline at the save as their own lease
/// (0, ended, when the save did not list it).
///
/// A RESTORE of a holder following a session the payload does not list is
/// refused: no server saves one (a deadline with the session bit set, from
/// an older encoding, is one).
fn on_sessions(
    mut loaded: Loaded,
    at_save: &[(u64, u64)],
    loading: bool,
) -> Result<Loaded, String> {
    if loaded.highest_session == 0 {
        return Ok(loaded);
    }
    let saved = |id: u64| at_save.iter().find(|(s, _)| *s == id).map(|(_, d)| *d);
    if !loading {
        if let Some(id) = loaded
            .lock
            .sessions()
            .into_iter()
            .find(|id| saved(*id).is_none())
        {
            return Err(format!(
                "a holder follows session {id}, which the payload does not list"
            ));
        }
    }
    let n = match loading {
        true => sessions::with_deadlines(|deadline_of| {
            let missing: Vec<u64> = loaded
                .lock
                .sessions()
                .into_iter()
                .filter(|id| deadline_of(*id).is_none())
                .collect();
            if missing.is_empty() {
                return 0;
            }
            loaded.lock.materialize_sessions_of(&missing, saved)
        }),
        false => loaded.lock.materialize_sessions(saved),
    };
    if n == 0 {
        return Ok(loaded);
    }
    if loading {
        stats::fixed_at_load(&log::LOAD_SESSION_GONE, &n.to_string());
    }
    Ok(loaded.lock.loaded())
}

unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard("rdb_load", std::ptr::null_mut(), || {
        if !(1..=ENCODING_VERSION).contains(&encver) {
            let why =
                format!("encoding version {encver} (this build reads 1 to {ENCODING_VERSION})");
            match clock::is_loading() {
                true => log::warning(&format!("lock: cannot load {why}")),
                false => log::RESTORE_REFUSED.warn(&why),
            }
            return std::ptr::null_mut();
        }
        match load_lock(rdb, encver) {
            Some(Loaded { lock, sweep_at, .. }) => {
                stats::value(1, lock.census());
                // The name it is loaded under counted (`keys::named`).
                match api!(RedisModule_GetKeyNameFromIO(rdb)) {
                    Some(key) if !key.is_null() => {
                        keys::named(RedisString::string_as_slice(key), false);
                    }
                    _ => keys::named_unknown(),
                }
                let followed: Vec<u64> = lock.holders().filter_map(|h| h.session()).collect();
                if !followed.is_empty() {
                    let key = api!(RedisModule_GetKeyNameFromIO(rdb)).unwrap_or(std::ptr::null());
                    if let (false, Some(db)) = (key.is_null(), api!(RedisModule_GetDbIdFromIO(rdb)))
                    {
                        let key = DbKey::new(db, RedisString::string_as_slice(key));
                        for id in followed {
                            sessions::join(id, &key);
                        }
                    }
                }
                if let Some(at) = sweep_at {
                    let key = api!(RedisModule_GetKeyNameFromIO(rdb)).unwrap_or(std::ptr::null());
                    if let (false, Some(db)) = (key.is_null(), api!(RedisModule_GetDbIdFromIO(rdb)))
                    {
                        events::loaded(db, RedisString::string_as_slice(key), at);
                    }
                }
                lock.into_raw().cast::<c_void>()
            }
            // The file or payload could not be read (a load fails on it
            // anyway), or a RESTORE payload was refused.
            None => std::ptr::null_mut(),
        }
    })
}

/// Whether this process emitted the sessions into its AOF rewrite.
static SESSIONS_EMITTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guard("aof_rewrite", (), || {
        // The sessions first, once a rewrite (it runs in a child of its
        // own: the parent never sets this), before any holder follows one.
        // (A rewrite with no lock key at all keeps no session.)
        if !SESSIONS_EMITTED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            let n = |v: u64| std::os::raw::c_longlong::try_from(v).unwrap_or(0);
            for (id, deadline) in sessions::saved() {
                api!(RedisModule_EmitAOF(
                    aof,
                    replication::SESSION_SYNC_COMMAND.as_ptr(),
                    c"ll".as_ptr(),
                    n(id),
                    n(deadline)
                ));
            }
            // The holders following connection leases, each with its
            // deadline as read now (its key's effect follows).
            for (token, lease, deadline) in sessions::saved_followers() {
                api!(RedisModule_EmitAOF(
                    aof,
                    replication::LEASE_SYNC_COMMAND.as_ptr(),
                    c"clll".as_ptr(),
                    c"OWN".as_ptr(),
                    n(token),
                    n(lease),
                    n(deadline)
                ));
            }
        }
        // SAFETY: as in rdb_save.
        let lock = unsafe { borrowed(value) };
        // The same effect replication sends: one `LOCK.SYNC key state owner`
        // per holder.
        for h in lock.holders() {
            let state = lock_core::effect::Encoded::of(&lock, &h);
            let state = state.as_bytes();
            api!(RedisModule_EmitAOF(
                aof,
                replication::SYNC_COMMAND.as_ptr(),
                replication::SET_FORMAT.as_ptr(),
                key,
                state.as_ptr(),
                state.len(),
                h.owner.as_ptr(),
                h.owner.len()
            ));
        }
    })
}

unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    guard("mem_usage", 0, || {
        // SAFETY: as in rdb_save.
        unsafe { borrowed(value) }.memory_usage()
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
        let lock = unsafe { borrowed(value) };
        let own = lock.memory_usage();
        let key = api!(RedisModule_GetKeyNameFromOptCtx(ctx)).unwrap_or(std::ptr::null());
        let db = api!(RedisModule_GetDbIdFromOptCtx(ctx));
        let bound = match (key.is_null(), db) {
            (false, Some(db)) => bindings::memory_of(db, RedisString::string_as_slice(key), &lock),
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
        if slot.is_null() {
            return 0;
        }
        // The lock is one block: moved whole, or left where it is.
        let moved = api!(RedisModule_DefragAlloc(ctx, *slot)).unwrap_or(std::ptr::null_mut());
        if !moved.is_null() {
            *slot = moved;
        }
        0
    })
}

unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guard("digest", (), || {
        // SAFETY: as in rdb_save.
        let lock = unsafe { borrowed(value) };
        let n = |v: u64| crate::redis::ffi::int(v);
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
        // Null: a write-back (`transitions::write_back_known`,
        // `write_back_key`) emptied the lock and counted the key out.
        if !value.is_null() {
            // SAFETY: a value of this type is a block from `Lock::into_raw`,
            // Redis's last reference to it: it is freed here.
            let lock = unsafe { Lock::from_raw(value.cast()) };
            stats::value(-1, lock.census());
            // (A large one's memory freed off the event loop: a million
            // holders' lock expired by Redis, deleted.)
            lock.let_go();
        }
    })
}

unsafe extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, when: c_int) {
    guard("aux_save", (), || {
        if when == raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
            raw::save_unsigned(rdb, fencing::to_save());
            let all = sessions::saved();
            raw::save_unsigned(rdb, all.len() as u64);
            for (id, deadline) in all {
                raw::save_unsigned(rdb, id);
                raw::save_unsigned(rdb, deadline);
            }
            let followers = sessions::saved_followers();
            raw::save_unsigned(rdb, followers.len() as u64);
            for (token, lease, deadline) in followers {
                raw::save_unsigned(rdb, token);
                raw::save_unsigned(rdb, lease);
                raw::save_unsigned(rdb, deadline);
            }
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
        let Ok(saved) = raw::load_unsigned(rdb) else {
            return raw::REDISMODULE_ERR as c_int;
        };
        let now = clock::now_ms();
        // 0: a counter that never issued anything.
        let saved = if saved == 0 || Tokens::loadable(saved, now) {
            saved
        } else {
            let clamped = Tokens::horizon(now);
            stats::fixed_at_load(&log::LOAD_COUNTER, &format!("{saved}, taken as {clamped}"));
            clamped
        };
        if fencing::starting() || replication::is_replica() {
            // An earlier run's counter, or the master's: arrived.
            fencing::observe(saved);
        } else {
            // A running master's reload of its own save: the next token is
            // above it, and no jump follows.
            fencing::raise_floor(saved);
        }
        if encver >= 4 {
            let Some(all) = load_sessions(rdb, now) else {
                return raw::REDISMODULE_ERR as c_int;
            };
            sessions::load(all);
        }
        let followers = match encver >= 5 {
            true => match load_followers(rdb, now) {
                Some(all) => all,
                None => return raw::REDISMODULE_ERR as c_int,
            },
            false => Vec::new(),
        };
        sessions::load_followers(followers);
        raw::REDISMODULE_OK as c_int
    })
}

/// A lock value is leaving its key, whatever removes it (`events::unlinked`).
/// The aux data's followers of connection leases (version 5), within the
/// bounds a lease has (ids no server can have issued dropped, a deadline
/// past `lock.max-ttl` clamped: logged and counted). `None`: a short read.
fn load_followers(rdb: *mut raw::RedisModuleIO, now: u64) -> Option<Vec<(u64, u64, u64)>> {
    let n = raw::load_unsigned(rdb).ok()?;
    let (latest, limit) = config::deadline_bounds(now);
    let mut all = Vec::with_capacity(usize::try_from(n.min(1024)).ok()?);
    for _ in 0..n {
        let token = raw::load_unsigned(rdb).ok()?;
        let lease = raw::load_unsigned(rdb).ok()?;
        let mut deadline = raw::load_unsigned(rdb).ok()?;
        if !Tokens::loadable(token, now) || !Tokens::loadable(lease, now) {
            stats::fixed_at_load(&log::LOAD_SESSION_DROPPED, &format!("{token} {lease}"));
            continue;
        }
        if deadline > limit {
            stats::fixed_at_load(
                &log::LOAD_CLAMPED,
                &format!("a bound holder's {deadline}, now ending at {latest}"),
            );
            deadline = latest;
        }
        fencing::observe(lease);
        all.push((token, lease, deadline));
    }
    Some(all)
}

/// The aux data's sessions (version 4): each within the bounds a lease
/// has (an id no server can have issued dropped, a deadline past
/// `lock.max-ttl` clamped: logged and counted). `None`: a short read.
fn load_sessions(rdb: *mut raw::RedisModuleIO, now: u64) -> Option<Vec<(u64, u64)>> {
    let n = raw::load_unsigned(rdb).ok()?;
    let (latest, limit) = config::deadline_bounds(now);
    let mut all = Vec::with_capacity(usize::try_from(n.min(1024)).ok()?);
    for _ in 0..n {
        let id = raw::load_unsigned(rdb).ok()?;
        let mut deadline = raw::load_unsigned(rdb).ok()?;
        if !Tokens::loadable(id, now) {
            stats::fixed_at_load(&log::LOAD_SESSION_DROPPED, &id.to_string());
            continue;
        }
        if deadline > limit {
            stats::fixed_at_load(
                &log::LOAD_CLAMPED,
                &format!("a session's {deadline}, now ending at {latest}"),
            );
            deadline = latest;
        }
        fencing::observe(id);
        all.push((id, deadline));
    }
    Some(all)
}

unsafe extern "C" fn unlink2(ctx: *mut raw::RedisModuleKeyOptCtx, value: *const c_void) {
    guard("unlink", (), || {
        let key = api!(RedisModule_GetKeyNameFromOptCtx(ctx)).unwrap_or(std::ptr::null());
        if key.is_null() {
            return;
        }
        let name = RedisString::string_as_slice(key);
        // Every lock value leaving its name is uncounted, an emptied one
        // (null: a transition deleting the key it emptied) too.
        keys::unnamed(name);
        if value.is_null() {
            return;
        }
        // Not an emptied one: no RENAME, MOVE or MIGRATE carries it.
        events::moved_or_gone();
        // SAFETY: as in rdb_save.
        let lock = unsafe { borrowed(value) };
        let Some(db) = api!(RedisModule_GetDbIdFromOptCtx(ctx)) else {
            return;
        };
        events::unlinked(db, name, &lock);
    })
}
