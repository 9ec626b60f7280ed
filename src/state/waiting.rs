//! Waiting inside the server: `WAIT ms` on every grant command.
//!
//! A request that cannot be granted blocks its client (`RM_BlockClient`, with
//! reply, timeout, free and disconnect callbacks) and joins its key's FIFO
//! queue (`lock_core::Queue`). Whenever a key with waiters changes (every
//! transaction `transitions` runs calls [`answer_waiters`]), the core grants from
//! the head (`Queue::settle`), and each answered waiter is unblocked with
//! its outcome; its grant is replicated with the transition that caused it.
//! Locks freed by other means (expiry, DEL, FLUSH, RENAME ...) reach
//! [`answer_waiters`] through the timer (`timers`, `events`).
//!
//! A multi-key request (`LOCK.MACQUIRE`) waits in the queue of each of its
//! keys at once, so the order across keys is the order of arrival. A key's
//! `Queue::settle` never grants it: when it heads a queue whose lock would admit it,
//! it is marked ready ([`take_ready`]), and `transitions` grants it on every key
//! at once when it heads all its queues and every lock admits it.
//!
//! One place decides whether a client still waits: this registry. A waiter
//! leaves it exactly once: granted (then Redis will not time it out), timed
//! out or disconnected (then it is no longer in any queue, so it is never
//! granted). A grant whose client vanished before its reply is revoked.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::ops::Bound;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use redis_module::{raw, Context, ContextFlags, RedisValue};

use crate::redis::catch;
use crate::redis::config;
use crate::redis::errors::LockError;
use crate::redis::ffi::{self, api, Str};
use crate::redis::ffi::{DbKey, DbKeyMap, KeyAt, KeyFilter, KeyRef};
use crate::redis::homes::Swapped;
use crate::redis::replies;
use crate::redis::shared::{self, Locked};
use crate::state::bindings::{self, ClientId};
use crate::state::keys::LockKey;
use crate::state::sessions;
use crate::state::stats;
use crate::state::timers;
use crate::state::txn::Txn;
use lock_core::deadlock::{EachQueued, Requested};
use lock_core::hash::Keyed;
use lock_core::shards::Sharded;
use lock_core::{Attempt, Changes, Kind, Lock, Owner, Queue, Request, Settling};

/// A blocked client's handle, unique while it is blocked.
pub type WaiterId = usize;

struct Blocked {
    handle: *mut raw::RedisModuleBlockedClient,
    /// Its key, or a multi-key request's keys in the order given (filed).
    keys: Few<DbKey>,
    /// Its place in each key's queue, as `keys` (set when it queues; a
    /// place never changes while it waits): the deadlock search reads them
    /// without a look at each queue.
    places: Few<u64>,
    /// Each key's number, as `keys` ([`Numbers`]).
    numbers: Few<u64>,
    /// Its owner's number, and the sequence number of its first request
    /// among the owner's ([`Numbers`]).
    owner_number: u64,
    own_seq: u64,
    /// What it asks of each key.
    request: Request,
    multi: bool,
    /// When its WAIT runs out (unix ms); `None` for `WAIT 0`.
    deadline: Option<u64>,
    /// `BIND`: the connection its grant is bound to.
    bind: Option<ClientId>,
    /// When it started waiting (unix ms).
    since: u64,
}

/// One value, or a multi-key request's several: a single-key waiter's key,
/// place and number kept in place, not each in an array of its own (three
/// allocations made at its `WAIT` and freed at its answer, about 140
/// instructions each to free).
enum Few<T> {
    One(T),
    Many(Vec<T>),
}

impl<T> std::ops::Deref for Few<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Few::One(one) => std::slice::from_ref(one),
            Few::Many(many) => many,
        }
    }
}

impl<'a, T> IntoIterator for &'a Few<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<T> FromIterator<T> for Few<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Few<T> {
        let mut iter = iter.into_iter();
        let Some(first) = iter.next() else {
            return Few::Many(Vec::new());
        };
        let Some(second) = iter.next() else {
            return Few::One(first);
        };
        let mut many = vec![first, second];
        many.extend(iter);
        Few::Many(many)
    }
}

impl<T> Few<T> {
    /// The first value, if any.
    fn into_first(self) -> Option<T> {
        match self {
            Few::One(one) => Some(one),
            Few::Many(many) => many.into_iter().next(),
        }
    }
}

/// A grant to end at the key's next visit, all its holds at once: its
/// client disconnected before hearing of it, or it was bound to a connection
/// that closed. Matched by token, so a later grant to the same owner stays.
struct Revocation {
    owner: Owner,
    token: u64,
    /// Its bound connection closed (counted in `INFO lock`).
    disconnect: bool,
}

/// What an unblocked waiter is told (the blocked client's private data).
struct Decision {
    outcome: Result<Attempt, LockError>,
    /// A multi-key grant: each key (filed) with its token, in the order given.
    granted: Vec<(DbKey, u64)>,
    multi: bool,
    /// Its (first) key, filed (`Registry`).
    key: DbKey,
    owner: Owner,
    replied: bool,
}

/// Every key below is filed under its database's home (`homes::Swapped`,
/// the database itself until a `SWAPDB`): a swap exchanges two homes and
/// the queues, deadlines, holders and revocations follow their keys with
/// nothing rewritten. Keys come in and go out by database ([`Registry::filed`],
/// [`Registry::db_key`]).
#[derive(Default)]
struct Registry {
    homes: Swapped,
    queues: DbKeyMap<Queue<WaiterId>>,
    waiters: Sharded<WaiterId, Blocked, Keyed>,
    revocations: DbKeyMap<Vec<Revocation>>,
    /// Each waiting owner's requests and each queue, by number (deadlock
    /// detection), in a stable order a search can page through across
    /// turns.
    numbers: Numbers,
    /// Multi-key requests that head a queue whose lock would admit them.
    ready: Vec<WaiterId>,
    /// Each queue's WAIT deadlines, earliest first: the waiters a visit
    /// must answer nil are a range, and the next visit its first entry
    /// (no walk of the queue in any transaction).
    timeouts: DbKeyMap<BTreeSet<(u64, WaiterId)>>,
    /// The holders of every key with a queue, as its last transaction left
    /// them, and how many such keys each owner holds (deadlock detection:
    /// an owner that holds none and waits nowhere cannot be waited for).
    /// Never fewer than the real holders: holders come only by grants, which
    /// on a key with a queue run its transaction ([`answer_waiters`]); a
    /// value put in place by other means (RESTORE, RENAME, MOVE, SWAPDB)
    /// makes its key `unsure` until its next transaction.
    key_holders: DbKeyMap<HashSet<Owner, Keyed>>,
    /// Each key's number as it was when its holder was indexed (checked
    /// by its generation when read: a number gone is looked up again).
    holds_waited: Sharded<Owner, BTreeMap<DbKey, u64>, Keyed>,
    unsure: HashSet<DbKey>,
    /// The holders of keys whose queue emptied (or whose holders were set
    /// anew), still in `holds_waited`: taken out a share of a tick at a
    /// time ([`retire_some`]). Until then more keys are listed for them
    /// than they hold (never fewer: the deadlock search checks each).
    retired: Vec<(DbKey, Vec<Owner>)>,
    /// The settle of each key whose visit a slice ended (its owner index
    /// kept for the next slice: `Settling::resume`).
    settling: DbKeyMap<Settling>,
    /// Flushed databases whose waited keys are still to be visited: each
    /// home (-1: every one) and the next piece of `queues` to look at
    /// ([`wake_some`]).
    woken: Vec<(i32, usize)>,
    /// Keys whose waiters are answered an error a slice at a time
    /// ([`fail_all`], [`fail_some`]): the error and the end of the key's
    /// queue when it was asked (the requests queued since are not failed:
    /// they wait behind), first asked first (`failing_order`).
    failing: DbKeyMap<(LockError, u64)>,
    failing_order: VecDeque<DbKey>,
}

/// Holders of one key taken out of the index at once; more wait for the
/// ticks (10,000 readers' key emptying its queue: 5 ms in one go).
const RETIRED_AT_ONCE: usize = 256;

/// Whether `Registry::retired` may hold anything (no mutex).
static RETIRING: AtomicBool = AtomicBool::new(false);

/// Whether `Registry::woken` may hold anything (no mutex).
static WAKING: AtomicBool = AtomicBool::new(false);

/// Whether `Registry::failing` may hold anything (no mutex).
static FAILING: AtomicBool = AtomicBool::new(false);

/// FLUSHDB of `db` (-1: FLUSHALL): every key waited for there is free, its
/// queue's head to be granted. Its visit is planned at the next ticks, a
/// piece of the queues at a time ([`wake_some`]): O(1) here whatever
/// waits (50,000 waited keys were 103 ms in the flush).
pub fn flushed(db: i32) {
    let mut registry = registry();
    if registry.queues.is_empty() {
        return;
    }
    let home = match db {
        -1 => -1,
        db => registry.homes.home(db),
    };
    registry.woken.push((home, 0));
    WAKING.store(true, Ordering::Relaxed);
    drop(registry);
    timers::work_now();
}

/// At a tick: plans the visits of flushed databases' waited keys, a piece
/// of the queues (a 1,024th of a large map) between two looks at the
/// clock, within the tick's share of the turn; the rest at the next tick.
pub fn wake_some() {
    if !WAKING.load(Ordering::Relaxed) {
        return;
    }
    let now = Some(crate::time::clock::now_ms());
    loop {
        let keys: Vec<DbKey> = {
            let mut registry = registry();
            let Some(&(home, at)) = registry.woken.last() else {
                WAKING.store(false, Ordering::Relaxed);
                return;
            };
            if at >= registry.queues.pieces() {
                registry.woken.pop();
                continue;
            }
            if let Some(w) = registry.woken.last_mut() {
                w.1 = at + 1;
            }
            let r = &*registry;
            r.queues
                .piece_keys(at)
                .filter(|k| home == -1 || k.db == home)
                .map(|k| r.db_key(k.clone()))
                .collect()
        };
        for key in keys {
            timers::schedule(key.db, &key.name, now);
        }
        if crate::time::clock::turn_over() {
            break;
        }
    }
    timers::work_now();
}

/// How many retired holders between two looks at the clock.
const RETIRED_PER_LOOK: usize = 64;

/// At a tick: ends retired holders' index entries, within the tick's
/// share of the turn; the rest at the next tick.
pub fn retire_some() {
    if !RETIRING.load(Ordering::Relaxed) {
        return;
    }
    let mut registry = registry();
    let mut more = true;
    while more && !crate::time::clock::turn_over() {
        more = registry.retire(RETIRED_PER_LOOK);
    }
    RETIRING.store(more, Ordering::Relaxed);
    drop(registry);
    if more {
        timers::work_now();
    }
}

impl Registry {
    /// `key` (by database) as the registry files it (by home).
    fn filed<'a>(&self, key: &'a DbKey) -> Cow<'a, DbKey> {
        let home = self.homes.home(key.db);
        match home == key.db {
            true => Cow::Borrowed(key),
            false => Cow::Owned(DbKey::new(home, &key.name)),
        }
    }

    /// A filed key by its database now.
    fn db_key(&self, key: DbKey) -> DbKey {
        DbKey {
            db: self.homes.db(key.db),
            ..key
        }
    }

    /// Filed keys to visit (`this` left out), by their databases now.
    fn to_visit(&self, keys: Vec<DbKey>, this: Option<&DbKey>) -> Vec<DbKey> {
        keys.into_iter()
            .filter(|k| Some(k) != this)
            .map(|k| self.db_key(k))
            .collect()
    }

    /// `blocked.keys` are filed.
    fn insert(&mut self, id: WaiterId, mut blocked: Blocked) {
        for key in &blocked.keys {
            WAITED.insert(self.homes.db(key.db), &key.name);
            let queue = self.queues.entry(key.clone()).or_default();
            match blocked.multi {
                true => queue.push_part(id, blocked.request.clone()),
                false => queue.push(id, blocked.request.clone()),
            }
            if let Some(at) = blocked.deadline {
                self.timeouts
                    .entry(key.clone())
                    .or_default()
                    .insert((at, id));
            }
        }
        // (A key given twice: its later place stands for both.)
        blocked.places = blocked
            .keys
            .iter()
            .map(|k| {
                self.queues
                    .get(k)
                    .and_then(|q| q.place(id))
                    .unwrap_or(u64::MAX)
            })
            .collect();
        blocked.numbers = blocked.keys.iter().map(|k| self.numbers.key(k)).collect();
        blocked.owner_number = self.numbers.owner_waits(&blocked.request.owner);
        blocked.own_seq = self.numbers.queued(
            id,
            blocked.owner_number,
            &blocked.numbers,
            &blocked.places,
            blocked.request.kind,
        );
        self.waiters.insert(id, blocked);
    }

    /// Removes a waiter from every queue it is in; the keys where it was
    /// not alone are returned in `left`, to be visited (it may have held
    /// back the requests behind it).
    fn take(&mut self, id: WaiterId, left: &mut Vec<DbKey>) -> Option<Blocked> {
        self.take_but(id, left, None)
    }

    /// [`Registry::take`], the waiter's timeout entry on key `popped`
    /// already taken out ([`Registry::pop_due`]).
    fn take_but(
        &mut self,
        id: WaiterId,
        left: &mut Vec<DbKey>,
        popped: Option<&DbKey>,
    ) -> Option<Blocked> {
        let blocked = self.waiters.remove(&id)?;
        self.numbers.left(id, &blocked);
        for key in &blocked.keys {
            if let (Some(at), false) = (blocked.deadline, popped == Some(key)) {
                if let Some(t) = self.timeouts.get_mut(key) {
                    t.remove(&(at, id));
                    if t.is_empty() {
                        self.timeouts.remove(key);
                    }
                }
            }
            if let Some(queue) = self.queues.get_mut(key) {
                queue.remove(id);
                match queue.is_empty() {
                    true => {
                        self.queues.remove(key);
                        self.numbers.key_gone(key);
                        // A kept settle lives no longer than its queue
                        // (while it lives, every transaction of the key
                        // takes it up: `answer_queued`).
                        self.settling.remove(key);
                        self.set_holders(key, Vec::new());
                    }
                    // (A storm of timeouts on one key: the key once.)
                    false if left.last() != Some(key) => left.push(key.clone()),
                    false => {}
                }
            }
        }
        self.ready.retain(|w| *w != id);
        if blocked.request.session != 0 {
            sessions::drop_waiter(blocked.request.session, id);
        }
        Some(blocked)
    }

    /// Takes out of `key`'s timeouts the first entries due at `now`, at
    /// most `most` (and `due`'s length), into `due` (earliest first, as
    /// they were): how many. One look-up of the key for them all, each the
    /// first of its set.
    fn pop_due(&mut self, key: &DbKey, now: u64, most: usize, due: &mut [WaiterId]) -> usize {
        let Some(t) = self.timeouts.get_mut(key) else {
            return 0;
        };
        let mut n = 0;
        for slot in due.iter_mut().take(most) {
            match t.first() {
                Some(&(at, _)) if at <= now => {}
                _ => break,
            }
            let Some((_, id)) = t.pop_first() else {
                break;
            };
            *slot = id;
            n += 1;
        }
        if t.is_empty() {
            self.timeouts.remove(key);
        }
        n
    }
}

impl Registry {
    /// `key`'s holders are now `holders` (none: it has no queue any more).
    fn set_holders(&mut self, key: &DbKey, holders: Vec<Owner>) {
        self.unsure.remove(key);
        let old = match holders.is_empty() {
            true => self.key_holders.remove(key),
            false => self
                .key_holders
                .insert(key.clone(), holders.iter().cloned().collect()),
        };
        match old {
            Some(old) if old.len() > RETIRED_AT_ONCE => {
                self.retired.push((key.clone(), old.into_iter().collect()));
                RETIRING.store(true, Ordering::Relaxed);
                // (As `unblock` does, with the registry held.)
                timers::work_now();
            }
            old => {
                for h in old.into_iter().flatten() {
                    self.not_holding(&h, key);
                }
            }
        }
        let number = self.numbers.key_number(key).unwrap_or(NO_NUMBER);
        for h in holders {
            self.holds_waited
                .entry(h)
                .or_default()
                .insert(key.clone(), number);
        }
    }

    /// Ends the index entries of retired holders, up to `most`; whether
    /// some are left.
    fn retire(&mut self, most: usize) -> bool {
        let mut done = 0;
        while let Some((key, owners)) = self.retired.last_mut() {
            let Some(owner) = owners.pop() else {
                self.retired.pop();
                continue;
            };
            let key = key.clone();
            // Its key may have a queue again, and this owner hold it.
            if !self
                .key_holders
                .get(&key)
                .is_some_and(|k| k.contains(&owner))
            {
                self.not_holding(&owner, &key);
            }
            done += 1;
            if done >= most {
                break;
            }
        }
        !self.retired.is_empty()
    }

    /// `key`'s holders after a transaction on it, `lock` as it left it at
    /// `now`: only the owners it changed are looked at (a slice of 10,000
    /// readers' grants costs its own grants, not a pass over every
    /// holder), unless the key's holders are not known yet.
    fn follow_holders(&mut self, key: &DbKey, lock: &Lock, now: u64, changes: &Changes) {
        if self.unsure.contains(key) || !self.key_holders.contains_key(key) {
            let holders = lock.live(now).map(|h| Owner::from(h.owner)).collect();
            self.set_holders(key, holders);
            return;
        }
        let Some(known) = self.key_holders.get_mut(key) else {
            return;
        };
        // An owner it did not hold before came by a grant: it is taken as
        // a holder without a look (never fewer than the real holders); one
        // it held may have left: looked up (a table of the holders only
        // when many did).
        let (mut added, mut held) = (Vec::new(), Vec::new());
        for owner in changes.owners() {
            match known.contains(owner) {
                true => held.push(owner),
                false => {
                    known.insert(Owner::from(owner));
                    added.push(owner);
                }
            }
        }
        let left: Vec<&[u8]> = match held.is_empty() {
            true => Vec::new(),
            false => lock
                .look_up(held.iter().copied())
                .into_iter()
                .filter(|(_, h)| !h.is_some_and(|h| h.is_live(now)))
                .map(|(o, _)| o)
                .collect(),
        };
        let number = match added.is_empty() {
            true => NO_NUMBER,
            false => self.numbers.key_number(key).unwrap_or(NO_NUMBER),
        };
        for owner in added {
            self.holds_waited
                .entry(Owner::from(owner))
                .or_default()
                .insert(key.clone(), number);
        }
        for owner in left {
            if let Some(known) = self.key_holders.get_mut(key) {
                known.remove(owner);
            }
            self.not_holding(owner, key);
        }
    }

    /// `owner` no longer holds `key` (as far as the index knows).
    fn not_holding(&mut self, owner: &[u8], key: &DbKey) {
        if let Some(keys) = self.holds_waited.get_mut(owner) {
            keys.remove(key);
            if keys.is_empty() {
                self.holds_waited.remove(owner);
            }
        }
    }
}

/// No number (a dead entry's, or an owner or key the registry does not
/// number).
pub const NO_NUMBER: u64 = lock_core::deadlock::NO_NUMBER;

/// A number the registry gives: a slot (low 32 bits) and the slot's
/// generation (high 32 bits): a slot given again comes with the next
/// generation, so a number names one key or owner for as long as the
/// process lives, and a number kept across a change names nobody.
fn number(slot: usize, generation: u32) -> u64 {
    (u64::from(generation) << 32) | (slot as u64 & u64::from(u32::MAX))
}

fn slot_of(number: u64) -> usize {
    (number & u64::from(u32::MAX)) as usize
}

/// An entry of a [`Compact`] list: ordered by its sequence number, dead
/// once its request left.
trait Entry {
    fn seq(&self) -> u64;
    fn dead(&self) -> bool;
    fn kill(&mut self);
}

/// Entries in the order of their sequence numbers, in one array: a leaving
/// request's entry is found by a binary search and marked dead, the dead
/// ones dropped once they are half (O(1) amortised a request).
struct Compact<T> {
    all: Vec<T>,
    dead: usize,
}

impl<T> Default for Compact<T> {
    fn default() -> Self {
        Compact {
            all: Vec::new(),
            dead: 0,
        }
    }
}

impl<T: Entry> Compact<T> {
    fn push(&mut self, entry: T) {
        self.all.push(entry);
    }

    /// Where the entries from sequence number `seq` on start (from the
    /// first, the usual listing, without a binary search: its probes are
    /// misses to memory one after the other on a cold array).
    fn from(&self, seq: u64) -> usize {
        match self.all.first() {
            Some(first) if first.seq() < seq => self.all.partition_point(|e| e.seq() < seq),
            _ => 0,
        }
    }

    /// Marks the entries from `seq` on that `this` picks, while it picks
    /// them, dead.
    fn kill_from(&mut self, seq: u64, mut this: impl FnMut(&T) -> bool) {
        let at = self.from(seq);
        for e in self.all.iter_mut().skip(at) {
            if e.dead() {
                continue;
            }
            if !this(e) {
                break;
            }
            e.kill();
            self.dead += 1;
        }
        if self.dead * 2 > self.all.len() {
            self.all.retain(|e| !e.dead());
            self.dead = 0;
        }
    }

    /// Drops every entry; a small array is kept for the slot's next use
    /// (an owner that waited once: no free now, no allocation then).
    fn empty(&mut self) {
        match self.all.capacity() <= KEPT_ENTRIES {
            true => self.all.clear(),
            false => self.all = Vec::new(),
        }
        self.dead = 0;
    }

    /// The live entries from sequence number `seq` on.
    fn live_from(&self, seq: u64) -> impl Iterator<Item = &T> + '_ {
        self.all
            .get(self.from(seq)..)
            .unwrap_or_default()
            .iter()
            .filter(|e| !e.dead())
    }
}

/// The most entries a [`Compact`] emptied keeps room for.
const KEPT_ENTRIES: usize = 4;

/// A request in a key's queue as the search reads it: its place, its
/// owner's number, what it asks.
struct Queued {
    place: u64,
    owner: u64,
    kind: Kind,
}

impl Entry for Queued {
    fn seq(&self) -> u64 {
        self.place
    }
    fn dead(&self) -> bool {
        self.owner == NO_NUMBER
    }
    fn kill(&mut self) {
        self.owner = NO_NUMBER;
    }
}

/// One of an owner's waiting requests as the search reads it: its
/// sequence number among the owner's, its waiter, its key's number, its
/// place there, what it asks.
struct Own {
    seq: u64,
    waiter: WaiterId,
    key: u64,
    place: u64,
    kind: Kind,
}

impl Entry for Own {
    fn seq(&self) -> u64 {
        self.seq
    }
    fn dead(&self) -> bool {
        self.key == NO_NUMBER
    }
    fn kill(&mut self) {
        self.key = NO_NUMBER;
    }
}

/// Numbers the registry keeps for the deadlock search (docs/design.md,
/// "Deadlock detection"): each key with a queue and each waiting owner
/// gets a number when it first queues and loses it when its last request
/// leaves; by number, each key's queue (place, owner's number, kind) and
/// each owner's requests (key's number, place, kind), in arrays, so that
/// the search walks integers: no name hashed, no map or tree visited per
/// request. Kept by [`Registry::insert`] and [`Registry::take`], the one
/// way into a queue and the one way out (and a queue's end,
/// [`Numbers::key_gone`]). Each is kept in arrays by slot, one array a
/// field (the generations apart: the search checks a number against a
/// dense array of 4 bytes a slot, and reads a name only at its first
/// meeting).
#[derive(Default)]
struct Numbers {
    key_of: DbKeyMap<u32>,
    key_generation: Vec<u32>,
    /// Filed.
    key_name: Vec<DbKey>,
    key_queue: Vec<Compact<Queued>>,
    free_keys: Vec<u32>,
    /// Each waiting owner's slot by its name's hash ([`owner_hash`]): the
    /// name itself kept once, in `owner_name` (an owner that waits is not
    /// copied twice, nor freed twice when it leaves); the slots of names
    /// of one hash chained through `owner_same`.
    owner_of: Sharded<u64, u32, Keyed>,
    /// The next slot whose name has the same hash ([`NO_SLOT`]: none).
    owner_same: Vec<u32>,
    /// How many owners have a number.
    owners: usize,
    owner_generation: Vec<u32>,
    owner_name: Vec<Owner>,
    /// The next sequence number among each owner's requests.
    owner_next: Vec<u64>,
    owner_requests: Vec<Compact<Own>>,
    /// Each owner's waiters.
    owner_waiters: Vec<usize>,
    free_owners: Vec<u32>,
}

/// The end of a chain of [`Numbers::owner_same`].
const NO_SLOT: u32 = u32::MAX;

/// The hash [`Numbers::owner_of`] files an owner's name under.
fn owner_hash(owner: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    Keyed::default().hash_one(owner)
}

/// Whether `number` is the number of slot `slot` of `generations` now.
fn is_now(generations: &[u32], number: u64) -> bool {
    generations
        .get(slot_of(number))
        .is_some_and(|g| (number >> 32) as u32 == *g)
}

impl Numbers {
    /// `key`'s number (filed), given now if it has none.
    fn key(&mut self, key: &DbKey) -> u64 {
        if let Some(n) = self.key_number(key) {
            return n;
        }
        let slot = match self.free_keys.pop() {
            Some(slot) => slot as usize,
            None => {
                self.key_generation.push(0);
                self.key_name.push(key.clone());
                self.key_queue.push(Compact::default());
                self.key_name.len() - 1
            }
        };
        let (Some(g), Some(name)) = (self.key_generation.get(slot), self.key_name.get_mut(slot))
        else {
            return NO_NUMBER;
        };
        *name = key.clone();
        self.key_of.insert(key.clone(), slot as u32);
        number(slot, *g)
    }

    /// `key`'s number (filed), if it has one.
    fn key_number(&self, key: &DbKey) -> Option<u64> {
        let slot = *self.key_of.get(key)? as usize;
        Some(number(slot, *self.key_generation.get(slot)?))
    }

    /// `key`'s queue is gone: its number too (its slot given again with
    /// the next generation).
    fn key_gone(&mut self, key: &DbKey) {
        let Some(slot) = self.key_of.remove(key) else {
            return;
        };
        if let Some(g) = self.key_generation.get_mut(slot as usize) {
            *g = g.wrapping_add(1);
            if let Some(q) = self.key_queue.get_mut(slot as usize) {
                *q = Compact::default();
            }
            // (Its name's room goes too; the slot keeps a few bytes.)
            if let Some(name) = self.key_name.get_mut(slot as usize) {
                name.name = Vec::new();
            }
            self.free_keys.push(slot);
        }
    }

    /// The slot of `owner`, if it has a number.
    fn owner_slot(&self, owner: &[u8]) -> Option<usize> {
        self.slot_filed(owner, owner_hash(owner))
    }

    /// The slot of `owner`, filed under `hash`.
    fn slot_filed(&self, owner: &[u8], hash: u64) -> Option<usize> {
        let mut slot = *self.owner_of.get(&hash)? as usize;
        loop {
            if self.owner_name.get(slot).is_some_and(|n| **n == *owner) {
                return Some(slot);
            }
            slot = *self.owner_same.get(slot)? as usize;
        }
    }

    /// Files slot `slot` under `hash` (at the head of its chain).
    fn file_owner(&mut self, slot: usize, hash: u64) {
        let head = self.owner_of.insert(hash, slot as u32).unwrap_or(NO_SLOT);
        if let Some(same) = self.owner_same.get_mut(slot) {
            *same = head;
        }
    }

    /// Takes slot `slot` out of `hash`'s chain.
    fn unfile_owner(&mut self, slot: usize, hash: u64) {
        let next = self.owner_same.get(slot).copied().unwrap_or(NO_SLOT);
        let Some(&head) = self.owner_of.get(&hash) else {
            return;
        };
        if head as usize == slot {
            match next {
                NO_SLOT => self.owner_of.remove(&hash),
                next => self.owner_of.insert(hash, next),
            };
        } else {
            let mut at = head as usize;
            while let Some(&after) = self.owner_same.get(at) {
                if after as usize == slot {
                    if let Some(a) = self.owner_same.get_mut(at) {
                        *a = next;
                    }
                    break;
                }
                at = after as usize;
            }
        }
    }

    /// `owner`'s number, given now if it has none, with one more waiter.
    fn owner_waits(&mut self, owner: &Owner) -> u64 {
        if let Some(slot) = self.owner_slot(owner) {
            if let (Some(w), Some(g)) = (
                self.owner_waiters.get_mut(slot),
                self.owner_generation.get(slot),
            ) {
                *w += 1;
                return number(slot, *g);
            }
            return NO_NUMBER;
        }
        let slot = match self.free_owners.pop() {
            Some(slot) => slot as usize,
            None => {
                self.owner_generation.push(0);
                // (Named below: an empty name allocates nothing.)
                self.owner_name.push(Owner::default());
                self.owner_same.push(NO_SLOT);
                self.owner_next.push(0);
                self.owner_requests.push(Compact::default());
                self.owner_waiters.push(0);
                self.owner_name.len() - 1
            }
        };
        let (Some(&g), Some(name), Some(w)) = (
            self.owner_generation.get(slot),
            self.owner_name.get_mut(slot),
            self.owner_waiters.get_mut(slot),
        ) else {
            return NO_NUMBER;
        };
        *name = owner.clone();
        *w = 1;
        self.file_owner(slot, owner_hash(owner));
        self.owners += 1;
        number(slot, g)
    }

    /// The slot of `owner` (its `number` when right, else its bytes).
    fn owner_slot_by(&self, owner: &[u8], number: u64) -> Option<usize> {
        match is_now(&self.owner_generation, number) {
            true => Some(slot_of(number)),
            false => self.owner_slot(owner),
        }
    }

    /// The waiter `id` of owner `owner` (numbered) queued: at `places` on
    /// the keys numbered `keys`. Returns the sequence number of its first
    /// entry among the owner's requests.
    fn queued(
        &mut self,
        id: WaiterId,
        owner: u64,
        keys: &[u64],
        places: &[u64],
        kind: Kind,
    ) -> u64 {
        for (key, place) in keys.iter().zip(places) {
            if *place == u64::MAX || !is_now(&self.key_generation, *key) {
                continue;
            }
            if let Some(q) = self.key_queue.get_mut(slot_of(*key)) {
                // (A key given twice: its one place, once.)
                if q.all.last().is_some_and(|q| q.place >= *place) {
                    continue;
                }
                q.push(Queued {
                    place: *place,
                    owner,
                    kind,
                });
            }
        }
        let slot = slot_of(owner);
        let (true, Some(next), Some(requests)) = (
            is_now(&self.owner_generation, owner),
            self.owner_next.get_mut(slot),
            self.owner_requests.get_mut(slot),
        ) else {
            return 0;
        };
        let first = *next;
        for (key, place) in keys.iter().zip(places) {
            if *place == u64::MAX {
                continue;
            }
            requests.push(Own {
                seq: *next,
                waiter: id,
                key: *key,
                place: *place,
                kind,
            });
            *next += 1;
        }
        first
    }

    /// The waiter `blocked` (`id`) left its queues; its owner loses its
    /// number with its last waiter.
    fn left(&mut self, id: WaiterId, blocked: &Blocked) {
        for (key, place) in blocked.numbers.iter().zip(&blocked.places) {
            if !is_now(&self.key_generation, *key) {
                continue;
            }
            if let Some(q) = self.key_queue.get_mut(slot_of(*key)) {
                q.kill_from(*place, |q| q.place == *place);
            }
        }
        let owner = blocked.owner_number;
        let slot = slot_of(owner);
        let (true, Some(requests), Some(waiters)) = (
            is_now(&self.owner_generation, owner),
            self.owner_requests.get_mut(slot),
            self.owner_waiters.get_mut(slot),
        ) else {
            return;
        };
        requests.kill_from(blocked.own_seq, |r| r.waiter == id);
        *waiters = waiters.saturating_sub(1);
        if *waiters == 0 {
            requests.empty();
            if let Some(g) = self.owner_generation.get_mut(slot) {
                *g = g.wrapping_add(1);
            }
            if let Some(name) = self.owner_name.get_mut(slot).map(std::mem::take) {
                self.unfile_owner(slot, owner_hash(&name));
                self.owners = self.owners.saturating_sub(1);
                self.free_owners.push(slot as u32);
            }
        }
    }
}

// SAFETY: blocked-client handles are only used on Redis's main thread; the
// mutex only makes the static well-formed.
unsafe impl Send for Registry {}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);

/// Whether `Registry::ready` may hold anything: every transition asks, and
/// this answers without the mutex.
static ANY_READY: AtomicBool = AtomicBool::new(false);

/// Whether the registry has a queue or a revocation anywhere, or a closed
/// connection's bound holders are not all ended yet, readable
/// without its mutex: a transition on a lock nobody waits for asks, every
/// time, and takes nothing.
static BUSY: AtomicBool = AtomicBool::new(false);

/// The registry, locked; `BUSY` follows it when the lock is let go.
/// The keys with a queue, filtered ([`waits_for`] asks it first).
static WAITED: KeyFilter = KeyFilter::new();

fn registry() -> Locked<Registry> {
    shared::lock(&REGISTRY, |r| {
        if r.queues.is_empty() {
            WAITED.clear();
        }
        let busy = !r.queues.is_empty() || !r.revocations.is_empty() || bindings::pending() != 0;
        BUSY.store(busy, Ordering::Relaxed);
    })
}

/// Whether any request waits anywhere (cheap: for callbacks on every write).
#[inline]
pub fn anyone_waits() -> bool {
    #[cold]
    #[inline(never)]
    fn queued() -> bool {
        !registry().queues.is_empty()
    }
    BUSY.load(Ordering::Relaxed) && queued()
}

/// Whether a request may wait, or a holder bound to a closed connection may
/// be left to end, anywhere (one atomic load): the fast paths then ask
/// about their own key ([`waits_for`]).
#[inline]
pub fn busy() -> bool {
    BUSY.load(Ordering::Relaxed)
}

/// Whether requests wait for key `name` of database `db` (one atomic load
/// while nobody waits anywhere; else the filter, then, if it cannot say no,
/// a map look-up, nothing copied): the fast paths' question.
#[inline]
pub fn waits_for(key: &KeyAt<'_>) -> bool {
    #[cold]
    #[inline(never)]
    fn queued(db: i32, name: &[u8]) -> bool {
        let registry = registry();
        let home = registry.homes.home(db);
        registry.queues.contains_key(&(home, name) as &dyn KeyRef)
    }
    BUSY.load(Ordering::Relaxed) && WAITED.may_contain(key) && queued(key.db, key.name)
}

/// A connection with bound holders closed: transitions take the general
/// path (which ends them) until none is left ([`busy`]).
pub fn connection_closed() {
    drop(registry());
}

/// How many requests wait, on every key; `None` rather than wait for the
/// registry (INFO during a crash report).
pub fn total() -> Option<usize> {
    REGISTRY.try_lock().ok().map(|r| r.waiters.len())
}

/// How many requests wait for `key` in the current database.
pub fn waiters(ctx: &Context, key: Str<'_>) -> usize {
    if !BUSY.load(Ordering::Relaxed) {
        return 0;
    }
    let db = ffi::selected_db(ctx);
    if !WAITED.may_contain(&KeyAt::new(db, key.as_slice())) {
        return 0;
    }
    let registry = registry();
    let home = registry.homes.home(db);
    registry
        .queues
        .get(&(home, key.as_slice()) as &dyn KeyRef)
        .map_or(0, Queue::len)
}

pub fn has_waiters(ctx: &Context, key: Str<'_>) -> bool {
    waiters(ctx, key) > 0
}

/// Inside MULTI/EXEC, a script or a function, on a replica's stream or while
/// loading, a client cannot block: WAIT becomes an immediate try.
pub fn can_block(ctx: &Context) -> bool {
    !ctx.get_flags().intersects(
        ContextFlags::MULTI
            | ContextFlags::LUA
            | ContextFlags::DENY_BLOCKING
            | ContextFlags::REPLICATED
            | ContextFlags::LOADING,
    )
}

/// Blocks the calling client until its request is granted, `ms` pass (0: no
/// limit), or it disconnects. `next_expiry` is the lock's earliest deadline:
/// the key is visited then, or at the WAIT deadline if that comes first.
///
/// The WAIT deadline is the module's, not Redis's block timeout: Redis checks
/// block timeouts only when its event loop wakes, and a grant made between
/// the deadline and that check would be swallowed (Redis skips the reply of a
/// client it times out after it was unblocked). Here the key's visit at the
/// deadline answers nil through the same unblock-and-reply path as a grant,
/// so every waiter gets exactly one reply.
pub fn block(
    ctx: &Context,
    key: Str<'_>,
    request: Request,
    ms: u64,
    next_expiry: Option<u64>,
    bind: Option<ClientId>,
) -> Result<WaiterId, LockError> {
    let key = ffi::db_key(ctx, key.as_slice());
    block_on(ctx, vec![(key, next_expiry)], request, false, ms, bind)
}

/// Blocks the calling client's multi-key request (`LOCK.MACQUIRE`): it
/// waits in every key's queue at once, each key with its lock's earliest
/// deadline.
pub fn block_multi(
    ctx: &Context,
    keys: Vec<(DbKey, Option<u64>)>,
    request: Request,
    ms: u64,
    bind: Option<ClientId>,
) -> Result<WaiterId, LockError> {
    block_on(ctx, keys, request, true, ms, bind)
}

fn block_on(
    ctx: &Context,
    keys: Vec<(DbKey, Option<u64>)>,
    request: Request,
    multi: bool,
    ms: u64,
    bind: Option<ClientId>,
) -> Result<WaiterId, LockError> {
    {
        let registry = registry();
        let full = |k: &DbKey| {
            let k = registry.filed(k);
            registry.queues.get(&*k).map_or(0, Queue::len) >= config::max_waiters()
        };
        if keys.iter().any(|(k, _)| full(k)) {
            return Err(LockError::TooManyWaiters(config::MAX_WAITERS.get()));
        }
    }
    let now = crate::time::clock::now_ms();
    // The clock reads whole milliseconds, so the request arrived up to a
    // millisecond after `now`: the deadline is rounded up by one, and the
    // nil never comes before `ms` have passed since the request arrived.
    let deadline = (ms > 0).then(|| now.saturating_add(ms).saturating_add(1));
    // No timeout callback: Redis's block timeout is not used (see above),
    // and with one, a `CLIENT UNBLOCK id TIMEOUT` arriving after the module
    // unblocked the client with a grant, but before Redis handled that
    // unblock, made Redis drop the reply: the client never got one. Without
    // it, `CLIENT UNBLOCK` leaves lock waiters alone (it answers 0).
    let handle = api!(RedisModule_BlockClient(
        ctx.ctx,
        Some(on_reply),
        None,
        Some(free_decision),
        0
    ))
    .filter(|h| !h.is_null())
    .ok_or(LockError::Internal)?;
    api!(RedisModule_SetDisconnectCallback(
        handle,
        Some(on_disconnect)
    ));
    stats::WAITS.incr();
    let id = handle as WaiterId;
    // A key that had no queue: its holders, as the index of who holds a
    // waited key needs them (later transactions on it keep them).
    let fresh: Vec<(DbKey, Vec<Owner>)> = {
        let registry = registry();
        keys.iter()
            .filter(|(k, _)| !registry.queues.contains_key(&*registry.filed(k)))
            .map(|(k, _)| k.clone())
            .collect::<Vec<_>>()
    }
    .into_iter()
    .map(|k| {
        let holders = live_holders(ctx, &k, now);
        (k, holders)
    })
    .collect();
    let mut locked = registry();
    for (k, holders) in fresh {
        let k = locked.filed(&k).into_owned();
        // Its number first (its queue is made below, under the same
        // lock): the holders' index keeps it, so the backward side of a
        // search finds the key by number, not by its name's hash.
        locked.numbers.key(&k);
        locked.set_holders(&k, holders);
    }
    let filed = keys
        .iter()
        .map(|(k, _)| locked.filed(k).into_owned())
        .collect();
    locked.insert(
        id,
        Blocked {
            handle,
            keys: filed,
            places: Few::Many(Vec::new()),
            numbers: Few::Many(Vec::new()),
            owner_number: NO_NUMBER,
            own_seq: 0,
            request,
            multi,
            deadline,
            bind,
            since: now,
        },
    );
    drop(locked);
    for (i, (key, next_expiry)) in keys.iter().enumerate() {
        // The WAIT deadline on the first key is enough: a visit of any key
        // answers a waiter whose WAIT ran out.
        let timeout = if i == 0 { deadline } else { None };
        let visit = match (*next_expiry, timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        timers::schedule_earlier(key.db, &key.name, visit);
    }
    Ok(id)
}

/// The most waiters one command's transaction answers nil for their WAIT's
/// end (a tick answers as many as its share of the turn allows,
/// `clock::turn_over`): the rest stay due, and the key's next visit (at
/// the next tick) answers them.
const TIMEOUTS_PER_VISIT: usize = 32;

/// How many timeouts are answered between two looks at the clock in a
/// tick.
const TIMEOUTS_PER_LOOK: usize = 16;

/// What a key's queue needs after [`answer_waiters`].
pub struct Pending {
    /// Requests still wait: visit the key at the lock's next expiry.
    pub waiting: bool,
    /// The earliest WAIT deadline among them: visit the key then too; or
    /// now, when the visit's budget ran out before its head was answered
    /// (the next tick goes on).
    pub next_timeout: Option<u64>,
    /// The visit's budget ran out (`next_timeout` is its `now`, at which
    /// the lock was purged: no holder's deadline comes before it).
    pub sliced: bool,
}

/// How long one visit of a queue may answer its head in a command's
/// transaction: the rest at the key's next visit, a tick at the next turn
/// (where the tick's own share of the turn, `clock::turn_over`, bounds
/// it). A grant costs more after the loop than in it (its replication, its
/// event, its reply to unblock): the share is well under the turn's.
const ANSWER_SHARE: Duration = Duration::from_micros(300);

/// How many answers between two looks at the clock.
const ANSWERS_PER_LOOK: usize = 16;

/// The time budget of one visit's answers.
struct Budget {
    started: Instant,
    /// In a tick: its share of the turn bounds the visit too.
    in_turn: bool,
    /// `lock.debug-grants-per-slice` (tests): at most this many (0: off).
    most: usize,
}

impl Budget {
    fn start(in_turn: bool) -> Budget {
        Budget {
            started: Instant::now(),
            in_turn,
            most: config::debug_grants_per_slice(),
        }
    }

    /// Whether the visit stops after `answers` answers.
    fn spent(&self, answers: usize) -> bool {
        if self.most != 0 && answers >= self.most {
            return true;
        }
        if !answers.is_multiple_of(ANSWERS_PER_LOOK) {
            return false;
        }
        let spent = self.started.elapsed();
        spent >= ANSWER_SHARE
            || self.in_turn && spent >= ANSWER_LEAST && crate::time::clock::turn_over()
    }
}

/// What a visit in a tick answers at least, even when the tick's share is
/// spent: every slice of a long queue's head moves it on by as much, whatever
/// else the tick did (a slice also costs a few passes over the key's
/// holders: with 10,000 of them, as long as this).
const ANSWER_LEAST: Duration = Duration::from_micros(100);

impl Pending {
    /// Nobody waits on the key.
    const NONE: Pending = Pending {
        waiting: false,
        next_timeout: None,
        sliced: false,
    };
}

/// Settles a key that just changed (called by `transitions::update` inside the
/// transition, so grants replicate with it): undoes grants whose clients
/// vanished, answers nil to waiters whose WAIT ran out, then grants from the
/// head of the queue.
#[inline]
pub fn answer_waiters(ctx: &Context, name: Str<'_>, txn: &mut Txn) -> Pending {
    if !BUSY.load(Ordering::Relaxed) {
        return Pending::NONE;
    }
    answer_queued(ctx, name, txn)
}

/// [`answer_waiters`] once some request waits somewhere: out of line.
#[cold]
#[inline(never)]
fn answer_queued(ctx: &Context, name: Str<'_>, txn: &mut Txn) -> Pending {
    let mut registry = registry();
    if registry.queues.is_empty() && registry.revocations.is_empty() {
        return Pending::NONE;
    }
    // Requests waiting for other keys only: nothing copied or looked up.
    let db = ffi::selected_db(ctx);
    if registry.revocations.is_empty() && !WAITED.may_contain(&KeyAt::new(db, name.as_slice())) {
        return Pending::NONE;
    }
    let key = &DbKey::new(registry.homes.home(db), name.as_slice());
    if let Some(revoked) = registry.revocations.remove(key) {
        for r in revoked {
            if txn
                .lock
                .release_all(&r.owner, r.token, txn.now, txn.changes)
            {
                txn.events.push(c"lock.release");
                if r.disconnect {
                    stats::RELEASES_ON_DISCONNECT.incr();
                }
            }
        }
    }
    if !registry.queues.contains_key(key) {
        return Pending::NONE;
    }
    // Its waiters are being answered an error ([`fail_all`]): nobody is
    // granted or timed out before each of them is answered, and a request
    // arriving meanwhile finds them waiting (nil, or it queues behind).
    if !registry.failing.is_empty() && registry.failing.contains_key(key) {
        return Pending {
            waiting: true,
            next_timeout: None,
            sliced: false,
        };
    }
    // In a command's transaction, at most a few; in a tick, as many as its
    // share of the turn allows (10,000 WAITs ending together are answered
    // over the next turns, each turn's share of work bounded, none late by
    // more than those turns). The rest stay due: the key's next visit (at
    // the next tick) answers them.
    let in_turn = crate::time::clock::in_turn();
    let mut left = Vec::new();
    let mut answered = 0;
    // Taken out of the key's timeouts a look's worth at a time (one
    // look-up of the key), each then out of the registry and answered.
    let mut due = [0; TIMEOUTS_PER_LOOK];
    loop {
        if answered > 0 && crate::time::clock::turn_over() {
            break;
        }
        let most = match in_turn {
            true => TIMEOUTS_PER_LOOK,
            false => TIMEOUTS_PER_VISIT.saturating_sub(answered),
        };
        let n = registry.pop_due(key, txn.now, most, &mut due);
        if n == 0 {
            break;
        }
        answered += n;
        for &id in due.iter().take(n) {
            // (Not a waiter any more: its entry went all the same.)
            if let Some(waiter) = registry.take_but(id, &mut left, Some(key)) {
                stats::WAIT_TIMEOUTS.incr();
                unblock(waiter, Ok(Attempt::Busy), Vec::new());
            }
        }
    }
    if !registry.queues.contains_key(key) {
        registry.set_holders(key, Vec::new());
        let left = registry.to_visit(left, Some(key));
        drop(registry);
        visit_now(left);
        return Pending::NONE;
    }
    // The head answered one request at a time, on a time budget: the rest
    // at the key's next visit, at the next turn (nothing queued meanwhile
    // overtakes it). (Their tokens are counted as grants by the
    // transaction's commit.)
    let budget = Budget::start(in_turn);
    // A visit a slice ended goes on with its index, unless the key's value
    // was put in place by other means since (its holders unsure).
    let mut settling = match registry.settling.remove(key) {
        Some(kept) if !registry.unsure.contains(key) => kept.resume(txn.lock, txn.now, txn.changes),
        _ => Settling::start(txn.lock, txn.now, txn.changes),
    };
    let mut answers = 0;
    let mut unfinished = false;
    loop {
        if answers > 0 && budget.spent(answers) {
            unfinished = true;
            break;
        }
        let Some(queue) = registry.queues.get_mut(key) else {
            break;
        };
        let Some((id, attempt)) = queue.settle_next(
            &mut settling,
            txn.lock,
            txn.now,
            txn.tokens,
            txn.changes,
            lock_core::max_holders(),
        ) else {
            break;
        };
        answers += 1;
        if let Some(waiter) = registry.take(id, &mut left) {
            if sessions::ended_while_waiting(&waiter.request, attempt, txn) {
                unblock(waiter, Err(LockError::NoSession), Vec::new());
                continue;
            }
            if let Attempt::Granted(token) = attempt {
                stats::GRANTS_AFTER_WAIT.incr();
                stats::WAIT_TIME.record(txn.now.saturating_sub(waiter.since));
                txn.events.push(replies::event_of(waiter.request.kind));
                if let Some(client) = waiter.bind {
                    bindings::bind(
                        client,
                        db,
                        &key.name,
                        &waiter.request.owner,
                        token,
                        waiter.request.kind.mode(),
                    );
                    if let Some(lease) = bindings::lease(client, sessions::draw_lease) {
                        let key = DbKey::new(db, name.as_slice());
                        sessions::follow_in(ctx, txn, &key, token, lease);
                        timers::sessions_changed();
                    }
                }
            }
            unblock(waiter, Ok(attempt), Vec::new());
        }
    }
    if unfinished {
        stats::GRANTS_SLICED.incr();
        // Kept for the next slice (a kept settle goes with its queue:
        // `Registry::take`, the one place a queue goes; no pass over the
        // others here, which was O(1,024 shards + keys) a slice).
        registry
            .settling
            .insert(key.clone(), settling.pause(txn.lock));
    }
    // A multi-key request at the head: `transitions` tries it on all its keys
    // once this one is written back, if this lock would let it in.
    let part = registry.queues.get(key).and_then(Queue::head_part);
    if let Some(id) = part {
        let admitted = registry
            .waiters
            .get(&id)
            .is_some_and(|w| txn.lock.check(&w.request, false, txn.now) != Attempt::Busy);
        if admitted && !registry.ready.contains(&id) {
            registry.ready.push(id);
            ANY_READY.store(true, Ordering::Relaxed);
        }
    }
    let next_timeout = match unfinished {
        true => Some(txn.now),
        false => registry
            .timeouts
            .get(key)
            .and_then(|t| t.first())
            .map(|(at, _)| *at),
    };
    let waiting = registry.queues.get(key).is_some_and(|q| !q.is_empty());
    match waiting {
        true => registry.follow_holders(key, txn.lock, txn.now, txn.changes),
        false => registry.set_holders(key, Vec::new()),
    }
    let left = registry.to_visit(left, Some(key));
    drop(registry);
    visit_now(left);
    Pending {
        waiting,
        next_timeout,
        sliced: unfinished,
    }
}

/// Whether a visit's purge of `lock` at `now` would drop nothing, known
/// without a pass over its holders: a slice of its settle stopped and
/// nothing changed it since (the kept settle's shape and earliest
/// deadline, `Settling::unexpired`; `changes` still empty, the key not
/// `unsure`). The settle's own resume purges when it must.
pub fn nothing_to_purge(db: i32, name: &[u8], lock: &Lock, now: u64, changes: &Changes) -> bool {
    if !changes.is_empty() {
        return false;
    }
    let registry = registry();
    if registry.settling.is_empty() {
        return false;
    }
    let key = DbKey::new(registry.homes.home(db), name);
    !registry.unsure.contains(&key)
        && registry
            .settling
            .get(&key)
            .is_some_and(|s| s.unexpired(lock, now))
}

/// Visits now the keys a waiter left (by database: [`Registry::to_visit`]).
fn visit_now(keys: Vec<DbKey>) {
    let now = Some(crate::time::clock::now_ms());
    for key in keys {
        timers::schedule(key.db, &key.name, now);
    }
}

/// Whether a multi-key request may be ready (cheap: no mutex).
pub fn any_ready() -> bool {
    ANY_READY.load(Ordering::Relaxed)
}

/// The next multi-key request marked ready, with its keys and request, if
/// it still waits.
pub fn take_ready() -> Option<(WaiterId, Vec<DbKey>, Request)> {
    if !ANY_READY.load(Ordering::Relaxed) {
        return None;
    }
    let mut registry = registry();
    while let Some(id) = registry.ready.pop() {
        if let Some(w) = registry.waiters.get(&id) {
            let keys = w.keys.iter().map(|k| registry.db_key(k.clone())).collect();
            return Some((id, keys, w.request.clone()));
        }
    }
    ANY_READY.store(false, Ordering::Relaxed);
    None
}

/// Whether a multi-key request heads the queue of every one of its keys.
pub fn heads_every_queue(id: WaiterId) -> bool {
    let registry = registry();
    let Some(w) = registry.waiters.get(&id) else {
        return false;
    };
    // (Not while a key's waiters are answered an error: `fail_all`.)
    w.keys.iter().all(|k| {
        registry
            .queues
            .get(k)
            .and_then(|q| q.iter().next())
            .is_some_and(|head| head.id == id)
            && (registry.failing.is_empty() || !registry.failing.contains_key(k))
    })
}

/// A multi-key request taken out of every queue to be granted or refused:
/// no timeout or disconnect can answer it meanwhile. [`answer`] replies.
pub struct Claimed {
    waiter: Blocked,
    /// Keys where others wait (by database): visited once it is answered.
    left: Vec<DbKey>,
}

impl Claimed {
    /// The connection it binds to when granted (`BIND`).
    pub fn bind(&self) -> Option<ClientId> {
        self.waiter.bind
    }
}

/// Claims a waiting multi-key request (`None` when it no longer waits).
pub fn claim(id: WaiterId) -> Option<Claimed> {
    let mut left = Vec::new();
    let mut registry = registry();
    let waiter = registry.take(id, &mut left)?;
    let left = registry.to_visit(left, None);
    Some(Claimed { waiter, left })
}

/// Answers a claimed multi-key request: the token of each of its keys, in
/// order, or an error.
pub fn answer(claimed: Claimed, outcome: Result<Vec<(DbKey, u64)>, LockError>) {
    let Claimed { waiter, left } = claimed;
    match outcome {
        Ok(granted) => {
            stats::GRANTS_AFTER_WAIT.incr();
            stats::WAIT_TIME.record(crate::time::clock::now_ms().saturating_sub(waiter.since));
            if let Some(client) = waiter.bind {
                for (key, token) in &granted {
                    bindings::bind(
                        client,
                        key.db,
                        &key.name,
                        &waiter.request.owner,
                        *token,
                        waiter.request.kind.mode(),
                    );
                }
            }
            let first = granted.first().map_or(0, |(_, t)| *t);
            // Filed, as the decision's keys are (a swap may come before
            // its cleanup callback).
            let granted = {
                let registry = registry();
                granted
                    .into_iter()
                    .map(|(k, t)| (registry.filed(&k).into_owned(), t))
                    .collect()
            };
            unblock(waiter, Ok(Attempt::Granted(first)), granted);
        }
        Err(e) => unblock(waiter, Err(e), Vec::new()),
    }
    visit_now(left);
}

/// `owner`'s waiting requests after the cursor `after` (deadlock
/// detection, a page at a time), into `out`: each one's key, its place in
/// that key's queue, what it asks; at most `limit` entries; and the cursor
/// to go on after when more are left (a sequence number among the owner's
/// requests: it stays right while requests leave). `number`: the owner's
/// number if the search has it ([`NO_NUMBER`]: its bytes are looked up).
/// Each key is given as `key_of` makes it from its number and its filed
/// key (the search's number for it: no copy; the key is by home, the
/// search's keys are filed, [`filed`], and read by [`db_of`]).
pub fn requests_of<K>(
    owner: &[u8],
    number: u64,
    after: Option<u64>,
    limit: usize,
    out: &mut Vec<Requested<K>>,
    mut key_of: impl FnMut(u64, &DbKey) -> K,
) -> Option<u64> {
    let registry = registry();
    let numbers = &registry.numbers;
    let slot = numbers.owner_slot_by(owner, number)?;
    let from = after.map_or(0, |a| a.saturating_add(1));
    let mut mine = numbers.owner_requests.get(slot)?.live_from(from).peekable();
    while let Some(r) = mine.next() {
        if is_now(&numbers.key_generation, r.key) {
            if let Some(key) = numbers.key_name.get(slot_of(r.key)) {
                out.push((key_of(r.key, key), r.place, r.kind));
            }
        }
        if out.len() >= limit && mine.peek().is_some() {
            return Some(r.seq);
        }
    }
    None
}

/// The keys with a queue that `owner` held at their last transaction,
/// after `after`, at most `limit`, each to `each` with its number
/// ([`NO_NUMBER`]: its queue is gone) (lent: deadlock detection numbers
/// it, and checks it against the lock).
pub fn waited_keys_held(
    owner: &[u8],
    after: Option<&DbKey>,
    limit: usize,
    each: &mut dyn FnMut(&DbKey, u64),
) {
    let registry = registry();
    let Some(keys) = registry.holds_waited.get(owner) else {
        return;
    };
    let numbers = &registry.numbers;
    let from = after.map_or(Bound::Unbounded, Bound::Excluded);
    for (key, kept) in keys.range::<DbKey, _>((from, Bound::Unbounded)).take(limit) {
        // The number kept with the entry while its generation stands (no
        // hash of the key's name), else the key's number now.
        let number = match is_now(&numbers.key_generation, *kept) {
            true => *kept,
            false => numbers.key_number(key).unwrap_or(NO_NUMBER),
        };
        each(key, number);
    }
}

/// The requests queued on `key` (filed; `number`: its number if the
/// search has it) at places `from..to`, at most `limit`, to `each`: place,
/// owner (lent, not copied), the owner's number and kind. Returns the
/// key's number ([`NO_NUMBER`]: it has no queue).
pub fn queued(
    key: &DbKey,
    number: u64,
    from: u64,
    to: u64,
    limit: usize,
    each: &mut EachQueued<'_>,
) -> u64 {
    let registry = registry();
    let numbers = &registry.numbers;
    let number = match is_now(&numbers.key_generation, number) {
        true => number,
        false => match numbers.key_number(key) {
            Some(n) => n,
            None => return NO_NUMBER,
        },
    };
    let Some(queue) = numbers.key_queue.get(slot_of(number)) else {
        return NO_NUMBER;
    };
    for q in queue
        .live_from(from)
        .take_while(|q| q.place < to)
        .take(limit)
    {
        let owner = numbers
            .owner_name
            .get(slot_of(q.owner))
            .map_or(&[][..], |o| &o[..]);
        each(q.place, owner, q.owner, q.kind);
    }
    number
}

/// `keys` (by database) as the registry files them (by home): the keys a
/// deadlock search asks about.
pub fn filed(keys: &[DbKey]) -> Vec<DbKey> {
    let registry = registry();
    keys.iter()
        .map(|k| registry.filed(k).into_owned())
        .collect()
}

/// The database whose home `home` is now (a filed key's).
pub fn db_of(home: i32) -> i32 {
    registry().homes.db(home)
}

/// Whether the waiter `id` still waits (not granted, timed out, gone).
pub fn still_waits(id: WaiterId) -> bool {
    registry().waiters.contains_key(&id)
}

/// Answers the waiter `id` with `error` and takes it out of every queue
/// (a deadlock found after it started waiting): state unchanged, but the
/// requests behind it may now be granted, so its keys are visited.
pub fn refuse(id: WaiterId, error: LockError) -> bool {
    let mut left = Vec::new();
    let (waiter, left) = {
        let mut registry = registry();
        let Some(waiter) = registry.take(id, &mut left) else {
            return false;
        };
        (waiter, registry.to_visit(left, None))
    };
    unblock(waiter, Err(error), Vec::new());
    visit_now(left);
    true
}

/// Answers the waiter `id` `NOSESSION` if it still waits with a session
/// that ended (a session's end answers the waiters it had; one answered
/// since may have left its id to a request that does not follow it).
pub fn refuse_if_session_ended(id: WaiterId) -> bool {
    let session = match registry().waiters.get(&id) {
        Some(w) => w.request.session,
        None => return false,
    };
    let now = crate::time::clock::now_ms();
    if session == 0 || sessions::live_deadline(session, now).is_some() {
        return false;
    }
    refuse(id, LockError::NoSession)
}

/// `key`'s number ([`NO_NUMBER`]: it has no queue) and where a request
/// joining its queue (filed) now would stand.
pub fn number_and_end(key: &DbKey) -> (u64, u64) {
    let registry = registry();
    let number = registry.numbers.key_number(key).unwrap_or(NO_NUMBER);
    (number, registry.queues.get(key).map_or(0, Queue::end))
}

/// How many keys and owners the registry numbers now (each key with a
/// queue, each owner with a request waiting).
pub fn numbered() -> (usize, usize) {
    let registry = registry();
    (registry.numbers.key_of.len(), registry.numbers.owners)
}

/// Whether anybody's waiting request can depend on `owner`: it waits
/// somewhere (requests may queue behind it), or holds a key with a queue,
/// or a key with a queue got a new value by other means than a grant (its
/// holders unknown until its next transaction). When not, a request of
/// `owner` can close no cycle: no search.
pub fn may_be_waited_for(owner: &[u8]) -> bool {
    let registry = registry();
    !registry.unsure.is_empty()
        || registry.numbers.owner_slot(owner).is_some()
        || registry.holds_waited.contains_key(owner)
}

/// A key's value was put in place by other means than a grant (RESTORE,
/// RENAME, MOVE; every key of two databases on SWAPDB, `None`'s
/// databases): if clients wait for it, its holders are unknown until its
/// next transaction (its visit, planned by the caller).
pub fn holders_unsure(key: &DbKey) {
    let mut registry = registry();
    let key = registry.filed(key).into_owned();
    if registry.queues.contains_key(&key) {
        registry.unsure.insert(key);
    }
}

/// SWAPDB: the queues, and everything kept by key, follow their keys (a
/// waiter waits for the lock it asked for, wherever SWAPDB moves it): the
/// two databases' homes are exchanged, O(1) whatever waits. The filter of
/// waited keys hashes database numbers: it answers "maybe" for every key
/// until the queues empty.
pub fn swap_dbs(a: i32, b: i32) {
    let mut registry = registry();
    registry.homes.swap(a, b);
    if !registry.queues.is_empty() {
        WAITED.fill();
    }
}

/// The live holders of `key` as stored now.
fn live_holders(ctx: &Context, key: &DbKey, now: u64) -> Vec<Owner> {
    ffi::keeping_db(ctx, || {
        if !ffi::select_db(ctx, key.db) {
            return Vec::new();
        }
        let name = ffi::name(ctx, &key.name);
        let Ok(k) = LockKey::open(ctx, Str::from(&name), false) else {
            return Vec::new();
        };
        match k.lock() {
            Ok(Some(lock)) => lock.live(now).map(|h| Owner::from(h.owner)).collect(),
            _ => Vec::new(),
        }
    })
}

/// Ends the grant `token` of `owner` on `key` at the key's next visit (now).
pub fn revoke(key: DbKey, owner: Owner, token: u64, disconnect: bool) {
    let at = Some(crate::time::clock::now_ms());
    timers::schedule(key.db, &key.name, at);
    add_revocation(key, owner, token, disconnect);
}

/// Ends the grant `token` of `owner` on `key` at the key's next visit,
/// which the caller makes.
pub fn add_revocation(key: DbKey, owner: Owner, token: u64, disconnect: bool) {
    let mut registry = registry();
    let key = match registry.filed(&key) {
        Cow::Borrowed(_) => key,
        Cow::Owned(k) => k,
    };
    registry
        .revocations
        .entry(key)
        .or_default()
        .push(Revocation {
            owner,
            token,
            disconnect,
        });
}

/// Answers every waiter of a key with `error`, in queue order: the key's
/// lock moved to another node (`MIGRATE`), this server became a replica,
/// or its visit failed (the key now holds another type). A queue may hold
/// as many as `lock.max-waiters` (up to 10^9): they are answered a slice
/// at a time, each within the budget of a visit's slice ([`Budget`]: in a
/// tick, its share of the turn too), the first here, the rest at the next
/// turns ([`fail_some`]). Until the last of them is answered nothing is
/// granted on the key or timed out there ([`answer_waiters`] leaves it
/// alone, a multi-key request waiting on it is not granted), and a request
/// arriving meanwhile finds them waiting: nil without `WAIT`, else it
/// queues behind them and is not failed (the key is visited once they are
/// all answered).
pub fn fail_all(db: i32, key: &[u8], error: LockError) {
    {
        let mut registry = registry();
        let id = DbKey::new(registry.homes.home(db), key);
        let Some(end) = registry.queues.get(&id).map(Queue::end) else {
            return;
        };
        match registry.failing.get_mut(&id) {
            // Asked again: every request queued now is failed too.
            Some(failing) => failing.1 = end,
            None => {
                registry.failing.insert(id.clone(), (error, end));
                registry.failing_order.push_back(id);
            }
        }
        FAILING.store(true, Ordering::Relaxed);
    }
    fail_slice(&Budget::start(crate::time::clock::in_turn()));
}

/// At a tick: goes on answering the waiters [`fail_all`] fails, one
/// slice's budget; the rest at the next tick, at once.
pub fn fail_some() {
    if !FAILING.load(Ordering::Relaxed) {
        return;
    }
    fail_slice(&Budget::start(true));
}

/// Answers failing waiters from the head of the first failing key's queue
/// on, in order, until `budget` is spent (at least one answer); a key
/// whose failed requests are all answered is visited (the requests queued
/// behind them are the key's as usual).
fn fail_slice(budget: &Budget) {
    let mut left = Vec::new();
    let mut done = Vec::new();
    let mut answers = 0;
    let (more, left) = {
        let mut registry = registry();
        let more = loop {
            let Some(key) = registry.failing_order.front().cloned() else {
                break false;
            };
            let Some(&(error, end)) = registry.failing.get(&key) else {
                registry.failing_order.pop_front();
                continue;
            };
            if answers > 0 && budget.spent(answers) {
                break true;
            }
            let head = registry
                .queues
                .get(&key)
                .and_then(|q| q.between(0, end).next())
                .map(|(_, w)| w.id);
            let Some(id) = head else {
                registry.failing.remove(&key);
                registry.failing_order.pop_front();
                done.push(registry.db_key(key));
                continue;
            };
            answers += 1;
            match registry.take(id, &mut left) {
                Some(waiter) => unblock(waiter, Err(error), Vec::new()),
                // Not a waiter any more (never expected): out of the queue.
                None => {
                    let emptied = registry.queues.get_mut(&key).is_some_and(|q| {
                        q.remove(id);
                        q.is_empty()
                    });
                    if emptied {
                        registry.queues.remove(&key);
                        registry.numbers.key_gone(&key);
                        registry.settling.remove(&key);
                        registry.set_holders(&key, Vec::new());
                    }
                }
            }
        };
        FAILING.store(more, Ordering::Relaxed);
        // (The keys still failing are visited once they are done.)
        let r = &*registry;
        left.retain(|k| !r.failing.contains_key(k));
        (more, r.to_visit(left, None))
    };
    visit_now(left);
    visit_now(done);
    if more {
        timers::work_now();
    }
}

/// The requests waiting for this key, in queue order: each one's owner and
/// how long it has waited (ms) at `now`.
pub fn waiting_on(key: &DbKey, now: u64) -> Vec<(Owner, u64)> {
    let registry = registry();
    let Some(queue) = registry.queues.get(&*registry.filed(key)) else {
        return Vec::new();
    };
    queue
        .iter()
        .filter_map(|w| {
            let b = registry.waiters.get(&w.id)?;
            Some((b.request.owner.clone(), now.saturating_sub(b.since)))
        })
        .collect()
}

/// Whether requests wait for this key.
pub fn is_waited_on(key: &DbKey) -> bool {
    let registry = registry();
    !registry.queues.is_empty() && registry.queues.contains_key(&*registry.filed(key))
}

fn unblock(waiter: Blocked, outcome: Result<Attempt, LockError>, granted: Vec<(DbKey, u64)>) {
    // `waiter` was taken out of the registry: this is its handle's one
    // RM_UnblockClient (now or from `LATER`), and nothing uses the handle
    // after it.
    let handle = waiter.handle;
    let data = match (&outcome, granted.is_empty()) {
        // A nil (its WAIT ran out): nothing to allocate, nothing to free.
        (Ok(Attempt::Busy), true) => nil_data(),
        _ => {
            let key = waiter.keys.into_first().unwrap_or_default();
            let decision = Box::new(Decision {
                outcome,
                granted,
                multi: waiter.multi,
                key,
                owner: waiter.request.owner,
                replied: false,
            });
            Box::into_raw(decision).cast::<c_void>()
        }
    };
    if ANY_LATER.load(Ordering::Relaxed) || !unblock_now() {
        let mut later = shared::lock(&LATER, |_| {});
        later.push_back((handle as usize, data as usize));
        if !ANY_LATER.swap(true, Ordering::Relaxed) {
            drop(later);
            timers::work_now();
        }
        return;
    }
    api!(RedisModule_UnblockClient(handle, data));
}

/// The private data of a nil: a blocked client told its WAIT ran out
/// carries no `Decision` (the reply callback answers nil, the cleanup
/// callback has nothing to do).
static NIL: u8 = 0;

fn nil_data() -> *mut c_void {
    std::ptr::addr_of!(NIL).cast_mut().cast::<c_void>()
}

/// Clients the module unblocked since Redis last ran its reply callbacks
/// for them (it runs them all, then writes their replies, before the event
/// loop's next sleep): each reply or cleanup callback sets it back to 0.
static UNBLOCKED: AtomicUsize = AtomicUsize::new(0);

/// When the first of them was unblocked ([`crate::time::clock::monotonic`] ns).
static UNBLOCKS_FROM: AtomicU64 = AtomicU64::new(0);

/// The module's time from the first unblock of a turn after which the
/// turn's later unblocks wait in [`LATER`], in order, for the next turns
/// ([`unblock_later`]). Redis's own work per unblocked client (its reply
/// callback, unblocking, the write of the reply: about 3.2 µs, twice the
/// module's work to decide it) comes after the module's, before the event
/// loop's next sleep: a turn that unblocked 10,000 at once held the event
/// loop for tens of milliseconds. The answers of a tick and of a visit's
/// slice are bounded by their own time budgets, so this only catches what
/// several of them add up to in one turn (a command's slice and a tick), or
/// work without a budget of its own. The grant itself is made and
/// replicated at once (a client that goes away meanwhile is revoked as
/// before, by the cleanup callback).
const UNBLOCK_SHARE_NS: u64 = 1_000_000;

/// How many unblocks between two looks at the clock.
const UNBLOCKS_PER_LOOK: usize = 16;

/// Counts an unblock of this turn: whether it is made now (the turn's
/// share not spent).
fn unblock_now() -> bool {
    let n = UNBLOCKED.fetch_add(1, Ordering::Relaxed);
    if n == 0 {
        UNBLOCKS_FROM.store(crate::time::clock::monotonic(), Ordering::Relaxed);
        return true;
    }
    !n.is_multiple_of(UNBLOCKS_PER_LOOK)
        || crate::time::clock::monotonic().saturating_sub(UNBLOCKS_FROM.load(Ordering::Relaxed))
            < UNBLOCK_SHARE_NS
}

/// Unblocks deferred to the next turns: each blocked-client handle with its
/// boxed `Decision` (or [`nil_data`]).
static LATER: LazyLock<Mutex<VecDeque<(usize, usize)>>> = LazyLock::new(Mutex::default);
static ANY_LATER: AtomicBool = AtomicBool::new(false);

/// At a tick: unblocks what [`unblock`] deferred, up to a turn's share;
/// the rest at the next tick, at once.
pub fn unblock_later() {
    if !ANY_LATER.load(Ordering::Relaxed) {
        return;
    }
    let mut later = shared::lock(&LATER, |_| {});
    while let Some(&(handle, data)) = later.front() {
        if !unblock_now() {
            break;
        }
        later.pop_front();
        // Its one RM_UnblockClient (see `unblock`).
        api!(RedisModule_UnblockClient(
            handle as *mut raw::RedisModuleBlockedClient,
            data as *mut c_void
        ));
    }
    let more = !later.is_empty();
    ANY_LATER.store(more, Ordering::Relaxed);
    drop(later);
    if more {
        timers::work_now();
    }
}

/// Removes a waiter whose client went away (or that Redis unblocked itself,
/// e.g. on a switch to replica); the request behind it may now be grantable
/// (a writer holding back readers), so its key is visited at once.
///
/// Redis frees a blocked-client handle only once the module has called
/// `RM_UnblockClient` on it, even when the client is gone: without that call
/// the handle and its two temporary clients (about 35 KB) leaked for every
/// waiter that disconnected.
fn leave(handle: *mut raw::RedisModuleBlockedClient) {
    let mut left = Vec::new();
    let left = {
        let mut registry = registry();
        if registry.take(handle as WaiterId, &mut left).is_none() {
            return;
        }
        registry.to_visit(left, None)
    };
    // No private data: nothing is replied (the client is gone) or revoked.
    // Taken above, so this is the handle's one RM_UnblockClient.
    api!(RedisModule_UnblockClient(handle, std::ptr::null_mut()));
    visit_now(left);
}

extern "C" fn on_reply(
    raw_ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    UNBLOCKED.store(0, Ordering::Relaxed);
    catch::callback("the WAIT reply", raw::REDISMODULE_OK as c_int, || {
        let ctx = Context::new(raw_ctx);
        let data =
            api!(RedisModule_GetBlockedClientPrivateData(raw_ctx)).unwrap_or(std::ptr::null_mut());
        if data == nil_data() {
            api!(RedisModule_ReplyWithNull(raw_ctx));
            return raw::REDISMODULE_OK as c_int;
        }
        // SAFETY: the private data is the `Decision` boxed in `unblock`.
        let reply = match unsafe { data.cast::<Decision>().as_mut() } {
            Some(decision) => {
                decision.replied = true;
                match (&decision.outcome, decision.multi) {
                    (Ok(Attempt::Granted(_)), true) => Ok(RedisValue::Array(
                        decision
                            .granted
                            .iter()
                            .map(|(_, t)| RedisValue::Integer(ffi::int(*t)))
                            .collect(),
                    )),
                    (outcome, _) => outcome.map_or_else(|e| Err(e.into()), replies::answer),
                }
            }
            None => Err(LockError::Internal.into()),
        };
        ctx.reply(reply);
        raw::REDISMODULE_OK as c_int
    })
}

extern "C" fn on_disconnect(
    _raw_ctx: *mut raw::RedisModuleCtx,
    handle: *mut raw::RedisModuleBlockedClient,
) {
    catch::callback("the WAIT disconnect", (), || {
        leave(handle);
    })
}

extern "C" fn free_decision(_raw_ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    UNBLOCKED.store(0, Ordering::Relaxed);
    catch::callback("the WAIT cleanup", (), || {
        if data.is_null() || data == nil_data() {
            return;
        }
        // SAFETY: the private data is the `Decision` boxed in `unblock`; Redis
        // frees it exactly once.
        let decision = unsafe { Box::from_raw(data.cast::<Decision>()) };
        if let (false, Ok(Attempt::Granted(token))) = (decision.replied, decision.outcome) {
            // Granted, but the client went away before hearing it: undo.
            let granted = match decision.multi {
                true => decision.granted,
                false => vec![(decision.key, token)],
            };
            for (key, token) in granted {
                // (Filed: by its database now.)
                let key = registry().db_key(key);
                bindings::forget(key.db, &key.name, [token]);
                revoke(key, decision.owner.clone(), token, false);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// INFO runs during a crash report too, maybe while the crashing code
    /// holds the registry: counting must not wait for it.
    #[test]
    fn counting_waiters_never_waits_for_the_registry() {
        let held = registry();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(total()));
        let answer = rx.recv_timeout(std::time::Duration::from_secs(5));
        drop(held);
        assert_eq!(answer, Ok(None), "answered at once, without the count");
        assert_eq!(total(), Some(0));
    }

    /// Owners whose names share a hash are each found by name, and each
    /// taken out of the chain leaves the others found, whatever its place
    /// in it (head, middle, last).
    #[test]
    fn owners_of_one_hash_are_each_found_and_unfiled() {
        let mut numbers = Numbers::default();
        let names: Vec<Owner> = (0..4)
            .map(|i| format!("o{i}").into_bytes().into())
            .collect();
        let slots: Vec<usize> = names
            .iter()
            .map(|n| slot_of(numbers.owner_waits(n)))
            .collect();
        assert_eq!(numbers.owners, 4);
        // All filed again under one hash: one chain.
        const ONE: u64 = 7;
        for (n, s) in names.iter().zip(&slots) {
            assert_eq!(numbers.owner_slot(n), Some(*s));
            numbers.unfile_owner(*s, owner_hash(n));
            assert_eq!(numbers.owner_slot(n), None);
            numbers.file_owner(*s, ONE);
        }
        let found = |numbers: &Numbers| -> Vec<Option<usize>> {
            names.iter().map(|n| numbers.slot_filed(n, ONE)).collect()
        };
        let all: Vec<Option<usize>> = slots.iter().map(|s| Some(*s)).collect();
        assert_eq!(found(&numbers), all);
        assert_eq!(numbers.slot_filed(b"o9", ONE), None);
        // The chain is o3, o2, o1, o0: out go a middle one, the last, the head.
        let mut left = all.clone();
        for i in [2, 0, 3] {
            numbers.unfile_owner(slots[i], ONE);
            left[i] = None;
            assert_eq!(found(&numbers), left, "after unfiling o{i}");
        }
        numbers.unfile_owner(slots[1], ONE);
        assert!(numbers.owner_of.is_empty());
    }
}
