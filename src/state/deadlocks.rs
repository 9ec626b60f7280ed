//! Deadlock detection in the server: before a request waits, would waiting
//! close a cycle of waits back to its own owner? The search is the core's
//! (`lock_core::deadlock`); this file shows it the server's state: the
//! waiting requests and their places (`waiting`) and the holders of their
//! keys (read from the keys, in whatever database each is, once a search).
//!
//! Most requests need no search at all: a cycle back to an owner needs
//! somebody waiting for it, and nobody can while it holds no key that has
//! a queue and has no request waiting anywhere (`waiting::may_be_waited_for`,
//! one look-up): a new worker queueing for a hot key, or at the top of a
//! chain, is answered at once however many wait. Otherwise the search is
//! complete and linear in the wait graph (every cycle is found, however
//! long; nothing is cut), and its cost is paid only by a request about to
//! block.
//!
//! The search never holds the event loop for long, whatever graph clients
//! built: the command runs it for at most [`SLICE`]; a search that needs
//! more lets the request wait (it is queued as any other) and goes on at
//! each of the event loop's next turns ([`go_on`], at most [`SLICE`] a turn
//! for all of them), in the timer's ticks: a search left unfinished asks
//! for the next turn (`timers::work_now`, the module's one "next turn"),
//! so the event loop does not sleep between two slices, and nothing runs
//! once no search is left; Redis serves its clients between them.
//! When it finds a cycle then, the request leaves its queues and is
//! answered `DEADLOCK`, state unchanged, as if it had been answered at
//! once; a cycle found after the graph may have changed is checked edge by
//! edge first (the core's `Search::stale`). A request granted, timed out or
//! gone before its search ends needs no verdict: the search is dropped.

use std::collections::HashSet;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use redis_module::Context;

use crate::redis::errors::LockError;
use crate::redis::ffi::{self, DbKey, DbKeyMap, Str};
use crate::redis::shared;
use crate::state::bindings;
use crate::state::keys::LockKey;
use crate::state::sessions;
use crate::state::stats;
use crate::state::timers;
use crate::state::waiting::{self, WaiterId};
use crate::time::clock;
use lock_core::deadlock::{EachQueued, Requested, Search, Slots, Verdict, WaitGraph, SLOTS_A_PAGE};
use lock_core::hash::Keyed;
use lock_core::{Kind, Lock, Owner, Request};

/// The longest a search runs in one turn of the event loop: in the
/// command, and in a turn for every search going on together.
pub const SLICE: Duration = Duration::from_micros(500);

/// A key's lock as one search read it, with its live holders counted once:
/// a few are scanned, many are also put in a set at the first question
/// about them (a key with 1,000 readers and 10,000 requests queued on it is
/// asked about every one of them). The lock's copy is its one block: no
/// holder's owner is copied unless the set is made.
struct Read {
    lock: Lock,
    live: usize,
    set: Option<HashSet<Owner, Keyed>>,
    now: u64,
}

/// Up to this many live holders, a question about one is a scan.
const SCANNED: usize = 8;

impl Read {
    fn new(lock: Lock, now: u64) -> Read {
        let live = lock.live(now).count();
        Read {
            lock,
            live,
            set: None,
            now,
        }
    }

    fn holds(&mut self, owner: &[u8]) -> bool {
        let (lock, now) = (&self.lock, self.now);
        if self.live <= SCANNED {
            return lock.live(now).any(|h| *h.owner == *owner);
        }
        self.set
            .get_or_insert_with(|| lock.live(now).map(|h| Owner::from(h.owner)).collect())
            .contains(owner)
    }

    fn admits(&self, kind: Kind) -> bool {
        self.live == 0 || self.lock.admits(kind, self.now)
    }
}

/// How much work (a step, an entry listed, a key read and each of its
/// holders) a slice does between two looks at the clock (looked at every
/// step, the clock was a visible share of a long search; 64 of these are a
/// few microseconds).
const CHECK_EVERY: usize = 64;

/// What reading a key costs, in [`CHECK_EVERY`]'s units, besides its
/// holders (opening it through the module API, copying its lock).
const READ_COST: usize = 8;

/// The keys one search met, each under a number of its own (the core's
/// key: no copy of a key's name, no hash of it, past the first meeting),
/// and each key's lock as read once in the search (many requests wait on
/// one key; empty when free or not a lock), by number. A key met by the
/// registry's number for it (`waiting::requests_of`) is found by that
/// number's slot in an array: its name is hashed once a search, at its
/// first meeting.
#[derive(Default)]
struct Reads {
    ids: DbKeyMap<usize>,
    keys: Vec<DbKey>,
    /// Each key's number in the registry ([`waiting::NO_NUMBER`]: not
    /// known yet).
    numbers: Vec<u64>,
    /// By the slot of a registry's number: the key's number in this
    /// search (pages kept from search to search: [`SPARE`]).
    by_number: Slots,
    reads: Vec<Option<Read>>,
}

impl Reads {
    /// For a new search: no key met (the room and the pages kept).
    fn reset(&mut self) {
        self.ids.clear();
        self.keys.clear();
        self.numbers.clear();
        self.by_number.renew();
        self.reads.clear();
    }

    /// `key`'s number, given at its first meeting.
    fn id(&mut self, key: &DbKey) -> usize {
        if let Some(id) = self.ids.get(key) {
            return *id;
        }
        let id = self.keys.len();
        self.keys.push(key.clone());
        self.numbers.push(waiting::NO_NUMBER);
        self.ids.insert(key.clone(), id);
        id
    }

    /// The key the registry numbers `number` (`key`, filed): its number.
    /// A key met by number is found by number only (its name is not
    /// hashed), unless keys were met without one (their queue gone, or
    /// not made yet when the search began): a key whose queue came or went
    /// between two slices may then be met twice under two numbers, which
    /// costs a second listing, never a wrong answer.
    fn id_numbered(&mut self, number: u64, key: &DbKey) -> usize {
        if number == waiting::NO_NUMBER {
            return self.id(key);
        }
        if let Some(id) = self.by_number.get(number) {
            return id as usize;
        }
        // (Not looked up among the keys met without a number: such a key
        // met by number too, before its number was known, is a second
        // one, a second listing, never a wrong answer.)
        self.keys.push(key.clone());
        self.numbers.push(number);
        let id = self.keys.len() - 1;
        self.numbered(id, number);
        id
    }

    /// Key `id` is the registry's `number`.
    fn numbered(&mut self, id: usize, number: u64) {
        if number == waiting::NO_NUMBER {
            return;
        }
        if let Some(n) = self.numbers.get_mut(id) {
            *n = number;
        }
        // (A search meets fewer than 2^32 keys; one past that is not
        // found by number: met again, a second listing.)
        if let Ok(id) = u32::try_from(id) {
            self.by_number.set(number, id);
        }
    }
}

/// The server's waits as the core's search sees them, during one slice.
struct Waits<'a> {
    ctx: &'a Context,
    now: u64,
    reads: &'a mut Reads,
    /// When this slice ends.
    until: Instant,
    /// Work done since the clock was last looked at ([`CHECK_EVERY`]).
    work: usize,
}

impl Waits<'_> {
    /// `f` on key `id`'s lock, read at its first use in this search.
    fn read<T>(&mut self, id: usize, f: impl FnOnce(&mut Read) -> T) -> T {
        let reads = &mut *self.reads;
        if !matches!(reads.reads.get(id), Some(Some(_))) {
            if let Some(key) = reads.keys.get(id) {
                let read = Read::new(read(self.ctx, key, self.now), self.now);
                self.work += READ_COST + read.live;
                if reads.reads.len() <= id {
                    reads.reads.resize_with(id + 1, || None);
                }
                if let Some(slot) = reads.reads.get_mut(id) {
                    *slot = Some(read);
                }
            }
        }
        match reads.reads.get_mut(id) {
            Some(Some(read)) => f(read),
            _ => f(&mut Read::new(Lock::default(), self.now)),
        }
    }
}

/// `key` is filed (`waiting::filed`): read in its database now.
fn read(ctx: &Context, key: &DbKey, now: u64) -> Lock {
    let db = waiting::db_of(key.db);
    if !ffi::select_db(ctx, db) {
        return Lock::default();
    }
    let name = ffi::name(ctx, &key.name);
    let read = LockKey::open(ctx, Str::from(&name), false)
        .map(|k| k.lock().map(|l| l.map(|l| Lock::clone(&l))));
    match read {
        // A closed connection's holders keep nobody waiting.
        Ok(Ok(Some(lock))) => {
            let lock = bindings::without_closed(db, &key.name, &lock, now).unwrap_or(lock);
            // Nor does an ended session's.
            sessions::without_ended(&lock, now).unwrap_or(lock)
        }
        _ => Lock::default(),
    }
}

impl WaitGraph for Waits<'_> {
    type Key = usize;

    fn requests_of(
        &mut self,
        owner: &[u8],
        number: u64,
        after: Option<u64>,
        limit: usize,
        out: &mut Vec<Requested<usize>>,
    ) -> Option<u64> {
        let reads = &mut *self.reads;
        let more = waiting::requests_of(owner, number, after, limit, out, |n, key| {
            reads.id_numbered(n, key)
        });
        self.work += out.len();
        more
    }

    fn holds(&mut self, key: &usize, owner: &[u8]) -> bool {
        self.read(*key, |read| read.holds(owner))
    }

    fn waited_keys_held(
        &mut self,
        owner: &[u8],
        after: Option<&usize>,
        limit: usize,
    ) -> Vec<usize> {
        let reads = &mut *self.reads;
        let after = after.and_then(|id| reads.keys.get(*id)).cloned();
        let mut keys = Vec::new();
        waiting::waited_keys_held(owner, after.as_ref(), limit, &mut |key, n| {
            keys.push(reads.id_numbered(n, key))
        });
        self.work += keys.len();
        keys
    }

    fn admits(&mut self, key: &usize, kind: Kind) -> bool {
        self.read(*key, |read| read.admits(kind))
    }

    fn holders(&mut self, key: &usize, each: &mut dyn FnMut(&[u8])) {
        self.read(*key, |read| {
            read.lock.live(read.now).for_each(|h| each(h.owner))
        })
    }

    fn queued(&mut self, key: &usize, from: u64, to: u64, limit: usize, each: &mut EachQueued<'_>) {
        let id = *key;
        let number = self
            .reads
            .numbers
            .get(id)
            .copied()
            .unwrap_or(waiting::NO_NUMBER);
        if let Some(key) = self.reads.keys.get(id) {
            let mut n = 0;
            let found = waiting::queued(
                key,
                number,
                from,
                to,
                limit,
                &mut |place, owner, o, kind| {
                    n += 1;
                    each(place, owner, o, kind)
                },
            );
            self.work += n;
            if found != number {
                self.reads.numbered(id, found);
            }
        }
    }

    fn out_of_time(&mut self) -> bool {
        self.work += 1;
        if self.work < CHECK_EVERY {
            return false;
        }
        self.work = 0;
        Instant::now() >= self.until
    }

    fn forget(&mut self) {
        // (The keys keep their numbers: the search holds them.)
        self.reads.reads.clear();
    }
}

/// A search that goes on after its request started waiting.
pub struct Unfinished {
    search: Search<usize, Keyed>,
    reads: Reads,
}

/// What a search found in the command's slice.
pub enum Check {
    /// Waiting would close a cycle: answer `DEADLOCK` (counted).
    Cycle,
    /// No cycle: wait.
    Clear,
    /// Not done: wait, and hand it to [`go_on_later`] with the waiter.
    Unfinished(Box<Unfinished>),
}

/// Whether `request`, about to wait on `keys`, would close a cycle of
/// waits, as far as one slice tells.
pub fn check(ctx: &Context, keys: &[DbKey], request: &Request) -> Check {
    if !waiting::may_be_waited_for(&request.owner) {
        return Check::Clear;
    }
    let spare = shared::lock(&SPARE, |_| ()).take();
    let mut unfinished = spare.unwrap_or_else(|| {
        Box::new(Unfinished {
            search: Search::with_hasher(&request.owner, request.kind, &[]),
            reads: Reads::default(),
        })
    });
    let reads = &mut unfinished.reads;
    reads.reset();
    // The registry's keys (by home): a search that goes on across a
    // SWAPDB follows them.
    let keys = waiting::filed(keys);
    let at: Vec<(usize, u64)> = keys
        .iter()
        .map(|k| {
            let (number, end) = waiting::number_and_end(k);
            (reads.id_numbered(number, k), end)
        })
        .collect();
    unfinished.search.again(&request.owner, request.kind, &at);
    match slice(ctx, &mut unfinished, Instant::now() + SLICE) {
        Some(Verdict::Cycle) => {
            stats::DEADLOCKS.incr();
            give_back(unfinished);
            Check::Cycle
        }
        Some(Verdict::Clear) => {
            give_back(unfinished);
            Check::Clear
        }
        None => {
            stats::DEADLOCK_SEARCHES_SLICED.incr();
            Check::Unfinished(unfinished)
        }
    }
}

/// A search that ended, kept for the next (`Search::again`, `Reads::reset`):
/// its arrays keep their room and its tables by registry number (the
/// core's owners, the shell's keys) their pages, so the next search grows
/// and zeroes nothing up to that size (each search's entries in the
/// tables stand by its epoch, `Slots`). One is kept; given back to the
/// allocator when the registry numbers fewer keys and owners than it met
/// and holds pages for (about a quarter, and a page).
static SPARE: Mutex<Option<Box<Unfinished>>> = Mutex::new(None);

/// A search ended: kept in [`SPARE`] for the next one (the larger of two),
/// or given back to the allocator when the registry numbers fewer than it
/// is made for.
fn give_back(mut unfinished: Box<Unfinished>) {
    // (What it read goes now: the keys' names and their locks' copies.)
    unfinished.reads.reset();
    let (live_keys, live_owners) = waiting::numbered();
    let live = live_keys + live_owners;
    let fits = |slots: &Slots, live: usize| slots.pages() <= live / SLOTS_A_PAGE + 1;
    let met = unfinished.search.met() + unfinished.reads.keys.len();
    if met > 4 * live + SLOTS_A_PAGE
        || !fits(&unfinished.reads.by_number, live_keys)
        || !fits(unfinished.search.slots(), live_owners)
    {
        return;
    }
    let mut spare = shared::lock(&SPARE, |_| ());
    if spare
        .as_ref()
        .is_none_or(|s| s.search.met() <= unfinished.search.met())
    {
        *spare = Some(unfinished);
    }
}

/// Runs one slice of a search, until `until`.
fn slice(ctx: &Context, unfinished: &mut Unfinished, until: Instant) -> Option<Verdict> {
    let Unfinished { search, reads } = unfinished;
    let mut waits = Waits {
        ctx,
        now: clock::now_ms(),
        reads,
        until,
        work: 0,
    };
    ffi::keeping_db(ctx, || search.run(&mut waits))
}

/// A search going on, with the waiter it is for.
type GoingOn = (WaiterId, Box<Unfinished>);

/// Searches going on.
static GOING_ON: LazyLock<Mutex<Vec<GoingOn>>> = LazyLock::new(Mutex::default);

/// Goes on with `unfinished` at the next turns, for the waiter `id`.
pub fn go_on_later(id: WaiterId, unfinished: Box<Unfinished>) {
    shared::lock(&GOING_ON, |_| ()).push((id, unfinished));
    timers::work_now();
}

/// A turn's share of the searches going on (at most [`SLICE`] for all of
/// them, each in turn): a cycle found answers its waiter `DEADLOCK`.
pub fn go_on(ctx: &Context) {
    let mut going = std::mem::take(&mut *shared::lock(&GOING_ON, |_| ()));
    if going.is_empty() {
        return;
    }
    let until = Instant::now() + SLICE;
    let mut left = Vec::with_capacity(going.len());
    let mut turn = going.drain(..);
    for (id, mut unfinished) in turn.by_ref() {
        if !waiting::still_waits(id) {
            give_back(unfinished);
            continue;
        }
        // The graph may have changed since its last slice.
        unfinished.search.stale();
        match slice(ctx, &mut unfinished, until) {
            Some(Verdict::Cycle) => {
                give_back(unfinished);
                if waiting::refuse(id, LockError::Deadlock) {
                    stats::DEADLOCKS.incr();
                }
            }
            Some(Verdict::Clear) => {
                if unfinished.search.gave_up() {
                    stats::DEADLOCK_SEARCHES_CUT.incr();
                }
                give_back(unfinished);
            }
            None => left.push((id, unfinished)),
        }
        if Instant::now() >= until {
            break;
        }
    }
    left.extend(turn);
    if !left.is_empty() {
        shared::lock(&GOING_ON, |_| ()).extend(left);
        timers::work_now();
    }
}
