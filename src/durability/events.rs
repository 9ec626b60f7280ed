//! What the module hears about lock keys from the server, and what it pays
//! for it on other keys' writes (docs/design.md, "What the module hears").
//!
//! - The type's unlink callback ([`unlinked`]) fires only for lock values,
//!   whatever removes them: DEL, UNLINK, a write of another type over the key,
//!   expiry, eviction, MIGRATE, and the old name of RENAME and MOVE. It wakes
//!   the key's waiters and, when every lease in it had run out, has the
//!   leases counted and `lock.expired` announced.
//! - The type's load callback indexes a loaded lock whose readers expire
//!   apart (start-up, DEBUG RELOAD, a replica's full sync): [`loaded`].
//!
//! The type's callbacks themselves are in `persistence`, which calls these.
//! - Server events, once per flush, swap, role change, load or fork, not
//!   per write: FLUSHDB/FLUSHALL and SWAPDB wake waiters, SWAPDB moves the
//!   timer's entries and bindings with their keys, a promotion or the end
//!   of a load jumps the token counter ahead (`fencing`) and a promotion
//!   visits what came due while the server was a replica. Closed
//!   connections (`CLIENT_CHANGE`) only while some grant is bound: a closed
//!   connection releases what was bound to it ([`watch_clients`]).
//! - Nothing periodic: no cron event; one timer at the event loop's first
//!   turn ([`on_started`]).
//! - One keyspace class, `generic` (`g`): the only way to hear that a lock
//!   appeared under a new name or database (`rename_to`, `move_to`,
//!   `restore`) or that its Redis TTL was changed (`expire`, `persist`), and
//!   that MIGRATE moved a waited-for key away (`del`). Its cost falls on
//!   generic commands (DEL, EXPIRE, RENAME ...) and on writes that set a TTL
//!   (`SET ... PX` fires `expire`); writes without a TTL (SET, INCR, HSET,
//!   LPUSH, scripts) fire no generic event and pay nothing. While some lock
//!   exists, an event on a name no lock has is told apart by its name
//!   first, before the event's: read in place (`ffi::name_of`), hashed and
//!   looked up in a filter of the names locks have (`keys::may_be_lock`),
//!   two loads, the key never opened. A flush that freed locks has the
//!   filter rebuilt (`keys::flushed`).
//!
//! Event callbacks must not write: every visit they ask for is made by the
//! timer (`timers`), right after.

use std::cell::RefCell;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, Ordering};

use lock_core::Lock;
use redis_module::{raw, Context, ContextFlags, RedisString, RedisValue, Status};

use crate::redis::catch;
use crate::redis::config;
use crate::redis::errors::LockError;
use crate::redis::ffi::DbKey;
use crate::redis::ffi::{self, api};
use crate::redis::replication;
use crate::redis::script_caller;
use crate::state::bindings;
use crate::state::keys;
use crate::state::sessions;
use crate::state::stats;
use crate::state::timers;
use crate::state::waiting;
use crate::time::clock;
use crate::time::fencing;

/// A lock value is leaving key `key` of database `db` (the type's unlink).
pub fn unlinked(db: i32, key: &[u8], lock: &Lock) {
    if sessions::any() {
        sessions::unlinked(&DbKey::new(db, key), lock);
    }
    let now = clock::now_ms();
    if !lock.is_empty() && !lock.is_held(now) {
        // Every lease had run out: Redis is expiring it (or a DEL, a write
        // over it, removes what was left). A RENAME or MOVE that follows
        // takes this back (`moved_away`).
        timers::expired(db, key, lock.holder_count());
        // Each holder's hold time until its deadline: summed up in a large
        // lock's block (no walk of its holders).
        stats::HOLD_TIME.record_all(&lock.held_at_deadlines());
    }
    if waiting::is_waited_on(&DbKey::new(db, key)) {
        timers::schedule(db, key, Some(now));
    } else {
        // Nothing to visit at this name any more (a RENAME or MOVE plans a
        // visit of the new one).
        timers::forget(db, key);
    }
}

/// A loaded lock (key `key` of database `db`) whose readers expire apart
/// is visited at its earliest deadline `at`, as a command would have
/// arranged (start-up, DEBUG RELOAD, a replica's full sync; a RESTORE is
/// refreshed by its keyspace event). The type's load callback calls it.
pub fn loaded(db: i32, key: &[u8], at: u64) {
    timers::schedule_earlier(db, key, Some(at));
}

/// Subscribes to the generic keyspace class and to the server events above
/// (closed connections only while some grant is bound: [`watch_clients`]).
/// Nothing periodic: a server that no lock is used on runs none of the
/// module's code.
pub fn subscribe(ctx: &Context) -> Status {
    // Key names read in place, if this server's strings allow it: the
    // keyspace callback is the one built for their layout.
    ffi::learn_string_layout(ctx.ctx);
    let on_generic: raw::RedisModuleNotificationFunc = match ffi::strings() {
        ffi::Layout::Redis => Some(on_generic::<ffi::RedisStrings>),
        ffi::Layout::Valkey => Some(on_generic::<ffi::ValkeyStrings>),
        ffi::Layout::ByCall => Some(on_generic::<ffi::StringsByCall>),
    };
    let keyspace = api!(RedisModule_SubscribeToKeyspaceEvents(
        ctx.ctx,
        raw::REDISMODULE_NOTIFY_GENERIC,
        on_generic
    ));
    let server_event = |id, callback| {
        api!(RedisModule_SubscribeToServerEvent(
            ctx.ctx,
            raw::RedisModuleEvent { id, dataver: 1 },
            Some(callback)
        ))
    };
    let ok = Some(raw::REDISMODULE_OK as c_int);
    let all = [
        keyspace,
        server_event(raw::REDISMODULE_EVENT_FLUSHDB, on_flush),
        server_event(raw::REDISMODULE_EVENT_SWAPDB, on_swapdb),
        server_event(raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED, on_role),
        server_event(raw::REDISMODULE_EVENT_LOADING, on_loaded),
        server_event(raw::REDISMODULE_EVENT_FORK_CHILD, on_fork),
    ];
    if all.iter().all(|s| *s == ok) {
        Status::Ok
    } else {
        Status::Err
    }
}

/// The rest of the load, once nothing can fail it any more (a timer or a
/// context left behind by a load Redis refused would outlive the module's
/// code): the module's own context, the first binding's subscription, and
/// the start-up's one look ([`on_started`]), at the event loop's first
/// turn, after the start-up load (Redis runs no timer while it loads).
pub fn start(ctx: &Context) {
    let own = api!(RedisModule_GetDetachedThreadSafeContext(ctx.ctx)).unwrap_or_default();
    OWN_CTX.store(own, Ordering::Relaxed);
    // The name filter's rebuilds on a context of their own.
    keys::start(ctx.ctx);
    bindings::on_first_binding(watch_clients);
    bindings::on_none_bound(unfollow_soon);
    api!(RedisModule_CreateTimer(
        ctx.ctx,
        0,
        Some(on_started),
        std::ptr::null_mut()
    ));
}

/// The module's own context (detached, used on the main thread only): to
/// subscribe and unsubscribe where Redis hands no context.
static OWN_CTX: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());

/// The module's own context, for `RedisModule_Call` where Redis hands none
/// (`INFO lock`'s look for `CONFIG RESETSTAT`: `stats::follow_resetstat`).
pub fn own_ctx() -> *mut raw::RedisModuleCtx {
    OWN_CTX.load(Ordering::Relaxed)
}

thread_local! {
    /// The old place of a lock RENAME or MOVE is carrying (`*_from` comes
    /// right before `*_to`).
    static MOVED_FROM: RefCell<Option<DbKey>> = const { RefCell::new(None) };
}

extern "C" fn on_generic<S: ffi::Strings>(
    raw_ctx: *mut raw::RedisModuleCtx,
    _class: c_int,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    // Most of these are not about locks: while no lock exists and nobody
    // waits, two atomic loads and nothing else, not even a stack frame for
    // the rest (a lock being renamed or moved exists all along:
    // `MOVED_FROM` is never left behind).
    if stats::lock_keys() == 0 && !waiting::busy() {
        return raw::REDISMODULE_OK as c_int;
    }
    // While some lock exists, an event on a name no lock has is answered
    // first, by the name alone (a `del`, a `copy_to`, a `rename_to` and a
    // `move_to` by their event: `by_event`): one byte says nothing else
    // matters (`keys::ATTENTION`), the name is read in place by the reader
    // of this server's layout (`S`: `ffi::Strings`), and looked up in a
    // probe of counts (`keys::probe_no`), before the rest of the event's
    // name is looked at; no call, the rest (and names past 32 bytes) out
    // of line.
    if keys::ATTENTION.load(Ordering::Relaxed) != 0 {
        return on_generic_locks(raw_ctx, event, key);
    }
    match by_event(event) {
        ByEvent::No => raw::REDISMODULE_OK as c_int,
        ByEvent::Name => on_generic_name::<S>(raw_ctx, event, key),
        ByEvent::Learn => on_generic_learn::<S>(raw_ctx, event, key),
    }
}

/// [`on_generic`] past the event's answer: the name's probe, inline.
#[inline(always)]
fn on_generic_name<S: ffi::Strings>(
    raw_ctx: *mut raw::RedisModuleCtx,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    // SAFETY: `key` is the live string Redis passed; `S` is the reader
    // chosen at load for this server's strings.
    if unsafe { S::name(key) }.is_some_and(keys::probe_no) {
        return raw::REDISMODULE_OK as c_int;
    }
    on_generic_maybe::<S>(raw_ctx, event, key)
}

/// [`on_generic`] for an event starting `r` or `m` while its `*_to`'s
/// address is not known yet ([`learn_to_event`]), out of line: the fast
/// path keeps no register across a call.
#[inline(never)]
extern "C" fn on_generic_learn<S: ffi::Strings>(
    raw_ctx: *mut raw::RedisModuleCtx,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    if learn_to_event(event) {
        return raw::REDISMODULE_OK as c_int;
    }
    on_generic_name::<S>(raw_ctx, event, key)
}

/// [`on_generic`] past the name's probe (`keys::probe_no`):
/// the filter's table, then the rest.
#[inline(never)]
extern "C" fn on_generic_maybe<S: ffi::Strings>(
    raw_ctx: *mut raw::RedisModuleCtx,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    // SAFETY: as in `on_generic`.
    if unsafe { S::name(key) }.is_some_and(keys::table_no) {
        return raw::REDISMODULE_OK as c_int;
    }
    on_generic_locks(raw_ctx, event, key)
}

/// What the event's name alone says ([`by_event`]).
enum ByEvent {
    /// About no lock.
    No,
    /// The key's name decides.
    Name,
    /// A `rename_*` or `move_*` while its `*_to`'s address is not known.
    Learn,
}

/// With no bit of [`keys::ATTENTION`] set, whether the event alone says it
/// is about no lock, before the key's name: a `del` (it matters only after
/// a lock was unlinked, an attention bit), a `copy_to` (the lock type has
/// no copy callback: `COPY` of a lock is refused, so a copy is never a
/// lock), or a `rename_to` or `move_to` (its `*_from` was answered no by
/// the name: a lock renamed or moved is unlinked from its old place first,
/// and the look at its `*_from` sets `MOVING`; so the value it names now
/// is no lock). An `expire` goes to the name after one compare; a
/// `rename_to` or a `move_to` is told by its address, the literal in the
/// server's executable seen once to hold it ([`TO_EVENTS`]), so that its
/// `*_from` goes to the name after one compare more, not after its
/// name's bytes.
#[inline(always)]
fn by_event(event: *const c_char) -> ByEvent {
    if event.is_null() {
        return ByEvent::No;
    }
    // SAFETY: Redis passes the event's name NUL-terminated: its first byte
    // is there.
    let first = unsafe { *event } as u8;
    if first == b'e' {
        // `expire`, the most frequent: its name decides.
        return ByEvent::Name;
    }
    if first < b'm' {
        // `del`, `copy_to` (never of a lock: the type copies none).
        return ByEvent::No;
    }
    // `rename_*`, `restore`, `move_*`, `persist`: only a `rename_to` and
    // a `move_to` are answered here.
    let to = match first {
        b'r' => &TO_EVENTS[0],
        b'm' => &TO_EVENTS[1],
        _ => return ByEvent::Name,
    };
    let known = to.load(Ordering::Relaxed);
    if event == known.cast_const() {
        ByEvent::No
    } else if known.is_null() {
        ByEvent::Learn
    } else {
        ByEvent::Name
    }
}

/// The addresses of the server's `rename_to` and `move_to` event names
/// ([`by_event`]), null until seen.
static TO_EVENTS: [AtomicPtr<c_char>; 2] = [
    AtomicPtr::new(std::ptr::null_mut()),
    AtomicPtr::new(std::ptr::null_mut()),
];

/// [`by_event`] for an event starting `r` or `m` while its `*_to`'s
/// address is not known: whether it is `rename_to` or `move_to` (its
/// bytes compared), and its address kept if it lies in the server's
/// executable (`ffi::in_server_image`: a literal, never another module's
/// buffer).
#[cold]
#[inline(never)]
fn learn_to_event(event: *const c_char) -> bool {
    // SAFETY: Redis passes the event's name NUL-terminated.
    let slot = match unsafe { CStr::from_ptr(event) }.to_bytes() {
        b"rename_to" => &TO_EVENTS[0],
        b"move_to" => &TO_EVENTS[1],
        _ => return false,
    };
    if ffi::in_server_image(event) {
        slot.store(event.cast_mut(), Ordering::Relaxed);
    }
    true
}

/// [`on_generic`] past the name's first answer (a name that may be a
/// lock's, or [`keys::ATTENTION`] set).
#[inline(never)]
extern "C" fn on_generic_locks(
    raw_ctx: *mut raw::RedisModuleCtx,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    let done = match event.is_null() || !may_concern_locks(event, key) {
        true => raw::REDISMODULE_OK as c_int,
        false => on_generic_heard(raw_ctx, event, key),
    };
    // Always OK, but not known to be at compile time: so the callers out
    // of line return what it returns, and [`on_generic`] jumps to them
    // (a tail call) rather than calls them, and keeps no stack frame.
    std::hint::black_box(done)
}

/// What the next events of a kind must be looked at for, whatever their
/// key's name (bits of `keys::ATTENTION`):
///
/// Some lock value left its name (the type's unlink) since the last
/// `rename_from` or `move_from` was looked at: the next one is (a lock
/// being renamed or moved may have been unlinked from its old name first).
const LEFT_A_NAME: u8 = 4;
/// The last `rename_from` or `move_from` was looked at (`MOVED_FROM`): its
/// `*_to` is too.
const MOVING: u8 = 8;
/// Some lock value left its name since the last `del` was looked at: the
/// next one is (`MIGRATE` unlinks the lock it moved away before its `del`;
/// a key that holds no lock has nothing to migrate).
const DELETED_A_LOCK: u8 = 16;

fn pending(bit: u8) -> bool {
    keys::ATTENTION.load(Ordering::Relaxed) & bit != 0
}

fn set_pending(bit: u8, on: bool) {
    keys::attend(bit, on);
}

/// A lock value left its name (the type's unlink: `persistence`).
pub fn moved_or_gone() {
    set_pending(LEFT_A_NAME | DELETED_A_LOCK, true);
}

/// Whether a generic event may be about a lock, or a key requests wait for
/// (exactly: no when it is not; the event's name told apart by its first
/// bytes, the key's name by `keys::may_be_lock`).
/// The events the module acts on: `expire`, `persist`, `restore` (of a
/// lock), `rename_*` and `move_*` (of a lock: its old name was counted
/// still, or it was unlinked from it first), `del` (of a lock requests
/// wait for, which `MIGRATE` unlinked first). Any other: no.
#[inline(always)]
fn may_concern_locks(event: *const c_char, key: *mut raw::RedisModuleString) -> bool {
    // SAFETY: Redis passes the event's name NUL-terminated: a byte is read
    // only after every one before it was seen not to be NUL.
    let at = |i: usize| unsafe { *event.add(i) } as u8;
    let name = || ffi::name_of(key);
    let moved = |from: bool| match from {
        true => pending(LEFT_A_NAME) || keys::may_be_lock(name()),
        false => pending(MOVING),
    };
    let renamed = at(0) == b'r' && at(1) == b'e' && at(2) == b'n';
    let is_from = |i: usize| at(i) == b'_' && at(i + 1) == b'f';
    let moved_from = (renamed && at(3) == b'a' && at(4) == b'm' && at(5) == b'e' && is_from(6))
        || (at(0) == b'm' && at(1) == b'o' && at(2) == b'v' && at(3) == b'e' && is_from(4));
    if !moved_from {
        // A lock's old name matters only to the `*_from` its RENAME or
        // MOVE fires next, in the same command: any other event ends it
        // (the bit must not send every later event here).
        set_pending(LEFT_A_NAME, false);
    }
    match at(0) {
        b'e' | b'p' => keys::may_be_lock(name()),
        b'r' if at(1) == b'e' => match at(2) {
            b'n' if at(3) == b'a' && at(4) == b'm' && at(5) == b'e' && at(6) == b'_' => {
                moved(at(7) == b'f')
            }
            _ => keys::may_be_lock(name()),
        },
        b'm' if at(1) == b'o' && at(2) == b'v' && at(3) == b'e' && at(4) == b'_' => {
            moved(at(5) == b'f')
        }
        b'd' => {
            let look = pending(DELETED_A_LOCK) && waiting::busy();
            if !look {
                // Nobody waits: the `del` that followed the unlink needs
                // no look (and the bit must not outlive it).
                set_pending(DELETED_A_LOCK, false);
            }
            look
        }
        _ => false,
    }
}

#[inline(never)]
fn on_generic_heard(
    raw_ctx: *mut raw::RedisModuleCtx,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    catch::callback("a keyspace event", raw::REDISMODULE_OK as c_int, || {
        // SAFETY: Redis passes the event's name as a NUL-terminated string.
        let event = unsafe { CStr::from_ptr(event) }.to_bytes();
        let ctx = Context::new(raw_ctx);
        let name = RedisString::string_as_slice(key);
        // With no lock anywhere (someone waits for a key that has none),
        // nothing is looked at and the key's name is not even copied.
        let locks = stats::lock_keys() > 0;
        match event {
            b"restore" | b"expire" | b"persist" if locks && looked_up(&ctx, key) => {
                let id = ffi::db_key(&ctx, name);
                if event == b"restore" {
                    waiting::holders_unsure(&id);
                }
                timers::refresh(id.db, &id.name);
            }
            b"rename_to" | b"move_to" => {
                set_pending(MOVING, false);
                let from = MOVED_FROM.with(|m| m.borrow_mut().take());
                if from.is_none() && !locks {
                    return raw::REDISMODULE_OK as c_int;
                }
                let id = ffi::db_key(&ctx, name);
                if let Some(from) = from.filter(|_| bindings::count() != 0) {
                    bindings::moved(&from, &id, keys::tokens(&ctx, key));
                }
                if locks && sessions::any() {
                    for session in keys::sessions(&ctx, key) {
                        sessions::join(session, &id);
                    }
                }
                if locks && looked_up(&ctx, key) {
                    // Its new name counted (its old one was at its unlink).
                    keys::named(name, false);
                    waiting::holders_unsure(&id);
                    timers::refresh(id.db, &id.name);
                }
            }
            b"rename_from" | b"move_from" => {
                set_pending(LEFT_A_NAME, false);
                if !locks {
                    MOVED_FROM.with(|m| *m.borrow_mut() = None);
                    return raw::REDISMODULE_OK as c_int;
                }
                let id = ffi::db_key(&ctx, name);
                timers::moved_away(id.db, &id.name);
                MOVED_FROM.with(|m| *m.borrow_mut() = Some(id));
                set_pending(MOVING, true);
            }
            b"del" => {
                set_pending(DELETED_A_LOCK, false);
                if !waiting::anyone_waits() {
                    return raw::REDISMODULE_OK as c_int;
                }
                let id = ffi::db_key(&ctx, name);
                if waiting::is_waited_on(&id) && migrating_away(&ctx, key) {
                    // MIGRATE moved the lock, holders and all, to another
                    // node: the waiters retry there (Redis answers them ASK).
                    waiting::fail_all(id.db, &id.name, LockError::Migrating);
                }
            }
            _ => {}
        }
        raw::REDISMODULE_OK as c_int
    })
}

/// Lock keys when the flush under way started ([`on_flush`]).
static KEYS_BEFORE_FLUSH: AtomicI64 = AtomicI64::new(0);

extern "C" fn on_flush(
    _raw_ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    catch::callback("a flush event", (), || {
        // SAFETY: for this event Redis passes a `RedisModuleFlushInfo`.
        let info = unsafe { data.cast::<raw::RedisModuleFlushInfo>().as_ref() };
        if subevent != raw::REDISMODULE_SUBEVENT_FLUSHDB_END {
            KEYS_BEFORE_FLUSH.store(stats::lock_keys(), Ordering::Relaxed);
            return;
        }
        let db = info.map_or(-1, |i| i.dbnum);
        let mut work = bindings::flushed(db);
        // The flushed locks' names go (no unlink told them apart): a
        // synchronous flush freed its values already, so the lock keys
        // counted before and after tell whether it held any.
        let sync = info.is_some_and(|i| i.sync != 0);
        let left = stats::lock_keys();
        let freed = !sync || left != KEYS_BEFORE_FLUSH.load(Ordering::Relaxed);
        let left = usize::try_from(left).ok().filter(|_| sync);
        keys::flushed(db == -1, freed, left);
        if db == -1 {
            // A flush of every database parks the bindings (a DEBUG RELOAD
            // loads the server's own data right after, in the same turn);
            // if no load followed by the next turn, they go.
            let own = OWN_CTX.load(Ordering::Relaxed);
            if !own.is_null() {
                api!(RedisModule_CreateTimer(
                    own,
                    0,
                    Some(on_flushed_turn),
                    std::ptr::null_mut()
                ));
            }
        }
        work |= sessions::flushed(db);
        timers::flushed(db);
        if work {
            // What the flush left to drop goes a slice of a tick at a time.
            timers::work_now();
        }
        // Its waited keys are free: visited from the next ticks on.
        waiting::flushed(db);
    })
}

/// Whether `key` holds a lock, opened to see (`lock_name_lookups`).
fn looked_up(ctx: &Context, key: *mut raw::RedisModuleString) -> bool {
    stats::NAME_LOOKUPS.incr();
    keys::is_lock(ctx, key)
}

/// In a cluster, whether this key's slot is being migrated away from this
/// node (so the key vanished because MIGRATE moved it, not because the lock
/// was freed). Only asked for keys that clients wait for.
fn migrating_away(ctx: &Context, key: *mut raw::RedisModuleString) -> bool {
    if !ctx.get_flags().contains(ContextFlags::CLUSTER) {
        return false;
    }
    let keyslot = ffi::name(ctx, b"KEYSLOT");
    let key = ffi::name(ctx, RedisString::string_as_slice(key));
    let Ok(RedisValue::Integer(slot)) = ctx.call("CLUSTER", &[&keyslot, &key]) else {
        return false;
    };
    // CLUSTER NODES is the server's own text (addresses, ids, slot ranges).
    let nodes = match ctx.call("CLUSTER", &["NODES"]) {
        Ok(RedisValue::SimpleString(s) | RedisValue::BulkString(s)) => s.into_bytes(),
        Ok(RedisValue::StringBuffer(b)) => b,
        Ok(RedisValue::VerbatimString((_, b))) => b,
        _ => return false,
    };
    let marker = format!("[{slot}->-");
    nodes
        .split(|&b| b == b'\n')
        .any(|line| contains(line, b"myself") && contains(line, marker.as_bytes()))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// After SWAPDB the timer's entries, the bindings, the sessions' keys and
/// the waiting queues follow their keys (each table swaps two homes: O(1)
/// whatever they hold); nothing is visited: every key keeps its value, its
/// queue and its planned visits, in the other database.
extern "C" fn on_swapdb(
    _raw_ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    catch::callback("a swapdb event", (), || {
        // SAFETY: for this event Redis passes a `RedisModuleSwapDbInfo`.
        let Some(info) = (unsafe { data.cast::<raw::RedisModuleSwapDbInfo>().as_ref() }) else {
            return;
        };
        keys::swapped();
        timers::swap_dbs(info.dbnum_first, info.dbnum_second);
        bindings::swap_dbs(info.dbnum_first, info.dbnum_second);
        sessions::swap_dbs(info.dbnum_first, info.dbnum_second);
        waiting::swap_dbs(info.dbnum_first, info.dbnum_second);
    })
}

/// A file (RDB, AOF, a replica's full sync) starts loading: values loaded
/// take their time from this moment (`clock::load_time`). It was loaded:
/// at start-up the token counter jumps past what it holds; a replica's
/// full sync owes a jump at its next promotion (`fencing::loaded`).
extern "C" fn on_loaded(
    raw_ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    catch::callback("a loading event", (), || {
        let over = subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED
            || subevent == raw::REDISMODULE_SUBEVENT_LOADING_FAILED;
        clock::loading(!over);
        match subevent {
            // DEBUG RELOAD / DEBUG LOADAOF: the server's own data is back,
            // its connections open all along: so are their bindings.
            raw::REDISMODULE_SUBEVENT_LOADING_ENDED => {
                if bindings::reloaded() {
                    waiting::connection_closed();
                }
                if bindings::count() != 0 {
                    // Bindings back from before the flush: heard and
                    // followed again.
                    watch_clients();
                }
                if bindings::dead() > 0 {
                    timers::work_now();
                }
            }
            raw::REDISMODULE_SUBEVENT_LOADING_RDB_START
            | raw::REDISMODULE_SUBEVENT_LOADING_AOF_START => {}
            // A master's data (a full sync), or no data: bindings stay gone.
            _ => bindings::drop_parked(),
        }
        if subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED {
            fencing::loaded(
                replication::is_replica(),
                clock::now_ms(),
                config::clock_skew_ms(),
            );
            // Redis 7.0 keeps a backlog after loading a file with
            // replication data: look whether effects have a listener.
            replication::check_listeners(&Context::new(raw_ctx));
        } else {
            replication::listeners_may_appear();
        }
    })
}

/// A fork: a snapshot for a replica's full sync or an AOF rewrite may be
/// starting (effects may have a listener from now on); when it ends, look
/// again.
extern "C" fn on_fork(
    raw_ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    catch::callback("a fork event", (), || {
        if subevent == raw::REDISMODULE_SUBEVENT_FORK_CHILD_BORN {
            replication::listeners_may_appear();
        } else {
            replication::check_listeners(&Context::new(raw_ctx));
        }
    })
}

/// The turn after a flush of every database: the bindings it parked go,
/// unless a load of the server's own data is under way (it takes them back
/// at its end, `bindings::reloaded`).
extern "C" fn on_flushed_turn(_raw_ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    catch::callback("the turn after a flush", (), || {
        if !clock::is_loading() {
            bindings::drop_parked();
        }
    })
}

/// The event loop's first turn (the start-up load, if any, is over):
/// loads from now on are reloads or full syncs (`fencing::loaded`), and
/// whether effects have a listener is looked at once. Later looks happen
/// at a fork's end, a load's end, and while effects are built
/// (`replication::BUILT`): nothing runs periodically.
extern "C" fn on_started(raw_ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    catch::callback("the start-up look", (), || {
        fencing::started();
        replication::check_listeners(&Context::new(raw_ctx));
    })
}

/// A replica became a master: its token counter jumps ahead, and what came
/// due meanwhile is visited now.
extern "C" fn on_role(
    _raw_ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    catch::callback("a role change", (), || {
        let master = subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER;
        replication::set_replica(!master);
        replication::listeners_may_appear();
        if master {
            // Above every token the old master can have issued, even those
            // this server never received, if anything came from it since
            // the last jump (`fencing::promoted`).
            fencing::promoted(clock::now_ms(), config::clock_skew_ms());
            timers::promoted();
        }
    })
}

/// Whether the module hears connections close (`CLIENT_CHANGE`): only while
/// some grant is bound, so that no other connection pays for the event.
static WATCHING: AtomicBool = AtomicBool::new(false);
/// Whether a look to stop hearing them is planned ([`unwatch_soon`]).
static UNWATCH_PLANNED: AtomicBool = AtomicBool::new(false);

const CLIENT_CHANGE: raw::RedisModuleEvent = raw::RedisModuleEvent {
    id: raw::REDISMODULE_EVENT_CLIENT_CHANGE,
    dataver: 1,
};

/// The first grant is bound (`bindings`, with no binding before it):
/// connections closing are heard from now on, before the command that
/// bound it returns.
fn watch_clients() {
    let ctx = OWN_CTX.load(Ordering::Relaxed);
    // A script may renew its caller's bound holders from now on (a
    // filter still registered is kept, and what it saw with it).
    script_caller::follow(ctx, true);
    if WATCHING.swap(true, Ordering::Relaxed) {
        return;
    }
    let done = api!(RedisModule_SubscribeToServerEvent(
        ctx,
        CLIENT_CHANGE,
        Some(on_client)
    ));
    if done != Some(raw::REDISMODULE_OK as c_int) {
        WATCHING.store(false, Ordering::Relaxed);
        crate::redis::log::warning(
            "lock: could not subscribe to closed connections: a bound grant ends with its lease",
        );
    }
}

/// Whether a look to stop following scripts' callers is planned
/// ([`unfollow_soon`]).
static UNFOLLOW_PLANNED: AtomicBool = AtomicBool::new(false);

/// The last binding is gone: no script can renew a bound holder, so the
/// command filter that names scripts' callers (`script_caller`, a call
/// on every command of every client) goes at the event loop's next turn,
/// if still none is bound; not at once, so that a transaction or a script
/// that releases its connection's last holder and binds another keeps
/// what the filter saw of its caller.
fn unfollow_soon() {
    let ctx = OWN_CTX.load(Ordering::Relaxed);
    if !ctx.is_null() {
        next_turn_once(ctx, &UNFOLLOW_PLANNED, on_unfollow);
    }
}

/// `look` at the event loop's next turn (a timer of 0 ms) through `ctx`,
/// unless one is planned already (`planned`, which `look` clears).
fn next_turn_once(
    ctx: *mut raw::RedisModuleCtx,
    planned: &AtomicBool,
    look: extern "C" fn(*mut raw::RedisModuleCtx, *mut c_void),
) {
    if planned.swap(true, Ordering::Relaxed) {
        return;
    }
    let timer = api!(RedisModule_CreateTimer(
        ctx,
        0,
        Some(look),
        std::ptr::null_mut()
    ));
    if timer.is_none() {
        planned.store(false, Ordering::Relaxed);
    }
}

extern "C" fn on_unfollow(_raw_ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    catch::callback("the script callers' look", (), || {
        UNFOLLOW_PLANNED.store(false, Ordering::Relaxed);
        if bindings::count() == 0 {
            script_caller::follow(OWN_CTX.load(Ordering::Relaxed), false);
        }
    })
}

/// A connection closed while no grant is bound: stop hearing them, at the
/// event loop's next turn (Redis is walking its listeners now, and frees
/// one that unsubscribes inside its own call), if still none is bound.
fn unwatch_soon(ctx: *mut raw::RedisModuleCtx) {
    next_turn_once(ctx, &UNWATCH_PLANNED, on_unwatch);
}

extern "C" fn on_unwatch(_raw_ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    catch::callback("the closed-connection look", (), || {
        UNWATCH_PLANNED.store(false, Ordering::Relaxed);
        if bindings::count() != 0 || !WATCHING.load(Ordering::Relaxed) {
            return;
        }
        let ctx = OWN_CTX.load(Ordering::Relaxed);
        let done = api!(RedisModule_SubscribeToServerEvent(ctx, CLIENT_CHANGE, None));
        if done == Some(raw::REDISMODULE_OK as c_int) {
            WATCHING.store(false, Ordering::Relaxed);
            script_caller::follow(ctx, false);
        }
    })
}

/// A connection closed: every grant bound to it ends at its key's next
/// visit (now), all holds at once, as by LOCK.RELEASE.
extern "C" fn on_client(
    raw_ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    catch::callback("a client event", (), || {
        if subevent != raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED {
            return;
        }
        if bindings::count() == 0 {
            unwatch_soon(raw_ctx);
            return;
        }
        // SAFETY: for this event Redis passes a `RedisModuleClientInfo`.
        let Some(info) = (unsafe { data.cast::<raw::RedisModuleClientInfo>().as_ref() }) else {
            return;
        };
        // Its holders hold nothing from now on: the connection is marked
        // closed at once and every transaction on their keys ends them
        // first; the timer ends the rest, a share per tick.
        if let Some(closed) = bindings::detach_client(info.id) {
            waiting::connection_closed();
            timers::release_bound(closed);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    #[test]
    fn an_event_is_answered_by_its_name_only_when_it_cannot_be_about_a_lock() {
        let answer = |name: &str| {
            let event = CString::new(name).unwrap_or_default();
            let by = by_event(event.as_ptr());
            // Outside a server no address is kept (`ffi::in_server_image`):
            // a `rename_*` or `move_*` is learnt from its bytes each time.
            let no = match by {
                ByEvent::No => true,
                ByEvent::Name => false,
                ByEvent::Learn => learn_to_event(event.as_ptr()),
            };
            (matches!(by, ByEvent::Learn), no)
        };
        for name in ["del", "copy_to"] {
            assert_eq!(answer(name), (false, true), "{name}");
        }
        for name in ["expire", "persist"] {
            assert_eq!(answer(name), (false, false), "{name}");
        }
        for name in ["rename_to", "move_to"] {
            assert_eq!(answer(name), (true, true), "{name}");
        }
        for name in [
            "rename_from",
            "move_from",
            "restore",
            "rename_t",
            "move_tox",
            "r",
            "m",
        ] {
            assert_eq!(answer(name), (true, false), "{name}");
        }
        assert!(TO_EVENTS
            .iter()
            .all(|t| t.load(Ordering::Relaxed).is_null()));
        assert!(matches!(by_event(std::ptr::null()), ByEvent::No));
    }
}
