//! Property tests: the core ([`Lock`], [`Queue`], [`Tokens`]) against the
//! reference model of the dev crate `lock-model`.
//!
//! `core_matches_the_model` runs random sequences of up to 60 operations
//! over 3 keys and 5 owners (`lock_model::op::Op`, from the strategies in
//! `lock_model::op::strategy`) through the one checker,
//! `lock_model::check`, which the fuzz runner uses too: it applies each
//! operation to the core (as the shell drives it) and to the model, compares
//! them and checks the contract's invariants after every step. The other
//! tests here check one transition or one encoding on its own.
//!
//! [`Queue`]: lock_core::Queue

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use proptest::prelude::*;

use lock_core::tokens::Tokens;
use lock_core::{Attempt, Changes, Holder, Invalid, Kind, Lock, Mode, Owner, Release, Request};
use lock_model::check::check;
use lock_model::op::{strategy, Op, Start, Who};

const MAX_STEPS: usize = 60;

/// Owner names are binary (a NUL byte inside) to keep them binary-safe.
fn name(owner: u8) -> Owner {
    vec![b'o', 0, b'0' + owner].into_boxed_slice()
}

fn request(kind: Kind, owner: u8, ttl: u64) -> Request {
    Request {
        kind,
        owner: name(owner),
        ttl,
    }
}

/// The case proptest once shrank a failure to (the first entry of
/// `model.proptest-regressions`, whose seed the strategies of the one op
/// type no longer map to it): a reader queued behind nobody, a grant, the
/// clock, then a writer.
#[test]
fn core_matches_the_model_regression() {
    let start = Start {
        last_token: 0,
        now: 1_000_000,
        max_holders: 1000,
    };
    check(
        start,
        &[
            Op::Enqueue {
                key: 1,
                kind: Kind::Read,
                owner: 2,
                ttl: 1,
                try_first: true,
                part: false,
            },
            Op::Grant {
                key: 1,
                kind: Kind::Read,
                who: Who::Owner(0),
                ttl: 1,
            },
            Op::Clock {
                forward: true,
                ms: 1,
            },
            Op::Grant {
                key: 1,
                kind: Kind::Acquire,
                who: Who::Owner(2),
                ttl: 1,
            },
        ],
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The core follows the model step by step, and every invariant holds.
    #[test]
    fn core_matches_the_model(
        start in strategy::start(),
        ops in prop::collection::vec(strategy::op(), 0..=MAX_STEPS),
    ) {
        check(start, &ops);
    }
    /// `Lock::first` (the shell's fast path for a grant on a free key)
    /// answers and leaves exactly what `try_acquire` on an empty lock with
    /// nobody queued does: the same token, block, counter and refusals.
    #[test]
    fn first_is_try_acquire_on_a_free_key(
        first_token in strategy::start().prop_map(|s| s.last_token),
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
    /// With a `token` (`TOKEN`: the holder's own, another grant's, or none
    /// issued) as well as without.
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
        token in prop::option::of(0u64..6),
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
        let outcome = general.release(&owner, token, now, &mut changes);
        let simple = one && outcome == Release::Last && changes.expired() == 0;
        match fast.release_sole(&owner, token, now) {
            Some(ended) => {
                prop_assert!(simple);
                prop_assert!(fast.is_empty() && general.is_empty());
                prop_assert_eq!(changes.owners().collect::<Vec<_>>(), vec![&owner[..]]);
                prop_assert_eq!(changes.ended().collect::<Vec<_>>(), vec![ended]);
            }
            None => {
                prop_assert!(!simple);
                prop_assert_eq!(fast.saved(), untouched.saved());
            }
        }

        let (mut general, mut fast) = (make().unwrap(), make().unwrap());
        let mut changes = Changes::default();
        let renewed = general.renew(&owner, ttl, token, now, &mut changes);
        let simple = one && renewed && changes.expired() == 0;
        match fast.renew_sole(&owner, ttl, token, now) {
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
