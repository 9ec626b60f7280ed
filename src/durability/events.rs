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
//!   exists and none was just unlinked, the event is told by its address
//!   (a `del`, `rename_*`, `move_*` or `copy_to` is about no lock then),
//!   and an `expire`'s key by its name: read in place (`ffi::Strings`),
//!   looked up in a probe of counts and then a filter of the names locks
//!   have (`keys::probe_no_inside`, `keys::may_be_lock`), the key never opened.
//!   A flush that freed locks has the filter rebuilt (`keys::flushed`).
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
use crate::redis::shared::MainCell;
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
    // Most of these are not about locks. Whether anything needs more than
    // the quick answers is one byte (`keys::ATTENTION`: no lock at all,
    // the filter unsure, a lock unlinked, moved or deleted just before);
    // while it is 0, the event is told by its address, no call and no
    // stack frame: an `expire` first, by one compare that also says the
    // byte is 0 (`keys::QUICK_EVENT`), goes to its key's name, read in
    // place by the reader of this server's layout (`S`: `ffi::Strings`)
    // and looked up in a probe of counts (`keys::probe_no_inside`); a `del`, a
    // `rename_*`, a `move_*` or a `copy_to` is about no lock ([`Known`]).
    // The rest out of line.
    if event == keys::QUICK_EVENT.get() {
        return on_generic_name::<S>(raw_ctx, event, key);
    }
    if keys::ATTENTION.get() != 0 {
        if stats::lock_keys() == 0 && !waiting::busy() {
            // No lock and nobody waits: nothing to look at (the count
            // itself, not `keys::NO_LOCKS`, which only makes the byte
            // say so: exact whatever thread counted).
            return raw::REDISMODULE_OK as c_int;
        }
        return on_generic_attend::<S>(raw_ctx, event, key);
    }
    on_generic_quick::<S>(raw_ctx, event, key)
}

/// [`on_generic`] while nothing needs attention: the event by its address.
#[inline(always)]
fn on_generic_quick<S: ffi::Strings>(
    raw_ctx: *mut raw::RedisModuleCtx,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    let known = |k: Known| k.at().get();
    // (An `expire` whose address is known was answered by
    // `keys::QUICK_EVENT`.) One compare each (not a loop, which the
    // compiler turns into vector compares of them all), in the order of
    // how often a cache server sees them, `*_from` before its `*_to`.
    let ok = raw::REDISMODULE_OK as c_int;
    if event == known(Known::Del) {
        return ok;
    }
    if event == known(Known::RenameFrom) {
        return ok;
    }
    if event == known(Known::RenameTo) {
        return ok;
    }
    if event == known(Known::MoveFrom) {
        return ok;
    }
    if event == known(Known::MoveTo) {
        return ok;
    }
    if event == known(Known::CopyTo) {
        return ok;
    }
    on_generic_event::<S>(raw_ctx, event, key)
}

/// [`on_generic`] past the event's answer: the name's probe, inline.
#[inline(always)]
fn on_generic_name<S: ffi::Strings>(
    raw_ctx: *mut raw::RedisModuleCtx,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    // SAFETY: `key` is the live string Redis passed; `S` is the reader
    // chosen at load for this server's strings; `probe_no_inside` reads the
    // bytes it is given, and the 8 before their end only when the reader
    // says they are inside the string object.
    if unsafe {
        S::with_name(
            key,
            #[inline(always)]
            |p, n, inside| keys::probe_no_inside(p, n, inside),
        )
    } == Some(true)
    {
        return raw::REDISMODULE_OK as c_int;
    }
    on_generic_maybe::<S>(raw_ctx, event, key)
}

/// [`on_generic`] with some bit of `keys::ATTENTION` set, while some lock
/// exists or someone waits, out of line: the quick answers while only
/// [`keys::NO_LOCKS`] is set (someone waits for a key that holds no lock);
/// else every event goes to [`on_generic_locks`].
#[inline(never)]
extern "C" fn on_generic_attend<S: ffi::Strings>(
    raw_ctx: *mut raw::RedisModuleCtx,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    if keys::ATTENTION.get() & !keys::NO_LOCKS == 0 {
        return on_generic_quick::<S>(raw_ctx, event, key);
    }
    on_generic_locks(raw_ctx, event, key)
}

/// [`on_generic`] for an event whose address is not known (not seen yet,
/// or not one [`Known`] keeps), out of line: its bytes, and its address
/// kept if it is one of them.
#[inline(never)]
extern "C" fn on_generic_event<S: ffi::Strings>(
    raw_ctx: *mut raw::RedisModuleCtx,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    if by_event(event) {
        return on_generic_name::<S>(raw_ctx, event, key);
    }
    raw::REDISMODULE_OK as c_int
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

/// The event names [`on_generic`] tells by their address
/// ([`Known::at`]).
#[derive(Clone, Copy)]
enum Known {
    Expire,
    Del,
    RenameFrom,
    RenameTo,
    MoveFrom,
    MoveTo,
    CopyTo,
}

impl Known {
    /// Where its address is kept, once known.
    #[inline(always)]
    fn at(self) -> &'static MainCell<*const c_char> {
        match self {
            Known::Expire => &keys::QUICK_EVENT_LEARNT,
            Known::Del => &KNOWN_DEL,
            Known::RenameFrom => &KNOWN_RENAME_FROM,
            Known::RenameTo => &KNOWN_RENAME_TO,
            Known::MoveFrom => &KNOWN_MOVE_FROM,
            Known::MoveTo => &KNOWN_MOVE_TO,
            Known::CopyTo => &KNOWN_COPY_TO,
        }
    }

    const ALL: [(Known, &'static [u8]); 7] = [
        (Known::Expire, b"expire"),
        (Known::Del, b"del"),
        (Known::RenameFrom, b"rename_from"),
        (Known::RenameTo, b"rename_to"),
        (Known::MoveFrom, b"move_from"),
        (Known::MoveTo, b"move_to"),
        (Known::CopyTo, b"copy_to"),
    ];
}

/// The addresses of the server's literals for [`Known`]'s event names
/// (`expire`'s: `keys::QUICK_EVENT_LEARNT`), null until seen
/// ([`by_event`]). Main thread only (plain loads: each compare one
/// instruction). One static each: the compiler turns loads from one
/// array into vector compares of all of them.
static KNOWN_DEL: MainCell<*const c_char> = MainCell::new(std::ptr::null());
static KNOWN_RENAME_FROM: MainCell<*const c_char> = MainCell::new(std::ptr::null());
static KNOWN_RENAME_TO: MainCell<*const c_char> = MainCell::new(std::ptr::null());
static KNOWN_MOVE_FROM: MainCell<*const c_char> = MainCell::new(std::ptr::null());
static KNOWN_MOVE_TO: MainCell<*const c_char> = MainCell::new(std::ptr::null());
static KNOWN_COPY_TO: MainCell<*const c_char> = MainCell::new(std::ptr::null());

/// With no bit of [`keys::ATTENTION`] set, whether an event whose address
/// is not known needs its key's name looked at: an `expire`, a `persist`
/// or a `restore` does. The others are about no lock: a `del` (it matters
/// only after a lock was unlinked, an attention bit), a `copy_to` (the
/// lock type has no copy callback: `COPY` of a lock is refused, so a copy
/// is never a lock), a `rename_*` or a `move_*` (a lock renamed or moved
/// is unlinked from its old name first, which sets an attention bit until
/// its `*_from` and `*_to` are looked at), and any other module's event. A
/// [`Known`] name's address is kept if it lies in the server's executable
/// (`ffi::in_server_image`: a literal, never another module's buffer), so
/// that the next one is told by one compare.
#[cold]
#[inline(never)]
fn by_event(event: *const c_char) -> bool {
    if event.is_null() {
        return false;
    }
    // SAFETY: Redis passes the event's name NUL-terminated.
    let name = unsafe { CStr::from_ptr(event) }.to_bytes();
    if let Some((known, _)) = Known::ALL.iter().find(|(_, n)| *n == name) {
        if ffi::in_server_image(event) {
            match known {
                Known::Expire => keys::learn_quick_event(event),
                _ => known.at().set(event),
            }
        }
        return matches!(known, Known::Expire);
    }
    matches!(name, b"persist" | b"restore")
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
    keys::ATTENTION.get() & bit != 0
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
    if at(0) != b'd' {
        // So does an unlinked lock to the `del` of the `MIGRATE` that
        // unlinked it, fired next (a lock that expired, or was deleted
        // by any other command, leaves the bit to the next event).
        set_pending(DELETED_A_LOCK, false);
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
        // Whether the key's name is looked at.
        let named = |name: &str| {
            let event = CString::new(name).unwrap_or_default();
            by_event(event.as_ptr())
        };
        for name in ["expire", "persist", "restore"] {
            assert!(named(name), "{name}");
        }
        for name in [
            "del",
            "copy_to",
            "rename_from",
            "rename_to",
            "move_from",
            "move_to",
            "rename_t",
            "move_tox",
            "expired",
            "expir",
            "r",
            "",
        ] {
            assert!(!named(name), "{name}");
        }
        // Outside a server no address is kept (`ffi::in_server_image`).
        assert!(Known::ALL.iter().all(|(k, _)| k.at().get().is_null()));
        assert!(!by_event(std::ptr::null()));
    }
}
