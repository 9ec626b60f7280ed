//! One module timer for every lock.
//!
//! A deadline-ordered index (`BTreeSet<(when, db, key)>`, plus a map from key
//! to its entry) lists the keys that must be looked at when a time comes:
//! a key with waiters, at its earliest holder deadline (so a waiter is granted
//! the moment a lease expires, not when Redis's lazy or active expiry gets
//! round to it); a shared lock whose readers expire at different times, at its
//! earliest deadline (so dead readers leave memory, LOCK.INFO and replicas);
//! and a key whose lock something else freed or moved (DEL, FLUSH*, RENAME,
//! RESTORE ...), at once. Exactly one Redis timer is armed, for the earliest
//! entry. Cost per indexed key: one set entry and one map entry, O(log n) to
//! move; keys that need no visit (an exclusive lock nobody waits for) are not
//! indexed at all.
//!
//! When the timer fires, it hands what is due to the handler registered at
//! load (`visits`), which visits each key through `transitions::update` with no
//! transition of its own: expired holders are dropped (and the drop
//! replicated), waiters are granted, and the key is indexed again if needed.
//! A key marked for a refresh also has its whole state written back and
//! replicated (its Redis TTL again the latest deadline). An entry that no
//! longer matches its key is harmless: the visit finds nothing to do. Each
//! visit is caught on its own, and the timer is re-armed whatever a visit
//! did, so one key can never hold up another.
//!
//! The timer can be armed from anywhere, even from callbacks Redis gives no
//! context (a value's unlink, its load): it uses a context of the module's
//! own, made once at load.
//!
//! A replica does not write: keys that come due there wait in `deferred`
//! until it becomes a master, and are visited then, a tick's share at a
//! time (a million leases run out on a replica: no promotion stall).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{LazyLock, Mutex, OnceLock};

use redis_module::{raw, Context, ContextFlags};

use crate::redis::catch;
use crate::redis::ffi::{self, api, DbKey, DbKeyMap, KeyAt, KeyFilter, KeyRef};
use crate::redis::homes::{self, Home, Homes};
use crate::redis::replication;
use crate::redis::shared::{self, Locked};
use crate::state::bindings::Detached;
use crate::state::sessions;
use crate::time::clock;

/// The entries of `by_time`, `by_key`, `refresh` and `deferred` name their
/// key's database by its home (`homes`: a flush or a swap is O(1)); an
/// entry of a flushed database is dropped when its time comes, unvisited.
#[derive(Default)]
struct Index {
    homes: Homes,
    /// How many keys of each live home are indexed (`len`): as many as
    /// databases with planned keys, a list looked through.
    counts: Vec<(Home, usize)>,
    by_time: BTreeSet<(u64, Home, Vec<u8>)>,
    by_key: DbKeyMap<u64>,
    /// Keys whose next visit also writes back and replicates their whole state.
    refresh: DbKeyMap<()>,
    /// Locks Redis removed after every lease in them ran out, with how many
    /// leases: counted and announced (`lock.expired`) at the next ticks, a
    /// share of the turn at a time ([`take_expired_some`]), or by the next
    /// command on their database first ([`take_expired`]). By database (as
    /// many entries as databases with some, none empty), in the order
    /// Redis removed them: a command takes its database's at once, and
    /// the RENAME that unlinked one takes it back from the end.
    expired: Vec<(i32, VecDeque<Expired>)>,
    /// Keys that came due while this server was a replica, each with its
    /// number in the order they came (`deferred_order`, by number): a
    /// master's ticks visit them from the first.
    deferred: DbKeyMap<u64>,
    deferred_order: BTreeMap<u64, DbKey>,
    /// The next number of a deferred key.
    deferred_next: u64,
    /// Connections that closed with bound grants, to end at the next ticks.
    released: VecDeque<Detached>,
    /// The armed Redis timer and when it fires.
    armed: Option<(raw::RedisModuleTimerID, u64)>,
}

/// An expired lock's name and how many leases it had.
type Expired = (Vec<u8>, usize);

static INDEX: LazyLock<Mutex<Index>> = LazyLock::new(Mutex::default);

/// The module's own context (a detached thread-safe context, used on the main
/// thread only), for arming the timer where Redis hands no context.
static MODULE_CTX: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());

/// Whether any key is indexed, and whether expired locks wait to be
/// announced, readable without the index's mutex: every transition asks
/// both, and on a server without shared locks or waiters takes nothing.
static INDEXED: AtomicBool = AtomicBool::new(false);
static EXPIRED: AtomicBool = AtomicBool::new(false);
/// Work a tick must go on with at once ([`work_now`]: a deadlock search
/// under way, unblocks left for the next turn).
static WORK: AtomicBool = AtomicBool::new(false);

/// The index, locked; `INDEXED` and `EXPIRED` follow it when the lock is
/// let go.
/// The indexed keys, filtered ([`planned`] asks it first).
static PLANNED: KeyFilter = KeyFilter::new();

fn index() -> Locked<Index> {
    shared::lock(&INDEX, |index| {
        // (A deferred key's visit is planned too: [`planned`].)
        let planned = !index.by_key.is_empty() || !index.deferred.is_empty();
        if !planned {
            PLANNED.clear();
        }
        INDEXED.store(planned, Ordering::Relaxed);
        EXPIRED.store(!index.expired.is_empty(), Ordering::Relaxed);
    })
}

/// Makes the module's own context; called once at load.
pub fn init(ctx: &Context) -> bool {
    homes::on_throw(work_now);
    let own = api!(RedisModule_GetDetachedThreadSafeContext(ctx.ctx)).unwrap_or_default();
    MODULE_CTX.store(own, Ordering::Relaxed);
    !own.is_null()
}

/// How many keys are indexed; `None` rather than wait for the index (INFO
/// during a crash report).
pub fn len() -> Option<usize> {
    INDEX
        .try_lock()
        .ok()
        .map(|i| i.counts.iter().map(|c| c.1).sum())
}

impl Index {
    /// Key `name` of database `db`, as the index keeps it (`None`: `db`
    /// has nothing indexed since it was last flushed).
    fn key(&self, db: i32, name: &[u8]) -> Option<DbKey> {
        Some(DbKey::new(self.homes.get(db)?, name))
    }

    /// Key `name` of database `db`, as the index keeps it from now on.
    fn key_made(&mut self, db: i32, name: &[u8]) -> DbKey {
        DbKey::new(self.homes.home(db), name)
    }

    /// `key` (by home) joined `by_key`, or left it.
    fn counted(&mut self, key: &DbKey, joined: bool) {
        let at = self.counts.iter().position(|c| c.0 == key.db);
        match (at, joined) {
            (Some(at), _) => {
                if let Some(c) = self.counts.get_mut(at) {
                    c.1 = match joined {
                        true => c.1 + 1,
                        false => c.1.saturating_sub(1),
                    };
                    if c.1 == 0 {
                        self.counts.swap_remove(at);
                    }
                }
            }
            (None, true) => self.counts.push((key.db, 1)),
            (None, false) => {}
        }
    }
}

/// Whether any key is indexed (so a change may have to unindex one).
pub fn any() -> bool {
    INDEXED.load(Ordering::Relaxed)
}

/// Whether a visit of key `name` of database `db` is planned (one atomic
/// load while no key is indexed; else the filter, then, if it cannot say
/// no, a map look-up, nothing copied): the fast paths' question.
#[inline]
pub fn planned(key: &KeyAt<'_>) -> bool {
    #[cold]
    #[inline(never)]
    fn indexed(db: i32, name: &[u8]) -> bool {
        let index = index();
        index.homes.get(db).is_some_and(|home| {
            let key = &(home, name) as &dyn KeyRef;
            index.by_key.contains_key(key)
                || !index.deferred.is_empty() && index.deferred.contains_key(key)
        })
    }
    INDEXED.load(Ordering::Relaxed) && PLANNED.may_contain(key) && indexed(key.db, key.name)
}

/// Visit `key` at `when` (unix ms), or never (`None`). Replaces any earlier plan.
pub fn schedule(db: i32, key: &[u8], when: Option<u64>) {
    let mut index = index();
    let id = match when {
        Some(_) => index.key_made(db, key),
        None => match index.key(db, key) {
            Some(id) => id,
            None => return,
        },
    };
    let home = id.db;
    let old = match when {
        Some(at) => {
            PLANNED.insert(db, key);
            index.by_key.insert(id.clone(), at)
        }
        None => index.by_key.remove(&id),
    };
    if old == when {
        return;
    }
    if old.is_none() || when.is_none() {
        index.counted(&id, when.is_some());
    }
    if let Some(old) = old {
        index.by_time.remove(&(old, home, key.to_vec()));
    }
    if let Some(at) = when {
        index.by_time.insert((at, home, key.to_vec()));
    }
    arm(&mut index, 0);
}

/// The lock at `key` is gone (DEL, a write over it, its expiry) and nobody
/// waits for it: no visit is planned for it any more.
pub fn forget(db: i32, key: &[u8]) {
    if !any() {
        return;
    }
    let mut index = index();
    let Some(id) = index.key(db, key) else {
        return;
    };
    index.refresh.remove(&id);
    if let Some(n) = index.deferred.remove(&id) {
        index.deferred_order.remove(&n);
    }
    if let Some(at) = index.by_key.remove(&id) {
        index.counted(&id, false);
        index.by_time.remove(&(at, id.db, id.name));
    }
}

/// FLUSHDB / FLUSHALL (`db` -1): no visit is planned for the keys flushed
/// (the caller plans one again for every key that has waiters). O(1): the
/// flushed databases' homes die, their entries dropped when their time
/// comes.
pub fn flushed(db: i32) {
    let mut index = index();
    for home in index.homes.flushed(db) {
        index.counts.retain(|c| c.0 != home);
    }
}

/// Visit `key` at `when` unless a visit is already planned before it.
pub fn schedule_earlier(db: i32, key: &[u8], when: Option<u64>) {
    let Some(when) = when else {
        return;
    };
    let planned = {
        let index = index();
        index
            .key(db, key)
            .and_then(|id| index.by_key.get(&id).copied())
    };
    if planned.is_none_or(|at| when < at) {
        schedule(db, key, Some(when));
    }
}

/// Visit `key` at once and write its whole state back: something outside the
/// module put the lock there or changed its Redis TTL.
pub fn refresh(db: i32, key: &[u8]) {
    {
        let mut index = index();
        let id = index.key_made(db, key);
        index.refresh.insert(id, ());
    }
    schedule(db, key, Some(clock::now_ms()));
}

/// Redis removed this lock after all its `leases` had run out: count them and
/// announce `lock.expired` at the next tick (a value's unlink may not notify).
pub fn expired(db: i32, key: &[u8], leases: usize) {
    let mut index = index();
    let entry = (key.to_vec(), leases);
    match index.expired.iter_mut().find(|(d, _)| *d == db) {
        Some((_, list)) => list.push_back(entry),
        None => index.expired.push((db, VecDeque::from([entry]))),
    }
    arm(&mut index, 0);
}

/// Whether Redis expired a lock whose leases are not yet announced (one
/// atomic load: callers ask before they look up their database).
pub fn any_expired() -> bool {
    EXPIRED.load(Ordering::Relaxed)
}

/// Takes out the expired locks of database `db` to announce now, so a
/// command's own events follow the announcement of what expired before it
/// (Redis may expire the key inside the command's own lookup).
pub fn take_expired(db: i32) -> Vec<(Vec<u8>, usize)> {
    if !EXPIRED.load(Ordering::Relaxed) {
        return Vec::new();
    }
    let mut index = index();
    match index.expired.iter().position(|(d, _)| *d == db) {
        Some(at) => index.expired.swap_remove(at).1.into(),
        None => Vec::new(),
    }
}

/// Takes out up to `most` expired locks to announce at a tick, first
/// removed first (the rest at the next ticks, at once), each with its
/// database.
pub fn take_expired_some(most: usize) -> Vec<(DbKey, usize)> {
    if !EXPIRED.load(Ordering::Relaxed) {
        return Vec::new();
    }
    let mut index = index();
    let Some((db, list)) = index.expired.first_mut() else {
        return Vec::new();
    };
    let db = *db;
    let n = most.min(list.len());
    let some = list
        .drain(..n)
        .map(|(name, leases)| (DbKey { db, name }, leases))
        .collect();
    if list.is_empty() {
        index.expired.swap_remove(0);
    }
    some
}

/// Some work goes on at the next tick, as soon as Redis has served its
/// clients once (the handler sees to it: a deadlock search under way,
/// unblocks left for the next turn). The module's one way to say "more
/// work at the next turn of the event loop": the tick runs in this turn
/// when called outside a tick, else at the next turn (a tick that leaves
/// work due posts [`next_turn`]'s wake, so the loop does not sleep between
/// two ticks); nothing is armed once no work is left (no timer at rest).
pub fn work_now() {
    WORK.store(true, Ordering::Relaxed);
    arm(&mut index(), 0);
}

/// A connection closed: end the grants that were bound to it, over the next
/// ticks (a connection may hold a million: no tick does more than its
/// share of the turn).
pub fn release_bound(closed: Detached) {
    let mut index = index();
    index.released.push_back(closed);
    arm(&mut index, 0);
}

/// The lock left this name by RENAME or MOVE, with its holders: not an expiry.
/// The unlink of the same RENAME or MOVE listed it last, if it listed it
/// (its leases had all run out): O(1), whatever Redis expired since the
/// last tick.
pub fn moved_away(db: i32, key: &[u8]) {
    let mut index = index();
    let Some(at) = index.expired.iter().position(|(d, _)| *d == db) else {
        return;
    };
    let Some((_, list)) = index.expired.get_mut(at) else {
        return;
    };
    if list.back().is_some_and(|(k, _)| k.as_slice() == key) {
        list.pop_back();
    }
    if list.is_empty() {
        index.expired.swap_remove(at);
    }
}

/// SWAPDB: the entries of two databases follow their keys (their homes
/// swap: O(1)). The filter of planned keys hashes databases' numbers: while
/// keys of either are indexed it says "maybe" for every key from now on
/// (the fast paths ask the index itself) until the index empties.
pub fn swap_dbs(a: i32, b: i32) {
    let mut index = index();
    let indexed = [a, b]
        .iter()
        .filter_map(|db| index.homes.get(*db))
        .any(|home| index.counts.iter().any(|c| c.0 == home));
    index.homes.swap(a, b);
    if indexed || !index.deferred.is_empty() {
        PLANNED.fill();
    }
}

/// This server became a master: every key that came due while it was a
/// replica is visited, from the next tick on, a tick's share at a time
/// ([`take_due`]: O(1) here whatever came due).
pub fn promoted() {
    if !index().deferred.is_empty() {
        work_now();
    }
}

/// Keeps exactly one Redis timer armed, for the earliest entry, no sooner
/// than `not_before` (unix ms).
/// A session opened, was renewed or ended: the timer is armed for the
/// earliest session deadline (and at once for an ended one's cleaning up).
pub fn sessions_changed() {
    arm(&mut index(), 0);
}

fn arm(index: &mut Index, not_before: u64) {
    let first = index.by_time.first().map(|(at, _, _)| *at);
    // A master ends sessions at their deadline (a replica hears of it).
    let sessions = sessions::next_work().filter(|_| !replication::is_replica());
    let first = match (first, sessions) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let now_too =
        !index.expired.is_empty() || !index.released.is_empty() || WORK.load(Ordering::Relaxed);
    let first = match (first, !now_too) {
        (first, true) => first,
        (Some(at), false) => Some(at.min(clock::now_ms())),
        (None, false) => Some(clock::now_ms()),
    }
    .map(|at| at.max(not_before));
    match (index.armed, first) {
        (Some((_, armed_at)), Some(at)) if armed_at <= at => return,
        (None, None) => return,
        _ => {}
    }
    let ctx = MODULE_CTX.load(Ordering::Relaxed);
    if ctx.is_null() {
        return;
    }
    if let Some((id, _)) = index.armed.take() {
        let mut data: *mut c_void = std::ptr::null_mut();
        api!(RedisModule_StopTimer(ctx, id, &mut data));
    }
    if let Some(at) = first {
        let now = clock::now_ms();
        let delay = at.saturating_sub(now).min(MAX_DELAY_MS);
        let id = api!(RedisModule_CreateTimer(
            ctx,
            ffi::int(delay),
            Some(on_timer),
            std::ptr::null_mut()
        ));
        // When it fires: `at`, or the step towards it.
        let fires = at.min(now.saturating_add(MAX_DELAY_MS));
        index.armed = id.map(|id| (id, fires));
    }
}

/// The farthest the timer is armed: a visit further away is reached in
/// steps (a tick that finds nothing due arms it again). Redis 7.0 keeps a
/// module timer's next firing as an `int` of microseconds (`ae.c`,
/// `retval * 1000`, fixed in Redis 7.2 by redis/redis#12474; Redis 8's
/// callback still returns an `int` of milliseconds, past 24.8 days): a
/// module timer more than 35.8 minutes away, once any module timer has
/// fired before it, overflows, and the event loop spins without sleeping
/// (every turn fires the timer handler, which finds nothing due) until it
/// is nearer; 30 minutes stays under both.
const MAX_DELAY_MS: u64 = 30 * 60 * 1000;

/// What a tick has to do; the handler registered at load does it.
pub struct Due {
    /// This server is a replica: it must not write.
    pub replica: bool,
    /// Keys to visit, and whether each is a refresh.
    pub visits: Vec<(DbKey, bool)>,
    /// Connections that closed with bound grants: as many of their grants
    /// as the tick's share of the turn allows are ended.
    pub released: Vec<Detached>,
}

/// Does a tick's work (`visits::tick`, registered by `lib` at load): the
/// timer only keeps time, so it needs nothing above it.
type Handler = fn(&Context, Due);

static HANDLER: OnceLock<Handler> = OnceLock::new();

/// Registers the handler of due work; called once at load.
pub fn set_handler(handler: Handler) {
    let _ = HANDLER.set(handler);
}

/// Takes every entry due at `now` out of the index; on a replica they are
/// deferred instead, and only their waiters are answered.
fn take_due(now: u64, replica: bool) -> Due {
    let mut index = index();
    let index = &mut *index;
    let mut visits = Vec::new();
    while let Some((at, home, key)) = index.by_time.first().cloned() {
        if at > now || visits.len() >= VISITS_PER_TICK {
            break;
        }
        index.by_time.remove(&(at, home, key.clone()));
        let id = DbKey::new(home, &key);
        index.by_key.remove(&id);
        let refresh = index.refresh.remove(&id).is_some();
        // A flushed database's entry goes unvisited.
        let Some(db) = index.homes.db_of(home) else {
            continue;
        };
        index.counted(&id, false);
        // (Still planned: `planned` asks `deferred`, the filter keeps it.)
        if replica && !index.deferred.contains_key(&id) {
            let n = index.deferred_next;
            index.deferred_next = n.wrapping_add(1);
            index.deferred.insert(id.clone(), n);
            index.deferred_order.insert(n, id.clone());
        }
        visits.push((DbKey { db, name: id.name }, refresh));
    }
    WORK.store(false, Ordering::Relaxed);
    // A master visits what came due while it was a replica, within the
    // tick's count (the rest at the next ticks, at once).
    while !replica && visits.len() < VISITS_PER_TICK {
        let Some((_, id)) = index.deferred_order.pop_first() else {
            break;
        };
        index.deferred.remove(&id);
        // (A flushed database's: nothing to visit.)
        if let Some(db) = index.homes.db_of(id.db) {
            visits.push((DbKey { db, name: id.name }, false));
        }
    }
    if !replica && !index.deferred.is_empty() {
        WORK.store(true, Ordering::Relaxed);
    }
    let released = index.released.drain(..).collect();
    Due {
        replica,
        visits,
        released,
    }
}

/// The most keys one tick visits (about a millisecond of work): more (a
/// connection with 100,000 bound locks closing, a mass expiry) wait for the
/// next tick, right after Redis has served its clients once, so no tick
/// stalls the server for long.
const VISITS_PER_TICK: usize = 200;

/// How long to wait before looking again while Redis pauses writes or loads.
const RETRY_MS: u64 = 10;

extern "C" fn on_timer(raw_ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    // The timer that fired is spent, whatever happens next.
    index().armed = None;
    let ran = catch::callback("the lock timer", false, || tick(&Context::new(raw_ctx)));
    catch::callback("arming the lock timer", (), || {
        let mut index = index();
        arm(&mut index, 0);
        if ran && due_now(&index) {
            drop(index);
            next_turn();
        }
    });
}

/// Runs a tick's work; `false` when it could not (writes paused, a load).
fn tick(ctx: &Context) -> bool {
    let flags = ctx.get_flags();
    if writes_paused() || flags.contains(ContextFlags::LOADING) {
        // CLIENT PAUSE WRITE, FAILOVER, CLUSTER FAILOVER: Redis neither
        // deletes expired keys nor accepts writes or replication now, and
        // a write here aborts the server. Keep every entry; look again soon.
        arm(&mut index(), clock::now_ms().saturating_add(RETRY_MS));
        return false;
    }
    let replica = flags.contains(ContextFlags::SLAVE);
    let now = clock::now_ms();
    clock::check_steps(now);
    let due = take_due(now, replica);
    if let Some(handler) = HANDLER.get() {
        handler(ctx, due);
    }
    true
}

/// Whether work is due now: an entry whose time has come (the rest of a
/// storm of WAIT deadlines, keys a tick's share left unvisited) or work
/// that goes on at once.
fn due_now(index: &Index) -> bool {
    let now_too =
        !index.expired.is_empty() || !index.released.is_empty() || WORK.load(Ordering::Relaxed);
    now_too
        || index
            .by_time
            .first()
            .is_some_and(|(at, _, _)| *at <= clock::now_ms())
}

/// Whether the wake of [`next_turn`] is posted and not yet handled.
static WAKE_POSTED: AtomicBool = AtomicBool::new(false);

/// A tick left work that is due now: the next tick runs at the event
/// loop's next turn, right after Redis has written the replies of this
/// one, without the millisecond Redis puts between a module timer's
/// callback and its next (a timer armed inside a timer callback fires one
/// millisecond after it at the soonest, and the event loop sleeps it out).
/// A one-shot event (`RM_EventLoopAddOneShot`, written to the server's
/// module pipe, so the event loop does not sleep) runs [`on_wake`] there,
/// outside any timer callback, where a timer armed with no delay fires in
/// the same turn. Without the API (before Redis 7.0), the timer alone.
fn next_turn() {
    if WAKE_POSTED.swap(true, Ordering::Relaxed) {
        return;
    }
    let posted = api!(RedisModule_EventLoopAddOneShot(
        Some(on_wake),
        std::ptr::null_mut()
    ));
    if posted != Some(raw::REDISMODULE_OK as c_int) {
        WAKE_POSTED.store(false, Ordering::Relaxed);
    }
}

/// The event loop's next turn after a tick that left work due now: the
/// timer is armed again with no delay, so it fires in this turn, after the
/// clients' events (replacing the one armed inside the last tick, due a
/// millisecond after it).
extern "C" fn on_wake(_data: *mut c_void) {
    WAKE_POSTED.store(false, Ordering::Relaxed);
    catch::callback("the lock timer's next turn", (), || {
        let mut index = index();
        if !due_now(&index) {
            return;
        }
        let ctx = MODULE_CTX.load(Ordering::Relaxed);
        if ctx.is_null() {
            return;
        }
        if let Some((id, _)) = index.armed.take() {
            let mut data: *mut c_void = std::ptr::null_mut();
            api!(RedisModule_StopTimer(ctx, id, &mut data));
        }
        let id = api!(RedisModule_CreateTimer(
            ctx,
            0,
            Some(on_timer),
            std::ptr::null_mut()
        ));
        index.armed = id.map(|id| (id, clock::now_ms()));
    });
}

/// Whether Redis pauses writes (and with them expiry and replication).
fn writes_paused() -> bool {
    api!(RedisModule_AvoidReplicaTraffic()).is_some_and(|paused| paused != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As `waiting::total`: INFO must never wait for the index.
    #[test]
    fn counting_keys_never_waits_for_the_index() {
        let held = index();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(len()));
        let answer = rx.recv_timeout(std::time::Duration::from_secs(5));
        drop(held);
        assert_eq!(answer, Ok(None));
    }
}
