//! Reading and writing a lock key: open it, run a core transition, then write
//! back exactly what changed (value, key expiry, deletion, replication).

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::{Context, RedisString};

use crate::redis::errors::LockError;
use crate::redis::ffi::{self, call, DbKey, KeyAt, Str};
use crate::redis::replication;
use crate::redis::replies;
use crate::state::bindings;
use crate::state::keys::LockKey;
use crate::state::sessions;
use crate::state::stats;
use crate::state::timers;
use crate::state::txn::{Events, Txn};
use crate::state::waiting;
use crate::time::clock;
use crate::time::fencing;
use lock_core::{Aside, Ask, Attempt, Census, Changes, Ended, Lock, Release, Tokens};

/// Runs a core transition on the lock at `name`, replicates its effect and
/// writes the key back. A key of another type is `WRONGTYPE` and runs nothing.
pub fn update<R>(
    ctx: &Context,
    name: Str<'_>,
    op: impl FnOnce(&mut Txn) -> R,
) -> Result<R, LockError> {
    transact(ctx, name, true, op)?.ok_or(LockError::Internal)
}

fn transact<R>(
    ctx: &Context,
    name: Str<'_>,
    on_missing: bool,
    op: impl FnOnce(&mut Txn) -> R,
) -> Result<Option<R>, LockError> {
    transact_open(ctx, LockKey::open(ctx, name, true)?, name, on_missing, op)
}

/// A grant request (`LOCK.ACQUIRE`, `RACQUIRE`, `READ`, `SEMAPHORE`) on
/// `name`, firing `event` when granted: the attempt, and the lock's earliest
/// deadline (when a refused request may next be admitted).
///
/// The most common grant, on a free key nobody waits for and whose visit
/// is not planned, is one step: the lock made by [`Lock::first`] (the
/// core's equivalent of the general transition there, property-tested to
/// match it), stored, replicated and announced. Everything else is the
/// general transition, on the same open key.
///
/// `lease` (0: none) is the lease of the connection a `BIND` binds the
/// grant to: its holder follows it from the grant on (`sessions::follow_in`).
pub fn grant(
    ctx: &Context,
    name: Str<'_>,
    ask: Ask<'_>,
    event: &'static CStr,
    lease: u64,
) -> Result<(Attempt, Option<u64>), LockError> {
    let key = LockKey::open(ctx, name, true)?;
    // A key that exists is read once, by the general transition (which
    // also answers WRONGTYPE).
    if key.is_empty() && (!anything_pending() || key_is_quiet(ctx, name)) {
        return first_grant(ctx, key, name, ask, event, lease).map(|attempt| (attempt, None));
    }
    grant_general(ctx, key, name, ask, event, lease)
}

/// [`grant`] through the general transition. Out of line: the instructions
/// of the common grant stay few and close together (its share of the CPU's
/// instruction cache is what its throughput pays for; benchmarks.md).
#[inline(never)]
fn grant_general(
    ctx: &Context,
    key: LockKey,
    name: Str<'_>,
    ask: Ask<'_>,
    event: &'static CStr,
    lease: u64,
) -> Result<(Attempt, Option<u64>), LockError> {
    let done = transact_open(ctx, key, name, true, |txn| {
        let queued = waiting::has_waiters(ctx, name);
        let attempt = txn
            .lock
            .try_acquire(ask, queued, txn.now, txn.tokens, txn.changes);
        if let Attempt::Granted(token) = attempt {
            txn.events.push(event);
            if lease != 0 {
                let key = ffi::db_key(ctx, name.as_slice());
                sessions::follow_in(ctx, txn, &key, token, lease);
            }
        }
        (attempt, txn.lock.earliest_deadline())
    })?;
    if lease != 0 {
        timers::sessions_changed();
    }
    done.ok_or(LockError::Internal)
}

/// `LOCK.RELEASE`: one of `owner`'s holds on `name` removed (with `token`,
/// of its grant carrying that token only: the core decides).
///
/// The most common release, of a lock's only holder holding once, on a key
/// nobody waits for and whose visit is not planned, is one step: the lock
/// emptied by [`Lock::release_sole`] (property-tested to match the general
/// transition there), the key deleted, the drop replicated and announced.
/// Everything else is the general transition, on the same open key; a
/// missing key runs nothing (if requests wait for it, the removal of its
/// lock planned their visit: `events::unlinked`).
pub fn release(
    ctx: &Context,
    name: Str<'_>,
    owner: &[u8],
    token: Option<u64>,
) -> Result<Release, LockError> {
    let mut key = LockKey::open(ctx, name, true)?;
    let quiet = !anything_pending() || key.is_empty() || key_is_quiet(ctx, name);
    if quiet {
        let (census, ended) = match key.lock_mut()? {
            None => return Ok(Release::NotHeld),
            // Dropped at the arm's end: an emptied lock leaves the key's
            // value null, as the general transition leaves it.
            Some(mut lock) => {
                // (Its census before the release: what the key's removal
                // takes from the gauges.)
                let census = lock.census();
                let now = clock::now_ms();
                let ended = match lock.release_sole(owner, token, now) {
                    None if sessions::any() => {
                        release_follower(ctx, name, &mut lock, owner, token, now)
                    }
                    ended => ended,
                };
                (census, ended)
            }
        };
        if let Some(ended) = ended {
            commit(ctx, name, None, Change::Left { owner, ended });
            delete_emptied(key, census);
            announce_quiet(ctx, name, c"lock.release");
            return Ok(Release::Last);
        }
    }
    release_general(ctx, key, name, owner, token, !quiet)
}

/// [`Lock::release_sole_follower`]: a bound holder's release in one step,
/// its follower out of the lease table in the same look at it.
#[cold]
#[inline(never)]
fn release_follower(
    ctx: &Context,
    name: Str<'_>,
    lock: &mut Lock,
    owner: &[u8],
    token: Option<u64>,
    now: u64,
) -> Option<Ended> {
    let db = ffi::selected_db(ctx);
    sessions::release_follower(db, name.as_slice(), |deadline_of| {
        lock.release_sole_follower(owner, token, now, deadline_of)
    })
}

/// [`release`] through the general transition (out of line, as
/// [`grant_general`] is).
#[inline(never)]
fn release_general(
    ctx: &Context,
    key: LockKey,
    name: Str<'_>,
    owner: &[u8],
    token: Option<u64>,
    waits: bool,
) -> Result<Release, LockError> {
    let done = transact_open(ctx, key, name, waits, |txn| {
        let outcome = txn.lock.release(owner, token, txn.now, txn.changes);
        if outcome != Release::NotHeld {
            txn.events.push(c"lock.release");
        }
        outcome
    })?;
    Ok(done.unwrap_or(Release::NotHeld))
}

/// `LOCK.RENEW`: `owner`'s lease on `name` ends `ttl` ms from now; whether
/// the owner held it (with `token`, under that token).
///
/// The most common renewal, of a lock's only holder, on a key nobody waits
/// for and whose visit is not planned, is one step ([`Lock::renew_sole`],
/// property-tested to match the general transition there): the lease and
/// the key's expiry moved, the holder's state replicated and announced.
/// Everything else is the general transition, on the same open key.
pub fn renew(
    ctx: &Context,
    name: Str<'_>,
    owner: &[u8],
    ttl: u64,
    token: Option<u64>,
) -> Result<bool, LockError> {
    let mut key = LockKey::open(ctx, name, true)?;
    let quiet = !anything_pending() || key.is_empty() || key_is_quiet(ctx, name);
    if quiet {
        let renewed = match key.lock_mut()? {
            None => return Ok(false),
            Some(mut lock) => {
                let deadline = lock.renew_sole(owner, ttl, token, clock::now_ms());
                if deadline.is_some() {
                    commit(ctx, name, None, Change::Sole(&lock, None));
                }
                deadline
            }
        };
        if let Some(deadline) = renewed {
            key.expire_at(deadline);
            drop(key);
            announce_quiet(ctx, name, c"lock.renew");
            return Ok(true);
        }
    }
    renew_general(ctx, key, name, owner, ttl, token, !quiet)
}

/// [`renew`] through the general transition (out of line).
#[inline(never)]
fn renew_general(
    ctx: &Context,
    key: LockKey,
    name: Str<'_>,
    owner: &[u8],
    ttl: u64,
    token: Option<u64>,
    waits: bool,
) -> Result<bool, LockError> {
    let done = transact_open(ctx, key, name, waits, |txn| {
        renew_in(txn, owner, ttl, token)
    })?;
    Ok(done.unwrap_or(false))
}

/// The renewal of the general transition, `LOCK.RENEW`'s and
/// `LOCK.KEEPALIVE`'s: `owner`'s lease ends `ttl` ms from now, if it holds
/// (under `token`, where given: `TOKEN`, or a binding's grant and no later
/// one).
fn renew_in(txn: &mut Txn, owner: &[u8], ttl: u64, token: Option<u64>) -> bool {
    let renewed = txn.lock.renew(owner, ttl, token, txn.now, txn.changes);
    if renewed {
        txn.events.push(c"lock.renew");
    }
    renewed
}

/// [`grant`] on a free key: what the general transition does there (a new
/// token, the lock stored with its expiry, its one holder replicated, the
/// event), step by step, with nothing to purge, answer, unbind or visit.
/// In line in each caller ([`grant`]'s is the common grant).
#[inline(always)]
fn first_grant(
    ctx: &Context,
    key: LockKey,
    name: Str<'_>,
    ask: Ask<'_>,
    event: &'static CStr,
    lease: u64,
) -> Result<Attempt, LockError> {
    let now = clock::now_ms();
    let mut tokens = fencing::for_transaction(now);
    let start = tokens;
    let (mut lock, token) = match Lock::first(ask, now, &mut tokens) {
        Ok(granted) => granted,
        Err(refused) => return Ok(refused_first(ctx, key, name, refused)),
    };
    let follows = match lease {
        0 => None,
        lease => follow_first(ctx, name, &mut lock, token, lease),
    };
    commit(
        ctx,
        name,
        Some((&start, &tokens)),
        Change::Sole(&lock, follows),
    );
    let (census, deadline) = (lock.census(), lock.latest_deadline());
    key.store(lock, stats::lock_keys() == 0)?;
    stats::value(1, census);
    // A key just made has no TTL (Redis's store of a value clears it): a
    // follower's, which must have none, is left as it is.
    let own = deadline.filter(|d| lock_core::lock::session_of(*d).is_none());
    if let Some(deadline) = own {
        key.expire_at(deadline);
    }
    drop(key);
    announce_quiet(ctx, name, event);
    Ok(Attempt::Granted(token))
}

/// [`first_grant`]'s holder, bound, follows `lease`: its entry names its
/// token, its own deadline goes to the lease table (`sessions::follow_in`,
/// in one step). The lease and the own deadline (`(lease, own)`), which
/// the holder's one effect carries.
#[cold]
#[inline(never)]
fn follow_first(
    ctx: &Context,
    name: Str<'_>,
    lock: &mut Lock,
    token: u64,
    lease: u64,
) -> Option<(u64, u64)> {
    let own = lock.follow_granted(token)?;
    // (The timer is armed already when the table has work due before it.)
    let armed = sessions::lease_work_by(own);
    sessions::set_own_new(token, lease, own, ffi::selected_db(ctx), name.as_slice());
    if !armed {
        timers::sessions_changed();
    }
    Some((lease, own))
}

/// A grant on a free key refused (no token left, a block past its size):
/// nothing changed, what came due elsewhere is still settled.
#[cold]
#[inline(never)]
fn refused_first(ctx: &Context, key: LockKey, name: Str<'_>, refused: Attempt) -> Attempt {
    drop(key);
    announce(ctx, name, [], false, None);
    refused
}

/// [`transact`] on a key already open for writing.
fn transact_open<R>(
    ctx: &Context,
    key: LockKey,
    name: Str<'_>,
    on_missing: bool,
    op: impl FnOnce(&mut Txn) -> R,
) -> Result<Option<R>, LockError> {
    let done = write_back_key(key, on_missing, |lock| {
        let mut changes = Changes::default();
        let now = clock::now_ms();
        let mut tokens = fencing::for_transaction(now);
        let start = tokens;
        let mut txn = Txn {
            lock,
            tokens: &mut tokens,
            changes: &mut changes,
            now,
            events: Events::default(),
        };
        if bindings::pending() != 0 {
            end_closed(ctx, name, &mut txn);
        }
        if sessions::any() {
            end_sessions(&mut txn);
        }
        let result = op(&mut txn);
        let pending = waiting::answer_waiters(ctx, name, &mut txn);
        let visit = next_visit(txn.lock, &pending);
        let events = txn.events;
        let expired = changes.expired() > 0;
        let aside = changes.take_aside();
        if aside.is_some() {
            // (Before the new holder's effect: the replica drops the rest.)
            replication::replicate_unlink(ctx, name);
        }
        commit(
            ctx,
            name,
            Some((&start, &tokens)),
            Change::Changes(lock, &changes),
        );
        Ok(((result, visit, events, expired, aside), !changes.is_empty()))
    })?;
    let Some((result, visit, events, expired, aside)) = done else {
        return Ok(None);
    };
    announce(ctx, name, events.iter(), expired, visit);
    if let Some(aside) = aside {
        keep_aside(ctx, name, aside);
    }
    Ok(Some(result))
}

/// Expired holders a grant set aside whole (`Lock::set_aside_for`: a
/// writer on a lock left with only expired readers mid-purge), by the key
/// they held, each ended a slice a turn ([`end_aside`], from the tick:
/// `visits::end_set_aside`) as a purge ends them: counted, their bindings
/// forgotten, their drops replicated. The list itself drives them, not the
/// key's visits: a `RENAME`, `MOVE` or flush of the key forgets its
/// visits, never them. No transaction looks at it.
static ASIDE: std::sync::Mutex<Vec<SetAside>> = std::sync::Mutex::new(Vec::new());

/// Holders set aside from a key: its database, its name, them.
type SetAside = (i32, Vec<u8>, Box<Aside>);

/// Whether [`ASIDE`] has any (no mutex on a tick without).
static ANY_ASIDE: AtomicBool = AtomicBool::new(false);

/// Keeps `aside` for the next ticks, the first at the next turn.
#[cold]
fn keep_aside(ctx: &Context, name: Str<'_>, aside: Box<Aside>) {
    let DbKey { db, name: key } = ffi::db_key(ctx, name.as_slice());
    let mut all = ASIDE.lock().unwrap_or_else(|p| p.into_inner());
    all.push((db, key, aside));
    ANY_ASIDE.store(true, Ordering::Relaxed);
    drop(all);
    timers::work_now();
}

/// The keys holders were set aside from, each once, while any are left
/// (none: no mutex).
pub fn set_aside_keys() -> Vec<DbKey> {
    if !ANY_ASIDE.load(Ordering::Relaxed) {
        return Vec::new();
    }
    let all = ASIDE.lock().unwrap_or_else(|p| p.into_inner());
    let mut keys: Vec<DbKey> = Vec::with_capacity(all.len());
    for (db, key, _) in all.iter() {
        if !keys.iter().any(|k| k.db == *db && k.name == *key) {
            keys.push(DbKey::new(*db, key));
        }
    }
    keys
}

/// A slice of the holders set aside from `key` in `db` ended into
/// `changes` ([`Aside::end_some`]): whether some are left for the next
/// turn (of these, or of a second set aside from the key).
pub fn end_aside(db: i32, key: &[u8], changes: &mut Changes) -> bool {
    if !ANY_ASIDE.load(Ordering::Relaxed) {
        return false;
    }
    let mut all = ASIDE.lock().unwrap_or_else(|p| p.into_inner());
    let Some(i) = all.iter().position(|(d, k, _)| *d == db && k == key) else {
        return false;
    };
    let more = all.get_mut(i).is_some_and(|(_, _, a)| a.end_some(changes));
    let done = (!more).then(|| all.swap_remove(i));
    ANY_ASIDE.store(!all.is_empty(), Ordering::Relaxed);
    let again = more || all.iter().any(|(d, k, _)| *d == db && k == key);
    drop(all);
    // (The last of them freed out of the mutex.)
    drop(done);
    again
}

/// The holders set aside from `key` in `db` let go of, uncounted: no
/// transaction can end them there (the key holds another type now, or
/// the server is a replica now: no drop of theirs can be replicated).
#[cold]
pub fn drop_aside(db: i32, key: &[u8]) {
    if !ANY_ASIDE.load(Ordering::Relaxed) {
        return;
    }
    let mut all = ASIDE.lock().unwrap_or_else(|p| p.into_inner());
    let mut gone = Vec::new();
    while let Some(i) = all.iter().position(|(d, k, _)| *d == db && k == key) {
        gone.push(all.swap_remove(i));
    }
    ANY_ASIDE.store(!all.is_empty(), Ordering::Relaxed);
    drop(all);
    drop(gone);
}

/// What a transition changed in its lock, as [`commit`] takes it.
enum Change<'a> {
    /// Its one holder is new or renewed (a first grant, a sole renewal),
    /// and the lease it follows with its own deadline (a bound grant).
    Sole(&'a Lock, Option<(u64, u64)>),
    /// Its one holder, `owner`, left (how long it held, its grant), and
    /// it is empty now (a sole release).
    Left { owner: &'a [u8], ended: Ended },
    /// What a general transition changed (`lock` as it is after it).
    Changes(&'a Lock, &'a Changes),
}

/// Every transition's one commit, whichever path decided it: the tokens it
/// issued (between `tokens`' two counters) made the server's and counted as
/// grants, the leases that ended counted, the bindings of holders that left
/// forgotten, the change replicated. Then the caller writes the key back
/// and [`announce`]s.
#[inline(always)]
fn commit(ctx: &Context, name: Str<'_>, tokens: Option<(&Tokens, &Tokens)>, change: Change<'_>) {
    if let Some((start, end)) = tokens {
        fencing::issued(start, end);
        let issued = end.last().saturating_sub(start.last());
        if issued != 0 {
            stats::GRANTS.add(usize::try_from(issued).unwrap_or(usize::MAX));
        }
    }
    match change {
        Change::Sole(lock, follows) => {
            // (A follower's key is in its lease table already: `follow_first`.)
            let sole = lock.first_holder().filter(|h| !h.is_follower());
            if let Some(id) = sole.and_then(|h| h.session()) {
                sessions::join(id, &ffi::db_key(ctx, name.as_slice()));
            }
            replication::replicate_sole(ctx, name, lock, follows)
        }
        Change::Left { owner, ended } => {
            stats::HOLD_TIME.record(u64::from(ended.held));
            if bindings::count() != 0 && bindings::may_be_bound(ended.token) {
                forget_bound(ctx, name, [ended.token]);
            }
            if ended.session != 0 {
                sessions::leave(ended.session, &ffi::db_key(ctx, name.as_slice()));
            }
            replication::replicate_dropped(ctx, name, owner);
        }
        Change::Changes(lock, changes) => {
            if changes.expired() > 0 {
                stats::EXPIRED_LEASES.add(changes.expired());
            }
            for held in changes.held() {
                stats::HOLD_TIME.record(u64::from(held));
            }
            if !changes.own().is_empty() {
                set_own(ctx, name, lock, changes);
            }
            if !changes.is_empty() {
                forget_bindings(ctx, name, changes);
                if sessions::any() {
                    follow_sessions(ctx, name, changes);
                }
                replication::replicate(ctx, name, lock, changes, &sessions::follower);
            }
        }
    }
}

/// Whether anyone waits, a visit is planned, or a closed connection's bound
/// holder is left to end, anywhere (atomics): only then does a fast path
/// look at its own key ([`key_is_quiet`]).
#[inline(always)]
fn anything_pending() -> bool {
    waiting::busy() || timers::any()
}

/// Whether a transition on `name` may take its one step: nobody waits for
/// this key, its visit is not planned, and no closed connection's bound
/// holder is left to end. Chosen by the key's own state: what waits or is
/// planned on other keys costs two look-ups here, never the general
/// transition.
#[inline(never)]
fn key_is_quiet(ctx: &Context, name: Str<'_>) -> bool {
    let key = KeyAt::new(ffi::selected_db(ctx), name.as_slice());
    bindings::pending() == 0 && !waiting::waits_for(&key) && !timers::planned(&key)
}

/// [`announce`] after a one-step transition, whose key has no visit to plan
/// or drop ([`key_is_quiet`]).
#[inline]
fn announce_quiet(ctx: &Context, name: Str<'_>, event: &'static CStr) {
    announce_expired_elsewhere(ctx);
    notify(ctx, event, name);
    grant_ready(ctx);
}

/// After a transition on `name`, its key written back: the leases Redis
/// expired meanwhile announced, the transaction's events fired, the key's
/// next visit planned, the multi-key requests it made ready granted.
fn announce(
    ctx: &Context,
    name: Str<'_>,
    events: impl IntoIterator<Item = &'static CStr>,
    expired: bool,
    visit: Option<u64>,
) {
    announce_expired_elsewhere(ctx);
    if expired {
        notify(ctx, c"lock.expired", name);
    }
    for event in events {
        notify(ctx, event, name);
    }
    plan_visit(ctx, name, visit);
    grant_ready(ctx);
}

/// The leases Redis expired since the last announcement (one atomic when
/// none did; the rest out of line, as every rare step of a command is).
#[inline]
fn announce_expired_elsewhere(ctx: &Context) {
    #[cold]
    #[inline(never)]
    fn announce_all(ctx: &Context) {
        for (key, leases) in timers::take_expired(ffi::selected_db(ctx)) {
            announce_expired(ctx, &key, leases);
        }
    }
    if timers::any_expired() {
        announce_all(ctx);
    }
}

/// The key's next visit (`None`: no visit, or one planned before is
/// dropped), when a visit is asked for or this key has one planned.
#[inline]
fn plan_visit(ctx: &Context, name: Str<'_>, visit: Option<u64>) {
    #[cold]
    #[inline(never)]
    fn schedule(ctx: &Context, name: Str<'_>, visit: Option<u64>) {
        let DbKey { db, name: key } = ffi::db_key(ctx, name.as_slice());
        timers::schedule(db, &key, visit);
    }
    if visit.is_some()
        || timers::any() && timers::planned(&KeyAt::new(ffi::selected_db(ctx), name.as_slice()))
    {
        schedule(ctx, name, visit);
    }
}

/// Set while multi-key requests are being granted: a transition inside
/// leaves the ready ones to the outer loop, so one multi-key grant is never
/// interleaved with another (redis runs one thing at a time: a flag does).
static GRANTING: AtomicBool = AtomicBool::new(false);

/// Decides a multi-key request on every key before granting any: `Ok(true)`
/// when every key would grant it now, `Ok(false)` when some key is busy
/// (held, or, where `queued` says so, others wait ahead), `Err` when some
/// key refuses it with an error (which wins over busy).
pub fn check_all(
    ctx: &Context,
    names: &[Str<'_>],
    ask: Ask<'_>,
    queued: impl Fn(Str<'_>) -> bool,
) -> Result<bool, LockError> {
    let now = clock::now_ms();
    let mut free = true;
    for name in names {
        let key = LockKey::open(ctx, *name, false)?;
        let stored = key.lock()?;
        let empty = Lock::default();
        let lock = stored.as_deref().unwrap_or(&empty);
        let open = stored
            .as_deref()
            .and_then(|l| bindings::without_closed(ffi::selected_db(ctx), name.as_slice(), l, now));
        let lock = open.as_ref().unwrap_or(lock);
        let live = sessions::without_ended(lock, now);
        let lock = live.as_ref().unwrap_or(lock);
        match lock.check(ask, queued(*name), now) {
            Attempt::Granted(_) => {}
            Attempt::Busy => free = false,
            refused => return Err(replies::error_of(refused).unwrap_or(LockError::Internal)),
        }
    }
    Ok(free)
}

/// Grants a multi-key request on every key, in the order given (after
/// [`check_all`] said yes, in the same command or timer tick); returns the
/// tokens in that order. Should a key refuse after all (no token left),
/// the new grants made before it are undone and its refusal returned.
pub fn grant_all(
    ctx: &Context,
    names: &[Str<'_>],
    ask: Ask<'_>,
    lease: u64,
) -> Result<Vec<u64>, LockError> {
    let outer = GRANTING.swap(true, Ordering::Relaxed);
    let result = grant_each(ctx, names, ask, lease);
    if !outer {
        GRANTING.store(false, Ordering::Relaxed);
        grant_ready(ctx);
    }
    result
}

/// `lease` (0: none): the lease of the connection a `BIND` binds the
/// grants to, which each holder follows from its grant on (its effect,
/// replicated once, carries it).
fn grant_each(
    ctx: &Context,
    names: &[Str<'_>],
    ask: Ask<'_>,
    lease: u64,
) -> Result<Vec<u64>, LockError> {
    let mut tokens: Vec<(u64, bool)> = Vec::with_capacity(names.len());
    for name in names {
        let attempt = grant_part(ctx, *name, ask, lease);
        match attempt {
            Ok((Attempt::Granted(token), new)) => tokens.push((token, new)),
            refused => {
                for (name, (token, new)) in names.iter().zip(&tokens) {
                    if *new {
                        let _ = update(ctx, *name, |txn| {
                            txn.lock
                                .release_all(ask.owner, *token, txn.now, txn.changes)
                        });
                    }
                }
                return Err(match refused {
                    Ok((attempt, _)) => replies::error_of(attempt).unwrap_or(LockError::Internal),
                    Err(e) => e,
                });
            }
        }
    }
    Ok(tokens.into_iter().map(|(t, _)| t).collect())
}

/// One key of a multi-key grant: the attempt, and whether it issued a new
/// token (a grant to undo should a later key refuse). On a free key nobody
/// waits for and whose visit is not planned, one step, as [`grant`]'s
/// ([`first_grant`]: chosen by the key's own state, what waits elsewhere
/// costs the look-ups of [`key_is_quiet`]); else the general transition.
fn grant_part(
    ctx: &Context,
    name: Str<'_>,
    ask: Ask<'_>,
    lease: u64,
) -> Result<(Attempt, bool), LockError> {
    let key = LockKey::open(ctx, name, true)?;
    if key.is_empty() && (!anything_pending() || key_is_quiet(ctx, name)) {
        let attempt = first_grant(ctx, key, name, ask, replies::MULTI_EVENT, lease)?;
        let new = matches!(attempt, Attempt::Granted(_));
        return Ok((attempt, new));
    }
    let done = transact_open(ctx, key, name, true, |txn| {
        let before = txn.tokens.last();
        let attempt = txn
            .lock
            .try_acquire(ask, false, txn.now, txn.tokens, txn.changes);
        let new = txn.tokens.last() != before;
        if let Attempt::Granted(token) = attempt {
            txn.events.push(replies::MULTI_EVENT);
            if lease != 0 {
                let key = ffi::db_key(ctx, name.as_slice());
                sessions::follow_in(ctx, txn, &key, token, lease);
            }
        }
        (attempt, new)
    })?;
    if lease != 0 {
        timers::sessions_changed();
    }
    done.ok_or(LockError::Internal)
}

/// Grants the multi-key requests that became ready (each heads a queue
/// whose lock would admit it), if each now heads every queue it is in and
/// every lock admits it; refuses those a key answers with an error.
#[inline]
fn grant_ready(ctx: &Context) {
    // The common case, nothing ready: one atomic load, nothing else.
    if waiting::any_ready() {
        grant_all_ready(ctx);
    }
}

#[cold]
#[inline(never)]
fn grant_all_ready(ctx: &Context) {
    if GRANTING.swap(true, Ordering::Relaxed) {
        return;
    }
    ffi::keeping_db(ctx, || grant_each_ready(ctx));
    GRANTING.store(false, Ordering::Relaxed);
}

/// Grants each ready multi-key request (in its database).
fn grant_each_ready(ctx: &Context) {
    while let Some((id, keys, request)) = waiting::take_ready() {
        let Some(db) = keys.first().map(|k| k.db) else {
            continue;
        };
        if !waiting::heads_every_queue(id) || !ffi::select_db(ctx, db) {
            continue;
        }
        let owned: Vec<RedisString> = keys.iter().map(|k| ffi::name(ctx, &k.name)).collect();
        let names: Vec<Str> = owned.iter().map(Str::from).collect();
        let ask = Ask::from(&request);
        let outcome = match check_all(ctx, &names, ask, |_| false) {
            Ok(false) => continue,
            Ok(true) => None,
            Err(e) => Some(e),
        };
        // Its session ended while it waited: NOSESSION, nothing granted.
        let ended =
            ask.session != 0 && sessions::live_deadline(ask.session, clock::now_ms()).is_none();
        let outcome = outcome.or(ended.then_some(LockError::NoSession));
        let Some(claimed) = waiting::claim(id) else {
            continue;
        };
        // Bound: its holders follow the connection's lease from their
        // grants on (drawn now for a connection's first binding).
        let known = claimed.bind().and_then(bindings::lease_of);
        let lease = known
            .or_else(|| claimed.bind().and_then(|_| sessions::draw_lease()))
            .unwrap_or(0);
        let outcome = match outcome {
            Some(e) => Err(e),
            None => grant_each(ctx, &names, ask, lease)
                .map(|tokens| keys.iter().cloned().zip(tokens).collect::<Vec<_>>()),
        };
        let drawn = match (claimed.bind(), &outcome) {
            (Some(client), Ok(_)) if known.is_none() => Some(client),
            _ => None,
        };
        // (It binds each grant.)
        waiting::answer(claimed, outcome);
        if let Some(client) = drawn {
            bindings::set_lease(client, lease);
        }
    }
}

/// The holders of this key bound to a connection that closed end first, in
/// the transaction that comes to the key (replicated with it), as the
/// timer's later share would end them: from the moment the connection
/// closed they hold nothing for any command.
#[cold]
#[inline(never)]
fn end_closed(ctx: &Context, name: Str<'_>, txn: &mut Txn) {
    let db = ffi::selected_db(ctx);
    let name = name.as_slice();
    for (owner, token) in bindings::closed_of(db, name, txn.lock) {
        bindings::forget(db, name, [token]);
        if txn.lock.release_all(&owner, token, txn.now, txn.changes) {
            txn.events.push(c"lock.release");
            stats::RELEASES_ON_DISCONNECT.incr();
        }
    }
}

/// The holders of this key whose session ended end first, in the
/// transaction that comes to the key (replicated with it), as the timer's
/// later visit would end them: from the session's end on they hold nothing
/// for any command. The core decides, from the sessions' deadlines.
#[cold]
#[inline(never)]
fn end_sessions(txn: &mut Txn) {
    if !txn.lock.has_sessions() {
        return;
    }
    let now = txn.now;
    let (lock, changes) = (&mut *txn.lock, &mut *txn.changes);
    sessions::with_deadlines(|deadline_of| lock.end_sessions(deadline_of, now, changes));
}

/// Own deadlines a repeat or a RENEW set on followers of a connection
/// lease: into the lease table, each replicated as one effect with its
/// absolute deadline (a holder whose entry changed too, a repeat's, by its
/// own effect, which carries them: `replication::replicate`).
#[cold]
#[inline(never)]
fn set_own(ctx: &Context, name: Str<'_>, lock: &Lock, changes: &Changes) {
    let key = ffi::db_key(ctx, name.as_slice());
    let touched = |token: u64| {
        changes
            .owners()
            .any(|o| lock.holder(o).is_some_and(|h| h.token == token))
    };
    for &(token, deadline) in changes.own() {
        if let Some(lease) = sessions::set_own(token, None, deadline, key.clone()) {
            if !touched(token) {
                replication::replicate_lease_own(ctx, token, lease, deadline);
            }
        }
    }
    // The timer ends the followers at their deadlines.
    timers::sessions_changed();
}

/// The sessions' counts follow the holders that joined or left one here.
#[cold]
#[inline(never)]
fn follow_sessions(ctx: &Context, name: Str<'_>, changes: &Changes) {
    let mut key = None;
    let mut key = || {
        key.get_or_insert_with(|| ffi::db_key(ctx, name.as_slice()))
            .clone()
    };
    for e in changes.ended().filter(|e| e.session != 0) {
        sessions::leave(e.session, &key());
    }
    for (from, to) in changes.joined() {
        if from != 0 {
            sessions::leave(from, &key());
        }
        sessions::join(to, &key());
    }
}

/// Holders that left in this transaction take their `BIND` with them
/// (looked up only for grants that may be bound: what is bound elsewhere
/// costs nothing here).
#[inline]
fn forget_bindings(ctx: &Context, name: Str<'_>, changes: &Changes) {
    if bindings::count() != 0 && changes.ended().any(|e| bindings::may_be_bound(e.token)) {
        forget_bound(ctx, name, changes.ended().map(|e| e.token));
    }
}

#[cold]
#[inline(never)]
fn forget_bound(ctx: &Context, name: Str<'_>, tokens: impl IntoIterator<Item = u64>) {
    bindings::forget(ffi::selected_db(ctx), name.as_slice(), tokens);
}

/// When this lock must next be looked at without anyone asking: at its
/// earliest deadline if requests wait for it, or if it is shared and some
/// reader expires before the key does; at the first WAIT deadline of its
/// waiters. Otherwise Redis's own key expiry is all it needs.
fn next_visit(lock: &Lock, pending: &waiting::Pending) -> Option<u64> {
    // A visit that stopped goes on now: no look at the holders (none
    // expires before it).
    if pending.sliced {
        return pending.next_timeout;
    }
    let expiry = match pending.waiting {
        true => lock.earliest_deadline(),
        false => lock.sweep_at(),
    };
    match (expiry, pending.next_timeout) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Opens `name`, runs `op` on its lock (empty when the key does not exist,
/// and then only if `on_missing`: else `None`) and, when `op` reports a
/// change, stores, re-expires or deletes the key: an emptied lock is
/// deleted, and the key expires with its last holder. `op` also says the
/// lock's latest deadline after it (`lock_core::Applied`, found on the walk
/// it made), so that the write-back walks the holders no more (a replica's
/// `LOCK.SYNC`).
pub fn write_back_known<R>(
    ctx: &Context,
    name: Str<'_>,
    on_missing: bool,
    op: impl FnOnce(&mut Lock) -> Result<(R, bool, Option<u64>), LockError>,
) -> Result<Option<R>, LockError> {
    write_back_latest(LockKey::open(ctx, name, true)?, on_missing, |lock| {
        op(lock).map(|(result, changed, latest)| (result, changed, Some(latest)))
    })
}

/// [`write_back_known`] on a key already open for writing, the latest
/// deadline found by a walk.
fn write_back_key<R>(
    key: LockKey,
    on_missing: bool,
    op: impl FnOnce(&mut Lock) -> Result<(R, bool), LockError>,
) -> Result<Option<R>, LockError> {
    write_back_latest(key, on_missing, |lock| {
        op(lock).map(|(result, changed)| (result, changed, None))
    })
}

/// [`write_back_key`], the latest deadline after `op` given by it (`Some`)
/// or found by a walk (`None`).
fn write_back_latest<R>(
    mut key: LockKey,
    on_missing: bool,
    op: impl FnOnce(&mut Lock) -> Result<(R, bool, Option<Option<u64>>), LockError>,
) -> Result<Option<R>, LockError> {
    let mut stored = key.lock_mut()?;
    let existed = stored.is_some();
    if !existed && !on_missing {
        return Ok(None);
    }
    let mut fresh = Lock::default();
    let lock: &mut Lock = match stored.as_mut() {
        Some(stored) => stored,
        None => &mut fresh,
    };
    let before = lock.census();
    let outcome = op(lock);
    let changed = matches!(outcome, Ok((_, true, _)));
    let latest = match &outcome {
        Ok((_, _, Some(latest))) => *latest,
        _ => lock.keep_latest(),
    };
    let census = lock.census();
    // The stored lock goes back to the key here: its value follows the
    // lock's block (null if it emptied).
    drop(stored);
    if !changed {
        // A stored lock a failed transition emptied midway must not stay
        // in its key.
        if existed && latest.is_none() {
            delete_emptied(key, before);
        }
        return outcome.map(|(result, ..)| Some(result));
    }
    let (result, ..) = outcome?;
    match (existed, latest) {
        (true, None) => {
            delete_emptied(key, before);
        }
        (true, Some(deadline)) => {
            if census != before {
                stats::holders(-1, before);
                stats::holders(1, census);
            }
            key.expire_at(deadline);
        }
        (false, None) => {}
        (false, Some(deadline)) => {
            key.store(fresh, stats::lock_keys() == 0)?;
            stats::value(1, census);
            key.expire_at(deadline);
        }
    }
    Ok(Some(result))
}

/// Deletes the key of a stored lock that emptied in place (its value is
/// null now: Redis frees nothing of ours), counting out the key and the
/// holders it had (`census`, by mode) here.
fn delete_emptied(key: LockKey, census: Census) {
    key.delete();
    stats::holders(-1, census);
    stats::value(-1, Census::ZERO);
}

/// Counts the leases of a lock Redis expired (all of them had run out) and
/// fires `lock.expired` in the context's database; a replica, which hears of
/// the removal as a DEL from its master, only counts.
pub fn announce_expired(ctx: &Context, key: &[u8], leases: usize) {
    stats::EXPIRED_LEASES.add(leases);
    if !ctx.get_flags().contains(redis_module::ContextFlags::SLAVE) {
        notify(ctx, c"lock.expired", Str::from(&ffi::name(ctx, key)));
    }
}

/// Fires a module keyspace event (`notify-keyspace-events` class `d`), e.g.
/// `__keyevent@0__:lock.acquire`.
pub fn notify(ctx: &Context, event: &CStr, key: Str<'_>) {
    let class =
        std::ffi::c_int::try_from(redis_module::raw::REDISMODULE_NOTIFY_MODULE).unwrap_or(0);
    call!(RedisModule_NotifyKeyspaceEvent(
        ctx.ctx,
        class,
        event.as_ptr(),
        key.raw()
    ));
}
