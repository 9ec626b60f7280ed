//! Deadlock detection: does a request that is about to wait close a cycle of
//! waits back to its own owner?
//!
//! A waiting request depends on every live holder that keeps it out and on
//! every request queued ahead of it that it cannot be granted with
//! ([`blockers`], [`queued_blockers`]: the definition): a waiting writer
//! keeps the readers behind it waiting, readers do not keep readers
//! waiting. Owners are compared by their bytes, across keys and databases:
//! an owner waits for whatever any of its waiting requests waits for.
//! [`search`] walks these dependencies from the new request; reaching its
//! owner again is a deadlock.
//!
//! The walk is complete (no step limit: every cycle is found, however long)
//! and linear in the part of the wait graph it walks. It goes both ways at
//! once: forward from the new request (whom it would wait for, and whom
//! they wait for...) and backward from its owner (who waits for it, and who
//! waits for them...), always on the side that has done less work so far,
//! and stops when the two meet (a cycle) or either side has nothing left
//! (none): its cost is about twice that of the cheaper side. A new worker
//! on a hot key, whom nobody waits for, costs one look-up however long the
//! queue; a request whose key's holder waits for nothing costs a few steps
//! however many wait behind the keys its owner holds; a request in the
//! middle of a long chain walks the short side. Each owner is expanded
//! once a side, each key's holders (or its holders' dependents) are listed
//! once, and each queue is gone through at most twice a side (for everyone
//! and for writers, remembering per key how far from which place requests
//! were listed): a walk over every request of a queue of n requests is
//! O(n). What the walk reads of a key (its holders, what its lock admits,
//! its queue when shorter than a page) is read once a search and kept by
//! the key's number (`KeyRead`), for both sides.
//!
//! The walk is resumable ([`Search::run`]): every listing is done a page of
//! at most [`PAGE`] entries at a time, and the walk stops between pages
//! when the graph says its time is up ([`WaitGraph::out_of_time`]). The
//! shell lets a request whose search needs more than one slice wait while
//! the search goes on over the next turns of its event loop. The graph may
//! change between slices: a cycle found then is checked edge by edge
//! against the graph as it is now ([`Search::stale`] before a slice that
//! follows a change), and the search starts again when one is gone.

use crate::shards::Sharded;
use std::collections::hash_map::RandomState;
use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use crate::lock::{Kind, Lock, Owner, Request};

/// An owner's waiting request as [`WaitGraph::requests_of`] lists it: its
/// key, its place in that key's queue, what it asks.
pub type Requested<K> = (K, u64, Kind);

/// How many entries one step of a walk lists at most: the walk checks its
/// time between steps.
pub const PAGE: usize = 256;

/// What [`WaitGraph::queued`] calls for each request: place, owner, the
/// owner's number ([`NO_NUMBER`]: none), kind.
pub type EachQueued<'a> = dyn FnMut(u64, &[u8], u64, Kind) + 'a;

/// No number: an owner the shell does not number (see [`WaitGraph`]).
pub const NO_NUMBER: u64 = u64::MAX;

/// How many times a search starts again when a cycle it found was gone
/// once checked (the graph changed under it); after that it answers
/// [`Verdict::Clear`] (the request waits as any other).
pub const RESTARTS: u32 = 3;

/// The most requests a check of a cycle may have read, over turns, to be
/// read again in one go at its end (each edge then holds at one instant):
/// at most about a quarter of a millisecond in the shell.
pub const RECHECK: usize = 512;

/// What the search asks of the shell, which keeps the waiting requests and
/// reads the locks: keys are the shell's own (`K`), numbers it gives each
/// key at its first meeting in a search, from 0 up (the search keeps what
/// it listed around each key in an array by that number); places are
/// sequence numbers in a key's queue (`crate::Queue::place`). Every
/// listing is paged: at most `limit` entries, and a way to go on after the
/// last.
///
/// Owners come with a number the shell may keep for them (the waiting
/// registry numbers each waiting owner while it waits, [`NO_NUMBER`] for
/// the others): its low 32 bits a slot, its high 32 bits the slot's
/// generation, so that a number names one owner for as long as the
/// process lives (a slot given again comes with a new generation). The
/// search finds an owner it met by number in an array (no hash of its
/// bytes), and gives the number back when it asks for that owner's
/// requests.
pub trait WaitGraph {
    type Key: Copy + Eq + Hash + Into<usize>;
    /// `owner`'s waiting requests, after the cursor `after` (`None`: from
    /// the first), at most about `limit` of them, into `out` (empty when
    /// given, its room kept from page to page): each one's key, its place
    /// in that key's queue, what it asks; and the cursor to go on from
    /// when more are left. `number`: the owner's number as the graph gave
    /// it ([`NO_NUMBER`]: none known).
    fn requests_of(
        &mut self,
        owner: &[u8],
        number: u64,
        after: Option<u64>,
        limit: usize,
        out: &mut Vec<Requested<Self::Key>>,
    ) -> Option<u64>;
    /// Keys with a queue that `owner` may hold, after `after`, at most
    /// `limit` of them, in a stable order (each is checked with
    /// [`WaitGraph::holds`]; none it holds may be missing).
    fn waited_keys_held(
        &mut self,
        owner: &[u8],
        after: Option<&Self::Key>,
        limit: usize,
    ) -> Vec<Self::Key>;
    /// Whether `owner` holds `key` now (its requests there wait for nobody).
    fn holds(&mut self, key: &Self::Key, owner: &[u8]) -> bool;
    /// Whether `key`'s lock admits a request of `kind` from someone not
    /// holding it (so its holders keep it waiting for nobody).
    fn admits(&mut self, key: &Self::Key, kind: Kind) -> bool;
    /// `each` live holder of `key` (its bytes lent: the search copies an
    /// owner only at its first meeting).
    fn holders(&mut self, key: &Self::Key, each: &mut dyn FnMut(&[u8]));
    /// The requests queued on `key` at places `from..to`, at most `limit`
    /// of them, to `each`: place, owner, the owner's number
    /// ([`NO_NUMBER`]: none) and kind.
    fn queued(
        &mut self,
        key: &Self::Key,
        from: u64,
        to: u64,
        limit: usize,
        each: &mut EachQueued<'_>,
    );
    /// Whether this slice's time is up (asked between steps).
    fn out_of_time(&mut self) -> bool {
        false
    }
    /// Forget what was read and kept (a check of a cycle reads the graph
    /// as it is now).
    fn forget(&mut self) {}
}

/// The verdict of a [`Search`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Verdict {
    /// Waiting would close a cycle: answer `DEADLOCK`.
    Cycle,
    /// No cycle: wait.
    Clear,
}

/// How far one side of a search has listed around a key.
#[derive(Clone, Copy)]
struct Listed {
    /// Forward: its holders listed. Backward: its holders' dependents.
    holders: bool,
    /// Forward: every request before this place is listed; backward: every
    /// request from this place on.
    all: u64,
    /// The same for writers.
    writers: u64,
}

impl Listed {
    fn forward() -> Listed {
        Listed {
            holders: false,
            all: 0,
            writers: 0,
        }
    }

    fn backward() -> Listed {
        Listed {
            holders: false,
            all: u64::MAX,
            writers: u64::MAX,
        }
    }
}

/// An owner as one search knows it: a number given at its first meeting
/// (its bytes hashed and copied once a search; every later step, task and
/// parent link is a number).
type Id = u32;

/// No owner: not reached (yet) on that side.
const UNSEEN: Id = Id::MAX;

/// The new request's own owner's number.
const ME: Id = 0;

/// One step of listing left to do.
enum Task<K> {
    /// Forward: who the new request waits for, on each of its keys.
    Start,
    /// Forward: who `owner`'s requests wait for (its requests from
    /// `after`).
    Requests { owner: Id, after: Option<u64> },
    /// Forward: who each of these requests of `owner` waits for (a page
    /// of them, one a step, the rest after what that one listed: each may
    /// read a lock). `items[at..]` are left; the page's room goes back to
    /// [`Search::spare`] when done.
    Expand {
        owner: Id,
        items: Vec<Requested<K>>,
        at: usize,
    },
    /// Forward: `key`'s holders keep `owner` waiting.
    Holders { key: K, owner: Id },
    /// Forward: the requests on `key` at `from..to` that `owner`'s request
    /// of `kind` cannot pass.
    Queued {
        key: K,
        owner: Id,
        kind: Kind,
        from: u64,
        to: u64,
    },
    /// Backward: the keys with a queue that `owner` holds, after `after`.
    Keys { owner: Id, after: Option<K> },
    /// Backward: of these keys, those `owner` holds (a page of them, one by
    /// one, the time looked at after each: each may read a lock).
    HeldOf { owner: Id, keys: VecDeque<K> },
    /// Backward: every request on `key`, from `from`, that `key` (held by
    /// `owner`) does not admit.
    Held { key: K, owner: Id, from: u64 },
    /// Backward: who waits behind `owner`'s requests (from `after`).
    Behind { owner: Id, after: Option<u64> },
    /// Backward: the requests on `key` at `from..to`, behind `owner`'s
    /// request of `kind` there, that cannot pass it.
    After {
        key: K,
        owner: Id,
        kind: Kind,
        from: u64,
        to: u64,
    },
}

impl<K> Task<K> {
    /// Whether this is a listing for the new request (forward).
    fn of_me(&self) -> bool {
        match self {
            Task::Start => true,
            Task::Holders { owner, .. } | Task::Queued { owner, .. } => *owner == ME,
            _ => false,
        }
    }
}

/// Where the two sides of a walk met.
enum Met {
    /// The forward side reached `at`, which the backward side had seen
    /// (or the new request's owner itself), from `by`.
    Forward { by: Id, at: Id },
    /// The backward side found `at`, which the forward side had seen,
    /// waiting for `of`.
    Backward { at: Id, of: Id },
}

/// The owners a search met, by number, and who reached each on each side.
/// An owner's bytes are copied once (shared by the map and the names).
struct Owners<S> {
    ids: Sharded<Arc<[u8]>, Id, S>,
    names: Vec<Arc<[u8]>>,
    /// Forward: the owner waiting for each ([`UNSEEN`]: not reached).
    fwd: Vec<Id>,
    /// Backward: the owner each waits for ([`ME`] for itself).
    back: Vec<Id>,
    /// Each owner's number as the graph gave it ([`NO_NUMBER`]: none).
    numbers: Vec<u64>,
    /// By the slot of a graph's number: that number and its owner (its
    /// pages kept from search to search: [`Search::again`]).
    by_number: Slots,
}

impl<S: BuildHasher + Clone + Default> Owners<S> {
    fn new(me: &[u8], by_number: Slots) -> Owners<S> {
        let mut owners = Owners {
            ids: Sharded::default(),
            names: Vec::new(),
            fwd: Vec::new(),
            back: Vec::new(),
            numbers: Vec::new(),
            by_number,
        };
        owners.reset(me);
        owners
    }

    /// None met but `me` (the arrays keep their room, the table by
    /// number its pages).
    fn reset(&mut self, me: &[u8]) {
        self.ids.clear();
        self.names.clear();
        self.fwd.clear();
        self.back.clear();
        self.numbers.clear();
        self.by_number.renew();
        self.id(me);
        // Who waits for `me` is found backward from it.
        if let Some(b) = self.back.get_mut(ME as usize) {
            *b = ME;
        }
    }

    /// `owner`'s number (given, and its bytes copied, at its first meeting).
    fn id(&mut self, owner: &[u8]) -> Id {
        if let Some(id) = self.ids.get(owner) {
            return *id;
        }
        let id = self.names.len() as Id;
        let owner: Arc<[u8]> = owner.into();
        self.names.push(owner.clone());
        self.ids.insert(owner, id);
        self.fwd.push(UNSEEN);
        self.back.push(UNSEEN);
        self.numbers.push(NO_NUMBER);
        id
    }

    /// `owner`'s number, found by the graph's `number` for it when given
    /// (an indexing, no hash of its bytes past its first meeting).
    fn id_numbered(&mut self, owner: &[u8], number: u64) -> Id {
        if number == NO_NUMBER {
            return self.id(owner);
        }
        if let Some(id) = self.by_number.get(number) {
            return id;
        }
        let id = self.id(owner);
        self.by_number.set(number, id);
        if let Some(n) = self.numbers.get_mut(id as usize) {
            *n = number;
        }
        id
    }

    /// The graph's number for `id` ([`NO_NUMBER`]: none known).
    fn number(&self, id: Id) -> u64 {
        self.numbers.get(id as usize).copied().unwrap_or(NO_NUMBER)
    }

    fn name(&self, id: Id) -> &[u8] {
        self.names.get(id as usize).map_or(&[], |n| &n[..])
    }

    fn fwd(&self, id: Id) -> Id {
        self.fwd.get(id as usize).copied().unwrap_or(UNSEEN)
    }

    fn back(&self, id: Id) -> Id {
        self.back.get(id as usize).copied().unwrap_or(UNSEEN)
    }
}

/// Keys per page of [`ByKey`].
const KEYS_A_PAGE: usize = 1024;

/// Slots per page of [`Slots`].
pub const SLOTS_A_PAGE: usize = 1024;

/// A search's numbers for what a graph numbers (owners in the core, keys
/// in the shell), by the slot of the graph's number (its low 32 bits):
/// pages of [`SLOTS_A_PAGE`] made at first use, only those a slot met
/// needs (the slots go up to the most the graph ever numbered), and kept
/// from one search to the next, so that a page is made (and zeroed) once,
/// not once a search. An entry stands only for the search that wrote it:
/// each search takes the pages with an epoch of its own ([`Slots::renew`]),
/// and an entry of another epoch is no entry. The epochs go round after
/// 2^32 searches: the pages are then dropped, so an entry left by a search
/// never stands for another.
pub struct Slots {
    pages: Vec<Option<Box<[SlotEntry]>>>,
    epoch: u32,
}

/// An entry of [`Slots`]: the graph's number, the search's, and the
/// epoch of the search that wrote it.
#[derive(Clone, Copy)]
struct SlotEntry {
    number: u64,
    id: u32,
    epoch: u32,
}

/// No search's entry (a page just made).
const NO_ENTRY: SlotEntry = SlotEntry {
    number: NO_NUMBER,
    id: u32::MAX,
    epoch: 0,
};

impl Default for Slots {
    fn default() -> Slots {
        Slots {
            pages: Vec::new(),
            epoch: 1,
        }
    }
}

impl Slots {
    /// For a new search: every entry written so far stands no more.
    pub fn renew(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.pages.clear();
            self.epoch = 1;
        }
    }

    /// The search's number for the graph's `number`, if this search
    /// gave it one.
    pub fn get(&self, number: u64) -> Option<u32> {
        let slot = (number & u64::from(u32::MAX)) as usize;
        let page = self.pages.get(slot / SLOTS_A_PAGE)?.as_ref()?;
        let e = page.get(slot % SLOTS_A_PAGE)?;
        (e.epoch == self.epoch && e.number == number).then_some(e.id)
    }

    /// The graph's `number` is the search's `id`.
    pub fn set(&mut self, number: u64, id: u32) {
        if number == NO_NUMBER {
            return;
        }
        let slot = (number & u64::from(u32::MAX)) as usize;
        let (page, at) = (slot / SLOTS_A_PAGE, slot % SLOTS_A_PAGE);
        if self.pages.len() <= page {
            self.pages.resize_with(page + 1, || None);
        }
        let epoch = self.epoch;
        let entry = self.pages.get_mut(page).and_then(|p| {
            p.get_or_insert_with(|| vec![NO_ENTRY; SLOTS_A_PAGE].into_boxed_slice())
                .get_mut(at)
        });
        if let Some(e) = entry {
            *e = SlotEntry { number, id, epoch };
        }
    }

    /// How many pages it keeps (each [`SLOTS_A_PAGE`] entries of 16 bytes).
    pub fn pages(&self) -> usize {
        self.pages.iter().filter(|p| p.is_some()).count()
    }
}

/// Something kept per key, by the key's number (the shell numbers keys
/// from 0 up at their first meeting): the first [`KEYS_A_PAGE`] in an array
/// grown as keys come (most searches meet a few keys), the next in pages of
/// [`KEYS_A_PAGE`] made at first use, so that a look-up is an indexing or
/// two, no hash, and growing never copies more than a page.
struct ByKey<T> {
    first: Vec<T>,
    /// Pages made; the first `used` are this search's (the others are
    /// kept for the next, filled with `new` again when taken).
    pages: Vec<Box<[T]>>,
    used: usize,
    /// A key not met yet.
    new: T,
    /// Where an index out of every page would go (never: pages are made up
    /// to the index asked; but no panic may reach Redis).
    none: T,
}

impl<T: Clone> ByKey<T> {
    fn new(new: T) -> ByKey<T> {
        ByKey {
            first: Vec::new(),
            pages: Vec::new(),
            used: 0,
            none: new.clone(),
            new,
        }
    }

    /// No key met (the room and the pages kept).
    fn clear(&mut self) {
        self.first.clear();
        self.used = 0;
    }

    fn get(&mut self, key: usize) -> &mut T {
        if key < KEYS_A_PAGE {
            if self.first.len() <= key {
                self.first.resize(key + 1, self.new.clone());
            }
            return match self.first.get_mut(key) {
                Some(t) => t,
                None => &mut self.none,
            };
        }
        let key = key - KEYS_A_PAGE;
        let (page, at) = (key / KEYS_A_PAGE, key % KEYS_A_PAGE);
        while self.used <= page {
            match self.pages.get_mut(self.used) {
                Some(kept) => kept.fill(self.new.clone()),
                None => self
                    .pages
                    .push(vec![self.new.clone(); KEYS_A_PAGE].into_boxed_slice()),
            }
            self.used += 1;
        }
        match self.pages.get_mut(page).and_then(|p| p.get_mut(at)) {
            Some(t) => t,
            None => &mut self.none,
        }
    }
}

/// Up to this many holders, "does this owner hold the key" is a scan of
/// their numbers; more are also put in a set.
const SCANNED: usize = 8;

/// What one search read of a key, read once (at the first question) and
/// kept by number: the graph's calls and the owners' numbering are paid
/// once a key, not once a request that waits on it.
#[derive(Clone, Default)]
struct KeyRead {
    /// Its live holders, by number (`None`: not read yet): where they are
    /// in [`Search::held`] (one array for every key).
    holders: Option<(u32, u32)>,
    /// The same as a set, when they are many.
    set: Option<HashSet<Id>>,
    /// Whether its lock admits a request of each kind from someone not
    /// holding it: `Acquire`, `Racquire`, `Read` (a semaphore's is asked
    /// each time).
    admits: [Option<bool>; 3],
    /// Its queue.
    queue: Queued,
}

/// A key's queue as one search read it.
#[derive(Clone, Default)]
enum Queued {
    /// Not listed yet.
    #[default]
    Unread,
    /// Every request queued on it at its first listing, by number: it had
    /// fewer than [`PAGE`] (most keys: a listing there is a search of this,
    /// not a call to the graph): where they are in [`Search::small`] (one
    /// array for every key, not an allocation a key).
    Small(u32, u32),
    /// More: every listing is a page from the graph.
    Big,
}

/// One direction's state.
struct Side<K> {
    next: VecDeque<Id>,
    listed: ByKey<Listed>,
    tasks: VecDeque<Task<K>>,
    /// Steps taken (the walk goes on the side that took fewer).
    work: u64,
}

impl<K> Side<K> {
    fn new(new: Listed) -> Side<K> {
        Side {
            next: VecDeque::new(),
            listed: ByKey::new(new),
            tasks: VecDeque::new(),
            work: 0,
        }
    }

    fn exhausted(&self) -> bool {
        self.tasks.is_empty() && self.next.is_empty()
    }

    /// Nothing listed, nothing to do (the room kept).
    fn reset(&mut self) {
        self.next.clear();
        self.listed.clear();
        self.tasks.clear();
        self.work = 0;
    }
}

/// Where a search stands.
enum Phase {
    Walking,
    /// A cycle was found; its edges `path[i] -> path[i + 1]` from `at` on
    /// are checked against the graph as it is now.
    Checking {
        path: Vec<Owner>,
        at: usize,
        /// The requests the check read so far.
        read: usize,
        /// Whether the graph may have changed since its first edge.
        spanned: bool,
    },
    Done(Verdict),
}

/// A search for a cycle of waits through a new request, resumable: see the
/// module's documentation. Its sets and maps hash with `S` (the shell may
/// give a cheaper hash than the default, keyed per process as that one is:
/// owners and keys are chosen by clients).
pub struct Search<K, S = RandomState> {
    me: Owner,
    kind: Kind,
    keys: Vec<(K, u64)>,
    owners: Owners<S>,
    fwd: Side<K>,
    back: Side<K>,
    /// A page of requests listed, each owner by number (kept between pages).
    page: Vec<(u64, Id, Kind)>,
    /// Room for pages of owners' requests, kept from page to page.
    spare: Vec<Vec<Requested<K>>>,
    /// What was read of each key (both sides share it).
    keys_read: ByKey<KeyRead>,
    /// The short queues read, one after the other ([`Queued::Small`]).
    small: Vec<(u64, Id, Kind)>,
    /// The holders read, key after key ([`KeyRead::holders`]).
    held: Vec<Id>,
    /// Where the two sides met.
    met: Option<Met>,
    phase: Phase,
    /// The graph may have changed since the walk read it: a cycle found is
    /// checked before it is believed.
    stale: bool,
    restarts: u32,
}

impl<K: Copy + Eq + Hash + Into<usize>> Search<K> {
    /// A search for `me`, about to wait with a request of `kind` on each of
    /// `keys` (at the end of each queue, at the place given).
    pub fn new(me: &[u8], kind: Kind, keys: &[(K, u64)]) -> Search<K> {
        Search::with_hasher(me, kind, keys)
    }
}

impl<K: Copy + Eq + Hash + Into<usize>, S: BuildHasher + Clone + Default> Search<K, S> {
    /// [`Search::new`], its sets and maps hashed with `S`.
    pub fn with_hasher(me: &[u8], kind: Kind, keys: &[(K, u64)]) -> Search<K, S> {
        let mut search = Search {
            me: me.into(),
            kind,
            keys: keys.to_vec(),
            owners: Owners::new(me, Slots::default()),
            fwd: Side::new(Listed::forward()),
            back: Side::new(Listed::backward()),
            page: Vec::new(),
            spare: Vec::new(),
            keys_read: ByKey::new(KeyRead::default()),
            small: Vec::new(),
            held: Vec::new(),
            met: None,
            phase: Phase::Walking,
            stale: false,
            restarts: 0,
        };
        search.start();
        search
    }

    /// The same search for another request (`me`, `kind`, `keys`, as
    /// [`Search::new`]'s): what this one made (its arrays, its pages) is
    /// kept for it, nothing of what it found. A search after another costs
    /// no growth of its arrays up to the size of the one before.
    pub fn again(&mut self, me: &[u8], kind: Kind, keys: &[(K, u64)]) {
        self.me = me.into();
        self.kind = kind;
        self.keys.clear();
        self.keys.extend_from_slice(keys);
        self.restarts = 0;
        self.start();
    }

    /// Its table of owners by the graph's numbers.
    pub fn slots(&self) -> &Slots {
        &self.owners.by_number
    }

    /// How many owners and keys it met (what its room is about).
    pub fn met(&self) -> usize {
        self.owners.names.len() + self.keys_read.first.len() + self.keys_read.used * KEYS_A_PAGE
    }

    fn start(&mut self) {
        self.owners.reset(&self.me);
        self.fwd.reset();
        self.back.reset();
        self.keys_read.clear();
        self.small.clear();
        self.held.clear();
        self.met = None;
        self.phase = Phase::Walking;
        self.stale = false;
        // Who waits for `me` already: if nobody does, no wait can close a
        // cycle (the backward side runs out at once).
        self.back.tasks.push_back(Task::Keys {
            owner: ME,
            after: None,
        });
        self.back.tasks.push_back(Task::Behind {
            owner: ME,
            after: None,
        });
        self.fwd.tasks.push_back(Task::Start);
    }

    /// The graph may have changed since the last slice: what the walk
    /// found from now on is checked before it is believed.
    pub fn stale(&mut self) {
        self.stale = true;
        if let Phase::Checking { at, spanned, .. } = &mut self.phase {
            *spanned |= *at > 0;
        }
    }

    /// Whether the search gave up: every cycle it found was gone once
    /// checked, [`RESTARTS`] times over (its verdict is then `Clear`).
    pub fn gave_up(&self) -> bool {
        self.restarts > RESTARTS
    }

    /// The verdict, once reached.
    pub fn verdict(&self) -> Option<Verdict> {
        match self.phase {
            Phase::Done(v) => Some(v),
            _ => None,
        }
    }

    /// Goes on until a verdict or until `graph` says its time is up
    /// (checked between steps; at least one step is taken).
    pub fn run<G: WaitGraph<Key = K>>(&mut self, graph: &mut G) -> Option<Verdict> {
        loop {
            match &self.phase {
                Phase::Done(v) => return Some(*v),
                Phase::Walking => self.walk_step(graph),
                Phase::Checking { .. } => self.check_step(graph),
            }
            if let Phase::Done(v) = self.phase {
                return Some(v);
            }
            if graph.out_of_time() {
                return None;
            }
        }
    }

    /// One step of the walk, on the side that did less so far.
    fn walk_step<G: WaitGraph<Key = K>>(&mut self, graph: &mut G) {
        if self.met.is_some() {
            return self.found(graph);
        }
        // Forward side done: every owner the new request waits for was
        // reached, and none was its own: no cycle.
        if self.fwd.exhausted() {
            self.phase = Phase::Done(Verdict::Clear);
            return;
        }
        // Backward side done: everyone who waits for the new request's
        // owner is seen, so a cycle needs one of them among the new
        // request's own blockers: list those (the forward side's first
        // tasks), nothing further.
        let forward = match self.back.exhausted() {
            true => match self.fwd.tasks.front() {
                Some(task) if task.of_me() => true,
                _ => {
                    self.phase = Phase::Done(Verdict::Clear);
                    return;
                }
            },
            false => self.fwd.work <= self.back.work,
        };
        let side = match forward {
            true => &mut self.fwd,
            false => &mut self.back,
        };
        side.work += 1;
        let task = match side.tasks.pop_front() {
            Some(task) => task,
            None => match side.next.pop_front() {
                Some(owner) if forward => Task::Requests { owner, after: None },
                Some(owner) => {
                    side.tasks.push_back(Task::Behind { owner, after: None });
                    Task::Keys { owner, after: None }
                }
                None => return,
            },
        };
        let listed = self.task(graph, task);
        let side = match forward {
            true => &mut self.fwd,
            false => &mut self.back,
        };
        side.work += listed as u64;
        if self.met.is_some() {
            self.found(graph);
        }
    }

    /// The sides met: a cycle, believed at once unless the graph may have
    /// changed under the walk.
    fn found<G: WaitGraph<Key = K>>(&mut self, graph: &mut G) {
        match self.stale {
            false => self.phase = Phase::Done(Verdict::Cycle),
            true => {
                let path = self
                    .path()
                    .into_iter()
                    .map(|id| Owner::from(self.owners.name(id)))
                    .collect();
                graph.forget();
                self.phase = Phase::Checking {
                    path,
                    at: 0,
                    read: 0,
                    spanned: false,
                };
            }
        }
    }

    /// The cycle found: `me`, whom it waits for, ..., `me` again.
    fn path(&self) -> Vec<Id> {
        let (mut path, mut at) = match &self.met {
            Some(Met::Forward { by, at }) => {
                let mut path = self.forward_chain(*by);
                path.push(*at);
                (path, *at)
            }
            Some(Met::Backward { at, of }) => {
                let mut path = self.forward_chain(*at);
                path.push(*of);
                (path, *of)
            }
            None => return Vec::new(),
        };
        while at != ME && path.len() <= self.owners.names.len() + 2 {
            match self.owners.back(at) {
                UNSEEN => break,
                p => {
                    path.push(p);
                    at = p;
                }
            }
        }
        path
    }

    /// `me`, ..., `to`: the forward side's way from the new request to `to`.
    fn forward_chain(&self, to: Id) -> Vec<Id> {
        let mut chain = vec![to];
        let mut at = to;
        while at != ME && chain.len() <= self.owners.names.len() + 1 {
            match self.owners.fwd(at) {
                UNSEEN => break,
                p => {
                    chain.push(p);
                    at = p;
                }
            }
        }
        chain.reverse();
        chain
    }

    /// Checks one edge of the cycle found against the graph as it is now.
    /// A check that went on over turns saw each edge at its own turn: at
    /// its end, when it read at most [`RECHECK`] requests, every edge is
    /// read again in one go, so that they hold at one instant.
    fn check_step<G: WaitGraph<Key = K>>(&mut self, graph: &mut G) {
        let Phase::Checking {
            path,
            at,
            read,
            spanned,
        } = &mut self.phase
        else {
            return;
        };
        let holds = match (path.get(*at).cloned(), path.get(*at + 1).cloned()) {
            (Some(x), Some(y)) => {
                let edge = edge(&self.keys, self.kind, graph, *at, &x, &y, read);
                *at += 1;
                edge
            }
            _ if *spanned && *read <= RECHECK => {
                let path = std::mem::take(path);
                graph.forget();
                let mut again = 0;
                let whole = path
                    .iter()
                    .zip(path.iter().skip(1))
                    .enumerate()
                    .all(|(i, (x, y))| edge(&self.keys, self.kind, graph, i, x, y, &mut again));
                if whole {
                    self.phase = Phase::Done(Verdict::Cycle);
                }
                whole
            }
            _ => {
                self.phase = Phase::Done(Verdict::Cycle);
                true
            }
        };
        if !holds {
            self.restarts += 1;
            match self.restarts > RESTARTS {
                true => self.phase = Phase::Done(Verdict::Clear),
                false => {
                    graph.forget();
                    self.start();
                }
            }
        }
    }

    /// `owner` is waited for by the new request, through `by`.
    fn reach(&mut self, owner: Id, by: Id) {
        if self.met.is_some() {
            return;
        }
        // (`me` is seen backward from the start: reaching it is a cycle.)
        if self.owners.back(owner) != UNSEEN {
            self.met = Some(Met::Forward { by, at: owner });
        } else if self.owners.fwd(owner) == UNSEEN {
            if let Some(p) = self.owners.fwd.get_mut(owner as usize) {
                *p = by;
            }
            self.fwd.next.push_back(owner);
        }
    }

    /// `owner` waits for `of`, who waits for the new request's owner.
    fn reach_back(&mut self, owner: Id, of: Id) {
        if self.met.is_some() {
            return;
        }
        if self.owners.fwd(owner) != UNSEEN {
            self.met = Some(Met::Backward { at: owner, of });
        } else if self.owners.back(owner) == UNSEEN {
            if let Some(p) = self.owners.back.get_mut(owner as usize) {
                *p = of;
            }
            self.back.next.push_back(owner);
        }
    }

    /// The requests on `key` at `from..to`, a page at most, each owner by
    /// number, into `self.page` (its room kept from page to page).
    fn list<G: WaitGraph<Key = K>>(&mut self, graph: &mut G, key: &K, from: u64, to: u64) {
        let mut page = std::mem::take(&mut self.page);
        page.clear();
        let owners = &mut self.owners;
        let read = self.keys_read.get((*key).into());
        if let Queued::Unread = read.queue {
            // The whole queue when it is short: one call for every listing
            // there, each owner numbered once.
            let start = self.small.len();
            let small = &mut self.small;
            graph.queued(key, 0, u64::MAX, PAGE, &mut |place, owner, n, kind| {
                small.push((place, owners.id_numbered(owner, n), kind));
            });
            let n = small.len() - start;
            read.queue = match n < PAGE {
                true => Queued::Small(start as u32, n as u32),
                false => {
                    small.truncate(start);
                    Queued::Big
                }
            };
        }
        match &read.queue {
            Queued::Small(start, n) => {
                let (start, n) = (*start as usize, *n as usize);
                let all = self.small.get(start..start + n).unwrap_or_default();
                let at = all.partition_point(|(place, _, _)| *place < from);
                let tail = all.get(at..).unwrap_or_default();
                page.extend(tail.iter().take_while(|(p, _, _)| *p < to).take(PAGE));
            }
            _ => graph.queued(key, from, to, PAGE, &mut |place, owner, n, kind| {
                page.push((place, owners.id_numbered(owner, n), kind));
            }),
        }
        self.page = page;
    }

    /// Whether `owner` holds `key` now (its requests there wait for
    /// nobody): the key's holders read once a search, by number.
    fn holds<G: WaitGraph<Key = K>>(&mut self, graph: &mut G, key: K, owner: Id) -> bool {
        let read = self.keys_read.get(key.into());
        let (start, n) = match read.holders {
            Some((start, n)) => (start as usize, n as usize),
            None => {
                let (owners, held) = (&mut self.owners, &mut self.held);
                let start = held.len();
                graph.holders(&key, &mut |h| held.push(owners.id(h)));
                let found = held.get(start..).unwrap_or_default();
                if found.len() > SCANNED {
                    read.set = Some(found.iter().copied().collect());
                }
                read.holders = Some((start as u32, found.len() as u32));
                (start, found.len())
            }
        };
        match &read.set {
            Some(set) => set.contains(&owner),
            None => self
                .held
                .get(start..start + n)
                .unwrap_or_default()
                .contains(&owner),
        }
    }

    /// Whether `key`'s lock admits a request of `kind` from someone not
    /// holding it (read once a search and kind).
    fn admits<G: WaitGraph<Key = K>>(&mut self, graph: &mut G, key: K, kind: Kind) -> bool {
        let slot = match kind {
            Kind::Acquire => 0,
            Kind::Racquire => 1,
            Kind::Read => 2,
            Kind::Semaphore(_) => return graph.admits(&key, kind),
        };
        let read = self.keys_read.get(key.into());
        match read.admits.get(slot).copied().flatten() {
            Some(admits) => admits,
            None => {
                let admits = graph.admits(&key, kind);
                if let Some(a) = read.admits.get_mut(slot) {
                    *a = Some(admits);
                }
                admits
            }
        }
    }

    /// Does one task, a page at most; what is left of it goes back first
    /// in line. Returns how many entries it listed.
    fn task<G: WaitGraph<Key = K>>(&mut self, graph: &mut G, task: Task<K>) -> usize {
        match task {
            Task::Start => {
                for (key, end) in self.keys.clone() {
                    self.expand(graph, ME, &key, end, self.kind);
                }
                self.keys.len()
            }
            Task::Requests { owner, after } => {
                let mut requests = self.spare.pop().unwrap_or_default();
                requests.clear();
                let number = self.owners.number(owner);
                let more =
                    graph.requests_of(self.owners.name(owner), number, after, PAGE, &mut requests);
                let n = requests.len();
                if let Some(after) = more {
                    self.fwd.tasks.push_front(Task::Requests {
                        owner,
                        after: Some(after),
                    });
                }
                self.fwd.tasks.push_front(Task::Expand {
                    owner,
                    items: requests,
                    at: 0,
                });
                n
            }
            Task::Expand { owner, items, at } => {
                // One request a step, the rest after the listings it made:
                // a key whose holders close the cycle is listed before the
                // owner's other keys are read (a writer waiting on 100 keys
                // of 1,000 readers each: one key read, not 100).
                let Some((key, place, kind)) = items.get(at).copied() else {
                    self.spare.push(items);
                    return 0;
                };
                self.expand(graph, owner, &key, place, kind);
                match at + 1 < items.len() {
                    true => self.fwd.tasks.push_back(Task::Expand {
                        owner,
                        items,
                        at: at + 1,
                    }),
                    false => self.spare.push(items),
                }
                1
            }
            Task::Holders { key, owner } => {
                // (Read with the first question about the key.)
                self.holds(graph, key, owner);
                let (start, n) = self.keys_read.get(key.into()).holders.unwrap_or((0, 0));
                let (start, n) = (start as usize, n as usize);
                for i in start..start + n {
                    let Some(h) = self.held.get(i).copied() else {
                        break;
                    };
                    if h != owner {
                        self.reach(h, owner);
                    }
                }
                n
            }
            Task::Queued {
                key,
                owner,
                kind,
                from,
                to,
            } => {
                self.list(graph, &key, from, to);
                let n = self.page.len();
                let last = self.page.last().map(|(place, _, _)| *place);
                for i in 0..n {
                    let Some((_, o, k)) = self.page.get(i).copied() else {
                        break;
                    };
                    let passes = kind == Kind::Read && k == Kind::Read;
                    if !passes && o != owner {
                        self.reach(o, owner);
                    }
                }
                if let (true, Some(last)) = (n == PAGE, last) {
                    self.fwd.tasks.push_front(Task::Queued {
                        key,
                        owner,
                        kind,
                        from: last.saturating_add(1),
                        to,
                    });
                }
                n
            }
            Task::After {
                key,
                owner,
                kind,
                from,
                to,
            } => {
                self.list(graph, &key, from, to);
                let n = self.page.len();
                let last = self.page.last().map(|(place, _, _)| *place);
                for i in 0..n {
                    let Some((_, o, k)) = self.page.get(i).copied() else {
                        break;
                    };
                    let passes = kind == Kind::Read && k == Kind::Read;
                    if !passes && o != owner && !self.holds(graph, key, o) {
                        self.reach_back(o, owner);
                    }
                }
                if let (true, Some(last)) = (n == PAGE, last) {
                    self.back.tasks.push_front(Task::After {
                        key,
                        owner,
                        kind,
                        from: last.saturating_add(1),
                        to,
                    });
                }
                n
            }
            Task::Keys { owner, after } => {
                let keys = graph.waited_keys_held(self.owners.name(owner), after.as_ref(), PAGE);
                let n = keys.len();
                if n == PAGE {
                    if let Some(last) = keys.last() {
                        self.back.tasks.push_front(Task::Keys {
                            owner,
                            after: Some(*last),
                        });
                    }
                }
                self.back.tasks.push_front(Task::HeldOf {
                    owner,
                    keys: keys.into(),
                });
                n
            }
            Task::HeldOf { owner, mut keys } => {
                let mut n = 0;
                while let Some(key) = keys.pop_front() {
                    n += 1;
                    if self.holds(graph, key, owner) {
                        let listed = self.back.listed.get(key.into());
                        let first = !std::mem::replace(&mut listed.holders, true);
                        if first {
                            self.back.tasks.push_back(Task::Held {
                                key,
                                owner,
                                from: 0,
                            });
                        }
                    }
                    if !keys.is_empty() && graph.out_of_time() {
                        self.back.tasks.push_front(Task::HeldOf { owner, keys });
                        break;
                    }
                }
                n
            }
            Task::Held { key, owner, from } => {
                self.list(graph, &key, from, u64::MAX);
                let n = self.page.len();
                let last = self.page.last().map(|(place, _, _)| *place);
                for i in 0..n {
                    let Some((_, o, k)) = self.page.get(i).copied() else {
                        break;
                    };
                    if !self.admits(graph, key, k) && !self.holds(graph, key, o) {
                        self.reach_back(o, owner);
                    }
                }
                if let (true, Some(last)) = (n == PAGE, last) {
                    self.back.tasks.push_front(Task::Held {
                        key,
                        owner,
                        from: last.saturating_add(1),
                    });
                }
                n
            }
            Task::Behind { owner, after } => {
                let mut requests = self.spare.pop().unwrap_or_default();
                requests.clear();
                let number = self.owners.number(owner);
                let more =
                    graph.requests_of(self.owners.name(owner), number, after, PAGE, &mut requests);
                let n = requests.len();
                if let Some(after) = more {
                    self.back.tasks.push_front(Task::Behind {
                        owner,
                        after: Some(after),
                    });
                }
                for (key, place, kind) in requests.drain(..) {
                    let from = place.saturating_add(1);
                    let listed = self.back.listed.get(key.into());
                    let to = match kind {
                        Kind::Read => listed.writers.min(listed.all),
                        _ => listed.all,
                    };
                    match kind {
                        Kind::Read => listed.writers = listed.writers.min(from),
                        _ => listed.all = listed.all.min(from),
                    }
                    if from < to {
                        self.back.tasks.push_back(Task::After {
                            key,
                            owner,
                            kind,
                            from,
                            to,
                        });
                    }
                }
                self.spare.push(requests);
                n
            }
        }
    }

    /// Lists what `owner`'s request of `kind` at `place` on `key` waits
    /// for, skipping what the forward side listed there already.
    fn expand<G: WaitGraph<Key = K>>(
        &mut self,
        graph: &mut G,
        owner: Id,
        key: &K,
        place: u64,
        kind: Kind,
    ) {
        if self.met.is_some() || self.holds(graph, *key, owner) {
            return;
        }
        let admits = match self.fwd.listed.get((*key).into()).holders {
            true => true,
            false => self.admits(graph, *key, kind),
        };
        let listed = self.fwd.listed.get((*key).into());
        let holders = !listed.holders && !admits;
        let (from, to) = match kind {
            Kind::Read => (listed.writers.max(listed.all), place),
            _ => (listed.all, place),
        };
        // The new request's own listing skips its owner's requests queued
        // ahead: it leaves the places listed as they were, so that a later
        // listing there reaches its owner through them (a cycle).
        if owner != ME {
            match kind {
                Kind::Read => listed.writers = listed.writers.max(place),
                _ => listed.all = listed.all.max(place),
            }
        }
        listed.holders |= holders;
        if holders {
            self.fwd.tasks.push_back(Task::Holders { key: *key, owner });
        }
        if from < to {
            self.fwd.tasks.push_back(Task::Queued {
                key: *key,
                owner,
                kind,
                from,
                to,
            });
        }
    }
}

/// Whether the edge `x -> y`, the `at`-th of a cycle found by a search for
/// a request of `kind` on `keys`, holds now. The first is the request's
/// own: it waits for `y` on one of its keys, not merely some other request
/// of its owner (that owner may be in a cycle the request is not part of).
fn edge<G: WaitGraph>(
    keys: &[(G::Key, u64)],
    kind: Kind,
    graph: &mut G,
    at: usize,
    x: &[u8],
    y: &[u8],
    read: &mut usize,
) -> bool {
    let mine = match at {
        0 => keys.iter().map(|(k, p)| (*k, *p, kind)).collect(),
        _ => requests_of(graph, x),
    };
    kept_out_by(graph, x, mine, y, read)
}

/// Every request of `owner` now: key, place, kind.
fn requests_of<G: WaitGraph>(graph: &mut G, owner: &[u8]) -> Vec<Requested<G::Key>> {
    let mut out = Vec::new();
    let mut page = Vec::new();
    let mut after = None;
    loop {
        page.clear();
        let more = graph.requests_of(owner, NO_NUMBER, after, PAGE, &mut page);
        out.append(&mut page);
        match more {
            Some(m) => after = Some(m),
            None => return out,
        }
    }
}

/// Whether one of `mine` (requests of `x`), on a key `x` does not hold, is
/// kept out by `y` holding the key or by a request of `y` queued ahead of
/// it that it cannot pass. Reads every request of `y` (a check of one edge
/// of a cycle found), counted in `read` with `mine`.
fn kept_out_by<G: WaitGraph>(
    graph: &mut G,
    x: &[u8],
    mine: Vec<Requested<G::Key>>,
    y: &[u8],
    read: &mut usize,
) -> bool {
    let theirs = requests_of(graph, y);
    *read += mine.len() + theirs.len();
    mine.into_iter().any(|(key, place, kind)| {
        if graph.holds(&key, x) {
            return false;
        }
        if graph.holds(&key, y) && !graph.admits(&key, kind) {
            return true;
        }
        theirs.iter().any(|(k, p, their)| {
            *k == key && *p < place && !(kind == Kind::Read && *their == Kind::Read)
        })
    })
}

/// Runs a whole search at once (no time limit): whether `me`, about to
/// wait with a request of `kind` on each of `keys` (at the end of each
/// queue), would close a cycle of waits back to itself.
pub fn search<G: WaitGraph>(
    me: &[u8],
    kind: Kind,
    keys: &[(G::Key, u64)],
    graph: &mut G,
) -> Verdict {
    let mut search = Search::new(me, kind, keys);
    loop {
        if let Some(v) = search.run(graph) {
            return v;
        }
    }
}

/// The owners of the requests `ahead` of `req` in one key's queue that keep
/// it waiting: all but readers ahead of a reader, and its own owner's.
pub fn queued_blockers<'a>(ahead: impl Iterator<Item = &'a Request>, req: &Request) -> Vec<Owner> {
    let mut out: Vec<Owner> = ahead
        .filter(|r| !(r.kind == Kind::Read && req.kind == Kind::Read) && r.owner != req.owner)
        .map(|r| r.owner.clone())
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The owners that keep `req` waiting on one key: the lock's live holders
/// when it does not admit the request, and `queued` (from
/// [`queued_blockers`]). An owner never waits for itself, and a key it
/// already holds keeps it waiting for nobody (its repeat is answered at once).
pub fn blockers(lock: &Lock, queued: Vec<Owner>, req: &Request, now: u64) -> Vec<Owner> {
    if lock.live(now).any(|h| *h.owner == *req.owner) {
        return Vec::new();
    }
    let mut out = queued;
    if !lock.admits(req.kind, now) {
        out.extend(
            lock.live(now)
                .filter(|h| *h.owner != *req.owner)
                .map(|h| Owner::from(h.owner)),
        );
        out.sort_unstable();
        out.dedup();
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap, HashSet};

    use proptest::prelude::*;

    use super::*;
    use crate::lock::{Changes, Mode};
    use crate::queue::Queue;
    use crate::tokens::Tokens;

    fn o(n: u32) -> Owner {
        format!("o{n}").into_bytes().into_boxed_slice()
    }

    fn req(kind: Kind, owner: &Owner) -> Request {
        Request {
            kind,
            owner: owner.clone(),
            ttl: 100,
            session: 0,
        }
    }

    /// An owner's requests: key, place, kind.
    type OwnersRequests = Vec<(usize, u64, Kind)>;

    /// Locks and their queues, as the shell keeps them: the search's graph.
    struct State {
        locks: Vec<Lock>,
        queues: Vec<Queue<u32>>,
        now: u64,
        /// Every step is a slice of its own (`Search::run` returns after
        /// each): the resumable walk must reach the same verdicts.
        slices: bool,
        /// A queued request (key, id) that leaves when the search forgets
        /// what it read: the graph changing under a sliced search.
        change: Option<(usize, u32)>,
        /// Each owner's requests (key, place, kind), made at first use.
        by_owner: Option<HashMap<Owner, OwnersRequests>>,
        /// Each waiting owner's number, as the shell's registry keeps them:
        /// made with `by_owner`, a slot and a generation; every change
        /// deals the slots out again (to other owners) with the next
        /// generation, so a number kept by a search across a change names
        /// nobody, and its slot somebody else.
        numbers: HashMap<Owner, u64>,
        named: HashMap<u64, Owner>,
        generation: u64,
    }

    impl State {
        fn index(&mut self) {
            if self.by_owner.is_some() {
                return;
            }
            let mut index: HashMap<Owner, OwnersRequests> = HashMap::new();
            for (k, q) in self.queues.iter().enumerate() {
                for w in q.iter() {
                    let at = (k, q.place(w.id).unwrap(), w.request.kind);
                    index.entry(w.request.owner.clone()).or_default().push(at);
                }
            }
            let mut waiting: Vec<Owner> = index.keys().cloned().collect();
            waiting.sort();
            let n = waiting.len().max(1) as u64;
            self.generation += 1;
            self.numbers.clear();
            self.named.clear();
            for (i, owner) in waiting.into_iter().enumerate() {
                let number = (self.generation << 32) | ((i as u64 + self.generation) % n);
                self.numbers.insert(owner.clone(), number);
                self.named.insert(number, owner);
            }
            self.by_owner = Some(index);
        }
    }

    impl WaitGraph for State {
        type Key = usize;
        fn requests_of(
            &mut self,
            owner: &[u8],
            number: u64,
            after: Option<u64>,
            limit: usize,
            out: &mut Vec<Requested<usize>>,
        ) -> Option<u64> {
            self.index();
            // As the shell does: a number still given is used alone (a
            // number the search kept for the wrong owner lists another's
            // requests), one that names nobody now falls back on the bytes.
            let owner = match self.named.get(&number) {
                Some(named) => named.clone(),
                None => Owner::from(owner),
            };
            let all = self.by_owner.as_ref().unwrap().get(&owner);
            let all = all.map_or(&[][..], |v| &v[..]);
            let from = after.unwrap_or(0) as usize;
            out.extend(all.iter().skip(from).take(limit).cloned());
            let next = from + out.len();
            (next < all.len()).then_some(next as u64)
        }
        fn holds(&mut self, key: &usize, owner: &[u8]) -> bool {
            self.locks[*key].live(self.now).any(|h| *h.owner == *owner)
        }
        fn waited_keys_held(
            &mut self,
            owner: &[u8],
            after: Option<&usize>,
            limit: usize,
        ) -> Vec<usize> {
            // Every key with a queue: a superset, as the trait allows.
            let from = after.map_or(0, |a| a + 1);
            (from..self.locks.len())
                .filter(|k| !self.queues[*k].is_empty() && self.holds(k, owner))
                .take(limit)
                .collect()
        }
        fn admits(&mut self, key: &usize, kind: Kind) -> bool {
            self.locks[*key].admits(kind, self.now)
        }
        fn holders(&mut self, key: &usize, each: &mut dyn FnMut(&[u8])) {
            for h in self.locks[*key].live(self.now) {
                each(h.owner);
            }
        }
        fn queued(
            &mut self,
            key: &usize,
            from: u64,
            to: u64,
            limit: usize,
            each: &mut EachQueued<'_>,
        ) {
            self.index();
            for (p, w) in self.queues[*key].between(from, to).take(limit) {
                let number = self.numbers.get(&w.request.owner).copied();
                each(
                    p,
                    &w.request.owner,
                    number.unwrap_or(NO_NUMBER),
                    w.request.kind,
                );
            }
        }
        fn out_of_time(&mut self) -> bool {
            self.slices
        }
        fn forget(&mut self) {
            // A change made while a cycle found waits to be checked.
            if let Some((key, id)) = self.change.take() {
                self.queues[key].remove(id);
                self.by_owner = None;
            }
        }
    }

    impl State {
        /// Holders given as (key, owner, kind), then requests queued as
        /// (key, owner, kind), in order.
        fn new(keys: usize, held: &[(usize, u32, Kind)], queued: &[(usize, u32, Kind)]) -> State {
            let mut tokens = Tokens::starting_after(0);
            let mut locks: Vec<Lock> = (0..keys).map(|_| Lock::default()).collect();
            for (k, owner, kind) in held {
                let mut c = Changes::default();
                locks[*k].try_acquire(&req(*kind, &o(*owner)), false, 0, &mut tokens, &mut c);
            }
            let mut queues: Vec<Queue<u32>> = (0..keys).map(|_| Queue::default()).collect();
            for (id, (k, owner, kind)) in queued.iter().enumerate() {
                queues[*k].push(id as u32, req(*kind, &o(*owner)));
            }
            State {
                locks,
                queues,
                now: 1,
                slices: false,
                change: None,
                by_owner: None,
                numbers: HashMap::new(),
                named: HashMap::new(),
                generation: 0,
            }
        }

        /// The definition, walked the naive way: every owner's blockers
        /// from `blockers` and `queued_blockers`, then reachability.
        fn naive(&self, me: &Owner, kind: Kind, keys: &[usize]) -> Verdict {
            let mut edges: HashMap<Owner, BTreeSet<Owner>> = HashMap::new();
            for (k, q) in self.queues.iter().enumerate() {
                for w in q.iter() {
                    let ahead =
                        queued_blockers(q.ahead(Some(w.id)).map(|a| &a.request), &w.request);
                    let b = blockers(&self.locks[k], ahead, &w.request, self.now);
                    edges.entry(w.request.owner.clone()).or_default().extend(b);
                }
            }
            let new = req(kind, me);
            let mut reach: Vec<Owner> = Vec::new();
            for k in keys {
                let ahead = queued_blockers(self.queues[*k].ahead(None).map(|a| &a.request), &new);
                reach.extend(blockers(&self.locks[*k], ahead, &new, self.now));
            }
            let mut seen: HashSet<Owner> = reach.iter().cloned().collect();
            while let Some(x) = reach.pop() {
                if x == *me {
                    return Verdict::Cycle;
                }
                for y in edges.get(&x).into_iter().flatten() {
                    if seen.insert(y.clone()) {
                        reach.push(y.clone());
                    }
                }
            }
            Verdict::Clear
        }

        fn search(&mut self, me: &Owner, kind: Kind, keys: &[usize]) -> Verdict {
            let at: Vec<(usize, u64)> = keys.iter().map(|k| (*k, self.queues[*k].end())).collect();
            self.slices = false;
            let whole = search(me, kind, &at, self);
            // The same search a step at a time: the same verdict.
            self.slices = true;
            let mut sliced = Search::new(me, kind, &at);
            let mut steps = 0u64;
            let verdict = loop {
                steps += 1;
                if let Some(v) = sliced.run(self) {
                    break v;
                }
            };
            self.slices = false;
            assert_eq!(whole, verdict, "sliced in {steps} steps");
            whole
        }
    }

    #[test]
    fn blockers_are_holders_it_cannot_join_and_requests_it_cannot_pass() {
        let mut lock = Lock::default();
        let mut tokens = Tokens::starting_after(0);
        let mut c = Changes::default();
        lock.try_acquire(&req(Kind::Read, &o(1)), false, 0, &mut tokens, &mut c);
        lock.try_acquire(&req(Kind::Read, &o(2)), false, 0, &mut tokens, &mut c);
        assert_eq!(lock.mode(), Mode::Shared);
        let writer = req(Kind::Acquire, &o(3));
        let reader = req(Kind::Read, &o(4));
        // A writer waits for both readers; a reader for nobody but the
        // writer queued ahead of it.
        assert_eq!(blockers(&lock, vec![], &writer, 1), vec![o(1), o(2)]);
        let queued = [writer.clone(), req(Kind::Read, &o(5))];
        let ahead = queued_blockers(queued.iter(), &reader);
        assert_eq!(blockers(&lock, ahead, &reader, 1), vec![o(3)]);
        // Its own requests and a key it holds keep an owner waiting for nobody.
        let me = req(Kind::Acquire, &o(3));
        let ahead = queued_blockers(queued.iter(), &me);
        assert_eq!(blockers(&lock, ahead, &me, 1), vec![o(1), o(2), o(5)]);
        let holder = req(Kind::Read, &o(1));
        let ahead = queued_blockers(queued.iter(), &holder);
        assert!(blockers(&lock, ahead, &holder, 1).is_empty());
        // Expired holders keep nobody.
        assert_eq!(blockers(&lock, vec![], &writer, 100), Vec::<Owner>::new());
    }

    #[test]
    fn a_cycle_through_others_is_found_and_a_chain_is_not() {
        let w = Kind::Acquire;
        // k0 held by o1, who waits for k1, held by o2, who waits for k2.
        let mut st = State::new(
            3,
            &[(0, 1, w), (1, 2, w), (2, 3, w)],
            &[(1, 1, w), (2, 2, w)],
        );
        // o3 asking for k0 closes o3 -> o1 -> o2 -> o3.
        assert_eq!(st.search(&o(3), w, &[0]), Verdict::Cycle);
        // o9, holding nothing, waits in a chain.
        assert_eq!(st.search(&o(9), w, &[0]), Verdict::Clear);
        // Behind a waiting writer of its own: o5's request queued ahead
        // keeps o4 waiting, who holds k2... through a queue, not a holder.
        let mut st = State::new(2, &[(0, 1, w), (1, 4, w)], &[(0, 5, w), (0, 4, w)]);
        assert_eq!(st.search(&o(5), w, &[1]), Verdict::Cycle);
        // Readers pass readers: a reader behind a reader waits for nobody.
        let r = Kind::Read;
        let mut st = State::new(2, &[(0, 1, r), (1, 2, w)], &[(1, 1, w), (0, 3, r)]);
        assert_eq!(st.search(&o(2), r, &[0]), Verdict::Clear);
        assert_eq!(st.search(&o(2), w, &[0]), Verdict::Cycle);
    }

    #[test]
    fn the_owners_own_request_ahead_is_seen_through_later_listings() {
        let w = Kind::Acquire;
        // o1 waits on k0 (held by o2) at the head; o2 waits behind it.
        // o1 asks for k0 again (say from another connection): o2 waits for
        // o1's first request: a cycle the new request's own listing skips.
        let mut st = State::new(1, &[(0, 3, w)], &[(0, 1, w), (0, 2, w)]);
        let mut held = State::new(2, &[(0, 3, w), (1, 2, w)], &[(0, 1, w), (0, 2, w)]);
        assert_eq!(st.search(&o(1), w, &[0]), st.naive(&o(1), w, &[0]));
        assert_eq!(
            held.search(&o(1), w, &[1, 0]),
            held.naive(&o(1), w, &[1, 0])
        );
        assert_eq!(held.search(&o(1), w, &[1, 0]), Verdict::Cycle);
    }

    fn kind_of(n: u8) -> Kind {
        match n % 3 {
            0 => Kind::Read,
            1 => Kind::Acquire,
            _ => Kind::Racquire,
        }
    }

    proptest! {
        /// The search agrees with the definition walked the naive way, on
        /// small graphs of every shape.
        #[test]
        fn search_is_reachability(
            held in proptest::collection::vec((0usize..4, 0u32..6, any::<u8>()), 0..8),
            queued in proptest::collection::vec((0usize..4, 0u32..6, any::<u8>()), 0..16),
            me in 0u32..7,
            kind in any::<u8>(),
            keys in proptest::collection::btree_set(0usize..4, 1..3),
        ) {
            let held: Vec<_> = held.into_iter().map(|(k, o, n)| (k, o, kind_of(n))).collect();
            let queued: Vec<_> = queued.into_iter().map(|(k, o, n)| (k, o, kind_of(n))).collect();
            let mut st = State::new(4, &held, &queued);
            let keys: Vec<usize> = keys.into_iter().collect();
            let want = st.naive(&o(me), kind_of(kind), &keys);
            prop_assert_eq!(st.search(&o(me), kind_of(kind), &keys), want);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(8))]
        /// And on graphs of 10,000 waiting requests over 1,000 keys.
        #[test]
        fn search_is_reachability_on_ten_thousand_requests(
            seed in any::<u64>(),
            me in 0u32..2_000,
        ) {
            let mut x = seed | 1;
            let mut next = move |n: u64| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % n
            };
            let held: Vec<_> = (0..1_000)
                .map(|k| (k, next(2_000) as u32, kind_of(next(3) as u8)))
                .collect();
            let queued: Vec<_> = (0..10_000)
                .map(|_| (next(1_000) as usize, next(2_000) as u32, kind_of(next(3) as u8)))
                .collect();
            let mut st = State::new(1_000, &held, &queued);
            let keys = [next(1_000) as usize];
            let want = st.naive(&o(me), Kind::Acquire, &keys);
            prop_assert_eq!(st.search(&o(me), Kind::Acquire, &keys), want);
        }
    }

    #[test]
    fn a_long_chain_is_walked_once_and_its_closing_cycle_found() {
        // 1,000 keys, k<i> held by o<i>, o<i> waiting for k<i-1>..k<i-10>.
        let w = Kind::Acquire;
        let held: Vec<_> = (0..1_000).map(|k| (k, k as u32, w)).collect();
        let mut queued = Vec::new();
        for i in 0..1_000usize {
            for j in (i + 1)..(i + 11).min(1_000) {
                queued.push((i, j as u32, w));
            }
        }
        let mut st = State::new(1_000, &held, &queued);
        // The bottom owner asking for the top key closes a cycle 1,000 long.
        assert_eq!(st.search(&o(0), w, &[999]), Verdict::Cycle);
        assert_eq!(st.search(&o(5_000), w, &[999]), Verdict::Clear);
    }

    #[test]
    fn a_cycle_gone_by_the_time_it_is_found_is_not_answered() {
        let w = Kind::Acquire;
        // k0 held by o1, who waits for k1, held by o2: o2 asking for k0
        // closes a cycle.
        let mut st = State::new(2, &[(0, 1, w), (1, 2, w)], &[(1, 1, w)]);
        assert_eq!(st.search(&o(2), w, &[0]), Verdict::Cycle);
        // The same search, sliced over a graph that changes: o1's request
        // (waiter 0) leaves before the cycle is checked.
        let at = [(0, st.queues[0].end())];
        let mut search = Search::new(&o(2), w, &at);
        search.stale();
        st.change = Some((1, 0));
        assert_eq!(search.run(&mut st), Some(Verdict::Clear));
        assert_eq!(st.naive(&o(2), w, &[0]), Verdict::Clear);
        // Unchanged, a stale search checks the cycle and believes it.
        let mut st = State::new(2, &[(0, 1, w), (1, 2, w)], &[(1, 1, w)]);
        let mut search = Search::new(&o(2), w, &at);
        search.stale();
        assert_eq!(search.run(&mut st), Some(Verdict::Cycle));
    }

    #[test]
    fn numbers_dealt_again_after_a_request_leaves_alias_no_old_edge() {
        let w = Kind::Acquire;
        // k0 held by o1, k1 by o2, k2 by o3; o1 waits for k1, o2 for k2,
        // o4 and o5 for k0: o3 asking for k0 closes o3 -> o1 -> o2 -> o3.
        let held = [(0, 1, w), (1, 2, w), (2, 3, w)];
        let queued = [(1, 1, w), (2, 2, w), (0, 4, w), (0, 5, w)];
        let mut st = State::new(3, &held, &queued);
        assert_eq!(st.search(&o(3), w, &[0]), Verdict::Cycle);
        let slot = |st: &State, n: u32| st.numbers[&o(n)] & u64::from(u32::MAX);
        let old = slot(&st, 2);
        // Sliced a step a slice: after the first, o2's request (waiter 1)
        // leaves, and the numbers are dealt again: o2's slot goes to o1
        // (with the next generation), o2 has none.
        let at = [(0, st.queues[0].end())];
        st.slices = true;
        let mut search = Search::new(&o(3), w, &at);
        let mut changed = false;
        let verdict = loop {
            if let Some(v) = search.run(&mut st) {
                break v;
            }
            if !changed {
                changed = true;
                st.queues[2].remove(1);
                st.by_owner = None;
                st.index();
                assert_eq!(slot(&st, 1), old);
                assert!(!st.numbers.contains_key(&o(2)));
            }
            search.stale();
        };
        st.slices = false;
        assert!(changed);
        assert_eq!(st.naive(&o(3), w, &[0]), Verdict::Clear);
        assert_eq!(verdict, Verdict::Clear);
        // o2 waiting again (a new number): the cycle is back, and found.
        st.queues[2].push(9, req(w, &o(2)));
        st.by_owner = None;
        assert_eq!(st.search(&o(3), w, &[0]), Verdict::Cycle);
    }

    /// Steps a whole search takes when each step is its own slice.
    fn steps(st: &mut State, me: &Owner, kind: Kind, keys: &[usize]) -> (Verdict, u64) {
        let at: Vec<(usize, u64)> = keys.iter().map(|k| (*k, st.queues[*k].end())).collect();
        st.slices = true;
        let mut search = Search::new(me, kind, &at);
        let mut n = 0;
        let v = loop {
            n += 1;
            if let Some(v) = search.run(st) {
                break v;
            }
        };
        st.slices = false;
        (v, n)
    }

    #[test]
    fn a_reader_holding_keys_that_thousands_wait_on_is_answered_in_a_few_steps() {
        // 20 readers hold each of 6 keys; 300 writers wait on all 6;
        // reader 0 asks for key 6, held by someone who waits for nothing.
        let (r, w) = (Kind::Read, Kind::Acquire);
        let mut held: Vec<_> = (0..6)
            .flat_map(|k| (0..20).map(move |o| (k, o, r)))
            .collect();
        held.push((6, 5_000, w));
        let queued: Vec<_> = (0..300)
            .flat_map(|o| (0..6).map(move |k| (k, 1_000 + o, w)))
            .collect();
        let mut st = State::new(7, &held, &queued);
        let (verdict, n) = steps(&mut st, &o(0), w, &[6]);
        assert_eq!(verdict, st.naive(&o(0), w, &[6]));
        assert_eq!(verdict, Verdict::Clear);
        // The holder's side runs out first: the 1,800 queued requests
        // behind reader 0's keys (8 pages) are not all listed.
        assert!(n < 8, "{n} steps");
        // The same reader asking for a key one of the writers holds: a
        // cycle, found however wide the fan.
        st.locks.push(Lock::default());
        st.queues.push(Queue::default());
        let mut tokens = Tokens::starting_after(1_000_000);
        let mut c = Changes::default();
        st.locks[7].try_acquire(&req(w, &o(1_200)), false, 0, &mut tokens, &mut c);
        let (verdict, _) = steps(&mut st, &o(0), w, &[7]);
        assert_eq!(verdict, Verdict::Cycle);
        assert_eq!(verdict, st.naive(&o(0), w, &[7]));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// A sliced search over a graph that changes between its slices (a
        /// queued request leaves, as by a timeout, after the first slice):
        /// what the search read before (a key's queue, its holders, kept
        /// once a search) never makes it answer a cycle that is gone, and a
        /// cycle whose every edge lasted is still found.
        #[test]
        fn a_sliced_search_over_a_changing_graph_is_sound_and_finds_cycles_that_last(
            held in proptest::collection::vec((0usize..4, 0u32..6, any::<u8>()), 0..8),
            queued in proptest::collection::vec((0usize..4, 0u32..6, any::<u8>()), 1..16),
            me in 0u32..7,
            kind in any::<u8>(),
            keys in proptest::collection::btree_set(0usize..4, 1..3),
            leaves in any::<prop::sample::Index>(),
            after in 1u32..9,
        ) {
            let held: Vec<_> = held.into_iter().map(|(k, o, n)| (k, o, kind_of(n))).collect();
            let queued: Vec<_> = queued.into_iter().map(|(k, o, n)| (k, o, kind_of(n))).collect();
            let mut st = State::new(4, &held, &queued);
            let keys: Vec<usize> = keys.into_iter().collect();
            let (me, kind) = (o(me), kind_of(kind));
            let at: Vec<(usize, u64)> = keys.iter().map(|k| (*k, st.queues[*k].end())).collect();
            st.slices = true;
            let mut search = Search::new(&me, kind, &at);
            let mut steps = 0;
            let verdict = loop {
                if let Some(v) = search.run(&mut st) {
                    break v;
                }
                steps += 1;
                if steps == after {
                    // Waiter `i` (queued `i`-th) leaves its key's queue.
                    let i = leaves.index(queued.len());
                    st.queues[queued[i].0].remove(i as u32);
                    st.by_owner = None;
                }
                search.stale();
            };
            st.slices = false;
            let now = st.naive(&me, kind, &keys);
            if verdict == Verdict::Cycle {
                prop_assert_eq!(now, Verdict::Cycle);
            } else if !search.gave_up() {
                prop_assert_eq!(now, Verdict::Clear);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        /// Wide shapes: many readers on many keys, many writers waiting on
        /// several keys each, the requester a reader among them.
        #[test]
        fn search_is_reachability_on_wide_fans(
            readers in 1u32..40,
            writers in 1u32..60,
            keys in 1usize..6,
            per in 1usize..4,
            me in 0u32..120,
            ask in 0usize..7,
            seed in any::<u64>(),
        ) {
            let mut x = seed | 1;
            let mut next = move |n: u64| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % n
            };
            let mut held: Vec<_> = (0..keys)
                .flat_map(|k| (0..readers).map(move |o| (k, o, Kind::Read)))
                .collect();
            // Key `keys` is held by a writer who may wait too.
            held.push((keys, 100 + next(writers as u64) as u32, Kind::Acquire));
            let mut queued = Vec::new();
            for wtr in 0..writers {
                for _ in 0..per {
                    queued.push((next(keys as u64 + 1) as usize, 100 + wtr, kind_of(next(3) as u8)));
                }
            }
            let mut st = State::new(keys + 1, &held, &queued);
            let ask = [ask.min(keys)];
            let want = st.naive(&o(me), Kind::Acquire, &ask);
            prop_assert_eq!(st.search(&o(me), Kind::Acquire, &ask), want);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(6))]
        /// The same, wider: hundreds of readers on up to 24 keys, hundreds
        /// of writers waiting on several keys each (each owner numbered once
        /// a search, whatever its length).
        #[test]
        fn search_is_reachability_on_wider_fans(
            readers in 40u32..300,
            writers in 60u32..400,
            keys in 6usize..24,
            per in 1usize..6,
            me in 0u32..1_400,
            ask in 0usize..25,
            seed in any::<u64>(),
        ) {
            let mut x = seed | 1;
            let mut next = move |n: u64| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % n
            };
            let mut held: Vec<_> = (0..keys)
                .flat_map(|k| (0..readers).map(move |o| (k, o, Kind::Read)))
                .collect();
            // Key `keys` is held by a writer who may wait too.
            held.push((keys, 1_000 + next(writers as u64) as u32, Kind::Acquire));
            let mut queued = Vec::new();
            for wtr in 0..writers {
                for _ in 0..per {
                    queued.push((next(keys as u64 + 1) as usize, 1_000 + wtr, kind_of(next(3) as u8)));
                }
            }
            let mut st = State::new(keys + 1, &held, &queued);
            let ask = [ask.min(keys)];
            let want = st.naive(&o(me), Kind::Acquire, &ask);
            prop_assert_eq!(st.search(&o(me), Kind::Acquire, &ask), want);
        }
    }

    #[test]
    fn a_cycle_through_another_request_of_the_owner_is_not_the_new_requests() {
        // o1 holds k2 and waits to write k1, held by o2; o2 waits to write
        // k2: o1 is in a cycle already (through that request). o1's new
        // request writes k0, held by o2 when the search walks (a cycle
        // through it too), by o3, who waits for nothing, when the cycle
        // found is checked: the new request waits for o3 alone, so it
        // closes no cycle, though its owner is in one.
        let w = Kind::Acquire;
        let queued = [(1, 1, w), (2, 2, w)];
        let make = |k0: u32| {
            let mut st = State::new(3, &[(0, k0, w), (1, 2, w), (2, 1, w)], &queued);
            let at = [(0, st.queues[0].end())];
            // Queued while its search goes on, as the server does.
            st.queues[0].push(10, req(w, &o(1)));
            st.slices = true;
            (st, at)
        };
        let (mut st, at) = make(2);
        let mut search = Search::new(&o(1), w, &at);
        let mut changed = false;
        let verdict = loop {
            if let Some(v) = search.run(&mut st) {
                break v;
            }
            if !changed && matches!(search.phase, Phase::Checking { at: 0, .. }) {
                st = make(3).0;
                changed = true;
            }
            search.stale();
        };
        assert!(changed, "the cycle through o2 was found and checked");
        assert_eq!(st.naive(&o(1), w, &[0]), Verdict::Clear);
        assert_eq!(verdict, Verdict::Clear);
    }

    #[test]
    fn slots_kept_across_searches_stand_only_for_the_search_that_wrote_them() {
        let n = |slot: u64, generation: u64| (generation << 32) | slot;
        let mut slots = Slots::default();
        slots.renew();
        slots.set(n(5, 1), 7);
        slots.set(n(3000, 1), 8);
        assert_eq!(slots.get(n(5, 1)), Some(7));
        assert_eq!(slots.get(n(3000, 1)), Some(8));
        // Another generation of the slot is another owner.
        assert_eq!(slots.get(n(5, 2)), None);
        // Only the pages met are made: 0 and 2.
        assert_eq!(slots.pages(), 2);
        // The next search sees none of it, in the same pages.
        slots.renew();
        assert_eq!(slots.get(n(5, 1)), None);
        assert_eq!(slots.get(n(3000, 1)), None);
        assert_eq!(slots.pages(), 2);
        slots.set(n(5, 1), 1);
        assert_eq!(slots.get(n(5, 1)), Some(1));
        // The epochs going round drop the pages: an entry of 2^32 searches
        // ago is not taken for this search's.
        slots.epoch = u32::MAX;
        slots.set(n(6, 1), 9);
        slots.renew();
        assert_eq!(slots.pages(), 0);
        assert_eq!(slots.get(n(6, 1)), None);
        slots.set(n(6, 1), 2);
        assert_eq!(slots.get(n(6, 1)), Some(2));
    }

    #[test]
    fn pages_of_keys_kept_for_the_next_search_start_as_new() {
        let mut by_key = ByKey::new(0u32);
        *by_key.get(3) = 1;
        *by_key.get(3000) = 2;
        assert_eq!((*by_key.get(3), *by_key.get(3000)), (1, 2));
        by_key.clear();
        assert_eq!(by_key.pages.len(), 2);
        assert_eq!(
            (*by_key.get(3), *by_key.get(3000), *by_key.get(1500)),
            (0, 0, 0)
        );
        assert_eq!(by_key.pages.len(), 2);
    }

    #[test]
    fn a_search_in_an_earlier_searchs_pages_reaches_the_definitions_verdicts() {
        // Searches one after the other on the same graph (the same numbers,
        // each owner numbered differently by each search), each in the
        // arrays and pages the one before left (`Search::again`): an entry of an earlier search taken
        // for this one's would name another owner here. Every verdict is
        // the definition's.
        let (r, w) = (Kind::Read, Kind::Acquire);
        let mut search: Search<usize> = Search::new(&o(0), w, &[]);
        let mut searches = 0;
        for seed in 0..40u32 {
            let keys = 6;
            let pick = |i: u32, m: u32| (seed.wrapping_mul(2654435761) ^ i.wrapping_mul(40503)) % m;
            let held: Vec<(usize, u32, Kind)> = (0..keys as u32)
                .map(|k| {
                    (
                        k as usize,
                        pick(k, 8),
                        if pick(k + 50, 3) == 0 { r } else { w },
                    )
                })
                .collect();
            let queued: Vec<(usize, u32, Kind)> = (0..12u32)
                .map(|i| {
                    let kind = if pick(i + 100, 4) == 0 { r } else { w };
                    (pick(i + 200, keys as u32) as usize, pick(i + 300, 8), kind)
                })
                .collect();
            let mut st = State::new(keys, &held, &queued);
            for me in 0..8 {
                for key in 0..keys {
                    for kind in [r, w] {
                        let at = [(key, st.queues[key].end())];
                        search.again(&o(me), kind, &at);
                        let v = loop {
                            if let Some(v) = search.run(&mut st) {
                                break v;
                            }
                        };
                        assert_eq!(
                            v,
                            st.naive(&o(me), kind, &[key]),
                            "seed {seed}, o{me} on k{key}, {kind:?}"
                        );
                        searches += 1;
                    }
                }
            }
        }
        assert_eq!(searches, 40 * 8 * 6 * 2);
    }

    #[test]
    fn a_slot_dealt_to_another_owner_between_slices_is_not_its_old_owner() {
        let (r, w) = (Kind::Read, Kind::Acquire);
        // k0 held by o7, who waits for nothing; on k1 o5 then o1 read, on
        // k0 o1 then o5 wait to write. o1 asking to write k1 waits for o5
        // (queued ahead on k1), who waits for o1 (queued ahead on k0): a
        // cycle, which o1's read on k1 leaving keeps.
        let held = [(0, 7, w)];
        let queued = [(1, 5, r), (1, 1, r), (0, 1, w), (0, 5, w)];
        let slot = |st: &State, n: u32| st.numbers[&o(n)] & u64::from(u32::MAX);
        // The read leaves after each of the first slices in turn (a step a
        // slice), and the numbers are dealt again: o5 gets the slot o1's
        // number had (the next generation), o1 the one o5's had. A number
        // the search kept names nobody now, its slot another owner: taken
        // for its old owner, o5 met on k0 after the change would be o1
        // (no edge to itself) and o1 would be o5, and the cycle missed.
        let mut changed = 0;
        for after in 1..=6 {
            let mut st = State::new(2, &held, &queued);
            let at = [(1, st.queues[1].end())];
            // Queued while its search goes on, as the server does (so the
            // check of a cycle found after a change sees its edge).
            st.queues[1].push(10, req(w, &o(1)));
            st.slices = true;
            let mut search = Search::new(&o(1), w, &at);
            let mut steps = 0;
            let verdict = loop {
                if let Some(v) = search.run(&mut st) {
                    break v;
                }
                steps += 1;
                if steps == after {
                    st.index();
                    let (one, five) = (slot(&st, 1), slot(&st, 5));
                    st.queues[1].remove(1);
                    st.by_owner = None;
                    st.index();
                    assert_eq!((slot(&st, 1), slot(&st, 5)), (five, one));
                    changed += 1;
                }
                search.stale();
            };
            st.slices = false;
            assert_eq!(st.naive(&o(1), w, &[1]), Verdict::Cycle);
            assert_eq!(
                verdict,
                Verdict::Cycle,
                "the read left after {after} slices"
            );
            assert!(!search.gave_up());
        }
        assert!(changed >= 2, "{changed}");
    }
}
