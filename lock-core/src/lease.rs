//! Connection leases: the deadlines of bound holders (`BIND`), so that one
//! `LOCK.KEEPALIVE` renews every holder bound to a connection in O(1),
//! exactly as renewing each of them would.
//!
//! The contract gives each bound holder its own lease (its grant's ttl, a
//! RENEW or a repeat grant moving it) until a KEEPALIVE sets every live
//! holder bound to the connection to now + ttl. Here a connection's holders
//! follow its **lease**, and each holder (a **follower**, named by an id the
//! shell draws) keeps its own deadline and the **batch** it joined when that
//! deadline was last set. A lease has one open batch: the followers whose own
//! deadline was set since its last KEEPALIVE (they live by their own
//! deadline). A KEEPALIVE at `now` closes the open batch into the lease's
//! current **generation** (its `cover` time `now`) and sets the
//! generation's deadline: a covered follower lives until its generation's
//! deadline, unless its own deadline had already passed at the cover (it
//! was dead then, and a renewal never brings a holder back). A generation
//! whose deadline passes before the next KEEPALIVE ends with all its
//! followers; the next KEEPALIVE starts a new one. So a follower's deadline
//! is read in O(1), and a KEEPALIVE is O(1) but for the count of the open
//! batch's followers already dead, read off a map of their deadlines (one
//! entry per distinct deadline that passed and the timer did not yet end).
//!
//! The table also says when followers end ([`Leases::end_due`]): each
//! follower at its own deadline (those covered and alive then are skipped),
//! and every follower of a generation at its deadline, a page at a time.
//! It holds no clock: time is an argument, as everywhere in the core.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::hash::Keyed;

/// A map by number (tokens, lease ids, internal numbers), hashed by
/// [`Keyed`]: numbers forged into a file cannot be chosen to collide.
type Map<V> = crate::shards::Sharded<u64, V, Keyed>;

#[derive(Debug, Clone)]
struct Follower<K> {
    lease: u64,
    batch: u64,
    /// Its own deadline: the last one its grant, repeat or RENEW set.
    own: u64,
    key: K,
    /// Reported ended by [`Leases::end_due`] (its holder's end to come).
    reported: bool,
    /// Its slot in [`Due`] while its own deadline is indexed there.
    due: Option<usize>,
}

/// How many milliseconds of own deadlines share a slot of [`Due`]: the
/// timer looks at a slot when all of it has passed, so a follower is ended
/// by the timer at most this much less one after its deadline (every
/// command sees it ended at its deadline exactly: [`Leases::deadline`]).
const SLOT: u64 = 4;

/// Followers by own deadline, for [`Leases::end_due`]: a slot per [`SLOT`]
/// ms of deadlines (a hash map from the slot's number to its place in a
/// slab, and the numbers in a heap, earliest first), each slot a list of
/// its followers. The slot set last is remembered, so that a bind whose
/// deadline falls in it (most do: leases of one ttl bound in a row)
/// touches no map, and a follower knows its slot, so that leaving touches
/// no map either, but for the removal of a slot its last follower left: a
/// bound grant and release pay a map's change per slot, not per holder (a
/// sorted set of every follower cost about 500 instructions a bind and 300
/// a release; a sorted map of slots, one insert of 300 to 500 per slot).
/// The heap keeps the number of a slot removed before its time until the
/// slots before it are gone (8 bytes; at most one per slot made).
#[derive(Debug, Default)]
struct Due {
    by_slot: Map<usize>,
    order: std::collections::BinaryHeap<std::cmp::Reverse<u64>>,
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// The slot set last: its number and place.
    last: Option<(u64, usize)>,
}

#[derive(Debug, Default)]
struct Slot {
    number: u64,
    /// Its followers, and ids that left it since (checked on use: a
    /// follower is in it while its `due` names it).
    members: crate::chunked::Chunked<u64>,
    /// How many followers are in it.
    live: u64,
    /// Where the next look for ids that left `members` starts.
    cursor: usize,
}

impl Due {
    /// Follower `x`, of own deadline `own`, indexed: its slot's place.
    fn add(&mut self, x: u64, own: u64) -> usize {
        let number = own / SLOT;
        let at = match self.last {
            Some((n, at)) if n == number => at,
            _ => {
                let at = match self.by_slot.get(&number) {
                    Some(&at) => at,
                    None => {
                        let at = self.alloc(number);
                        self.by_slot.insert(number, at);
                        self.order.push(std::cmp::Reverse(number));
                        at
                    }
                };
                self.last = Some((number, at));
                at
            }
        };
        if let Some(slot) = self.slots.get_mut(at) {
            slot.members.push(x);
            slot.live += 1;
        }
        at
    }

    fn alloc(&mut self, number: u64) -> usize {
        match self.free.pop() {
            Some(at) => {
                if let Some(s) = self.slots.get_mut(at) {
                    s.number = number;
                }
                at
            }
            None => {
                // (Room for a few at once: most slots hold several.)
                self.slots.push(Slot {
                    number,
                    members: crate::chunked::Chunked::default(),
                    ..Slot::default()
                });
                self.slots.len() - 1
            }
        }
    }

    /// A follower of slot `at` is no longer indexed: the slot goes with
    /// its last.
    fn remove(&mut self, at: usize) {
        let Some(slot) = self.slots.get_mut(at) else {
            return;
        };
        slot.live = slot.live.saturating_sub(1);
        if slot.live == 0 {
            let number = slot.number;
            self.drop_slot(number, at);
        }
    }

    fn drop_slot(&mut self, number: u64, at: usize) {
        if let Some(slot) = self.slots.get_mut(at) {
            // Its list's room is kept for the next slot (a small one: a
            // slot set in a row grows it once, not at every slot).
            let mut members = std::mem::take(&mut slot.members);
            members.clear();
            *slot = Slot {
                members,
                ..Slot::default()
            };
        }
        self.by_slot.remove(&number);
        // The heap's first is a slot that is (no wake-up for nothing).
        while let Some(std::cmp::Reverse(n)) = self.order.peek() {
            if self.by_slot.contains_key(n) {
                break;
            }
            self.order.pop();
        }
        self.free.push(at);
        if self.last.is_some_and(|(n, _)| n == number) {
            self.last = None;
        }
    }

    /// The first slot, when all of it has passed at `now`: its number and
    /// place.
    fn first_passed(&mut self, now: u64) -> Option<(u64, usize)> {
        loop {
            let std::cmp::Reverse(number) = *self.order.peek()?;
            if Due::end_of(number) > now {
                return None;
            }
            match self.by_slot.get(&number) {
                Some(&at) => return Some((number, at)),
                // A slot removed before its time.
                None => {
                    self.order.pop();
                }
            }
        }
    }

    /// When the earliest slot ends.
    fn next(&self) -> Option<u64> {
        self.order.peek().map(|n| Due::end_of(n.0))
    }

    /// The last millisecond of slot `number`.
    fn end_of(number: u64) -> u64 {
        number.saturating_mul(SLOT).saturating_add(SLOT - 1)
    }
}

#[derive(Debug, Default)]
struct Batch {
    /// `None` while open (its followers live by their own deadlines).
    gen: Option<u64>,
    /// When it was covered: a follower whose own deadline had passed then
    /// stays ended.
    cover: u64,
    /// Its followers, and ids that left it since (checked on use).
    members: crate::chunked::Chunked<u64>,
    /// How many followers it has.
    live: u64,
    /// Where the next look for ids that left `members` starts.
    cursor: usize,
    /// While open: how many followers end at each own deadline (but for
    /// those of `tail`).
    open: BTreeMap<u64, u64>,
    /// While open: the own deadline set last and how many followers set
    /// it since (counted here, not in `open`): followers bound in a row
    /// mostly share their deadline's millisecond, so most binds and
    /// leaves of an open batch touch no map.
    tail: (u64, u64),
}

impl Batch {
    /// One more follower of the open batch ends at `own`.
    fn add_open(&mut self, own: u64) {
        match self.tail {
            (at, n) if at == own || n == 0 => self.tail = (own, n + 1),
            (at, n) => {
                *self.open.entry(at).or_insert(0) += n;
                self.tail = (own, 1);
            }
        }
    }

    /// One follower of the open batch that ended at `own` left.
    fn remove_open(&mut self, own: u64) {
        match self.tail {
            (at, n) if at == own && n > 0 => self.tail.1 = n - 1,
            _ => {
                if let Some(n) = self.open.get_mut(&own) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        self.open.remove(&own);
                    }
                }
            }
        }
    }

    /// How many followers of the open batch end at or before `now`.
    fn dead_at(&self, now: u64) -> u64 {
        let tail = match self.tail {
            (at, n) if at <= now => n,
            _ => 0,
        };
        self.open.range(..=now).map(|(_, n)| *n).sum::<u64>() + tail
    }
}

#[derive(Debug, Default)]
struct Gen {
    lease: u64,
    deadline: u64,
    /// Its batches (some may have gone since: pruned a few at a time from
    /// `cursor` on, so no KEEPALIVE walks the list whole).
    batches: crate::chunked::Chunked<u64>,
    cursor: usize,
    /// Batches that still have followers.
    batch_count: u64,
    /// Followers alive by it (covered while their own deadline was ahead).
    alive: u64,
}

#[derive(Debug, Default)]
struct Lease {
    /// Its current generation (none before its first KEEPALIVE).
    gen: Option<u64>,
    /// Its open batch.
    open: u64,
    /// How many followers it has (alive or not).
    count: u64,
}

/// The connection leases of a server and the holders that follow them,
/// `K` what the shell keeps per follower (the holder's key).
#[derive(Debug)]
pub struct Leases<K> {
    leases: Map<Lease>,
    followers: Map<Follower<K>>,
    batches: Map<Batch>,
    gens: Map<Gen>,
    /// Every follower at its own deadline.
    own_due: Due,
    /// Every generation at its deadline.
    gen_due: BTreeSet<(u64, u64)>,
    /// Batches of generations that ended, their followers still to end.
    ending: VecDeque<(u64, crate::chunked::Chunked<u64>)>,
    /// Batches of generations that ended, not yet looked at: each taken
    /// into `ending` by a later page ([`Leases::end_due`]), so a
    /// generation's end never walks its batches in one call.
    ending_gens: VecDeque<crate::chunked::Chunked<u64>>,
    /// Maps of deadlines given up, dropped a page at a time.
    garbage: Vec<std::collections::btree_map::IntoIter<u64, u64>>,
    /// The next batch or generation number (internal).
    next: u64,
}

impl<K> Default for Leases<K> {
    fn default() -> Self {
        Leases {
            leases: Map::default(),
            followers: Map::default(),
            batches: Map::default(),
            gens: Map::default(),
            own_due: Due::default(),
            gen_due: BTreeSet::new(),
            ending: VecDeque::new(),
            ending_gens: VecDeque::new(),
            garbage: Vec::new(),
            next: 1,
        }
    }
}

impl<K: Clone> Leases<K> {
    fn number(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// How many followers the table has.
    pub fn len(&self) -> usize {
        self.followers.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.followers.is_empty()
    }

    /// Whether `x` is a follower here.
    pub fn follows(&self, x: u64) -> bool {
        self.followers.contains_key(&x)
    }

    /// How many followers lease `l` has, alive or not (those whose
    /// deadline passed stay until they [`Leases::leave`]).
    pub fn count(&self, l: u64) -> u64 {
        self.leases.get(&l).map_or(0, |l| l.count)
    }

    /// The lease follower `x` follows.
    pub fn lease_of(&self, x: u64) -> Option<u64> {
        self.followers.get(&x).map(|f| f.lease)
    }

    /// Follower `x`'s deadline: its own, or its generation's (`None`: not a
    /// follower, or ended by [`Leases::end_due`]).
    pub fn deadline(&self, x: u64) -> Option<u64> {
        let f = self.followers.get(&x)?;
        let b = self.batches.get(&f.batch)?;
        match b.gen {
            None => Some(f.own),
            Some(_) if f.own <= b.cover => Some(f.own),
            Some(g) => self.gens.get(&g).map(|g| g.deadline),
        }
    }

    /// The open batch of lease `l` (made, with the lease, if need be).
    fn open_batch(&mut self, l: u64) -> u64 {
        if let Some(lease) = self.leases.get(&l) {
            return lease.open;
        }
        let open = self.number();
        self.batches.insert(open, Batch::default());
        self.leases.insert(
            l,
            Lease {
                gen: None,
                open,
                count: 0,
            },
        );
        open
    }

    /// Follower `x`'s own deadline is `own` (a bound grant, a repeat, a
    /// RENEW, a bind that moved it), on lease `l`, its holder on `key`: it
    /// lives by it until the lease's next KEEPALIVE.
    pub fn set_own(&mut self, x: u64, l: u64, own: u64, key: K) {
        self.leave(x);
        self.add(x, l, own, key);
    }

    /// [`Leases::set_own`] of an `x` that is no follower here (a bound
    /// grant's new token, above every id the table was given): nothing to
    /// leave first.
    pub fn set_own_new(&mut self, x: u64, l: u64, own: u64, key: K) {
        self.add(x, l, own, key);
    }

    fn add(&mut self, x: u64, l: u64, own: u64, key: K) {
        let open = match self.leases.get_mut(&l) {
            Some(lease) => {
                lease.count += 1;
                lease.open
            }
            None => {
                let open = self.open_batch(l);
                if let Some(lease) = self.leases.get_mut(&l) {
                    lease.count += 1;
                }
                open
            }
        };
        if let Some(b) = self.batches.get_mut(&open) {
            b.members.push(x);
            b.live += 1;
            b.add_open(own);
        }
        let due = Some(self.own_due.add(x, own));
        let follower = Follower {
            lease: l,
            batch: open,
            own,
            key,
            reported: false,
            due,
        };
        // (A follower `x` already, after all (a forged file's follower of
        // no holder, its token never issued): it is replaced.)
        if let Some(old) = self.followers.insert(x, follower) {
            self.let_go(old);
        }
    }

    /// Follower `x` is gone (its holder ended, or stopped following): its
    /// key, if it was one.
    pub fn leave(&mut self, x: u64) -> Option<K> {
        let f = self.followers.remove(&x)?;
        Some(self.let_go(f))
    }

    /// What follower `x`, `f`, counted, taken off (it is out of
    /// `followers` already, or replaced there): its key.
    fn let_go(&mut self, f: Follower<K>) -> K {
        if let Some(at) = f.due {
            self.own_due.remove(at);
            // Two more entries of its slot looked at, those that left
            // dropped, as a batch's members are: no slot keeps more than
            // about twice its followers.
            let followers = &self.followers;
            let slot = self.own_due.slots.get_mut(at);
            if let Some(slot) = slot.filter(|s| s.members.len() > 2 * s.live as usize + 8) {
                for _ in 0..2 {
                    if slot.cursor >= slot.members.len() {
                        slot.cursor = 0;
                    }
                    let Some(&m) = slot.members.get(slot.cursor) else {
                        break;
                    };
                    if followers.get(&m).is_some_and(|f| f.due == Some(at)) {
                        slot.cursor += 1;
                    } else {
                        slot.members.swap_remove(slot.cursor);
                    }
                }
            }
        }
        if let Some(lease) = self.leases.get_mut(&f.lease) {
            lease.count = lease.count.saturating_sub(1);
        }
        let mut emptied = None;
        if let Some(b) = self.batches.get_mut(&f.batch) {
            b.live = b.live.saturating_sub(1);
            match b.gen {
                None => b.remove_open(f.own),
                Some(g) => {
                    if f.own > b.cover {
                        if let Some(g) = self.gens.get_mut(&g) {
                            g.alive = g.alive.saturating_sub(1);
                        }
                    }
                    if b.live == 0 {
                        emptied = Some(g);
                    }
                }
            }
            if b.live == 0 && b.gen.is_none() {
                b.members.clear();
            } else if b.members.len() > 2 * b.live as usize + 8 {
                // Two more entries looked at, those that left dropped: each
                // change leaves at most one, so the list stays within about
                // twice its followers, and no change walks it whole (nor
                // looks at all while it is within that).
                let (followers, batch) = (&self.followers, f.batch);
                for _ in 0..2 {
                    if b.cursor >= b.members.len() {
                        b.cursor = 0;
                    }
                    let Some(&m) = b.members.get(b.cursor) else {
                        break;
                    };
                    if followers.get(&m).is_some_and(|f| f.batch == batch) {
                        b.cursor += 1;
                    } else {
                        b.members.swap_remove(b.cursor);
                    }
                }
            }
        }
        if let Some(g) = emptied {
            self.batches.remove(&f.batch);
            let current = self
                .gens
                .get_mut(&g)
                .map(|gen| {
                    gen.batch_count = gen.batch_count.saturating_sub(1);
                    (gen.lease, gen.batch_count, gen.deadline)
                })
                .filter(|(_, n, _)| *n == 0);
            if let Some((l, _, deadline)) = current {
                let is_current = self.leases.get(&l).is_some_and(|l| l.gen == Some(g));
                if !is_current {
                    self.gens.remove(&g);
                    self.gen_due.remove(&(deadline, g));
                }
            }
        }
        f.key
    }

    /// `LOCK.KEEPALIVE` at `now`: every follower of lease `l` alive at `now`
    /// lives until `deadline`. How many that is.
    pub fn keepalive(&mut self, l: u64, now: u64, deadline: u64) -> u64 {
        let Some(lease) = self.leases.get(&l) else {
            return 0;
        };
        let (open, current) = (lease.open, lease.gen);
        // The current generation, if its deadline has not passed; else a
        // new one (the old one's followers ended at its deadline).
        let live_gen = current.filter(|g| self.gens.get(g).is_some_and(|g| g.deadline > now));
        let g = match live_gen {
            Some(g) => {
                if let Some(gen) = self.gens.get_mut(&g) {
                    self.gen_due.remove(&(gen.deadline, g));
                    gen.deadline = deadline;
                }
                g
            }
            None => {
                if let Some(old) = current {
                    self.retire(old);
                }
                let g = self.number();
                self.gens.insert(
                    g,
                    Gen {
                        lease: l,
                        deadline,
                        ..Gen::default()
                    },
                );
                g
            }
        };
        self.gen_due.insert((deadline, g));
        if let Some(gen) = self.gens.get_mut(&g) {
            if gen.batches.len() > 2 * gen.batch_count as usize + 64 {
                // Four more entries looked at, those gone dropped: each
                // KEEPALIVE adds at most one, so the list stays within
                // about twice its batches, and none walks it whole.
                let batches = &self.batches;
                for _ in 0..4 {
                    if gen.cursor >= gen.batches.len() {
                        gen.cursor = 0;
                    }
                    let Some(&b) = gen.batches.get(gen.cursor) else {
                        break;
                    };
                    if batches.get(&b).is_some_and(|b| b.gen == Some(g)) {
                        gen.cursor += 1;
                    } else {
                        gen.batches.swap_remove(gen.cursor);
                    }
                }
            }
        }
        // The open batch joins it: its followers whose own deadline is
        // still ahead live by the generation from now on.
        let fresh = self.number();
        self.batches.insert(fresh, Batch::default());
        if let Some(lease) = self.leases.get_mut(&l) {
            lease.gen = Some(g);
            lease.open = fresh;
        }
        let mut alive = 0;
        if let Some(mut b) = self.batches.remove(&open) {
            let dead = b.dead_at(now);
            alive = b.live.saturating_sub(dead);
            let map = std::mem::take(&mut b.open);
            b.tail = (0, 0);
            if !map.is_empty() {
                self.garbage.push(map.into_iter());
            }
            if b.live > 0 {
                b.gen = Some(g);
                b.cover = now;
                self.batches.insert(open, b);
                if let Some(gen) = self.gens.get_mut(&g) {
                    gen.batches.push(open);
                    gen.batch_count += 1;
                }
            }
        }
        match self.gens.get_mut(&g) {
            Some(gen) => {
                gen.alive += alive;
                gen.alive
            }
            None => 0,
        }
    }

    /// Generation `g` is no longer its lease's current one: dropped if no
    /// batch is left in it.
    fn retire(&mut self, g: u64) {
        if let Some(gen) = self.gens.get(&g) {
            if gen.batch_count == 0 {
                self.gen_due.remove(&(gen.deadline, g));
                self.gens.remove(&g);
            }
        }
    }

    /// The key of follower `x`'s holder.
    pub fn key_of(&self, x: u64) -> Option<K> {
        self.followers.get(&x).map(|f| f.key.clone())
    }

    /// Whether follower `x`'s holder is on `key`.
    pub fn is_at(&self, x: u64, key: &K) -> bool
    where
        K: PartialEq,
    {
        self.followers.get(&x).is_some_and(|f| &f.key == key)
    }

    /// Whether follower `x`'s holder's key is one `is` says (compared in
    /// place: nothing made to compare it with).
    pub fn key_is(&self, x: u64, is: impl FnOnce(&K) -> bool) -> bool {
        self.followers.get(&x).is_some_and(|f| is(&f.key))
    }

    /// Follower `x`'s holder is on `key` now (its key loaded, or moved):
    /// whether `x` follows here.
    pub fn set_key(&mut self, x: u64, key: K) -> bool {
        match self.followers.get_mut(&x) {
            Some(f) => {
                f.key = key;
                true
            }
            None => false,
        }
    }

    /// The whole table, as pieces to drop one at a time (a follower, a
    /// batch, a generation, an entry of the deadlines): the shell drops a
    /// table of a million followers (a flush's) a slice of each event-loop
    /// turn at a time.
    pub fn into_pieces(self) -> impl Iterator<Item = ()> {
        let Leases {
            leases,
            followers,
            batches,
            gens,
            own_due,
            gen_due,
            ending,
            ending_gens,
            garbage,
            ..
        } = self;
        // A slot owns its list; the maps of slots hold plain numbers.
        let Due {
            by_slot,
            order,
            slots,
            free,
            ..
        } = own_due;
        followers
            .into_iter()
            .map(drop)
            .chain(batches.into_iter().map(drop))
            .chain(gens.into_iter().map(drop))
            .chain(slots.into_iter().map(drop))
            .chain(std::iter::once((by_slot, order, free)).map(drop))
            .chain(gen_due.into_iter().map(drop))
            .chain(ending.into_iter().map(drop))
            .chain(ending_gens.into_iter().map(drop))
            .chain(garbage.into_iter().flatten().map(drop))
            .chain(leases.into_iter().map(drop))
    }

    /// Every follower as a file keeps it: `(x, lease, deadline)`, its
    /// deadline as read now (loaded as its own, it is exact: the lease's
    /// next KEEPALIVE covers it as it would have covered it here).
    pub fn all(&self) -> Vec<(u64, u64, u64)> {
        let mut all: Vec<(u64, u64, u64)> = self
            .followers
            .iter()
            .filter_map(|(x, f)| Some((*x, f.lease, self.deadline(*x)?)))
            .collect();
        all.sort_unstable();
        all
    }

    /// When the timer must look at a follower ending at `own` (the end of
    /// its slot).
    pub fn due_at(own: u64) -> u64 {
        Due::end_of(own / SLOT)
    }

    /// Lease `l` ends (its connection closed): it is forgotten, its
    /// followers stay until they leave (the shell ends them with the
    /// connection's bindings), then end by their deadlines as they are.
    pub fn forget_lease(&mut self, l: u64) {
        self.leases.remove(&l);
    }

    /// Up to `n` followers whose deadline has passed at `now`: their ids
    /// and keys, to visit (each reported once; a follower stays in the
    /// table, its deadline passed, until it [`Leases::leave`]s: the visit
    /// ends its holder). A follower is looked at at its own deadline
    /// (skipped if covered and alive then), and every follower of a
    /// generation at the generation's deadline.
    pub fn end_due(&mut self, now: u64, n: usize) -> Vec<(u64, K)> {
        let mut keys = Vec::new();
        // A page of given-up maps dropped.
        if let Some(mut it) = self.garbage.pop() {
            if it.nth(n).is_some() {
                self.garbage.push(it);
            }
        }
        while let Some(&(at, g)) = self.gen_due.first() {
            if at > now {
                break;
            }
            self.gen_due.remove(&(at, g));
            let Some(gen) = self.gens.get_mut(&g) else {
                continue;
            };
            // Its batches looked at by the pages below (a million of them
            // are not walked here).
            gen.cursor = 0;
            let batches = std::mem::take(&mut gen.batches);
            if !batches.is_empty() {
                self.ending_gens.push_back(batches);
            }
            let is_current = self
                .leases
                .get(&gen.lease)
                .is_some_and(|l| l.gen == Some(g));
            if !is_current && gen.batch_count == 0 {
                self.gens.remove(&g);
            }
        }
        // Entries looked at (a batch, a member), whatever they give.
        let mut budget = 4 * n + 64;
        while keys.len() < n && budget > 0 {
            budget -= 1;
            let Some((b, members)) = self.ending.front_mut() else {
                // The next batch of an ended generation, its members taken.
                let Some(gen) = self.ending_gens.front_mut() else {
                    break;
                };
                let Some(b) = gen.pop() else {
                    self.ending_gens.pop_front();
                    continue;
                };
                let members = self
                    .batches
                    .get_mut(&b)
                    .map(|b| std::mem::take(&mut b.members))
                    .unwrap_or_default();
                self.ending.push_back((b, members));
                continue;
            };
            let b = *b;
            let Some(x) = members.pop() else {
                self.ending.pop_front();
                continue;
            };
            if let Some(f) = self
                .followers
                .get_mut(&x)
                .filter(|f| f.batch == b && !f.reported)
            {
                f.reported = true;
                keys.push((x, f.key.clone()));
            }
        }
        while keys.len() < n && budget > 0 {
            budget -= 1;
            let Some((number, at)) = self.own_due.first_passed(now) else {
                break;
            };
            let member = self
                .own_due
                .slots
                .get_mut(at)
                .and_then(|slot| slot.members.pop());
            let Some(x) = member else {
                self.own_due.drop_slot(number, at);
                continue;
            };
            // Out of the index (an id that left it is skipped; one set
            // twice in a slot is taken once).
            match self.followers.get_mut(&x) {
                Some(f) if f.due == Some(at) => f.due = None,
                _ => continue,
            }
            self.own_due.remove(at);
            if self.deadline(x).is_some_and(|d| d <= now) {
                if let Some(f) = self.followers.get_mut(&x).filter(|f| !f.reported) {
                    f.reported = true;
                    keys.push((x, f.key.clone()));
                }
            }
        }
        keys
    }

    /// When [`Leases::end_due`] has work next (`None`: never; 0: now).
    pub fn next_due(&self) -> Option<u64> {
        if !self.ending.is_empty() || !self.ending_gens.is_empty() || !self.garbage.is_empty() {
            return Some(0);
        }
        let own = self.own_due.next();
        let gen = self.gen_due.first().map(|(at, _)| *at);
        match (own, gen) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The naive reading: each follower its own deadline, a KEEPALIVE
    /// renewing each live one.
    #[derive(Default)]
    struct Naive {
        f: BTreeMap<u64, (u64, u64)>,
    }

    impl Naive {
        fn keepalive(&mut self, l: u64, now: u64, deadline: u64) -> u64 {
            let mut n = 0;
            for (lease, d) in self.f.values_mut() {
                if *lease == l && *d > now {
                    *d = deadline;
                    n += 1;
                }
            }
            n
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Set(u64, u64, u64),
        Leave(u64),
        Keepalive(u64, u64),
        Tick(u64, usize),
    }

    fn run(ops: &[Op]) {
        let mut t: Leases<u64> = Leases::default();
        let mut naive = Naive::default();
        let mut now = 1000;
        for op in ops {
            now += 1;
            match *op {
                Op::Set(x, l, ttl) => {
                    // Only a live holder is renewed or moved (the shell
                    // sees a dead one as gone).
                    if naive.f.get(&x).is_some_and(|(_, d)| *d <= now) {
                        continue;
                    }
                    t.set_own(x, l, now + ttl, x);
                    naive.f.insert(x, (l, now + ttl));
                }
                Op::Leave(x) => {
                    t.leave(x);
                    naive.f.remove(&x);
                }
                Op::Keepalive(l, ttl) => {
                    let n = naive.keepalive(l, now, now + ttl);
                    assert_eq!(t.keepalive(l, now, now + ttl), n, "{ops:?}");
                }
                Op::Tick(dt, n) => {
                    now += dt;
                    // The shell's visit ends each holder reported.
                    for (x, key) in t.end_due(now, n) {
                        assert_eq!(x, key);
                        let (_, d) = naive.f.remove(&x).unwrap();
                        assert!(d <= now, "ended early: {ops:?}");
                        t.leave(x);
                    }
                }
            }
            for (x, (l, d)) in &naive.f {
                match t.deadline(*x) {
                    Some(got) => assert_eq!(got, *d, "follower {x}: {ops:?}"),
                    None => panic!("follower {x} missing: {ops:?}"),
                }
                assert_eq!(t.lease_of(*x), Some(*l));
            }
            assert_eq!(t.len(), naive.f.len());
            for l in 1..3 {
                let n = naive.f.values().filter(|(lease, _)| *lease == l).count();
                assert_eq!(t.count(l), n as u64);
            }
        }
        // Everything ends, given time.
        now += 1_000_000;
        let mut guard = 0;
        while !t.is_empty() {
            for (x, _) in t.end_due(now, 3) {
                t.leave(x);
            }
            guard += 1;
            assert!(guard < 100_000);
        }
    }

    proptest::proptest! {
        #[test]
        fn follows_the_naive_reading(ops in proptest::collection::vec(
            proptest::prop_oneof![
                (0u64..12, 1u64..3, 1u64..40).prop_map(|(x, l, ttl)| Op::Set(x, l, ttl)),
                (0u64..12).prop_map(Op::Leave),
                (1u64..3, 1u64..40).prop_map(|(l, ttl)| Op::Keepalive(l, ttl)),
                (0u64..30, 1usize..5).prop_map(|(dt, n)| Op::Tick(dt, n)),
            ],
            0..80,
        )) {
            run(&ops);
        }
    }

    use proptest::prelude::Strategy;

    #[test]
    fn a_keepalive_is_one_change_whatever_the_followers() {
        let mut t: Leases<u64> = Leases::default();
        for x in 0..100_000 {
            t.set_own(x, 7, 5000, x);
        }
        assert_eq!(t.keepalive(7, 1000, 9000), 100_000);
        assert_eq!(t.deadline(42), Some(9000));
        // A RENEW of one moves it back to its own deadline.
        t.set_own(42, 7, 3000, 42);
        assert_eq!(t.deadline(42), Some(3000));
        assert_eq!(t.deadline(43), Some(9000));
        // The generation ends with all its followers, a page at a time.
        // (The timer looks at own deadlines a slot of SLOT ms at a time.)
        assert_eq!(t.end_due(3000, 10), Vec::<(u64, u64)>::new());
        assert_eq!(t.deadline(42), Some(3000));
        assert_eq!(t.end_due(3000 + SLOT - 1, 10), vec![(42, 42)]);
        t.leave(42);
        assert_eq!(t.end_due(8999, 10), Vec::<(u64, u64)>::new());
        assert_eq!(t.end_due(9000, 10).len(), 10);
        assert_eq!(t.deadline(43), Some(9000));
        let mut left = t.len() - 10;
        while left > 0 {
            let n = t.end_due(9000, 1000).len();
            assert!(n > 0);
            left -= n;
        }
        assert!(t.end_due(9000, 1000).is_empty());
        for x in 0..100_000 {
            t.leave(x);
        }
        assert!(t.is_empty());
        // Renewals leave no trail: a batch's list stays within about twice
        // its followers.
        for i in 0..10_000 {
            t.set_own(5, 8, 20_000 + i, 5);
            t.set_own(6, 8, 20_000 + i, 6);
        }
        let open = t.leases.get(&8).map(|l| l.open).unwrap();
        assert!(t.batches.get(&open).unwrap().members.len() <= 2 * 2 + 10);
        // Nor do binds and leaves in one slot of deadlines that a
        // follower keeps: a slot's list stays within about twice its own.
        t.set_own(1_000_000, 9, 50_000, 1_000_000);
        for i in 0..10_000 {
            t.set_own(i, 9, 50_000 + i % SLOT, i);
            t.leave(i);
        }
        let slot = t.own_due.by_slot.get(&(50_000 / SLOT)).copied().unwrap();
        assert!(t.own_due.slots[slot].members.len() <= 2 + 10);
        assert_eq!(
            t.end_due(50_000 + SLOT - 1, 10),
            vec![(1_000_000, 1_000_000)]
        );
        t.leave(1_000_000);
        assert!(t.own_due.by_slot.is_empty());
        // A new follower's id that is one after all (a forged file's)
        // replaces it.
        t.set_own(77, 9, 60_000, 77);
        t.set_own_new(77, 9, 70_000, 77);
        assert_eq!((t.count(9), t.deadline(77)), (1, Some(70_000)));
        t.leave(77);
        assert_eq!(t.count(9), 0);
        assert!(t.own_due.by_slot.is_empty());
        // A follower dead before a KEEPALIVE stays dead.
        t.set_own(1, 7, 9500, 1);
        assert_eq!(t.keepalive(7, 9600, 20_000), 0);
        assert_eq!(t.deadline(1), Some(9500));
        // Handed over whole, it is dropped a piece at a time: each
        // follower one.
        let followers = t.len();
        assert!(t.into_pieces().count() > followers);
    }
}
