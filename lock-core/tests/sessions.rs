//! Property tests of sessions in the core (contract v4, "Sessions"): a
//! holder's lease is its own or its session's, and the core decides from
//! the sessions' deadlines it is given (`Lock::end_sessions`,
//! `HolderRef::deadline_with`), never from a table or a clock of its own.
//!
//! Random sequences over one key, a few owners and two sessions (grants with
//! and without `SESSION`, releases, renewals, keepalives that lengthen or
//! shorten a session, closes, the clock moving) run on the core as the
//! shell drives it (every transaction first ends the holders of ended
//! sessions) and on an independent model: owner -> (holds, token, own
//! deadline or session). After every step the stored holders, who is live,
//! every lease's end, and the sessions' memberships reported by `Changes`
//! (`joined`, `Ended::session`) equal the model's.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;

use proptest::prelude::*;

use lock_core::lock::{session_deadline, session_of, MAX_DEADLINE};
use lock_core::tokens::Tokens;
use lock_core::{Attempt, Changes, Kind, Lock, Owner, Release, Request};

const OWNERS: u8 = 4;
/// Session ids (drawn like tokens in the shell; any positive id here).
const SESSIONS: [u64; 2] = [7, 1_795_000_000_000_001];

#[derive(Clone, Debug)]
enum Op {
    Grant {
        kind: Kind,
        owner: u8,
        ttl: u64,
        session: Option<usize>,
    },
    Release {
        owner: u8,
    },
    Renew {
        owner: u8,
        ttl: u64,
    },
    /// Open, or KEEPALIVE: the session's deadline is now + ttl.
    Keep {
        session: usize,
        ttl: u64,
    },
    Close {
        session: usize,
    },
    Clock {
        ms: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let kind = prop_oneof![
        1 => Just(Kind::Acquire),
        1 => Just(Kind::Racquire),
        2 => Just(Kind::Read),
        1 => Just(Kind::Semaphore(2)),
    ];
    let session = prop_oneof![1 => Just(None), 2 => (0..SESSIONS.len()).prop_map(Some)];
    prop_oneof![
        5 => (kind, 0..OWNERS, 1u64..40, session)
            .prop_map(|(kind, owner, ttl, session)| Op::Grant { kind, owner, ttl, session }),
        2 => (0..OWNERS).prop_map(|owner| Op::Release { owner }),
        2 => (0..OWNERS, 1u64..40).prop_map(|(owner, ttl)| Op::Renew { owner, ttl }),
        3 => (0..SESSIONS.len(), 1u64..60).prop_map(|(session, ttl)| Op::Keep { session, ttl }),
        1 => (0..SESSIONS.len()).prop_map(|session| Op::Close { session }),
        3 => (0u64..25).prop_map(|ms| Op::Clock { ms }),
    ]
}

fn name(owner: u8) -> Owner {
    vec![b'o', owner].into_boxed_slice()
}

/// The model's holder: holds, token, and its lease: its own deadline or
/// the session it follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MHolder {
    holds: u32,
    token: u64,
    lease: Lease,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lease {
    Own(u64),
    Session(u64),
}

struct Model {
    now: u64,
    /// Open sessions: id -> deadline.
    sessions: BTreeMap<u64, u64>,
    holders: BTreeMap<u8, MHolder>,
    /// How many holders follow each session.
    members: BTreeMap<u64, i64>,
}

impl Model {
    fn end(&self, lease: Lease) -> u64 {
        match lease {
            Lease::Own(d) => d,
            Lease::Session(id) => self.sessions.get(&id).copied().unwrap_or(0),
        }
    }

    fn live(&self, h: &MHolder) -> bool {
        self.now < self.end(h.lease)
    }

    /// What every transaction does first: holders whose session ended
    /// leave.
    fn end_sessions(&mut self) {
        let ended: Vec<u8> = self
            .holders
            .iter()
            .filter(|(_, h)| matches!(h.lease, Lease::Session(_)) && !self.live(h))
            .map(|(o, _)| *o)
            .collect();
        for o in ended {
            self.leave(o);
        }
    }

    /// What a grant, a release and a renewal do first: holders whose
    /// lease ended leave.
    fn purge(&mut self) {
        let ended: Vec<u8> = self
            .holders
            .iter()
            .filter(|(_, h)| !self.live(h))
            .map(|(o, _)| *o)
            .collect();
        for o in ended {
            self.leave(o);
        }
    }

    fn leave(&mut self, owner: u8) {
        if let Some(MHolder {
            lease: Lease::Session(id),
            ..
        }) = self.holders.remove(&owner)
        {
            *self.members.entry(id).or_default() -= 1;
        }
    }
}

/// The core's leases as the model writes them.
fn stored(lock: &Lock) -> BTreeMap<Owner, (u32, u64, u64)> {
    lock.holders()
        .map(|h| (Owner::from(h.owner), (h.holds, h.token, h.deadline)))
        .collect()
}

fn model_stored(m: &Model) -> BTreeMap<Owner, (u32, u64, u64)> {
    m.holders
        .iter()
        .map(|(o, h)| {
            let deadline = match h.lease {
                Lease::Own(d) => d,
                Lease::Session(id) => session_deadline(id),
            };
            (name(*o), (h.holds, h.token, deadline))
        })
        .collect()
}

/// The memberships a transaction's `Changes` report, applied to `members`.
fn follow(members: &mut BTreeMap<u64, i64>, changes: &Changes) {
    for e in changes.ended().filter(|e| e.session != 0) {
        *members.entry(e.session).or_default() -= 1;
    }
    for (from, to) in changes.joined() {
        if from != 0 {
            *members.entry(from).or_default() -= 1;
        }
        *members.entry(to).or_default() += 1;
    }
}

fn run(ops: &[Op]) {
    let mut lock = Lock::default();
    let mut tokens = Tokens::starting_after(1000);
    let mut m = Model {
        now: 1_000_000,
        sessions: BTreeMap::new(),
        holders: BTreeMap::new(),
        members: BTreeMap::new(),
    };
    // The shell's table is the model's sessions; its counts follow Changes.
    let mut members: BTreeMap<u64, i64> = BTreeMap::new();
    for (n, op) in ops.iter().enumerate() {
        let ctx = format!("step {n}: {op:?} at {}", m.now);
        let now = m.now;
        let table = m.sessions.clone();
        let deadline_of = |id: u64| table.get(&id).copied();
        let mut changes = Changes::default();
        if let Op::Grant {
            session: Some(i), ..
        } = *op
        {
            if deadline_of(SESSIONS[i]).is_none_or(|d| d <= now) {
                // The shell answers NOSESSION before any transaction.
                continue;
            }
        }
        let keyed = !matches!(op, Op::Keep { .. } | Op::Close { .. } | Op::Clock { .. });
        if keyed {
            lock.end_sessions(deadline_of, now, &mut changes);
            m.end_sessions();
        }
        match *op {
            Op::Grant {
                kind,
                owner,
                ttl,
                session,
            } => {
                let session = session.map_or(0, |i| SESSIONS[i]);
                m.purge();
                let req = Request {
                    kind,
                    owner: name(owner),
                    ttl,
                    session,
                };
                let got = lock.try_acquire(&req, false, now, &mut tokens, &mut changes);
                let own = now.saturating_add(ttl).min(MAX_DEADLINE);
                // Who else holds (all live, after the purge), and whether
                // they admit a newcomer of this kind.
                let others: Vec<u8> = m.holders.keys().copied().filter(|o| *o != owner).collect();
                let admits = others.is_empty()
                    || match kind {
                        Kind::Read => lock.mode() == lock_core::Mode::Shared,
                        Kind::Semaphore(l) => {
                            lock.mode() == lock_core::Mode::Semaphore && others.len() < l as usize
                        }
                        _ => false,
                    };
                match m.holders.get(&owner).copied() {
                    Some(h) => {
                        let mut h = h;
                        if matches!(kind, Kind::Racquire | Kind::Read) {
                            h.holds += 1;
                        }
                        let lease = match (session, h.lease) {
                            (0, Lease::Own(_)) => Lease::Own(own),
                            (0, l) => l,
                            (s, _) => Lease::Session(s),
                        };
                        if let Attempt::Granted(t) = got {
                            {
                                assert_eq!(t, h.token, "{ctx}: a repeat keeps its token");
                                if let (Lease::Session(a), Lease::Session(b)) = (h.lease, lease) {
                                    if a != b {
                                        *m.members.entry(a).or_default() -= 1;
                                        *m.members.entry(b).or_default() += 1;
                                    }
                                } else if let (Lease::Own(_), Lease::Session(b)) = (h.lease, lease)
                                {
                                    *m.members.entry(b).or_default() += 1;
                                }
                                h.lease = lease;
                                m.holders.insert(owner, h);
                            }
                        }
                    }
                    None => {
                        assert_eq!(
                            matches!(got, Attempt::Granted(_)),
                            admits,
                            "{ctx}: a newcomer is granted iff the live holders admit it: {got:?}"
                        );
                        if let Attempt::Granted(t) = got {
                            let lease = match session {
                                0 => Lease::Own(own),
                                s => {
                                    *m.members.entry(s).or_default() += 1;
                                    Lease::Session(s)
                                }
                            };
                            m.holders.insert(
                                owner,
                                MHolder {
                                    holds: 1,
                                    token: t,
                                    lease,
                                },
                            );
                        }
                    }
                }
            }
            Op::Release { owner } => {
                m.purge();
                let got = lock.release(&name(owner), None, now, &mut changes);
                let want = match m.holders.get_mut(&owner) {
                    None => Release::NotHeld,
                    Some(h) if h.holds > 1 => {
                        h.holds -= 1;
                        Release::Remaining
                    }
                    Some(_) => {
                        m.leave(owner);
                        Release::Last
                    }
                };
                assert_eq!(got, want, "{ctx}");
            }
            Op::Renew { owner, ttl } => {
                m.purge();
                let got = lock.renew(&name(owner), ttl, None, now, &mut changes);
                let want = match m.holders.get_mut(&owner) {
                    None => false,
                    Some(h) => {
                        // A session holder's renewal changes nothing.
                        if let Lease::Own(_) = h.lease {
                            h.lease = Lease::Own(now.saturating_add(ttl).min(MAX_DEADLINE));
                        }
                        true
                    }
                };
                assert_eq!(got, want, "{ctx}");
            }
            Op::Keep { session, ttl } => {
                m.sessions.insert(SESSIONS[session], now + ttl);
            }
            Op::Close { session } => {
                m.sessions.remove(&SESSIONS[session]);
            }
            Op::Clock { ms } => m.now += ms,
        }
        follow(&mut members, &changes);
        // The stored state is the model's.
        assert_eq!(stored(&lock), model_stored(&m), "{ctx}");
        // Every lease's end and liveness, with the sessions as they are now.
        let table = m.sessions.clone();
        let deadline_of = |id: u64| table.get(&id).copied();
        for h in lock.holders() {
            let o = h.owner[1];
            let mh = m.holders[&o];
            assert_eq!(h.deadline_with(deadline_of), m.end(mh.lease), "{ctx}");
            assert_eq!(h.is_live_with(m.now, deadline_of), m.live(&mh), "{ctx}");
            assert_eq!(
                h.session(),
                match mh.lease {
                    Lease::Session(id) => Some(id),
                    Lease::Own(_) => None,
                },
                "{ctx}"
            );
            assert!(session_of(h.deadline).is_some() == h.session().is_some());
        }
        // A holder following a session keeps the key's own expiry out of it.
        if lock.holders().any(|h| h.session().is_some()) {
            assert!(
                lock.latest_deadline()
                    .is_some_and(|d| session_of(d).is_some()),
                "{ctx}"
            );
            assert!(
                lock.earliest_deadline()
                    .is_none_or(|d| session_of(d).is_none()),
                "{ctx}"
            );
            assert!(
                lock.sweep_at().is_none_or(|d| session_of(d).is_none()),
                "{ctx}"
            );
        }
        // The memberships the changes reported are the model's.
        let nonzero = |b: &BTreeMap<u64, i64>| -> BTreeMap<u64, i64> {
            b.iter()
                .filter(|(_, n)| **n != 0)
                .map(|(k, v)| (*k, *v))
                .collect()
        };
        assert_eq!(nonzero(&members), nonzero(&m.members), "{ctx}: memberships");
    }
    // A copy made by DUMP/RESTORE: every session holder takes its session's
    // deadline as its own lease.
    let table = m.sessions.clone();
    let mut copy = lock.clone();
    copy.materialize_sessions(|id| table.get(&id).copied());
    for (h, c) in lock.holders().zip(copy.holders()) {
        assert_eq!(c.session(), None);
        assert_eq!(c.deadline, h.deadline_with(|id| table.get(&id).copied()));
        assert_eq!((c.owner, c.holds, c.token), (h.owner, h.holds, h.token));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn sessions_match_the_model(ops in prop::collection::vec(op(), 1..60)) {
        run(&ops);
    }
}

/// Ending a session ends its holders at once, whatever their number, and
/// only them; a repeat without SESSION keeps its session; a renewal of a
/// session holder changes nothing.
#[test]
fn a_session_end_ends_its_holders_and_only_them() {
    let mut lock = Lock::default();
    let mut tokens = Tokens::starting_after(1);
    let mut changes = Changes::default();
    for o in 0..50u8 {
        let session = if o % 2 == 0 { 7 } else { 0 };
        let req = Request {
            kind: Kind::Read,
            owner: name(o),
            ttl: 100,
            session,
        };
        assert!(matches!(
            lock.try_acquire(&req, false, 10, &mut tokens, &mut changes),
            Attempt::Granted(_)
        ));
    }
    assert_eq!(changes.joined().count(), 25);
    let req = Request {
        kind: Kind::Read,
        owner: name(0),
        ttl: 5,
        session: 0,
    };
    lock.try_acquire(&req, false, 11, &mut tokens, &mut changes);
    assert_eq!(lock.holder(&name(0)).unwrap().session(), Some(7));
    assert!(lock.renew(&name(0), 1, None, 12, &mut changes));
    assert_eq!(lock.holder(&name(0)).unwrap().session(), Some(7));
    let mut changes = Changes::default();
    // Live: nothing ends.
    assert_eq!(lock.end_sessions(|_| Some(1000), 20, &mut changes), 0);
    assert!(changes.is_empty());
    // Ended (unknown): its 25 end, at the end given (now, here).
    assert_eq!(lock.end_sessions(|_| None, 20, &mut changes), 25);
    assert_eq!(lock.holder_count(), 25);
    assert_eq!(changes.expired(), 25);
    assert!(changes.ended().all(|e| e.session == 7));
    assert!(lock.holders().all(|h| h.session().is_none()));
}
