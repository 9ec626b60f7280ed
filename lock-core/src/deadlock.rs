//! Deadlock detection: does a request that is about to wait close a cycle of
//! waits back to its own owner?
//!
//! A waiting request depends on every live holder that keeps it out and on
//! every request queued ahead of it that it cannot be granted with
//! ([`blockers`]): a waiting writer keeps the readers behind it waiting,
//! readers do not keep readers waiting. Owners are compared by their bytes,
//! across keys and databases: an owner waits for whatever any of its waiting
//! requests waits for. [`search`] walks these dependencies from the new
//! request's blockers; reaching its owner again is a deadlock.
//!
//! The walk is breadth first (short cycles are found first) and bounded:
//! past `limit` steps (owners expanded plus
//! dependencies listed) it stops without a verdict ([`Search::Cut`]), and the
//! request waits as usual (never a false `DEADLOCK`; its WAIT timeout still
//! ends it).

use std::collections::{HashSet, VecDeque};

use crate::lock::{Kind, Lock, Owner, Request};

/// Where the shell keeps waiting requests: what one owner's waiting
/// requests wait for.
pub trait WaitGraph {
    /// The owners that any waiting request of `owner` depends on.
    fn waits_for(&mut self, owner: &[u8]) -> Vec<Owner>;
}

/// The verdict of a [`search`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Search {
    /// Waiting would close a cycle: answer `DEADLOCK`.
    Cycle,
    /// No cycle: wait.
    Clear,
    /// The search stopped at its limit: wait (no verdict).
    Cut,
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

/// Whether `me`, about to wait for `first`, would close a cycle, walking
/// at most `limit` steps of `graph` (owners expanded plus dependencies
/// listed). Breadth first: the shortest cycles, the common ones, are found
/// before the limit can cut the search.
pub fn search(me: &[u8], first: Vec<Owner>, graph: &mut impl WaitGraph, limit: usize) -> Search {
    if first.iter().any(|o| **o == *me) {
        return Search::Cycle;
    }
    let mut seen: HashSet<Owner> = first.iter().cloned().collect();
    let mut queue: VecDeque<Owner> = first.into();
    let mut steps = 0usize;
    while let Some(owner) = queue.pop_front() {
        let next = graph.waits_for(&owner);
        steps = steps.saturating_add(1 + next.len());
        for o in next {
            if *o == *me {
                return Search::Cycle;
            }
            if !seen.contains(&o) {
                seen.insert(o.clone());
                queue.push_back(o);
            }
        }
        if steps > limit && !queue.is_empty() {
            return Search::Cut;
        }
    }
    Search::Clear
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::lock::{Changes, Mode};
    use crate::tokens::Tokens;

    struct Edges(BTreeMap<Owner, Vec<Owner>>);

    impl WaitGraph for Edges {
        fn waits_for(&mut self, owner: &[u8]) -> Vec<Owner> {
            self.0.get(owner).cloned().unwrap_or_default()
        }
    }

    fn o(n: u8) -> Owner {
        vec![b'o', n].into_boxed_slice()
    }

    fn req(kind: Kind, owner: &Owner) -> Request {
        Request {
            kind,
            owner: owner.clone(),
            ttl: 100,
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
        let mut g = Edges(BTreeMap::from([
            (o(2), vec![o(3)]),
            (o(3), vec![o(1)]),
            (o(4), vec![o(5)]),
        ]));
        assert_eq!(search(&o(1), vec![o(2)], &mut g, 100), Search::Cycle);
        assert_eq!(search(&o(1), vec![o(4)], &mut g, 100), Search::Clear);
        assert_eq!(search(&o(9), vec![o(2)], &mut g, 100), Search::Clear);
        assert_eq!(search(&o(1), vec![o(2)], &mut g, 1), Search::Cut);
        assert_eq!(search(&o(1), vec![o(2)], &mut g, 2), Search::Cycle);
    }

    proptest! {
        /// The search agrees with reachability computed the naive way.
        #[test]
        fn search_is_reachability(
            edges in proptest::collection::vec((0u8..8, 0u8..8), 0..24),
            me in 0u8..8,
            first in proptest::collection::vec(0u8..8, 0..4),
        ) {
            let mut map: BTreeMap<Owner, Vec<Owner>> = BTreeMap::new();
            for (a, b) in &edges {
                map.entry(o(*a)).or_default().push(o(*b));
            }
            // Naive: the closure of `first` under the edges, 8 rounds.
            let mut reach: Vec<u8> = first.clone();
            for _ in 0..8 {
                for (a, b) in &edges {
                    if reach.contains(a) && !reach.contains(b) {
                        reach.push(*b);
                    }
                }
            }
            let want = if reach.contains(&me) { Search::Cycle } else { Search::Clear };
            let got = search(&o(me), first.iter().map(|n| o(*n)).collect(), &mut Edges(map), 10_000);
            prop_assert_eq!(got, want);
        }
    }
}
