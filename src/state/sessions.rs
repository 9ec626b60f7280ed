//! Sessions (`LOCK.SESSION`): leases that many holders share.
//!
//! A holder following a session stores the session's id in place of its
//! own deadline (`lock_core::lock::session_deadline`): renewing the session
//! is one change here, whatever its holders (`LOCK.SESSION KEEPALIVE` is
//! O(1)), and the core decides a holder's liveness from the deadline this
//! table gives it (`deadline_of`). A session that ended (closed, or its
//! deadline passed) is gone from the table at once, so every command sees
//! its holders ended from that moment; the cleaning up (its keys visited,
//! their holders dropped and the drops replicated, their waiters granted,
//! its own waiters answered `NOSESSION`) is sliced across the timer's ticks
//! ([`take_work`]).
//!
//! Per session the table keeps its deadline, how many holders follow it
//! and on which keys (a count per key: the keys its end must visit), and
//! the waiters that asked with it. Holders join through the commits of
//! transitions (`lock_core::Changes::joined`), loads and applied effects,
//! and leave through ended holders (`lock_core::Ended::session`), the
//! unlink of a key and flushes.

use std::collections::{hash_set, BTreeSet, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

use crate::redis::ffi::DbKey;
use crate::redis::homes::{self, Home, Homes, NOWHERE};
use crate::redis::replication;
use crate::redis::shared::{self, Locked};
use crate::state::bindings;
use crate::state::txn::Txn;
use crate::time::clock;
use crate::time::fencing;
use lock_core::hash::Keyed;
use lock_core::lease::Leases;
use lock_core::shards::Sharded;
use lock_core::{Attempt, Changes, Ended, Lock, Request};
use redis_module::Context;

/// A waiting request's id (`waiting::WaiterId`).
pub type WaiterId = usize;

#[derive(Default, Debug)]
struct Session {
    deadline: u64,
    /// Its holders by database's home (`homes`: a flushed database's are
    /// gone at once, whatever their number).
    places: Vec<Place>,
    /// The requests waiting with it now (each leaves at its answer:
    /// [`drop_waiter`]; a waiter's id is used again after it).
    waiters: HashSet<WaiterId, Keyed>,
}

/// A place's keys: a count per key (sharded: a session may hold a million).
type Keys = Sharded<Vec<u8>, u32, Keyed>;

/// A session's holders in one database's home: how many, and on which
/// keys (a count per key: the keys its end must visit).
#[derive(Default, Debug)]
struct Place {
    home: Home,
    holders: u64,
    keys: Keys,
}

impl Session {
    /// Its holders in live homes.
    fn holders(&self, homes: &Homes) -> u64 {
        self.places
            .iter()
            .filter(|p| homes.is_live(p.home))
            .map(|p| p.holders)
            .sum()
    }

    /// Its place in `home`, made if need be.
    fn place(&mut self, home: Home) -> Option<&mut Place> {
        let at = match self.places.iter().position(|p| p.home == home) {
            Some(at) => at,
            None => {
                self.places.push(Place {
                    home,
                    ..Place::default()
                });
                self.places.len() - 1
            }
        };
        self.places.get_mut(at)
    }

    /// Its places in flushed databases go (their maps dropped a slice of a
    /// tick at a time): whether any did.
    fn prune(&mut self, homes: &Homes) -> bool {
        let before = self.places.len();
        let (live, dead): (Vec<Place>, Vec<Place>) = std::mem::take(&mut self.places)
            .into_iter()
            .partition(|p| homes.is_live(p.home));
        self.places = live;
        for p in dead {
            homes::throw(p.keys.into_iter().map(drop));
        }
        self.places.len() != before
    }
}

/// A session that ended, its keys and waiters still to visit: its key
/// maps taken over whole (ending a session of a million keys moves no key),
/// then read a page at a time.
#[derive(Debug)]
struct Ending {
    places: Vec<(Home, <Keys as IntoIterator>::IntoIter)>,
    waiters: hash_set::IntoIter<WaiterId>,
}

#[derive(Default)]
struct Table {
    /// The databases' homes of the sessions' places.
    homes: Homes,
    live: Sharded<u64, Session, Keyed>,
    by_deadline: BTreeSet<(u64, u64)>,
    ending: VecDeque<Ending>,
    /// Connection leases (`BIND`) and the holders that follow them, by
    /// their tokens (`lock_core::lease`): their deadlines are read here as
    /// sessions' are.
    leases: HomeLeases,
    /// Followers whose key was unlinked in this command: a RENAME or MOVE
    /// brings them back under the new name ([`join`]); anything else that
    /// looks at the table first lets them go.
    unlinked: Vec<(u64, DbKey)>,
    /// The followers of [`Table::unlinked`] not brought back yet: a RENAME
    /// brings back each of a key's followers in turn ([`join`]), each in
    /// O(1), and none lets go of the others before they are.
    unlinked_ids: HashSet<u64, Keyed>,
    /// Room for followers' key names, given back by those that left and
    /// taken by those bound next ([`Table::key`]): a bound grant and its
    /// release allocate nothing for the lease table's key.
    spare: Vec<Vec<u8>>,
    /// Bound session holders whose key was unlinked in this command, by
    /// grant: their bindings go as the followers' do, unless a RENAME or
    /// MOVE carried them along (`bindings::moved`, before anything else
    /// looks at the table).
    unbound: Vec<(u64, DbKey)>,
}

/// How many names [`Table::spare`] keeps, and the longest room it keeps.
const SPARE: usize = 256;
const SPARE_ROOM: usize = 64;

/// Where a follower's key is not known yet (a load: its key follows).
fn nowhere() -> DbKey {
    DbKey::new(-1, b"")
}

/// The connection leases' followers, a table (`lock_core::lease::Leases`)
/// per database's home (`homes`), and one for followers whose key is not
/// known yet ([`NOWHERE`]): a flush drops a database's table whole, a
/// slice of a tick at a time, and `SWAPDB` swaps two homes; each
/// follower is in one table. A lease's count and `KEEPALIVE` are the sum
/// over the tables (as many as databases with followers: one, mostly).
#[derive(Default)]
struct HomeLeases {
    homes: Homes,
    /// As many as databases with followers (one, mostly): a list looked
    /// through.
    tables: Vec<(Home, Leases<Vec<u8>>)>,
}

impl HomeLeases {
    fn values(&self) -> impl Iterator<Item = &Leases<Vec<u8>>> {
        self.tables.iter().map(|(_, t)| t)
    }

    fn table(&self, home: Home) -> Option<&Leases<Vec<u8>>> {
        self.tables.iter().find(|(h, _)| *h == home).map(|(_, t)| t)
    }

    fn table_mut(&mut self, home: Home) -> Option<&mut Leases<Vec<u8>>> {
        self.tables
            .iter_mut()
            .find(|(h, _)| *h == home)
            .map(|(_, t)| t)
    }

    /// `home`'s table, made if need be.
    fn entry(&mut self, home: Home) -> Option<&mut Leases<Vec<u8>>> {
        if self.table(home).is_none() {
            self.tables.push((home, Leases::default()));
        }
        self.table_mut(home)
    }

    fn is_empty(&self) -> bool {
        self.values().all(Leases::is_empty)
    }

    fn next_due(&self) -> Option<u64> {
        self.values().filter_map(Leases::next_due).min()
    }

    /// The home of the table follower `x` is in.
    fn home_of(&self, x: u64) -> Option<Home> {
        self.tables
            .iter()
            .find(|(_, t)| t.follows(x))
            .map(|(h, _)| *h)
    }

    // (Each look-up below asks each table once: one table, mostly.)

    fn follows(&self, x: u64) -> bool {
        self.values().any(|t| t.follows(x))
    }

    fn deadline(&self, x: u64) -> Option<u64> {
        self.values().find_map(|t| t.deadline(x))
    }

    fn lease_of(&self, x: u64) -> Option<u64> {
        self.values().find_map(|t| t.lease_of(x))
    }

    fn key_of(&self, x: u64) -> Option<DbKey> {
        let (home, name) = self
            .tables
            .iter()
            .find_map(|(h, t)| Some((*h, t.key_of(x)?)))?;
        Some(DbKey::new(self.homes.db_of(home)?, &name))
    }

    fn is_at(&self, x: u64, key: &DbKey) -> bool {
        let Some(home) = self.homes.get(key.db) else {
            return false;
        };
        self.table(home).is_some_and(|t| t.is_at(x, &key.name))
    }

    /// Follower `x` leaves: its key's name (its room, for the next).
    fn leave(&mut self, x: u64) -> Option<Vec<u8>> {
        self.tables.iter_mut().find_map(|(_, t)| t.leave(x))
    }

    /// Whether follower `x`'s holder is on `name` in database `db`
    /// (compared in place: nothing made to compare it with).
    fn is_at_name(&self, x: u64, db: i32, name: &[u8]) -> bool {
        let Some(home) = self.homes.get(db) else {
            return false;
        };
        self.table(home)
            .is_some_and(|t| t.key_is(x, |k| k.as_slice() == name))
    }

    /// [`Leases::set_own_new`]: a follower no table has yet.
    fn set_own_new(&mut self, x: u64, lease: u64, own: u64, key: DbKey) {
        let to = self.homes.home(key.db);
        if let Some(t) = self.entry(to) {
            t.set_own_new(x, lease, own, key.name);
        }
    }

    /// Follower `x`'s holder is on `key` now (loaded, or moved): in
    /// another database, it moves to that table with its deadline as read
    /// now (exact: the lease's next KEEPALIVE covers it as it would have).
    fn set_key(&mut self, x: u64, key: &DbKey) {
        let to = self.homes.home(key.db);
        // Mostly it stays in its database: one look-up.
        if let Some(t) = self.table_mut(to) {
            if t.set_key(x, key.name.clone()) {
                return;
            }
        }
        let Some(from) = self.home_of(x) else {
            return;
        };
        let Some(t) = self.table_mut(from) else {
            return;
        };
        let (Some(lease), Some(deadline)) = (t.lease_of(x), t.deadline(x)) else {
            return;
        };
        t.leave(x);
        if let Some(t) = self.entry(to) {
            t.set_own(x, lease, deadline, key.name.clone());
        }
    }

    fn set_own(&mut self, x: u64, lease: u64, own: u64, key: &DbKey) {
        let to = self.homes.home(key.db);
        // (It leaves its table there itself.)
        for (_, t) in self.tables.iter_mut().filter(|(h, _)| *h != to) {
            if t.leave(x).is_some() {
                break;
            }
        }
        if let Some(t) = self.entry(to) {
            t.set_own(x, lease, own, key.name.clone());
        }
    }

    fn keepalive(&mut self, lease: u64, now: u64, deadline: u64) -> u64 {
        self.tables
            .iter_mut()
            .map(|(_, t)| t.keepalive(lease, now, deadline))
            .sum()
    }

    fn count(&self, lease: u64) -> u64 {
        self.values().map(|t| t.count(lease)).sum()
    }

    fn all(&self) -> Vec<(u64, u64, u64)> {
        let mut all: Vec<_> = self.values().flat_map(Leases::all).collect();
        all.sort_unstable();
        all
    }

    /// Up to `n` followers whose deadline passed at `now`: their keys.
    fn end_due(&mut self, now: u64, n: usize) -> Vec<DbKey> {
        let mut keys = Vec::new();
        for (home, t) in self.tables.iter_mut() {
            if keys.len() >= n {
                break;
            }
            let db = self.homes.db_of(*home).unwrap_or(-1);
            keys.extend(
                t.end_due(now, n - keys.len())
                    .into_iter()
                    .map(|(_, name)| DbKey::new(db, &name)),
            );
        }
        keys
    }

    /// FLUSHDB / FLUSHALL (`db` -1): the flushed databases' tables go
    /// whole (and, for FLUSHALL, the followers whose key is not known),
    /// dropped a slice of a tick at a time. Whether any went.
    fn flushed(&mut self, db: i32) -> bool {
        let mut dead = self.homes.flushed(db);
        if db == -1 {
            dead.push(NOWHERE);
        }
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.tables)
            .into_iter()
            .partition(|(h, _)| dead.contains(h));
        self.tables = kept;
        let any = !gone.is_empty();
        for (_, t) in gone {
            homes::throw(t.into_pieces());
        }
        any
    }

    /// Every table replaced by `t` (a load's followers, their keys to come).
    fn replace(&mut self, t: Leases<Vec<u8>>) {
        for (_, old) in std::mem::take(&mut self.tables) {
            homes::throw(old.into_pieces());
        }
        self.tables.push((NOWHERE, t));
    }
}

static TABLE: LazyLock<Mutex<Table>> = LazyLock::new(Mutex::default);

/// Whether a session ever existed here (opened, received or loaded): from
/// then on every transaction asks the table whether its key's session
/// holders still hold; a server that never used one takes nothing else.
static ANY: AtomicBool = AtomicBool::new(false);
/// How many sessions are live (open), for `INFO lock` and the cap.
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// The earliest session deadline (`u64::MAX`: none), for the timer.
static NEXT_END: AtomicU64 = AtomicU64::new(u64::MAX);
/// Whether ended sessions have cleaning up left.
static ENDING: AtomicBool = AtomicBool::new(false);
/// When the lease table has work next (`u64::MAX`: none).
static NEXT_LEASE: AtomicU64 = AtomicU64::new(u64::MAX);

fn table() -> Locked<Table> {
    let mut t = table_as_is();
    t.let_go();
    t
}

/// [`table`], followers unlinked in this command kept for [`join`].
fn table_as_is() -> Locked<Table> {
    shared::lock(&TABLE, |t| {
        if !t.live.is_empty() || !t.leases.is_empty() {
            ANY.store(true, Ordering::Relaxed);
        }
        LIVE.store(t.live.len(), Ordering::Relaxed);
        ENDING.store(!t.ending.is_empty(), Ordering::Relaxed);
        let next = t.by_deadline.first().map_or(u64::MAX, |(at, _)| *at);
        NEXT_END.store(next, Ordering::Relaxed);
        let lease = t.leases.next_due().unwrap_or(u64::MAX);
        NEXT_LEASE.store(lease, Ordering::Relaxed);
    })
}

/// Whether a session ever existed here (one atomic).
#[inline]
pub fn any() -> bool {
    ANY.load(Ordering::Relaxed)
}

/// How many sessions are open.
pub fn count() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// When the timer must next look at sessions: the earliest deadline, or
/// now-ish when an ended session still has cleaning up (`None`: never).
pub fn next_work() -> Option<u64> {
    if ENDING.load(Ordering::Relaxed) {
        return Some(0);
    }
    let next = NEXT_END
        .load(Ordering::Relaxed)
        .min(NEXT_LEASE.load(Ordering::Relaxed));
    Some(next).filter(|&at| at != u64::MAX)
}

impl Table {
    /// A follower's key, in the room of one that left if any.
    fn key(&mut self, db: i32, name: &[u8]) -> DbKey {
        let mut room = self
            .spare
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(name.len().max(16)));
        room.clear();
        room.extend_from_slice(name);
        DbKey { db, name: room }
    }

    /// The key of a follower that left: its room kept for the next.
    fn give_back(&mut self, name: Option<Vec<u8>>) {
        if let Some(name) = name {
            if self.spare.len() < SPARE && name.capacity() <= SPARE_ROOM {
                self.spare.push(name);
            }
        }
    }

    /// The followers unlinked by the last command and not moved: gone.
    fn let_go(&mut self) {
        if self.unlinked.is_empty() && self.unbound.is_empty() {
            return;
        }
        let waiting = std::mem::take(&mut self.unlinked_ids);
        for (x, key) in std::mem::take(&mut self.unlinked) {
            // Its binding is stale (its holder went with the key).
            if waiting.contains(&x) && self.leases.is_at(x, &key) {
                self.leases.leave(x);
                bindings::forget(key.db, &key.name, [x]);
            }
        }
        for (token, key) in std::mem::take(&mut self.unbound) {
            bindings::forget(key.db, &key.name, [token]);
        }
    }

    fn set_deadline(&mut self, id: u64, deadline: u64) -> bool {
        let Some(s) = self.live.get_mut(&id) else {
            return false;
        };
        self.by_deadline.remove(&(s.deadline, id));
        s.deadline = deadline;
        self.by_deadline.insert((deadline, id));
        true
    }

    /// Ends `id`: out of the table, its keys and waiters queued for the
    /// cleaning up. Its holder count then.
    fn end(&mut self, id: u64) -> Option<u64> {
        let mut s = self.live.remove(&id)?;
        self.by_deadline.remove(&(s.deadline, id));
        s.prune(&self.homes);
        let holders = s.holders(&self.homes);
        let places: Vec<_> = s
            .places
            .into_iter()
            .filter(|p| !p.keys.is_empty())
            .map(|p| (p.home, p.keys.into_iter()))
            .collect();
        if !places.is_empty() || !s.waiters.is_empty() {
            self.ending.push_back(Ending {
                places,
                waiters: s.waiters.into_iter(),
            });
        }
        Some(holders)
    }
}

/// Opens session `id` live until `deadline` (a new one, or one a master
/// or a file names: its deadline set).
pub fn open(id: u64, deadline: u64) {
    let mut t = table();
    if !t.set_deadline(id, deadline) {
        t.live.insert(
            id,
            Session {
                deadline,
                ..Session::default()
            },
        );
        t.by_deadline.insert((deadline, id));
    }
}

/// The deadline of a live session at `now` (`None`: ended or unknown).
pub fn live_deadline(id: u64, now: u64) -> Option<u64> {
    table()
        .live
        .get(&id)
        .map(|s| s.deadline)
        .filter(|&d| now < d)
}

/// `LOCK.SESSION KEEPALIVE`: the session's deadline becomes `deadline`, if
/// it is live at `now` (false: it ended, or never was).
pub fn keep_alive(id: u64, deadline: u64, now: u64) -> bool {
    let mut guard = table();
    let t = &mut *guard;
    match t.live.get_mut(&id) {
        Some(s) if now < s.deadline => {
            // Its places in flushed databases go now (O(1) a place).
            s.prune(&t.homes);
            t.set_deadline(id, deadline)
        }
        _ => false,
    }
}

/// Ends session `id` now (CLOSE, its end applied from a master or a file):
/// how many holders followed it (`None`: it was not live).
pub fn end(id: u64) -> Option<u64> {
    table().end(id)
}

/// The sessions whose deadline passed at `now`, ended (their ids).
pub fn end_due(now: u64) -> Vec<u64> {
    let mut t = table();
    let mut ended = Vec::new();
    while let Some(&(at, id)) = t.by_deadline.first() {
        if at > now {
            break;
        }
        t.end(id);
        ended.push(id);
    }
    ended
}

/// `LOCK.SESSION INFO`: the deadline and holder count of a session live
/// at `now`.
pub fn info(id: u64, now: u64) -> Option<(u64, u64)> {
    let t = table();
    t.live
        .get(&id)
        .filter(|s| now < s.deadline)
        .map(|s| (s.deadline, s.holders(&t.homes)))
}

/// Runs `f` with the sessions' deadlines (`None`: ended or unknown), the
/// table locked once for all of its look-ups.
pub fn with_deadlines<R>(f: impl FnOnce(&dyn Fn(u64) -> Option<u64>) -> R) -> R {
    let t = table();
    let deadline_of = |id: u64| match t.live.get(&id) {
        Some(s) => Some(s.deadline),
        None => t.leases.deadline(id),
    };
    f(&deadline_of)
}

/// A bound holder's release in one step (`Lock::release_sole_follower`,
/// `release` given the followers' deadlines): when it ends a follower of
/// key `name` in database `db`, the follower leaves the lease table in the
/// same look at it, and the holder's end is returned with no session to
/// leave (nothing else to do for it: no key is made to compare with).
pub fn release_follower(
    db: i32,
    name: &[u8],
    release: impl FnOnce(&dyn Fn(u64) -> Option<u64>) -> Option<Ended>,
) -> Option<Ended> {
    // A follower leaving changes none of the flags that follow the table
    // but when the lease table next has work, which can only come later
    // (the timer then finds nothing and looks again): they are left as
    // they are (every bound release does this).
    let mut t = shared::lock(&TABLE, |_| {});
    let ended = {
        let t = &*t;
        let deadline_of = |id: u64| match t.live.get(&id) {
            Some(s) => Some(s.deadline),
            None => t.leases.deadline(id),
        };
        release(&deadline_of)
    };
    let mut ended = ended?;
    let x = ended.session;
    if x != 0 && t.leases.is_at_name(x, db, name) {
        let key = t.leases.leave(x);
        t.give_back(key);
        ended.session = 0;
    }
    Some(ended)
}

/// A holder on `key` began to follow session `id`.
pub fn join(id: u64, key: &DbKey) {
    let mut guard = table_as_is();
    let t = &mut *guard;
    let home = t.homes.home(key.db);
    if let Some(s) = t.live.get_mut(&id) {
        if let Some(p) = s.place(home) {
            p.holders += 1;
            *p.keys.entry(key.name.clone()).or_insert(0) += 1;
        }
    } else if t.leases.follows(id) {
        // A follower's key loaded, or moved (RENAME, MOVE): the key's other
        // followers are still to come back (the same event brings them).
        let back = t.unlinked_ids.remove(&id);
        t.leases.set_key(id, key);
        if back {
            return;
        }
    }
    t.let_go();
}

/// A holder on `key` stopped following session `id`.
pub fn leave(id: u64, key: &DbKey) {
    table().leave(id, key);
}

impl Table {
    fn leave(&mut self, id: u64, key: &DbKey) {
        // (A forged state may repeat a token on another key: that
        // holder is not this follower.)
        if self.leases.is_at(id, key) {
            let key = self.leases.leave(id);
            self.give_back(key);
        }
        let Some(home) = self.homes.get(key.db) else {
            return;
        };
        let Some(s) = self.live.get_mut(&id) else {
            return;
        };
        let Some(p) = s.places.iter_mut().find(|p| p.home == home) else {
            return;
        };
        p.holders = p.holders.saturating_sub(1);
        if let Some(n) = p.keys.get_mut(&key.name) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                p.keys.remove(&key.name);
            }
        }
    }
}

/// Lets go of what the last command unlinked and did not move (the
/// followers and the bindings of holders whose key went): before a count
/// is read outside a lock command (`INFO lock`).
pub fn settle() {
    if any() {
        drop(table());
    }
}

/// A lock with holders left key `key` (DEL, a write over it, the old name
/// of RENAME and MOVE): those following a session leave it.
pub fn unlinked(key: &DbKey, lock: &Lock) {
    let mut t = table_as_is();
    for h in lock.holders() {
        match h.session() {
            // A RENAME or MOVE may bring it back at once (`join`).
            Some(x) if h.is_follower() => {
                t.unlinked.push((x, key.clone()));
                t.unlinked_ids.insert(x);
            }
            Some(id) => {
                t.leave(id, key);
                if bindings::may_be_bound(h.token) {
                    t.unbound.push((h.token, key.clone()));
                }
            }
            None => {}
        }
    }
}

/// A waiting request granted with `attempt` whose session ended while it
/// waited (before the timer answered it): the grant is undone in `txn`, and
/// the caller answers `NOSESSION`.
pub fn ended_while_waiting(request: &Request, attempt: Attempt, txn: &mut Txn) -> bool {
    let Attempt::Granted(token) = attempt else {
        return false;
    };
    if request.session == 0 || live_deadline(request.session, txn.now).is_some() {
        return false;
    }
    txn.lock
        .release_all(&request.owner, token, txn.now, txn.changes);
    true
}

/// A waiting request follows session `id`: answered `NOSESSION` if the
/// session ends first.
pub fn add_waiter(id: u64, waiter: WaiterId) {
    if let Some(s) = table().live.get_mut(&id) {
        s.waiters.insert(waiter);
    }
}

/// A waiting request of session `id` was answered (granted, timed out,
/// refused, its client gone): it no longer follows the session, and its
/// id may be a later request's.
pub fn drop_waiter(id: u64, waiter: WaiterId) {
    if let Some(s) = table().live.get_mut(&id) {
        s.waiters.remove(&waiter);
    }
}

/// Up to `n` pieces of cleaning up of ended sessions: keys to visit and
/// waiters to answer. Empty when none is left.
pub fn take_work(n: usize, now: u64) -> (Vec<DbKey>, Vec<WaiterId>) {
    if !ENDING.load(Ordering::Relaxed) && NEXT_LEASE.load(Ordering::Relaxed) > now {
        return (Vec::new(), Vec::new());
    }
    let mut guard = table();
    let t = &mut *guard;
    let (mut keys, mut waiters) = (Vec::new(), Vec::new());
    if NEXT_LEASE.load(Ordering::Relaxed) <= now {
        keys = t.leases.end_due(now, n);
    }
    while keys.len() + waiters.len() < n {
        let Some(e) = t.ending.front_mut() else {
            break;
        };
        if let Some(w) = e.waiters.next() {
            waiters.push(w);
            continue;
        }
        let Some((home, place)) = e.places.last_mut() else {
            t.ending.pop_front();
            continue;
        };
        match t.homes.db_of(*home) {
            // A flushed database's keys: nothing to visit, dropped later.
            None => {
                if let Some((_, gone)) = e.places.pop() {
                    homes::throw(gone.map(drop));
                }
            }
            Some(db) => match place.next() {
                Some((name, _)) => keys.push(DbKey { db, name }),
                None => {
                    e.places.pop();
                }
            },
        }
    }
    (keys, waiters)
}

/// The lock as its holders stand at `now`, those whose session ended left
/// out (`None`: none of them did): what a read (LOCK.INFO, a check, a
/// guard, the deadlock search) sees, as if the timer had ended them.
pub fn without_ended(lock: &Lock, now: u64) -> Option<Lock> {
    if !any() || !lock.has_sessions() {
        return None;
    }
    let mut open = lock.clone();
    let mut changes = Changes::default();
    let ended = with_deadlines(|deadline_of| open.end_sessions(deadline_of, now, &mut changes));
    (ended > 0).then_some(open)
}

/// A holder's lease end as reads show it: its own deadline or its
/// session's (0 for an ended one).
pub fn deadline_of(h: &lock_core::HolderRef<'_>) -> u64 {
    match h.session() {
        None => h.deadline,
        Some(_) => with_deadlines(|deadline_of| h.deadline_with(deadline_of)),
    }
}

/// [`set_own`] of a bound grant on a free key (`transitions::follow_first`:
/// its token is new, so no follower has it yet): its key `name` in
/// database `db`, made in the room of a follower that left.
pub fn set_own_new(token: u64, lease: u64, own: u64, db: i32, name: &[u8]) {
    // What a new follower changes of the flags that follow the table, set
    // here rather than all looked at again when its lock is let go (every
    // bound grant does this).
    let mut t = shared::lock(&TABLE, |_| {});
    let key = t.key(db, name);
    t.leases.set_own_new(token, lease, own, key);
    ANY.store(true, Ordering::Relaxed);
    NEXT_LEASE.fetch_min(Leases::<DbKey>::due_at(own), Ordering::Relaxed);
}

/// The holder of grant `token` on `key` follows lease `lease` (its
/// connection's: a `BIND`; `None`: the one it follows), its own deadline
/// `own` (a bound grant, a repeat, a RENEW). False: no such follower
/// (`lease` `None` and it follows none).
pub fn set_own(token: u64, lease: Option<u64>, own: u64, key: DbKey) -> Option<u64> {
    let mut t = table();
    let lease = lease.or_else(|| t.leases.lease_of(token))?;
    t.leases.set_own(token, lease, own, &key);
    Some(lease)
}

/// Whether the lease table has work due at or before a follower ending at
/// `own` is (the end of its deadline's slot, [`Leases::due_at`]) already:
/// the timer is armed for it, so that follower need not arm it. (Compared
/// with `own` itself, every grant after the first in one slot re-armed.)
pub fn lease_work_by(own: u64) -> bool {
    NEXT_LEASE.load(Ordering::Relaxed) <= Leases::<DbKey>::due_at(own)
}

/// A new lease's id, drawn like a session id (above every token and id
/// issued or seen: never one an earlier run saved).
pub fn draw_lease() -> Option<u64> {
    let now = clock::now_ms();
    let mut tokens = fencing::for_transaction(now);
    let start = tokens;
    let id = tokens.issue()?;
    fencing::issued(&start, &tokens);
    Some(id)
}

/// The holder of grant `token` on `key`, in the transaction `txn`, follows
/// `lease` from now on (`BIND`): a plain holder becomes a follower (its own
/// deadline kept in the lease table, its entry naming its token), a
/// follower of another lease moves with its own deadline. Replicated as
/// one effect with the absolute deadline: the holder's own in the
/// transaction's, which carries its lease (a plain holder's entry
/// changes), or `LOCK.LEASESYNC OWN` (a move). A session holder stays on
/// its session.
pub fn follow_in(ctx: &Context, txn: &mut Txn, key: &DbKey, token: u64, lease: u64) {
    // A forged state repeating a token (a RESTORE of the lock elsewhere):
    // the copy keeps its own lease, the follower stays the original's.
    if table().leases.key_of(token).is_some_and(|k| &k != key) {
        return;
    }
    // A plain holder's entry changes: its effect, in the transaction's,
    // carries the lease and its own deadline (`replication::replicate`).
    if let Some(own) = txn.lock.follow(token, txn.changes) {
        set_own(token, Some(lease), own, key.clone());
        return;
    }
    // A follower moves to this lease: its entry stays, so the move is its
    // own effect.
    if let Some((_, own)) = follower(token).filter(|(l, _)| *l != lease) {
        set_own(token, Some(lease), own, key.clone());
        replication::replicate_lease_own(ctx, token, lease, own);
    }
}

/// A master's (or the AOF's) `LOCK.LEASESYNC OWN`: the holder of grant
/// `token` follows `lease` with its own deadline (its key kept, or learned
/// when its holder's effect comes: [`join`]).
pub fn sync_own(token: u64, lease: u64, own: u64) {
    let mut t = table();
    let key = t.leases.key_of(token).unwrap_or_else(nowhere);
    t.leases.set_own(token, lease, own, &key);
}

/// `LOCK.KEEPALIVE` of lease `lease` at `now`: each of its followers alive
/// at `now` lives until `deadline`. How many.
pub fn lease_keepalive(lease: u64, now: u64, deadline: u64) -> u64 {
    table().leases.keepalive(lease, now, deadline)
}

/// How many holders follow lease `lease`, alive or not.
pub fn lease_count(lease: u64) -> u64 {
    table().leases.count(lease)
}

/// The lease the holder of grant `token` follows, and its deadline.
pub fn follower(token: u64) -> Option<(u64, u64)> {
    let t = table();
    Some((t.leases.lease_of(token)?, t.leases.deadline(token)?))
}

/// Every follower, as a file keeps it: `(token, lease, deadline)` (its
/// deadline as read now: its own from the load on, which is what the
/// lease's next KEEPALIVE would cover all the same).
pub fn saved_followers() -> Vec<(u64, u64, u64)> {
    table().leases.all()
}

/// A file's followers (their keys follow as they load: [`join`]).
pub fn load_followers(all: impl IntoIterator<Item = (u64, u64, u64)>) {
    let mut t = table();
    let mut loaded = Leases::default();
    for (x, lease, deadline) in all {
        loaded.set_own(x, lease, deadline, Vec::new());
    }
    t.leases.replace(loaded);
}

/// Every session, as a file keeps it: `(id, deadline)`.
pub fn saved() -> Vec<(u64, u64)> {
    let t = table();
    let mut all: Vec<(u64, u64)> = t.live.iter().map(|(id, s)| (*id, s.deadline)).collect();
    all.sort_unstable();
    all
}

/// A file's sessions replace the table (a load: the keys that follow are
/// counted in as they load).
pub fn load(sessions: impl IntoIterator<Item = (u64, u64)>) {
    let mut t = table();
    let leases = std::mem::take(&mut t.leases);
    let homes = std::mem::take(&mut t.homes);
    let old = std::mem::replace(
        &mut *t,
        Table {
            leases,
            homes,
            ..Table::default()
        },
    );
    // (Dropped a slice of a tick at a time: a load follows a flush of
    // every database, whose keys' counts are gone already.)
    homes::throw(
        old.live
            .into_values()
            .flat_map(|s| s.places)
            .map(|p| homes::throw(p.keys.into_iter().map(drop))),
    );
    for (id, deadline) in sessions {
        t.live.insert(
            id,
            Session {
                deadline,
                ..Session::default()
            },
        );
        t.by_deadline.insert((deadline, id));
    }
}

/// FLUSHDB / FLUSHALL (`db` -1): the holders of the flushed keys are gone,
/// in O(1) whatever their number: the flushed databases' homes die (each
/// session's count there is left out from now on, its place dropped when
/// next looked at), and their followers' tables go whole. What they held
/// is dropped a slice of a tick at a time: whether any is left to.
pub fn flushed(db: i32) -> bool {
    if !any() {
        return false;
    }
    let mut t = table();
    t.homes.flushed(db);
    t.leases.flushed(db) || homes::any()
}

/// SWAPDB: the keys of `a` are `b`'s and the other way round (two homes
/// swapped, O(1)).
pub fn swap_dbs(a: i32, b: i32) {
    if !any() {
        return;
    }
    let mut t = table();
    t.homes.swap(a, b);
    t.leases.homes.swap(a, b);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_joins_and_leaves_and_end_queues_keys() {
        load([(7, 1000)]);
        let k = DbKey::new(0, b"k");
        join(7, &k);
        join(7, &k);
        join(7, &DbKey::new(0, b"j"));
        leave(7, &k);
        assert_eq!(info(7, 10), Some((1000, 2)));
        assert_eq!(info(7, 1000), None);
        assert!(keep_alive(7, 2000, 999));
        assert!(!keep_alive(7, 3000, 2000));
        assert_eq!(end_due(1999), Vec::<u64>::new());
        assert_eq!(end_due(2000), vec![7]);
        assert_eq!(end(7), None);
        let (mut keys, waiters) = take_work(10, 0);
        keys.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(keys, vec![DbKey::new(0, b"j"), k]);
        assert!(waiters.is_empty());
        assert_eq!(take_work(10, 0).0.len(), 0);
        assert!(any());
    }
}
