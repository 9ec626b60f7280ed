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
//! waits for them...), always on the smaller frontier, and stops when the
//! two meet (a cycle) or either side has nothing left (none): its cost is
//! about that of the smaller side. A new worker on a hot key, whom nobody
//! waits for, costs one look-up however long the queue; a request in the
//! middle of a long chain walks the short side. Each owner is expanded once
//! a side, each key's holders (or its holders' dependents) are listed once,
//! and each queue is gone through at most twice a side (for everyone and
//! for writers, remembering per key how far from which place requests were
//! listed): a walk over every request of a queue of n requests is O(n).

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;

use crate::lock::{Kind, Lock, Owner, Request};

/// What the search asks of the shell, which keeps the waiting requests and
/// reads the locks: keys are the shell's own (`K`), places are sequence
/// numbers in a key's queue (`crate::Queue::place`).
pub trait WaitGraph {
    type Key: Clone + Eq + Hash;
    /// Every waiting request of `owner`: its key, its place in that key's
    /// queue, what it asks.
    fn requests_of(&mut self, owner: &[u8]) -> Vec<(Self::Key, u64, Kind)>;
    /// Keys with a queue that `owner` may hold (each is checked with
    /// [`WaitGraph::holds`]; none it holds may be missing).
    fn waited_keys_held(&mut self, owner: &[u8]) -> Vec<Self::Key>;
    /// Whether `owner` holds `key` now (its requests there wait for nobody).
    fn holds(&mut self, key: &Self::Key, owner: &[u8]) -> bool;
    /// Whether `key`'s lock admits a request of `kind` from someone not
    /// holding it (so its holders keep it waiting for nobody).
    fn admits(&mut self, key: &Self::Key, kind: Kind) -> bool;
    /// The live holders of `key`.
    fn holders(&mut self, key: &Self::Key) -> Vec<Owner>;
    /// The requests queued on `key` at places `from..to`: owner and kind.
    fn queued(&mut self, key: &Self::Key, from: u64, to: u64) -> Vec<(Owner, Kind)>;
}

/// The verdict of a [`search`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Search {
    /// Waiting would close a cycle: answer `DEADLOCK`.
    Cycle,
    /// No cycle: wait.
    Clear,
}

/// How far one side of a search has listed around a key.
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

/// One direction's state.
struct Side<K> {
    seen: HashSet<Owner>,
    next: VecDeque<Owner>,
    listed: HashMap<K, Listed>,
}

impl<K> Side<K> {
    fn new() -> Side<K> {
        Side {
            seen: HashSet::new(),
            next: VecDeque::new(),
            listed: HashMap::new(),
        }
    }
}

/// Whether `me`, about to wait with a request of `kind` on each of `keys`
/// (at the end of each queue), would close a cycle of waits back to itself.
pub fn search<G: WaitGraph>(
    me: &[u8],
    kind: Kind,
    keys: &[(G::Key, u64)],
    graph: &mut G,
) -> Search {
    let mut walk = Walk {
        me,
        fwd: Side::new(),
        back: Side::new(),
        cycle: false,
    };
    // Who waits for `me` already: if nobody does, no wait can close a cycle.
    walk.back.seen.insert(me.into());
    walk.expand_back(graph, me);
    if walk.back.next.is_empty() {
        return Search::Clear;
    }
    for (key, end) in keys {
        walk.expand(graph, me, key, *end, kind);
    }
    while !walk.cycle && !walk.fwd.next.is_empty() && !walk.back.next.is_empty() {
        if walk.fwd.next.len() <= walk.back.next.len() {
            if let Some(owner) = walk.fwd.next.pop_front() {
                for (key, place, kind) in graph.requests_of(&owner) {
                    walk.expand(graph, &owner, &key, place, kind);
                }
            }
        } else if let Some(owner) = walk.back.next.pop_front() {
            walk.expand_back(graph, &owner);
        }
    }
    match walk.cycle {
        true => Search::Cycle,
        false => Search::Clear,
    }
}

struct Walk<'m, K> {
    me: &'m [u8],
    fwd: Side<K>,
    back: Side<K>,
    cycle: bool,
}

impl<K: Clone + Eq + Hash> Walk<'_, K> {
    /// `owner` is waited for by the new request, through others.
    fn reach(&mut self, owner: Owner) {
        if *owner == *self.me || self.back.seen.contains(&owner) {
            self.cycle = true;
        } else if self.fwd.seen.insert(owner.clone()) {
            self.fwd.next.push_back(owner);
        }
    }

    /// `owner` waits for the new request's owner, through others.
    fn reach_back(&mut self, owner: Owner) {
        if self.fwd.seen.contains(&owner) {
            self.cycle = true;
        } else if self.back.seen.insert(owner.clone()) {
            self.back.next.push_back(owner);
        }
    }

    /// Lists what `owner`'s request of `kind` at `place` on `key` waits
    /// for, skipping what this side listed there already.
    fn expand<G: WaitGraph<Key = K>>(
        &mut self,
        graph: &mut G,
        owner: &[u8],
        key: &K,
        place: u64,
        kind: Kind,
    ) {
        if self.cycle || graph.holds(key, owner) {
            return;
        }
        let listed = self
            .fwd
            .listed
            .entry(key.clone())
            .or_insert_with(Listed::forward);
        let holders = !listed.holders && !graph.admits(key, kind);
        let (from, to) = match kind {
            Kind::Read => (listed.writers.max(listed.all), place),
            _ => (listed.all, place),
        };
        // The new request's own listing skips its owner's requests queued
        // ahead: it leaves the places listed as they were, so that a later
        // listing there reaches its owner through them (a cycle).
        if *owner != *self.me {
            match kind {
                Kind::Read => listed.writers = listed.writers.max(place),
                _ => listed.all = listed.all.max(place),
            }
        }
        if holders {
            listed.holders = true;
            for h in graph.holders(key) {
                if *h != *owner {
                    self.reach(h);
                }
            }
        }
        if from < to {
            for (o, k) in graph.queued(key, from, to) {
                let passes = kind == Kind::Read && k == Kind::Read;
                if !passes && *o != *owner {
                    self.reach(o);
                }
            }
        }
    }

    /// Lists who waits for `owner`: the requests its keys do not admit
    /// (those of owners not holding them), and those queued behind its own
    /// requests that cannot pass them.
    fn expand_back<G: WaitGraph<Key = K>>(&mut self, graph: &mut G, owner: &[u8]) {
        for key in graph.waited_keys_held(owner) {
            if self.cycle {
                return;
            }
            if !graph.holds(&key, owner) {
                continue;
            }
            let listed = self
                .back
                .listed
                .entry(key.clone())
                .or_insert_with(Listed::backward);
            if listed.holders {
                continue;
            }
            listed.holders = true;
            for (o, k) in graph.queued(&key, 0, u64::MAX) {
                if !graph.admits(&key, k) && !graph.holds(&key, &o) {
                    self.reach_back(o);
                }
            }
        }
        for (key, place, kind) in graph.requests_of(owner) {
            if self.cycle {
                return;
            }
            let listed = self
                .back
                .listed
                .entry(key.clone())
                .or_insert_with(Listed::backward);
            let from = place.saturating_add(1);
            let to = match kind {
                Kind::Read => listed.writers.min(listed.all),
                _ => listed.all,
            };
            match kind {
                Kind::Read => listed.writers = listed.writers.min(from),
                _ => listed.all = listed.all.min(from),
            }
            if from < to {
                for (o, k) in graph.queued(&key, from, to) {
                    let passes = kind == Kind::Read && k == Kind::Read;
                    if !passes && *o != *owner && !graph.holds(&key, &o) {
                        self.reach_back(o);
                    }
                }
            }
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
    use std::collections::BTreeSet;

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
        }
    }

    /// Locks and their queues, as the shell keeps them: the search's graph.
    struct State {
        locks: Vec<Lock>,
        queues: Vec<Queue<u32>>,
        now: u64,
    }

    impl WaitGraph for State {
        type Key = usize;
        fn requests_of(&mut self, owner: &[u8]) -> Vec<(usize, u64, Kind)> {
            let mut out = Vec::new();
            for (k, q) in self.queues.iter().enumerate() {
                for w in q.iter().filter(|w| *w.request.owner == *owner) {
                    out.push((k, q.place(w.id).unwrap(), w.request.kind));
                }
            }
            out
        }
        fn holds(&mut self, key: &usize, owner: &[u8]) -> bool {
            self.locks[*key].live(self.now).any(|h| *h.owner == *owner)
        }
        fn waited_keys_held(&mut self, owner: &[u8]) -> Vec<usize> {
            // Every key with a queue: a superset, as the trait allows.
            (0..self.locks.len())
                .filter(|k| !self.queues[*k].is_empty() && self.holds(k, owner))
                .collect()
        }
        fn admits(&mut self, key: &usize, kind: Kind) -> bool {
            self.locks[*key].admits(kind, self.now)
        }
        fn holders(&mut self, key: &usize) -> Vec<Owner> {
            self.locks[*key]
                .live(self.now)
                .map(|h| Owner::from(h.owner))
                .collect()
        }
        fn queued(&mut self, key: &usize, from: u64, to: u64) -> Vec<(Owner, Kind)> {
            self.queues[*key]
                .between(from, to)
                .map(|(_, w)| (w.request.owner.clone(), w.request.kind))
                .collect()
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
            }
        }

        /// The definition, walked the naive way: every owner's blockers
        /// from `blockers` and `queued_blockers`, then reachability.
        fn naive(&self, me: &Owner, kind: Kind, keys: &[usize]) -> Search {
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
                    return Search::Cycle;
                }
                for y in edges.get(&x).into_iter().flatten() {
                    if seen.insert(y.clone()) {
                        reach.push(y.clone());
                    }
                }
            }
            Search::Clear
        }

        fn search(&mut self, me: &Owner, kind: Kind, keys: &[usize]) -> Search {
            let at: Vec<(usize, u64)> = keys.iter().map(|k| (*k, self.queues[*k].end())).collect();
            search(me, kind, &at, self)
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
        assert_eq!(st.search(&o(3), w, &[0]), Search::Cycle);
        // o9, holding nothing, waits in a chain.
        assert_eq!(st.search(&o(9), w, &[0]), Search::Clear);
        // Behind a waiting writer of its own: o5's request queued ahead
        // keeps o4 waiting, who holds k2... through a queue, not a holder.
        let mut st = State::new(2, &[(0, 1, w), (1, 4, w)], &[(0, 5, w), (0, 4, w)]);
        assert_eq!(st.search(&o(5), w, &[1]), Search::Cycle);
        // Readers pass readers: a reader behind a reader waits for nobody.
        let r = Kind::Read;
        let mut st = State::new(2, &[(0, 1, r), (1, 2, w)], &[(1, 1, w), (0, 3, r)]);
        assert_eq!(st.search(&o(2), r, &[0]), Search::Clear);
        assert_eq!(st.search(&o(2), w, &[0]), Search::Cycle);
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
        assert_eq!(held.search(&o(1), w, &[1, 0]), Search::Cycle);
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
        assert_eq!(st.search(&o(0), w, &[999]), Search::Cycle);
        assert_eq!(st.search(&o(5_000), w, &[999]), Search::Clear);
    }
}
