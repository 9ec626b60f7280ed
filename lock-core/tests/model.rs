//! Property tests: the core ([`Lock`], [`Queue`], [`Tokens`]) against a naive
//! reference model written here, independently of the core's logic.
//!
//! Random sequences of up to 60 operations over 3 keys and 4 owners are run
//! on both the core (as the shell drives it: grant requests are made with
//! `queued_ahead = !queue.is_empty()`) and the model, and after every step the
//! two are compared and the contract's invariants are checked.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;

use lock_core::tokens::{Tokens, MAX_TOKEN};
use lock_core::{
    Attempt, Changes, Holder, Invalid, Kind, Lock, Mode, Owner, Queue, Release, Request,
};
use lock_model::model::{mode_of, MWait, Model};

const KEYS: usize = 3;
const OWNERS: u8 = 4;
const MAX_STEPS: usize = 60;

/// Owner names are binary (a NUL byte inside) to keep them binary-safe.
fn name(owner: u8) -> Owner {
    vec![b'o', 0, b'0' + owner].into_boxed_slice()
}

/// An owner of the model (`usize`) by its number here.
fn oid(owner: u8) -> usize {
    usize::from(owner)
}

/// The model's owner `o` by name.
fn owner_named(o: usize) -> Owner {
    name(u8::try_from(o).unwrap())
}

// ---------------------------------------------------------------------------
// Views of the core.
// ---------------------------------------------------------------------------

type Stored = BTreeMap<Owner, (u32, u64, u64)>;

/// Every stored holder (expired ones included) by owner.
fn stored(lock: &Lock) -> Stored {
    lock.holders()
        .map(|h| (Owner::from(h.owner), (h.holds, h.token, h.deadline)))
        .collect()
}

fn live_view(lock: &Lock, now: u64) -> BTreeMap<Owner, (Mode, u32, u64, u64)> {
    lock.live(now)
        .map(|h| {
            (
                Owner::from(h.owner),
                (lock.mode(), h.holds, h.token, h.deadline),
            )
        })
        .collect()
}

fn queue_view(queue: &Queue<u32>) -> Vec<(u32, Kind, Owner, u64)> {
    queue
        .iter()
        .map(|w| (w.id, w.request.kind, w.request.owner.clone(), w.request.ttl))
        .collect()
}

fn request(kind: Kind, owner: u8, ttl: u64) -> Request {
    Request {
        kind,
        owner: name(owner),
        ttl,
    }
}

// ---------------------------------------------------------------------------
// Operations.
// ---------------------------------------------------------------------------

/// Who sends a command: any owner, or one of the key's current holders (so
/// that releases, renewals and re-entries hit holders often).
#[derive(Clone, Copy, Debug)]
enum Who {
    Owner(u8),
    Holder(Index),
}

impl Who {
    fn resolve(self, model: &Model, key: usize) -> u8 {
        match self {
            Who::Owner(owner) => owner,
            Who::Holder(pick) => {
                let live: Vec<u8> = model.keys[key]
                    .holders
                    .iter()
                    .filter(|(_, h)| model.now < h.deadline)
                    .map(|(&o, _)| u8::try_from(o).unwrap())
                    .collect();
                if live.is_empty() {
                    // Nobody holds: any owner.
                    u8::try_from(pick.index(usize::from(OWNERS))).unwrap()
                } else {
                    live[pick.index(live.len())]
                }
            }
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// ACQUIRE / RACQUIRE / READ without WAIT: an immediate try.
    Grant {
        key: usize,
        kind: Kind,
        who: Who,
        ttl: u64,
    },
    Release {
        key: usize,
        who: Who,
    },
    Renew {
        key: usize,
        who: Who,
        ttl: u64,
    },
    Advance(u64),
    /// A request with WAIT. `try_first`: as the shell does, try at once and
    /// queue only when busy; otherwise push it unconditionally (exercises
    /// `settle` on queues the shell would not build, e.g. a holder's repeat).
    Enqueue {
        key: usize,
        kind: Kind,
        owner: u8,
        ttl: u64,
        try_first: bool,
    },
    /// A queued waiter times out or disconnects.
    Remove {
        key: usize,
        pick: Index,
    },
    /// Removing an id that may be long gone (answered or removed already).
    RemoveId {
        key: usize,
        id: u32,
    },
    Settle {
        key: usize,
    },
}

impl Op {
    fn key(&self) -> Option<usize> {
        match *self {
            Op::Advance(_) => None,
            Op::Grant { key, .. }
            | Op::Release { key, .. }
            | Op::Renew { key, .. }
            | Op::Enqueue { key, .. }
            | Op::Remove { key, .. }
            | Op::RemoveId { key, .. }
            | Op::Settle { key } => Some(key),
        }
    }
}

fn kind() -> impl Strategy<Value = Kind> {
    // Readers a little more often: shared states with several readers.
    prop_oneof![1 => Just(Kind::Acquire), 1 => Just(Kind::Racquire), 2 => Just(Kind::Read)]
}

fn op() -> impl Strategy<Value = Op> {
    // Key 0 is the busiest, so that states with several readers and several
    // holds arise often; keys 1 and 2 still see every operation.
    let key = || prop_oneof![2 => Just(0usize), 1 => 1..KEYS];
    let owner = || 0..OWNERS;
    let ttl = || 1u64..=50;
    let who = move || {
        prop_oneof![
            3 => owner().prop_map(Who::Owner),
            2 => any::<Index>().prop_map(Who::Holder),
        ]
    };
    prop_oneof![
        5 => (key(), kind(), who(), ttl())
            .prop_map(|(key, kind, who, ttl)| Op::Grant { key, kind, who, ttl }),
        3 => (key(), who()).prop_map(|(key, who)| Op::Release { key, who }),
        2 => (key(), who(), ttl()).prop_map(|(key, who, ttl)| Op::Renew { key, who, ttl }),
        // Time moves by 0..=40 ms, small steps more often than large ones.
        2 => prop_oneof![0u64..=5, 0u64..=40].prop_map(Op::Advance),
        4 => (key(), kind(), owner(), ttl(), prop::bool::weighted(0.8)).prop_map(
            |(key, kind, owner, ttl, try_first)| Op::Enqueue { key, kind, owner, ttl, try_first }
        ),
        1 => (key(), any::<Index>()).prop_map(|(key, pick)| Op::Remove { key, pick }),
        1 => (key(), 0u32..64).prop_map(|(key, id)| Op::RemoveId { key, id }),
        3 => key().prop_map(|key| Op::Settle { key }),
    ]
}

fn start_token() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..1000,
        // Close to exhaustion: TokensExhausted must refuse and change nothing.
        1 => (MAX_TOKEN - 6)..=MAX_TOKEN,
    ]
}

// ---------------------------------------------------------------------------
// The run.
// ---------------------------------------------------------------------------

struct Core {
    now: u64,
    tokens: Tokens,
    locks: Vec<Lock>,
    queues: Vec<Queue<u32>>,
    /// Each key as a replica sees it, built only from `Changes` (put/remove).
    replicas: Vec<Lock>,
}

/// What one step did, for the checks that follow it.
#[derive(Default)]
struct Step {
    changes: Changes,
    /// Owners answered with a grant/renewal: they may be listed in `changes`
    /// although a same-deadline re-entry leaves their state equal.
    answered_ok: BTreeSet<Owner>,
    /// Tokens in this step's replies.
    replied: Vec<u64>,
}

#[allow(clippy::too_many_lines)]
fn run(first_token: u64, start: u64, ops: &[Op]) -> Result<(), TestCaseError> {
    prop_assert_eq!(MAX_TOKEN, i64::MAX as u64);
    let mut core = Core {
        now: start,
        tokens: Tokens::starting_after(first_token),
        locks: vec![Lock::default(); KEYS],
        queues: (0..KEYS).map(|_| Queue::default()).collect(),
        replicas: vec![Lock::default(); KEYS],
    };
    let mut model = Model::new(KEYS, start, first_token);
    let mut next_id: u32 = 0;
    let mut tokens_seen = TokensSeen {
        seen: BTreeSet::new(),
        highest: first_token,
    };
    let mut removed_ids: BTreeSet<u32> = BTreeSet::new();
    let mut answered_ids: BTreeSet<u32> = BTreeSet::new();

    for (n, op) in ops.iter().enumerate() {
        let stored_before: Vec<Stored> = core.locks.iter().map(stored).collect();
        let mut step = Step::default();
        let now = core.now;

        match *op {
            Op::Advance(ms) => {
                core.now += ms;
                model.now += ms;
            }

            Op::Grant {
                key,
                kind,
                who,
                ttl,
            } => {
                let owner = who.resolve(&model, key);
                let live_before = live_view(&core.locks[key], now);
                let held = model.live(key, oid(owner));
                let queued = !core.queues[key].is_empty();
                let got = core.locks[key].try_acquire(
                    &request(kind, owner, ttl),
                    queued,
                    now,
                    &mut core.tokens,
                    &mut step.changes,
                );
                let want = model.grant(
                    key,
                    kind,
                    oid(owner),
                    ttl,
                    !model.keys[key].queue.is_empty(),
                );
                prop_assert_eq!(got, want, "step {}: {:?} (owner {})", n, op, owner);
                match held {
                    Some(h) if h.mode != mode_of(kind) => {
                        // Upgrade/downgrade: an error, and nothing changes.
                        prop_assert_eq!(got, Attempt::Conflict(h.mode));
                        prop_assert_eq!(&live_view(&core.locks[key], now), &live_before);
                    }
                    Some(h) => {
                        // A holder's repeat is answered at once, even behind waiters.
                        prop_assert_eq!(got, Attempt::Granted(h.token));
                    }
                    None if queued => {
                        // A newcomer never jumps the queue.
                        prop_assert_eq!(got, Attempt::Busy);
                    }
                    None => {}
                }
                if let Attempt::Granted(t) = got {
                    step.answered_ok.insert(name(owner));
                    step.replied.push(t);
                }
            }

            Op::Release { key, who } => {
                let owner = who.resolve(&model, key);
                let got = core.locks[key].release(&name(owner), now, &mut step.changes);
                let want = model.release(key, oid(owner));
                prop_assert_eq!(got, want, "step {}: {:?} (owner {})", n, op, owner);
            }

            Op::Renew { key, who, ttl } => {
                let owner = who.resolve(&model, key);
                let got = core.locks[key].renew(&name(owner), ttl, now, &mut step.changes);
                let want = model.renew(key, oid(owner), ttl);
                prop_assert_eq!(got, want, "step {}: {:?} (owner {})", n, op, owner);
                if got {
                    step.answered_ok.insert(name(owner));
                }
            }

            Op::Enqueue {
                key,
                kind,
                owner,
                ttl,
                try_first,
            } => {
                let id = next_id;
                next_id += 1;
                let waiter = MWait {
                    id,
                    kind,
                    owner: usize::from(owner),
                    ttl,
                    part: false,
                };
                if try_first {
                    let queued = !core.queues[key].is_empty();
                    let got = core.locks[key].try_acquire(
                        &request(kind, owner, ttl),
                        queued,
                        now,
                        &mut core.tokens,
                        &mut step.changes,
                    );
                    let want = model.grant(
                        key,
                        kind,
                        oid(owner),
                        ttl,
                        !model.keys[key].queue.is_empty(),
                    );
                    prop_assert_eq!(got, want, "step {}: {:?}", n, op);
                    match got {
                        Attempt::Busy => {
                            core.queues[key].push(id, request(kind, owner, ttl));
                            model.keys[key].queue.push_back(waiter);
                        }
                        Attempt::Granted(t) => {
                            step.answered_ok.insert(name(owner));
                            step.replied.push(t);
                        }
                        _ => {}
                    }
                } else {
                    core.queues[key].push(id, request(kind, owner, ttl));
                    model.keys[key].queue.push_back(waiter);
                }
            }

            Op::Remove { key, pick } => {
                if model.keys[key].queue.is_empty() {
                    prop_assert!(!core.queues[key].remove(u32::MAX));
                } else {
                    let at = pick.index(model.keys[key].queue.len());
                    let id = model.keys[key].queue[at].id;
                    prop_assert!(core.queues[key].remove(id), "step {}: remove {}", n, id);
                    model.keys[key].queue.remove(at);
                    removed_ids.insert(id);
                    prop_assert!(!core.queues[key].remove(id), "removed twice");
                }
            }

            Op::RemoveId { key, id } => {
                let present = model.keys[key].queue.iter().position(|w| w.id == id);
                prop_assert_eq!(core.queues[key].remove(id), present.is_some(), "step {}", n);
                if let Some(at) = present {
                    model.keys[key].queue.remove(at);
                    removed_ids.insert(id);
                }
            }

            Op::Settle { key } => {
                let before: Vec<(u32, Owner)> = core.queues[key]
                    .iter()
                    .map(|w| (w.id, w.request.owner.clone()))
                    .collect();
                let got = core.queues[key].settle(
                    &mut core.locks[key],
                    now,
                    &mut core.tokens,
                    &mut step.changes,
                );
                let want = model.settle(key);
                prop_assert_eq!(&got, &want, "step {}: {:?}", n, op);
                // FIFO: the answered waiters are the head of the queue, in
                // order, so nobody behind a waiting request is answered.
                prop_assert!(got.len() <= before.len());
                for (&(id, outcome), (queued_id, owner)) in got.iter().zip(&before) {
                    prop_assert_eq!(id, *queued_id, "step {}: answered out of order", n);
                    prop_assert!(!removed_ids.contains(&id), "removed waiter {} answered", id);
                    prop_assert!(answered_ids.insert(id), "waiter {} answered twice", id);
                    prop_assert_ne!(outcome, Attempt::Busy);
                    if let Attempt::Granted(t) = outcome {
                        step.replied.push(t);
                        step.answered_ok.insert(owner.clone());
                    }
                }
                // The new head, if any, really cannot be granted: readers at
                // the head went together, and a waiting writer blocks the rest.
                let lock = &core.locks[key];
                if let Some(head) = core.queues[key].iter().next() {
                    let owner = &head.request.owner;
                    prop_assert!(lock.live(now).all(|h| *h.owner != **owner));
                    prop_assert!(!lock.admits(head.request.kind, now));
                    prop_assert!(lock.is_held(now));
                    if head.request.kind == Kind::Read {
                        prop_assert_eq!(lock.mode(), Mode::Exclusive);
                    }
                }
            }
        }

        check_keys(n, op, &core, &model, &stored_before)?;
        tokens_seen.check(n, &core, &step)?;
        if let Some(key) = op.key() {
            check_changes(n, op, &mut core, key, &stored_before[key], &step)?;
        } else {
            prop_assert!(step.changes.is_empty());
        }
    }
    Ok(())
}

/// Every token seen so far (issued, in a reply or in a state).
struct TokensSeen {
    seen: BTreeSet<u64>,
    /// The counter after the previous step: every new token must be above it.
    highest: u64,
}

impl TokensSeen {
    /// Every newly issued token is above every token issued before (across
    /// keys, releases and expiries), and live tokens are all distinct.
    fn check(&mut self, n: usize, core: &Core, step: &Step) -> Result<(), TestCaseError> {
        let mut live_tokens = BTreeSet::new();
        for lock in &core.locks {
            for h in lock.live(core.now) {
                prop_assert!(
                    live_tokens.insert(h.token),
                    "step {}: token {} twice",
                    n,
                    h.token
                );
            }
        }
        let mut new_tokens: BTreeSet<u64> = step.replied.iter().copied().collect();
        for lock in &core.locks {
            new_tokens.extend(lock.holders().map(|h| h.token));
        }
        new_tokens.retain(|t| !self.seen.contains(t));
        for &t in &new_tokens {
            prop_assert!(
                t > self.highest,
                "step {}: new token {} not above {}",
                n,
                t,
                self.highest
            );
            prop_assert!(t <= MAX_TOKEN);
        }
        // The counter moves only by issuing, one token per new grant.
        let last = core.tokens.last();
        prop_assert!(last >= self.highest);
        prop_assert!(new_tokens.len() as u64 <= last - self.highest);
        self.highest = last;
        self.seen.extend(new_tokens);
        Ok(())
    }
}

/// The state checks after any step, on every key.
fn check_keys(
    n: usize,
    op: &Op,
    core: &Core,
    model: &Model,
    stored_before: &[Stored],
) -> Result<(), TestCaseError> {
    let now = core.now;
    prop_assert_eq!(now, model.now);
    prop_assert_eq!(core.tokens.last(), model.last_token, "step {}: {:?}", n, op);
    for (key, (lock, queue)) in core.locks.iter().zip(&core.queues).enumerate() {
        // The live holders and the waiters equal the model's.
        prop_assert_eq!(
            live_view(lock, now),
            model.live_view(key, owner_named),
            "step {}: {:?}: key {} live holders",
            n,
            op,
            key
        );
        prop_assert_eq!(
            queue_view(queue),
            model.queue_view(key, owner_named),
            "step {}: queue",
            n
        );
        // `live` never reports an expired holder.
        prop_assert!(lock.live(now).all(|h| h.deadline > now));
        prop_assert_eq!(lock.is_held(now), lock.live(now).next().is_some());
        // No owner twice; at most one exclusive holder, and (one mode per
        // lock) never an exclusive holder beside a live reader.
        let all = stored(lock);
        prop_assert_eq!(all.len(), lock.holder_count(), "duplicate owner");
        if lock.mode() == Mode::Exclusive {
            prop_assert!(
                lock.holder_count() <= 1,
                "two exclusive holders: {:?}",
                lock
            );
        }
        prop_assert!(lock.holders().all(|h| h.holds >= 1 && h.token >= 1));
        // The key's Redis expiry is the latest deadline: that of a live holder
        // while any holds; the next self-change is no later than any live deadline.
        let live_deadlines: Vec<u64> = model
            .live_view(key, owner_named)
            .values()
            .map(|v| v.3)
            .collect();
        if let Some(&latest) = live_deadlines.iter().max() {
            prop_assert_eq!(lock.latest_deadline(), Some(latest));
            let earliest = live_deadlines.iter().min().copied();
            prop_assert!(lock.earliest_deadline() <= earliest);
        }

        // Round trips: from_holders and put rebuild an equal lock.
        let rebuilt =
            Lock::from_holders(lock.kind(), lock.holders().map(|h| h.to_owned()).collect());
        prop_assert_eq!(rebuilt.as_ref(), Ok(lock));
        let mut put_back = Lock::default();
        for h in lock.holders() {
            prop_assert_eq!(put_back.put(lock.kind(), h.to_owned()), Ok(()));
        }
        if lock.is_empty() {
            prop_assert!(put_back.is_empty());
        } else {
            prop_assert_eq!(&put_back, lock);
        }

        // Only the operated key may change.
        if op.key() != Some(key) {
            prop_assert_eq!(&all, &stored_before[key], "step {}: key {} changed", n, key);
        }
    }
    Ok(())
}

/// `Changes` lists exactly the owners whose stored state (holds, token,
/// deadline, presence) changed, plus possibly owners answered with a grant or
/// renewal that left their state equal (a re-entry at the same `now` with the
/// same ttl rewrites an equal deadline). A replica fed with them stays equal.
fn check_changes(
    n: usize,
    op: &Op,
    core: &mut Core,
    key: usize,
    before: &Stored,
    step: &Step,
) -> Result<(), TestCaseError> {
    let after = stored(&core.locks[key]);
    let owners: BTreeSet<&Owner> = before.keys().chain(after.keys()).collect();
    let differ: BTreeSet<Owner> = owners
        .into_iter()
        .filter(|o| before.get(*o) != after.get(*o))
        .cloned()
        .collect();
    let listed: BTreeSet<Owner> = step.changes.owners().map(Owner::from).collect();
    prop_assert_eq!(
        listed.len(),
        step.changes.owners().count(),
        "repeats in Changes"
    );
    prop_assert!(
        differ.is_subset(&listed),
        "step {}: {:?}: changed {:?} but Changes lists {:?}",
        n,
        op,
        differ,
        listed
    );
    let extra: BTreeSet<&Owner> = listed.difference(&differ).collect();
    prop_assert!(
        extra.iter().all(|o| step.answered_ok.contains(*o)),
        "step {}: {:?}: Changes lists unchanged {:?}",
        n,
        op,
        extra
    );

    // A replica applying exactly the listed owners' state stays equal.
    // As replication.rs does, drops go first: `Changes` may list a
    // re-granted owner before an expired one it purged in the same step.
    let master = &core.locks[key];
    let replica = &mut core.replicas[key];
    for owner in step.changes.owners() {
        if master.holder(owner).is_none() {
            prop_assert!(replica.remove(owner), "step {}: drop of an absent owner", n);
        }
    }
    for owner in step.changes.owners() {
        if let Some(h) = master.holder(owner) {
            prop_assert_eq!(
                replica.put(master.kind(), h.to_owned()),
                Ok(()),
                "step {}",
                n
            );
        }
    }
    prop_assert_eq!(stored(replica), after, "step {}: replica differs", n);
    if !master.is_empty() {
        prop_assert_eq!(replica.mode(), master.mode());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The core follows the model step by step, and every invariant holds.
    #[test]
    fn core_matches_the_model(
        first_token in start_token(),
        start in 1_000_000u64..2_000_000,
        ops in prop::collection::vec(op(), 0..=MAX_STEPS),
    ) {
        run(first_token, start, &ops)?;
    }

    /// `Lock::first` (the shell's fast path for a grant on a free key)
    /// answers and leaves exactly what `try_acquire` on an empty lock with
    /// nobody queued does: the same token, block, counter and refusals.
    #[test]
    fn first_is_try_acquire_on_a_free_key(
        first_token in start_token(),
        kind in prop_oneof![
            Just(Kind::Acquire),
            Just(Kind::Racquire),
            Just(Kind::Read),
            any::<u32>().prop_map(Kind::Semaphore),
        ],
        owner in prop::collection::vec(any::<u8>(), 1..300),
        ttl in prop_oneof![1u64..100_000, Just(u64::MAX)],
        now in any::<u64>(),
    ) {
        let req = Request { kind, owner: owner.clone().into(), ttl };
        let mut general = Tokens::starting_after(first_token);
        let mut fast = general;
        let mut lock = Lock::default();
        let mut changes = Changes::default();
        let attempt = lock.try_acquire(&req, false, now, &mut general, &mut changes);
        match Lock::first(&req, now, &mut fast) {
            Ok((made, token)) => {
                prop_assert_eq!(attempt, Attempt::Granted(token));
                prop_assert_eq!(made.saved(), lock.saved());
                prop_assert_eq!(made.mode(), lock.mode());
                prop_assert_eq!(made.limit(), lock.limit());
                prop_assert_eq!(made.memory_usage(), lock.memory_usage());
                prop_assert_eq!(changes.owners().collect::<Vec<_>>(), vec![&owner[..]]);
            }
            Err(refused) => {
                prop_assert_eq!(attempt, refused);
                prop_assert!(lock.is_empty());
                prop_assert!(changes.is_empty());
            }
        }
        prop_assert_eq!(fast, general);
    }

    /// `release_sole` and `renew_sole` (the shell's one-step release and
    /// renewal) leave exactly what `release` and `renew` leave, and act on
    /// exactly the locks where those touch the one live holder and expire
    /// nothing (holding once, for a release); elsewhere they change nothing.
    #[test]
    fn sole_release_and_renew_are_the_general_ones(
        kind in prop_oneof![
            Just(Kind::Racquire),
            Just(Kind::Read),
            (1u32..4).prop_map(Kind::Semaphore),
        ],
        raw in prop::collection::btree_map(0u8..3, (1u32..3, 0u64..20), 1..4),
        who in 0u8..4,
        now in 0u64..20,
        ttl in prop_oneof![0u64..10, Just(u64::MAX)],
    ) {
        let semaphore = matches!(kind, Kind::Semaphore(_));
        let holders: Vec<Holder> = raw
            .iter()
            .zip(1u64..)
            .map(|((&o, &(holds, deadline)), token)| Holder {
                owner: name(o),
                holds: if semaphore { 1 } else { holds },
                since: 3,
                token,
                deadline,
            })
            .collect();
        let make = || Lock::from_holders(kind, holders.clone());
        prop_assume!(make().is_ok());
        let owner = name(who);
        let untouched = make().unwrap();
        let one = untouched.holder_count() == 1;

        let (mut general, mut fast) = (make().unwrap(), make().unwrap());
        let mut changes = Changes::default();
        let outcome = general.release(&owner, now, &mut changes);
        let simple = one && outcome == Release::Last && changes.expired() == 0;
        match fast.release_sole(&owner, now) {
            Some(held) => {
                prop_assert!(simple);
                prop_assert!(fast.is_empty() && general.is_empty());
                prop_assert_eq!(changes.owners().collect::<Vec<_>>(), vec![&owner[..]]);
                prop_assert_eq!(changes.held().collect::<Vec<_>>(), vec![held]);
            }
            None => {
                prop_assert!(!simple);
                prop_assert_eq!(fast.saved(), untouched.saved());
            }
        }

        let (mut general, mut fast) = (make().unwrap(), make().unwrap());
        let mut changes = Changes::default();
        let renewed = general.renew(&owner, ttl, now, &mut changes);
        let simple = one && renewed && changes.expired() == 0;
        match fast.renew_sole(&owner, ttl, now) {
            Some(deadline) => {
                prop_assert!(simple);
                prop_assert_eq!(fast.saved(), general.saved());
                prop_assert_eq!(fast.latest_deadline(), Some(deadline));
                prop_assert_eq!(fast.sweep_at(), None);
                prop_assert_eq!(changes.owners().collect::<Vec<_>>(), vec![&owner[..]]);
            }
            None => {
                prop_assert!(!simple);
                prop_assert_eq!(fast.saved(), untouched.saved());
            }
        }
    }

    /// from_holders accepts exactly the consistent states and keeps them as given.
    #[test]
    fn from_holders_round_trips(
        exclusive in any::<bool>(),
        raw in prop::collection::btree_map(0u8..6, (1u32..5, 1u64..1000, 0u64..100), 0..5),
        zero in prop::option::of(0usize..3),
    ) {
        let mode = if exclusive { Mode::Exclusive } else { Mode::Shared };
        let mut holders: Vec<Holder> = raw
            .iter()
            // Distinct tokens (no server issues one twice): base * 8 + owner.
            .map(|(&o, &(holds, token, deadline))| Holder { owner: name(o), holds, since: 0, token: token * 8 + u64::from(o), deadline })
            .collect();
        let mut expected: Result<(), Invalid> = Ok(());
        if exclusive && holders.len() > 1 {
            expected = Err(Invalid::SecondExclusiveHolder);
        }
        // Spoil the first holder in one of three ways.
        match (zero, holders.first_mut()) {
            (Some(0), Some(h)) => { h.owner = Box::default(); expected = Err(Invalid::EmptyOwner); }
            (Some(1), Some(h)) => { h.holds = 0; expected = Err(Invalid::ZeroHolds); }
            (Some(2), Some(h)) => { h.token = 0; expected = Err(Invalid::ZeroToken); }
            _ => {}
        }
        let built = Lock::from_holders(Kind::of(mode, None).unwrap(), holders.clone());
        match expected {
            Ok(()) => {
                let lock = built.unwrap();
                prop_assert_eq!(lock.holders().map(|h| h.to_owned()).collect::<Vec<_>>(), holders.clone());
                if !holders.is_empty() {
                    prop_assert_eq!(lock.mode(), mode);
                }
                let again = Lock::from_holders(lock.kind(), lock.holders().map(|h| h.to_owned()).collect());
                if !lock.is_empty() {
                    // RDB encoding 3: the block itself, read back.
                    // What its one walk found is what walks of the lock find.
                    let saved = Lock::from_saved(lock.saved().to_vec(), 5).unwrap();
                    prop_assert_eq!(&saved.lock, &lock);
                    prop_assert!(saved.lock.holders().all(|h| h.since == 5));
                    prop_assert_eq!(Some(saved.highest_token), lock.holders().map(|h| h.token).max());
                    prop_assert_eq!(saved.sweep_at, lock.sweep_at());
                    // And the older encodings' walk of a lock built from fields.
                    let fields = Lock::from_holders(lock.kind(), lock.holders().map(|h| h.to_owned()).collect());
                    let walked = fields.unwrap().loaded();
                    prop_assert_eq!((walked.highest_token, walked.sweep_at), (saved.highest_token, saved.sweep_at));
                }
                prop_assert_eq!(again, Ok(lock));
            }
            Err(e) => prop_assert_eq!(built, Err(e)),
        }
        // Two holders with one token are refused.
        if expected.is_ok() && !exclusive && holders.len() >= 2 {
            let mut dup = holders.clone();
            dup[1].token = dup[0].token;
            prop_assert_eq!(Lock::from_holders(Kind::of(mode, None).unwrap(), dup), Err(Invalid::DuplicateToken));
        }
        // A duplicate owner is refused.
        if let Some(h) = holders.first().cloned() {
            if expected.is_ok() && !exclusive {
                let mut dup = holders.clone();
                dup.push(h);
                prop_assert_eq!(Lock::from_holders(Kind::of(mode, None).unwrap(), dup), Err(Invalid::DuplicateOwner));
            }
        }
    }
}

/// A re-entry that would overflow the hold count is refused and changes nothing.
#[test]
fn too_many_holds_changes_nothing() {
    for kind in [Kind::Racquire, Kind::Read] {
        let holder = Holder {
            owner: name(1),
            holds: u32::MAX - 1,
            since: 0,
            token: 7,
            deadline: 100,
        };
        let mut lock = Lock::from_holders(kind, vec![holder]).unwrap();
        let mut tokens = Tokens::starting_after(7);
        let mut c = Changes::default();
        let r = request(kind, 1, 50);
        assert_eq!(
            lock.try_acquire(&r, true, 10, &mut tokens, &mut c),
            Attempt::Granted(7)
        );
        let before = lock.clone();
        let mut c = Changes::default();
        assert_eq!(
            lock.try_acquire(&r, false, 20, &mut tokens, &mut c),
            Attempt::TooManyHolds
        );
        assert_eq!(lock, before);
        assert!(c.is_empty());
        assert_eq!(tokens.last(), 7);
        if kind == Kind::Racquire {
            // ACQUIRE adds no hold, so it still succeeds.
            let a = request(Kind::Acquire, 1, 50);
            assert_eq!(
                lock.try_acquire(&a, false, 20, &mut tokens, &mut c),
                Attempt::Granted(7)
            );
        }
    }
}

proptest! {
    /// Whatever bytes a file holds, loading them answers, never panics; and
    /// a saved lock with any byte changed or cut is refused or still a
    /// valid lock.
    #[test]
    fn saved_locks_load_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..200),
                                       flip in any::<(usize, u8)>(), cut in any::<usize>()) {
        let _ = Lock::from_saved(bytes, 1);
        let holders = vec![
            Holder { owner: b"a"[..].into(), holds: 1, since: 0, token: 7, deadline: 9 },
            Holder { owner: b"bb"[..].into(), holds: 2, since: 0, token: 8, deadline: 10 },
        ];
        let lock = Lock::from_holders(Kind::Read, holders).unwrap();
        let mut saved = lock.saved().to_vec();
        let i = flip.0 % saved.len();
        saved[i] ^= flip.1;
        if let Ok(l) = Lock::from_saved(saved.clone(), 1) {
            prop_assert!(l.lock.holders().count() == l.lock.holder_count());
            prop_assert_eq!(Some(l.highest_token), l.lock.holders().map(|h| h.token).max());
            prop_assert_eq!(l.sweep_at, l.lock.sweep_at());
        }
        saved.truncate(cut % saved.len());
        prop_assert!(Lock::from_saved(saved, 1).is_err(), "a cut block");
    }
}
