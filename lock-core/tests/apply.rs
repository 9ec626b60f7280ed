//! A replica's apply of one effect (`Lock::apply_set`, `Lock::apply_drop`:
//! one walk of the holders) against its definition: the owner's holder
//! looked up, `force` or `remove`, then `sweep_at` and `latest_deadline`,
//! each a walk of its own.

use lock_core::lock::session_deadline;
use lock_core::{Applied, Holder, Invalid, Kind, Lock};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Set {
        kind: Kind,
        owner: u8,
        holds: u32,
        since: u32,
        token: u64,
        deadline: u64,
    },
    Drop(u8),
}

fn owner(o: u8) -> Box<[u8]> {
    format!("o{o}").into_bytes().into()
}

/// The definition: what `LOCK.SYNC` did before the one walk.
fn by_definition(lock: &mut Lock, op: &Op) -> Result<Applied, Invalid> {
    match op {
        Op::Set {
            kind,
            owner: o,
            holds,
            since,
            token,
            deadline,
        } => {
            let followed = lock.holder(&owner(*o)).and_then(|h| h.session());
            lock.force(
                *kind,
                Holder {
                    owner: owner(*o),
                    holds: *holds,
                    since: *since,
                    token: *token,
                    deadline: *deadline,
                },
            )?;
            Ok(Applied {
                followed,
                deadlines: deadlines(lock),
            })
        }
        Op::Drop(o) => {
            let followed = lock.holder(&owner(*o)).and_then(|h| h.session());
            lock.remove(&owner(*o));
            Ok(Applied {
                followed,
                deadlines: deadlines(lock),
            })
        }
    }
}

fn deadlines(lock: &Lock) -> Option<(u64, u64)> {
    let lo = lock.holders().map(|h| h.deadline).min()?;
    Some((lo, lock.latest_deadline()?))
}

fn applied(lock: &mut Lock, op: &Op) -> Result<Applied, Invalid> {
    match op {
        Op::Set {
            kind,
            owner: o,
            holds,
            since,
            token,
            deadline,
        } => lock.apply_set(
            *kind,
            Holder {
                owner: owner(*o),
                holds: *holds,
                since: *since,
                token: *token,
                deadline: *deadline,
            },
        ),
        Op::Drop(o) => Ok(lock.apply_drop(&owner(*o))),
    }
}

/// A holder's every field: owner, holds, since, token, deadline.
type Fields = (Vec<u8>, u32, u32, u64, u64);

/// Every field, `since` included, in order.
fn state(lock: &Lock) -> (Option<Kind>, Vec<Fields>) {
    let kind = (!lock.is_empty()).then(|| lock.kind());
    let holders = lock
        .holders()
        .map(|h| (h.owner.to_vec(), h.holds, h.since, h.token, h.deadline))
        .collect();
    (kind, holders)
}

/// When a walk of the holders says the lock must be visited: the earliest
/// deadline, when it is a holder's own and not the latest.
fn walked_sweep_at(lock: &Lock) -> Option<u64> {
    let lo = lock.holders().map(|h| h.deadline).min()?;
    let hi = lock.holders().map(|h| h.deadline).max()?;
    (lo != hi && lock_core::lock::session_of(lo).is_none()).then_some(lo)
}

fn op() -> impl Strategy<Value = Op> {
    let kind = prop_oneof![
        Just(Kind::Acquire),
        Just(Kind::Racquire),
        Just(Kind::Read),
        Just(Kind::Read),
        Just(Kind::Read),
        (0u32..5).prop_map(Kind::Semaphore),
    ];
    let deadline = prop_oneof![
        (0u64..6).prop_map(|d| 1_000 + d),
        (1u64..4).prop_map(session_deadline),
    ];
    prop_oneof![
        4 => (kind, 0u8..8, 0u32..3, 0u32..3, 0u64..14, deadline).prop_map(
            |(kind, owner, holds, since, token, deadline)| Op::Set {
                kind,
                owner,
                holds,
                since,
                token,
                deadline,
            }
        ),
        1 => (0u8..8).prop_map(Op::Drop),
    ]
}

proptest! {
    /// Any sequence of effects, of every kind, on whatever state the
    /// earlier ones left (owners and tokens clashing, modes changing,
    /// semaphores past their limit, holders following sessions): the same
    /// state, the same answer and the same report as the definition.
    #[test]
    fn an_apply_is_its_definition(ops in proptest::collection::vec(op(), 0..60)) {
        let (mut model, mut lock) = (Lock::default(), Lock::default());
        for op in &ops {
            let want = by_definition(&mut model, op);
            let got = applied(&mut lock, op);
            prop_assert_eq!(&got, &want, "{:?}", op);
            prop_assert_eq!(state(&lock), state(&model), "{:?}", op);
            if let Ok(a) = got {
                prop_assert_eq!(a.sweep_at(), walked_sweep_at(&model));
                // The lock's own plan (a kept bound, no walk) is never later.
                if let Some(at) = a.sweep_at() {
                    prop_assert!(lock.sweep_at().is_some_and(|s| s <= at));
                }
                prop_assert_eq!(a.latest_deadline(), model.latest_deadline());
            }
        }
    }
}

fn reader(i: u64, deadline: u64) -> Holder {
    Holder {
        owner: format!("reader-{i}").into_bytes().into(),
        holds: 1,
        since: 0,
        token: i + 1,
        deadline,
    }
}

/// 10,000 readers granted one by one as a master's stream carries them,
/// then renewed, re-entered, dropped: the lock the definition builds from
/// the same holders (each step's report checked against running extremes).
#[test]
fn ten_thousand_readers_applied_one_by_one_are_the_definitions_lock() {
    let mut lock = Lock::default();
    let n = 10_000;
    let (mut lo, mut hi) = (u64::MAX, 0);
    let mut all = Vec::new();
    for i in 0..n {
        let h = reader(i, 1_000 + (i * 7919) % 997);
        (lo, hi) = (lo.min(h.deadline), hi.max(h.deadline));
        all.push(h.clone());
        let got = lock.apply_set(Kind::Read, h).unwrap();
        assert_eq!((got.followed, got.deadlines), (None, Some((lo, hi))));
    }
    let mut model = Lock::from_holders(Kind::Read, all).unwrap();
    assert_eq!(state(&lock), state(&model));
    let mut renewed = reader(5_000, 9_000);
    renewed.holds = 2;
    lock.apply_set(Kind::Read, renewed.clone()).unwrap();
    model.force(Kind::Read, renewed).unwrap();
    let got = lock.apply_drop(b"reader-7");
    model.remove(b"reader-7");
    assert_eq!(got.deadlines, deadlines(&model));
    assert_eq!(got.sweep_at(), model.sweep_at());
    assert_eq!(state(&lock), state(&model));
    assert_eq!(lock.holder_count(), (n - 1) as usize);
}
