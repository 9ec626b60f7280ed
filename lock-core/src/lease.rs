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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

#[derive(Debug, Clone)]
struct Follower<K> {
    lease: u64,
    batch: u64,
    /// Its own deadline: the last one its grant, repeat or RENEW set.
    own: u64,
    key: K,
    /// Reported ended by [`Leases::end_due`] (its holder's end to come).
    reported: bool,
}

#[derive(Debug, Default)]
struct Batch {
    /// `None` while open (its followers live by their own deadlines).
    gen: Option<u64>,
    /// When it was covered: a follower whose own deadline had passed then
    /// stays ended.
    cover: u64,
    /// Its followers, and ids that left it since (checked on use).
    members: Vec<u64>,
    /// How many followers it has.
    live: u64,
    /// Where the next look for ids that left `members` starts.
    cursor: usize,
    /// While open: how many followers end at each own deadline.
    open: BTreeMap<u64, u64>,
}

#[derive(Debug, Default)]
struct Gen {
    lease: u64,
    deadline: u64,
    /// Its batches (some may have gone since).
    batches: Vec<u64>,
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
    leases: HashMap<u64, Lease>,
    followers: HashMap<u64, Follower<K>>,
    batches: HashMap<u64, Batch>,
    gens: HashMap<u64, Gen>,
    /// Every follower at its own deadline.
    own_due: BTreeSet<(u64, u64)>,
    /// Every generation at its deadline.
    gen_due: BTreeSet<(u64, u64)>,
    /// Batches of generations that ended, their followers still to end.
    ending: VecDeque<(u64, Vec<u64>)>,
    /// Maps of deadlines given up, dropped a page at a time.
    garbage: Vec<std::collections::btree_map::IntoIter<u64, u64>>,
    /// The next batch or generation number (internal).
    next: u64,
}

impl<K> Default for Leases<K> {
    fn default() -> Self {
        Leases {
            leases: HashMap::new(),
            followers: HashMap::new(),
            batches: HashMap::new(),
            gens: HashMap::new(),
            own_due: BTreeSet::new(),
            gen_due: BTreeSet::new(),
            ending: VecDeque::new(),
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
        let open = self.open_batch(l);
        if let Some(lease) = self.leases.get_mut(&l) {
            lease.count += 1;
        }
        if let Some(b) = self.batches.get_mut(&open) {
            b.members.push(x);
            b.live += 1;
            *b.open.entry(own).or_insert(0) += 1;
        }
        self.own_due.insert((own, x));
        self.followers.insert(
            x,
            Follower {
                lease: l,
                batch: open,
                own,
                key,
                reported: false,
            },
        );
    }

    /// Follower `x` is gone (its holder ended, or stopped following): its
    /// key, if it was one.
    pub fn leave(&mut self, x: u64) -> Option<K> {
        let f = self.followers.remove(&x)?;
        self.own_due.remove(&(f.own, x));
        if let Some(lease) = self.leases.get_mut(&f.lease) {
            lease.count = lease.count.saturating_sub(1);
        }
        let mut emptied = None;
        if let Some(b) = self.batches.get_mut(&f.batch) {
            b.live = b.live.saturating_sub(1);
            match b.gen {
                None => {
                    if let Some(n) = b.open.get_mut(&f.own) {
                        *n = n.saturating_sub(1);
                        if *n == 0 {
                            b.open.remove(&f.own);
                        }
                    }
                }
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
            } else {
                // Two more entries looked at, those that left dropped: each
                // change leaves at most one, so the list stays within about
                // twice its followers, and no change walks it whole.
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
        Some(f.key)
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
                let batches = &self.batches;
                gen.batches
                    .retain(|b| batches.get(b).is_some_and(|b| b.gen == Some(g)));
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
            let dead: u64 = b.open.range(..=now).map(|(_, n)| *n).sum();
            alive = b.live.saturating_sub(dead);
            let map = std::mem::take(&mut b.open);
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
            garbage,
            ..
        } = self;
        followers
            .into_iter()
            .map(drop)
            .chain(batches.into_iter().map(drop))
            .chain(gens.into_iter().map(drop))
            .chain(own_due.into_iter().map(drop))
            .chain(gen_due.into_iter().map(drop))
            .chain(ending.into_iter().map(drop))
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
            let batches = std::mem::take(&mut gen.batches);
            for b in batches {
                let members = self
                    .batches
                    .get_mut(&b)
                    .map(|b| std::mem::take(&mut b.members))
                    .unwrap_or_default();
                self.ending.push_back((b, members));
            }
            let is_current = self
                .leases
                .get(&gen.lease)
                .is_some_and(|l| l.gen == Some(g));
            if !is_current && gen.batch_count == 0 {
                self.gens.remove(&g);
            }
        }
        while keys.len() < n {
            let Some((b, members)) = self.ending.front_mut() else {
                break;
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
        while keys.len() < n {
            let Some(&(at, x)) = self.own_due.first() else {
                break;
            };
            if at > now {
                break;
            }
            self.own_due.remove(&(at, x));
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
        if !self.ending.is_empty() || !self.garbage.is_empty() {
            return Some(0);
        }
        let own = self.own_due.first().map(|(at, _)| *at);
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
        assert_eq!(t.end_due(3000, 10), vec![(42, 42)]);
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
        assert!(t.batches.get(&open).unwrap().members.len() <= 8);
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
