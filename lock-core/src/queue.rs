//! The wait queue of one key: first come, first served.
//!
//! The queue holds requests that could not be granted when they arrived. When
//! the lock changes, [`Queue::settle`] grants from the head for as long as the
//! head can be granted: consecutive readers at the head go together, and a
//! waiting exclusive request holds back every request behind it (writer
//! preference). A request whose owner now holds the other mode is answered
//! with the conflict and leaves the queue.
//!
//! A multi-key request (`LOCK.MACQUIRE`) waits in the queue of each of its
//! keys as a *part*. A part at the head holds back everything behind it, and
//! `settle` never grants it: only the shell, which sees every key, grants a
//! multi-key request, at once on all its keys, when it heads every queue it
//! is in ([`Queue::head_part`]) and every lock admits it.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use crate::hash::Keyed;
use crate::lock::{max_holders, Ask, Attempt, Changes, HolderIndex, Lock, Request, Shape};
use crate::tokens::Tokens;

/// A waiting request, identified by the shell's waiter id `W`.
#[derive(Debug)]
pub struct Waiter<W> {
    pub id: W,
    pub request: Request,
    /// A part of a multi-key request.
    pub part: bool,
}

/// Requests in arrival order, each under the sequence number it got when
/// it queued (numbers only grow): a request leaves from anywhere in
/// O(log n), and "who is ahead of me" is a range of numbers, so a deadlock
/// search can go through one queue once, however many of its requests it
/// looks at ([`Queue::between`]).
#[derive(Debug)]
pub struct Queue<W> {
    waiters: BTreeMap<u64, Waiter<W>>,
    seq_of: HashMap<W, u64, Keyed>,
    next: u64,
}

impl<W> Default for Queue<W> {
    fn default() -> Self {
        Queue {
            waiters: BTreeMap::new(),
            seq_of: HashMap::default(),
            next: 0,
        }
    }
}

impl<W: Eq + Hash + Copy> Queue<W> {
    pub fn len(&self) -> usize {
        self.waiters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    pub fn push(&mut self, id: W, request: Request) {
        self.enqueue(id, request, false);
    }

    /// Queues one key's part of a multi-key request.
    pub fn push_part(&mut self, id: W, request: Request) {
        self.enqueue(id, request, true);
    }

    fn enqueue(&mut self, id: W, request: Request, part: bool) {
        let seq = self.next;
        self.next += 1;
        if let Some(old) = self.seq_of.insert(id, seq) {
            // Queued twice: the later place stands.
            self.waiters.remove(&old);
        }
        self.waiters.insert(seq, Waiter { id, request, part });
    }

    /// The multi-key request at the head, if the head is one.
    pub fn head_part(&self) -> Option<W> {
        self.waiters
            .first_key_value()
            .map(|(_, w)| w)
            .filter(|w| w.part)
            .map(|w| w.id)
    }

    /// The requests queued ahead of `id` (all of them when it is not queued).
    pub fn ahead(&self, id: Option<W>) -> impl Iterator<Item = &Waiter<W>> {
        let end = id.and_then(|id| self.seq_of.get(&id).copied());
        self.waiters
            .range(..end.unwrap_or(u64::MAX))
            .map(|(_, w)| w)
    }

    /// Where `id` stands (its sequence number), if it is queued.
    pub fn place(&self, id: W) -> Option<u64> {
        self.seq_of.get(&id).copied()
    }

    /// The requests from place `from` (included) to place `to` (excluded),
    /// in order, with their places.
    pub fn between(&self, from: u64, to: u64) -> impl Iterator<Item = (u64, &Waiter<W>)> {
        self.waiters
            .range(from..to.max(from))
            .map(|(seq, w)| (*seq, w))
    }

    /// Where a request arriving now would stand.
    pub fn end(&self) -> u64 {
        self.next
    }

    /// Removes a waiter that timed out or went away; false when it was not queued.
    pub fn remove(&mut self, id: W) -> bool {
        match self.seq_of.remove(&id) {
            Some(seq) => self.waiters.remove(&seq).is_some(),
            None => false,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Waiter<W>> {
        self.waiters.values()
    }

    /// Grants from the head while the head can be granted, up to a
    /// multi-key part. Returns each answered waiter with its outcome, in
    /// queue order; they have left the queue. A head refused for the holder
    /// limit keeps its place, as a busy one does ([`Attempt::waits`]):
    /// readers at the head are granted together up to the limit.
    pub fn settle(
        &mut self,
        lock: &mut Lock,
        now: u64,
        tokens: &mut Tokens,
        changes: &mut Changes,
    ) -> Vec<(W, Attempt)> {
        self.settle_within(lock, now, tokens, changes, max_holders())
    }

    /// [`Queue::settle`] with at most `max` holders (in place of
    /// [`max_holders`]).
    pub fn settle_within(
        &mut self,
        lock: &mut Lock,
        now: u64,
        tokens: &mut Tokens,
        changes: &mut Changes,
        max: usize,
    ) -> Vec<(W, Attempt)> {
        let mut answered = Vec::new();
        let mut settling = Settling::start(lock, now, changes);
        while let Some(a) = self.settle_next(&mut settling, lock, now, tokens, changes, max) {
            answered.push(a);
        }
        answered
    }

    /// The next answer of a settle under way ([`Settling::start`]), at the
    /// same `now`: the head granted (or answered the conflict), leaving the
    /// queue, or `None` when the head must wait (or is a multi-key part, or
    /// nobody waits). The shell answers a queue's head this way one request
    /// at a time and may stop between two (its time budget): the rest is
    /// the next turn's, and whatever queues meanwhile stays behind it.
    pub fn settle_next(
        &mut self,
        settling: &mut Settling,
        lock: &mut Lock,
        now: u64,
        tokens: &mut Tokens,
        changes: &mut Changes,
        max: usize,
    ) -> Option<(W, Attempt)> {
        let head = self.waiters.first_entry()?;
        let waiter = head.get();
        if waiter.part {
            return None;
        }
        let ask = Ask::from(&waiter.request);
        let attempt = lock.grant_in_turn(ask, now, tokens, changes, &mut settling.index, max);
        if attempt.waits() {
            return None;
        }
        let id = waiter.id;
        head.remove();
        self.seq_of.remove(&id);
        Some((id, attempt))
    }
}

/// A settle under way ([`Queue::settle_next`]): the lock was purged at its
/// `now`, and the owners it granted are indexed (linear time in the grants
/// and holders, not their product). A settle the shell ends between two
/// answers (its time budget) is kept for the key's next slice
/// ([`Settling::pause`], [`Settling::resume`]): its index is built once a
/// visit, not once a slice.
#[derive(Default)]
pub struct Settling {
    index: HolderIndex,
    /// The lock's shape when the last slice ended ([`Settling::pause`]).
    paused: Option<Shape>,
}

impl Settling {
    /// Starts a settle of `lock` at `now`: its expired holders dropped.
    pub fn start(lock: &mut Lock, now: u64, changes: &mut Changes) -> Settling {
        lock.purge(now, changes);
        Settling::default()
    }

    /// Ends a slice: the lock's shape as the slice leaves it, for the next
    /// one's [`Settling::resume`].
    pub fn pause(mut self, lock: &Lock) -> Settling {
        self.paused = Some(lock.shape());
        if self.index.earliest == 0 {
            // Once a visit; the grants keep it after.
            self.index.earliest = lock.earliest_of_all();
        }
        self
    }

    /// Whether no holder of `lock` has expired at `now`, as this paused
    /// settle knows without a pass over them: the lock has the shape the
    /// slice left and `now` is before the earliest deadline it kept.
    pub fn unexpired(&self, lock: &Lock, now: u64) -> bool {
        self.paused == Some(lock.shape()) && now < self.index.earliest
    }

    /// The next slice of a settle a slice ended ([`Settling::pause`]), at
    /// `now`: the index kept when nothing changed the lock since (the same
    /// block with the same holders, and `changes` of this transaction still
    /// empty) and the purge at `now` drops nothing, else a new start
    /// ([`Settling::start`]). The caller knows of changes made outside its
    /// transactions (a value put in place by RESTORE, RENAME, MOVE, SWAPDB)
    /// and starts anew then.
    pub fn resume(self, lock: &mut Lock, now: u64, changes: &mut Changes) -> Settling {
        if !changes.is_empty() || self.paused != Some(lock.shape()) {
            return Settling::start(lock, now, changes);
        }
        // No pass over the holders when none can have expired.
        if now >= self.index.earliest {
            lock.purge(now, changes);
        }
        if !changes.is_empty() {
            // Holders went: entries moved, the index is stale.
            return Settling::default();
        }
        Settling {
            paused: None,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::{Kind, Mode};

    fn req(kind: Kind, owner: &str) -> Request {
        Request {
            kind,
            owner: owner.as_bytes().into(),
            ttl: 100,
            session: 0,
        }
    }

    fn held_by_writer() -> (Lock, Tokens) {
        let mut lock = Lock::default();
        let mut tokens = Tokens::starting_after(0);
        let mut c = Changes::default();
        lock.try_acquire(&req(Kind::Acquire, "w0"), false, 0, &mut tokens, &mut c);
        (lock, tokens)
    }

    #[test]
    fn readers_at_the_head_go_together_and_stop_at_a_writer() {
        let (mut lock, mut tokens) = held_by_writer();
        let mut q = Queue::default();
        q.push(1, req(Kind::Read, "r1"));
        q.push(2, req(Kind::Read, "r2"));
        q.push(3, req(Kind::Acquire, "w1"));
        q.push(4, req(Kind::Read, "r3"));
        let mut c = Changes::default();
        assert!(q.settle(&mut lock, 50, &mut tokens, &mut c).is_empty());
        lock.release(b"w0", None, 50, &mut c);
        let answered = q.settle(&mut lock, 50, &mut tokens, &mut c);
        assert_eq!(
            answered,
            vec![(1, Attempt::Granted(2)), (2, Attempt::Granted(3))]
        );
        assert_eq!(lock.mode(), Mode::Shared);
        assert_eq!(q.len(), 2);
        // When the readers expire the writer goes, then the last reader waits for it.
        let answered = q.settle(&mut lock, 150, &mut tokens, &mut c);
        assert_eq!(answered, vec![(3, Attempt::Granted(4))]);
        assert_eq!(q.iter().map(|w| w.id).collect::<Vec<_>>(), vec![4]);
    }

    #[test]
    fn removed_waiters_are_never_granted() {
        let (mut lock, mut tokens) = held_by_writer();
        let mut q = Queue::default();
        q.push(1, req(Kind::Acquire, "a"));
        q.push(2, req(Kind::Acquire, "b"));
        assert!(q.remove(1));
        assert!(!q.remove(1));
        let mut c = Changes::default();
        let answered = q.settle(&mut lock, 100, &mut tokens, &mut c);
        assert_eq!(answered, vec![(2, Attempt::Granted(2))]);
    }

    #[test]
    fn a_multi_key_part_at_the_head_holds_back_everything_behind_it() {
        let (mut lock, mut tokens) = held_by_writer();
        let mut q = Queue::default();
        q.push_part(1, req(Kind::Acquire, "m"));
        q.push(2, req(Kind::Read, "r"));
        let mut c = Changes::default();
        lock.release(b"w0", None, 1, &mut c);
        assert!(q.settle(&mut lock, 1, &mut tokens, &mut c).is_empty());
        assert_eq!(q.head_part(), Some(1));
        assert!(lock.is_empty(), "the part is never granted by one key");
        assert_eq!(q.ahead(Some(2)).map(|w| w.id).collect::<Vec<_>>(), vec![1]);
        assert_eq!(q.ahead(None).count(), 2);
        assert!(q.remove(1));
        assert_eq!(q.head_part(), None);
        let answered = q.settle(&mut lock, 1, &mut tokens, &mut c);
        assert_eq!(answered, vec![(2, Attempt::Granted(2))]);
    }

    #[test]
    fn a_waiter_whose_owner_holds_the_other_mode_gets_the_conflict() {
        let mut lock = Lock::default();
        let mut tokens = Tokens::starting_after(0);
        let mut c = Changes::default();
        lock.try_acquire(&req(Kind::Read, "a"), false, 0, &mut tokens, &mut c);
        let mut q = Queue::default();
        q.push(7, req(Kind::Acquire, "a"));
        let answered = q.settle(&mut lock, 1, &mut tokens, &mut c);
        assert_eq!(answered, vec![(7, Attempt::Conflict(Mode::Shared))]);
    }

    #[test]
    fn readers_past_the_holder_limit_keep_their_place_until_a_holder_leaves() {
        for kind in [Kind::Read, Kind::Semaphore(10)] {
            let mut lock = Lock::default();
            let mut tokens = Tokens::starting_after(0);
            let mut c = Changes::default();
            if kind == Kind::Read {
                lock.try_acquire(&req(Kind::Acquire, "w0"), false, 0, &mut tokens, &mut c);
            }
            let mut q = Queue::default();
            for i in 0..6 {
                q.push(i, req(kind, &format!("r{i}")));
            }
            q.push(6, req(kind, "r6"));
            lock.release(b"w0", None, 1, &mut c);
            let answered = q.settle_within(&mut lock, 1, &mut tokens, &mut c, 3);
            let ids: Vec<_> = answered.iter().map(|(id, _)| *id).collect();
            assert_eq!(ids, [0, 1, 2], "{kind:?}: three granted together");
            assert!(answered
                .iter()
                .all(|(_, a)| matches!(a, Attempt::Granted(_))));
            assert_eq!(q.iter().map(|w| w.id).collect::<Vec<_>>(), [3, 4, 5, 6]);
            assert!(q
                .settle_within(&mut lock, 2, &mut tokens, &mut c, 3)
                .is_empty());
            // One holder leaves: the next one in turn, and only it.
            lock.release(b"r1", None, 3, &mut c);
            let answered = q.settle_within(&mut lock, 3, &mut tokens, &mut c, 3);
            assert_eq!(answered.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [3]);
            assert_eq!(lock.holder_count(), 3);
            // Two leases end (ttl 100; r3's a little later): the next two,
            // in order, up to the limit; then the last.
            let answered = q.settle_within(&mut lock, 101, &mut tokens, &mut c, 3);
            assert_eq!(
                answered.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
                [4, 5]
            );
            let answered = q.settle_within(&mut lock, 103, &mut tokens, &mut c, 3);
            assert_eq!(answered.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [6]);
        }
    }

    /// A settle in slices grants what one settle grants, in the same
    /// order, with the same tokens; a request queued between two slices
    /// stays behind the rest (a reader too: first come, first served).
    #[test]
    fn a_settle_in_slices_grants_what_one_settle_grants_in_order() {
        let run = |slice: usize| {
            let (mut lock, mut tokens) = held_by_writer();
            let mut c = Changes::default();
            let mut q = Queue::default();
            for i in 0..10 {
                q.push(i, req(Kind::Read, &format!("r{i}")));
            }
            lock.release(b"w0", None, 1, &mut c);
            let mut all: Vec<(i32, Attempt)> = Vec::new();
            let mut slices = 0;
            loop {
                let mut settling = Settling::start(&mut lock, 1, &mut c);
                let mut more = false;
                while let Some(a) =
                    q.settle_next(&mut settling, &mut lock, 1, &mut tokens, &mut c, 100)
                {
                    all.push(a);
                    if all.len().is_multiple_of(slice) {
                        more = true;
                        break;
                    }
                }
                slices += 1;
                if slices == 2 {
                    q.push(10, req(Kind::Read, "late"));
                }
                if !more {
                    break;
                }
            }
            assert!(q.is_empty());
            (all, slices)
        };
        let (whole, one) = run(usize::MAX);
        let (sliced, many) = run(3);
        assert_eq!(
            (one, many),
            (1, 4),
            "three a slice; the late one at the end"
        );
        assert_eq!(sliced.len(), 11);
        assert_eq!(
            sliced.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            (0..=10).collect::<Vec<_>>()
        );
        assert!(sliced
            .iter()
            .zip(sliced.iter().skip(1))
            .all(|((_, a), (_, b))| match (a, b) {
                (Attempt::Granted(x), Attempt::Granted(y)) => x < y,
                _ => false,
            }));
        assert_eq!(whole.len(), 10, "the late one came after the one settle");
    }

    /// A settle kept across slices ([`Settling::pause`], `resume`) finds
    /// every holder where an index rebuilt at each slice finds it, whether
    /// the lock stayed as the last slice left it (the index kept), or holders
    /// came and went between two slices (a release, a lease's end: a new
    /// start), and grants what a settle in one go grants.
    #[test]
    fn a_kept_index_agrees_with_a_rebuilt_one_after_every_slice() {
        let (mut lock, mut tokens) = held_by_writer();
        let mut q = Queue::default();
        for i in 0..60 {
            q.push(i, req(Kind::Read, &format!("r{i}")));
        }
        // A repeat of one already granted: found through the kept index.
        q.push(60, req(Kind::Read, "r3"));
        let mut c = Changes::default();
        lock.release(b"w0", None, 1, &mut c);
        let mut kept: Option<Settling> = None;
        let (mut answered, mut slice, mut now) = (Vec::new(), 0, 1);
        loop {
            let mut c = Changes::default();
            // Between slices, sometimes a change of the transaction's own
            // (a release) or by time (leases ending) before the next one.
            match slice % 3 {
                1 => {
                    let owner = format!("r{}", answered.len() / 2);
                    lock.release(owner.as_bytes(), None, now, &mut c);
                }
                2 if slice == 5 => now = 101,
                _ => {}
            }
            let mut settling = match kept.take() {
                Some(s) => s.resume(&mut lock, now, &mut c),
                None => Settling::start(&mut lock, now, &mut c),
            };
            assert!(
                lock.holders().all(|h| h.is_live(now)) || lock.purge_left(now),
                "purged at {now}"
            );
            // (Not while a purge in slices goes on: no table then.)
            if slice % 3 == 0 && slice > 0 && !lock.purge_left(now) {
                assert!(settling.index.table.is_some(), "kept at slice {slice}");
            }
            let mut more = false;
            for _ in 0..7 {
                match q.settle_next(&mut settling, &mut lock, now, &mut tokens, &mut c, 1000) {
                    Some(a) => answered.push(a),
                    None => break,
                }
                assert!(settling.index.agrees_with(&lock), "slice {slice}");
                assert!(settling.index.earliest <= lock.earliest_of_all());
                more = !q.is_empty();
            }
            slice += 1;
            if !more {
                break;
            }
            let paused = settling.pause(&lock);
            // What it knows without a pass is true.
            for at in [now, 100, 101, 200] {
                if paused.unexpired(&lock, at) {
                    assert!(lock.holders().all(|h| h.is_live(at)), "at {at}");
                }
            }
            assert!(
                paused.unexpired(&lock, now) || lock.purge_left(now),
                "nothing expires at {now}"
            );
            kept = Some(paused);
        }
        assert!(q.is_empty());
        assert_eq!(answered.len(), 61);
        assert!(answered
            .iter()
            .all(|(_, a)| matches!(a, Attempt::Granted(_))));
        // The repeat got its holder's token, not a second holder.
        let r3 = lock.holder(b"r3").map(|h| h.token);
        assert_eq!(answered.last().map(|(_, a)| *a), r3.map(Attempt::Granted));
        let owners: std::collections::HashSet<_> = lock.holders().map(|h| h.owner).collect();
        assert_eq!(owners.len(), lock.holder_count(), "one holder per owner");
    }
}
