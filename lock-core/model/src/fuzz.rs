//! Fuzzing the pure core: bytes decoded into operations on a few keys, with
//! clock jumps forward and backward and replicated effects, checking the
//! contract's invariants after every step.
//!
//! One decoder and one checker, used by two drivers:
//! - the libFuzzer target `fuzz/fuzz_targets/core_ops.rs` (`cargo fuzz`;
//!   `make fuzz`), which depends on this crate;
//! - the bounded run of `lock-core/tests/fuzz.rs` (part of `cargo test`),
//!   which feeds pseudo-random inputs from a seeded xorshift for
//!   `CORE_FUZZ_SECS` seconds (default 10; `CORE_FUZZ_SEED` replays a run).
//!
//! [`run`] panics (with the step and the reason) on the first broken
//! invariant. Besides comparing every result and every stored state with a
//! small reference model written here, it checks, independently of the
//! model: at most one exclusive holder and never beside a live reader; no
//! duplicate owner, holds >= 1, token >= 1; a new grant's token is above every
//! token issued or observed before, and live tokens are unique across keys;
//! a dropped token never comes back; `live` never reports an expired holder
//! and a grant is live at once; a refusal, a conflict or a failed `put`
//! changes nothing but the purge of expired holders; the queue answers its
//! head in order, never a removed or answered waiter, and stops only at a
//! head that really cannot be granted; `Changes` lists every owner whose
//! stored state changed (and a replica fed with exactly those is equal to
//! the master); and nothing panics.
//!
//! The clock may run backwards here (a wall clock can be stepped back): a
//! holder past its deadline that no transition has dropped yet is then live
//! again. That is allowed; what must hold is that no transition ever grants
//! on top of a live holder, and that a holder once dropped never returns.

use std::collections::{BTreeMap, BTreeSet};

use lock_core::tokens::{Tokens, MAX_TOKEN};
use lock_core::{
    Attempt, Changes, Holder, HolderRef, Kind, Lock, Mode, Owner, Queue, Release, Request,
};

use crate::model::{mode_of, reentrant, MHold, MKey, MWait, Model};

/// How many lock keys an input drives.
pub const KEYS: usize = 3;
/// How many distinct owners (plus the empty owner, used only by bad `put`s).
pub const OWNERS: usize = 5;
/// The clock never goes beyond this (deadlines then never saturate to `now`).
const MAX_NOW: u64 = 1 << 62;
/// A realistic wall clock (unix ms, 2023).
const WALL_CLOCK: u64 = 1_700_000_000_000;

/// Owner names: short, binary (NUL, 0xff), and long.
fn owner_name(i: usize) -> Owner {
    match i % OWNERS {
        0 => b"a".to_vec().into_boxed_slice(),
        1 => b"b".to_vec().into_boxed_slice(),
        2 => vec![0u8, 0xff, b'c'].into_boxed_slice(),
        3 => vec![b'd'; 70].into_boxed_slice(),
        _ => b"A".to_vec().into_boxed_slice(),
    }
}

// ---------------------------------------------------------------------------
// Decoding.
// ---------------------------------------------------------------------------

/// The fuzz input as a stream of numbers; zeros once it is used up.
struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Input<'_> {
    fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    fn u16(&mut self) -> u64 {
        u64::from(self.byte()) | (u64::from(self.byte()) << 8)
    }

    fn u32(&mut self) -> u64 {
        self.u16() | (self.u16() << 16)
    }

    fn u64(&mut self) -> u64 {
        self.u32() | (self.u32() << 32)
    }

    fn key(&mut self) -> usize {
        // Key 0 twice as often: busier states.
        usize::from(self.byte() % 4).saturating_sub(1)
    }

    fn owner(&mut self) -> usize {
        usize::from(self.byte()) % OWNERS
    }

    fn kind(&mut self) -> Kind {
        match self.byte() % 6 {
            0 => Kind::Acquire,
            1 => Kind::Racquire,
            2 | 3 => Kind::Read,
            // Limits 1 to 3, mostly 2: full semaphores and other limits.
            _ => Kind::Semaphore(u32::from(self.byte() % 4).clamp(1, 3)),
        }
    }

    /// A ttl >= 1 (what argument parsing guarantees), mostly short.
    fn ttl(&mut self) -> u64 {
        match self.byte() % 16 {
            0 => self.u32().max(1),
            1 => 2_592_000_000,
            2 => 3_153_600_000_000,
            3 => u64::MAX - self.u16(), // saturates the deadline
            4..=7 => 1 + self.byte() as u64 % 4,
            _ => 1 + self.byte() as u64 % 64,
        }
    }
}

/// One decoded operation.
#[derive(Clone, Debug)]
pub enum Op {
    /// ACQUIRE / RACQUIRE / READ without WAIT, as the shell runs it
    /// (`queued_ahead` = the key has waiters).
    Grant {
        key: usize,
        kind: Kind,
        owner: usize,
        ttl: u64,
    },
    Release {
        key: usize,
        owner: usize,
    },
    Renew {
        key: usize,
        owner: usize,
        ttl: u64,
    },
    /// The clock moves forward (`true`) or backward.
    Clock {
        forward: bool,
        ms: u64,
    },
    /// A request with WAIT: tried at once and queued when busy (as the
    /// shell does), or queued unconditionally (`try_first` false).
    Enqueue {
        key: usize,
        kind: Kind,
        owner: usize,
        ttl: u64,
        try_first: bool,
        /// Queued (not tried) as one key's part of a multi-key request: it
        /// holds back everything behind it and `settle` never grants it.
        part: bool,
    },
    /// A queued waiter times out or disconnects (picked by position).
    Remove {
        key: usize,
        pick: usize,
    },
    /// Removing a waiter id that may be long gone.
    RemoveId {
        key: usize,
        id: u32,
    },
    /// A visit of the key: purge, then grant from the head of the queue.
    Settle {
        key: usize,
    },
    /// A replicated `LOCK.SYNC SET` (or a loaded record): `owner` None is the
    /// empty owner; the token is `Fresh(k)` (k above the counter), `Same`
    /// (the owner's stored token, else fresh) or `Zero`.
    Put {
        key: usize,
        owner: Option<usize>,
        mode: Mode,
        holds: u32,
        token: PutToken,
        /// Deadline relative to now (may be in the past).
        deadline_delta: i64,
    },
    /// A replicated `LOCK.SYNC DROP`.
    Drop {
        key: usize,
        owner: usize,
    },
}

#[derive(Clone, Copy, Debug)]
pub enum PutToken {
    Fresh(u64),
    Same,
    Zero,
}

/// The start of a run: the token counter and the clock.
#[derive(Clone, Copy, Debug)]
pub struct Start {
    pub last_token: u64,
    pub now: u64,
}

fn decode_start(input: &mut Input) -> Start {
    let last_token = match input.byte() % 8 {
        0 => MAX_TOKEN - u64::from(input.byte() % 8), // close to exhaustion
        1 => u64::from(input.byte()),
        2 => input.u64() % MAX_TOKEN,
        _ => WALL_CLOCK * 1000 + input.u16(),
    };
    let now = match input.byte() % 8 {
        0 => input.u16(), // near the epoch: backward jumps hit 0
        1 => input.u64() % MAX_NOW,
        _ => WALL_CLOCK + input.u16(),
    };
    Start { last_token, now }
}

fn decode_op(input: &mut Input) -> Op {
    match input.byte() % 20 {
        0..=2 => Op::Grant {
            key: input.key(),
            kind: input.kind(),
            owner: input.owner(),
            ttl: input.ttl(),
        },
        3 | 4 => Op::Release {
            key: input.key(),
            owner: input.owner(),
        },
        5 => Op::Renew {
            key: input.key(),
            owner: input.owner(),
            ttl: input.ttl(),
        },
        6 | 7 => {
            let ms = match input.byte() % 8 {
                0 => input.u16(),
                1 => input.u32(),
                2 => input.u64(),
                _ => u64::from(input.byte() % 64),
            };
            Op::Clock { forward: true, ms }
        }
        8 => {
            let ms = match input.byte() % 4 {
                0 => input.u16(),
                1 => input.u64(),
                _ => u64::from(input.byte() % 64),
            };
            Op::Clock { forward: false, ms }
        }
        9..=11 => Op::Enqueue {
            key: input.key(),
            kind: input.kind(),
            owner: input.owner(),
            ttl: input.ttl(),
            try_first: !input.byte().is_multiple_of(5),
            part: input.byte().is_multiple_of(3),
        },
        12 => Op::Remove {
            key: input.key(),
            pick: usize::from(input.byte()),
        },
        13 => Op::RemoveId {
            key: input.key(),
            id: u32::from(input.byte()),
        },
        14 | 15 => Op::Settle { key: input.key() },
        16 | 17 => {
            let key = input.key();
            let owner = match input.byte() % 16 {
                0 => None,
                n => Some(usize::from(n) % OWNERS),
            };
            let mode = if input.byte().is_multiple_of(2) {
                Mode::Exclusive
            } else {
                Mode::Shared
            };
            let holds = match input.byte() % 8 {
                0 => 0,
                1 => u32::MAX,
                2 => u32::MAX - 1,
                n => u32::from(n),
            };
            let token = match input.byte() % 8 {
                0 => PutToken::Zero,
                1..=3 => PutToken::Same,
                _ => PutToken::Fresh(u64::from(input.byte() % 4)),
            };
            let deadline_delta = match input.byte() % 4 {
                0 => -(input.u16() as i64),
                1 => input.u32() as i64,
                _ => i64::from(input.byte() % 64) - 8,
            };
            Op::Put {
                key,
                owner,
                mode,
                holds,
                token,
                deadline_delta,
            }
        }
        _ => Op::Drop {
            key: input.key(),
            owner: input.owner(),
        },
    }
}

/// Decodes a whole input (for printing a failing case).
pub fn decode(data: &[u8]) -> (Start, Vec<Op>) {
    let mut input = Input { data, pos: 0 };
    let start = decode_start(&mut input);
    let mut ops = Vec::new();
    while !input.is_empty() {
        ops.push(decode_op(&mut input));
    }
    (start, ops)
}

// ---------------------------------------------------------------------------
// The run.
// ---------------------------------------------------------------------------

/// Where a check failed: shown only when one does.
struct Ctx<'a> {
    n: usize,
    op: &'a Op,
    now: u64,
    start: Start,
}

impl std::fmt::Display for Ctx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "step {}: {:?} at now={} (start {:?})",
            self.n, self.op, self.now, self.start
        )
    }
}

/// Stored holders by owner: (holds, token, deadline).
type Stored = BTreeMap<Owner, (u32, u64, u64)>;

fn stored(lock: &Lock) -> Stored {
    lock.holders()
        .map(|h| (Owner::from(h.owner), (h.holds, h.token, h.deadline)))
        .collect()
}

fn model_stored(key: &MKey) -> Stored {
    key.holders
        .iter()
        .map(|(&o, h)| (owner_name(o), (h.holds, h.token, h.deadline)))
        .collect()
}

struct Core {
    now: u64,
    tokens: Tokens,
    locks: Vec<Lock>,
    queues: Vec<Queue<u32>>,
    /// Each key as a replica sees it: built only from `Changes` and the
    /// replicated effects (`put` / `remove`).
    replicas: Vec<Lock>,
}

/// What one step did, for the checks after it.
#[derive(Default)]
struct Step {
    changes: Changes,
    /// Owners answered with a grant or a renewal: `Changes` may list them
    /// although their state is equal (same deadline rewritten).
    answered_ok: BTreeSet<Owner>,
    /// Holders dropped by purges during this step, per the model.
    purged: usize,
    /// A replicated effect ran (no `Changes`; the replica gets it verbatim).
    effect: bool,
}

/// Decodes `data` and runs it against the core, the model and the checks.
/// Panics on the first broken invariant.
pub fn run(data: &[u8]) {
    let mut input = Input { data, pos: 0 };
    let start = decode_start(&mut input);
    let mut core = Core {
        now: start.now,
        tokens: Tokens::starting_after(start.last_token),
        locks: vec![Lock::default(); KEYS],
        queues: (0..KEYS).map(|_| Queue::default()).collect(),
        replicas: vec![Lock::default(); KEYS],
    };
    let mut model = Model::new(KEYS, start.now, start.last_token);
    let mut next_id: u32 = 0;
    let mut removed_ids: BTreeSet<u32> = BTreeSet::new();
    let mut answered_ids: BTreeSet<u32> = BTreeSet::new();
    // Every token ever stored in a lock, and those no lock holds any more.
    let mut tokens_seen: BTreeSet<u64> = BTreeSet::new();
    let mut tokens_dead: BTreeSet<u64> = BTreeSet::new();

    let mut n = 0usize;
    while !input.is_empty() {
        let op = decode_op(&mut input);
        let ctx = Ctx {
            n,
            op: &op,
            now: core.now,
            start,
        };
        let ctx = &ctx;
        let before: Vec<Stored> = core.locks.iter().map(stored).collect();
        let modes_before: Vec<Mode> = core.locks.iter().map(Lock::mode).collect();
        let last_before = core.tokens.last();
        let now = core.now;
        let mut step = Step::default();

        match op {
            Op::Clock { forward, ms } => {
                core.now = if forward {
                    now.saturating_add(ms).min(MAX_NOW)
                } else {
                    now.saturating_sub(ms)
                };
                model.now = core.now;
            }

            Op::Grant {
                key,
                kind,
                owner,
                ttl,
            } => {
                let queued = !core.queues[key].is_empty();
                assert_eq!(queued, !model.keys[key].queue.is_empty(), "{ctx}");
                step.purged = model.purge(key);
                let got = grant(&mut core, &mut step, key, (kind, owner, ttl), queued);
                let want = model.grant(key, kind, owner, ttl, queued);
                assert_eq!(got, want, "{ctx}: core vs model");
                check_attempt(
                    &core,
                    key,
                    (kind, owner, ttl),
                    queued,
                    got,
                    (&before[key], modes_before[key]),
                    ctx,
                );
                if let Attempt::Granted(t) = got {
                    check_grant_token(&before[key], owner, t, last_before, ctx);
                }
            }

            Op::Release { key, owner } => {
                step.purged = model.purge(key);
                let name = owner_name(owner);
                let got = core.locks[key].release(&name, now, &mut step.changes);
                assert_eq!(got, model.release(key, owner), "{ctx}: core vs model");
                let live_before = before[key].get(&name).filter(|h| now < h.2).map(|h| h.0);
                let after = core.locks[key].holder(&name).map(|h| h.holds);
                match got {
                    Release::NotHeld => assert_eq!(live_before, None, "{ctx}: held, not released"),
                    Release::Last => {
                        assert_eq!(live_before, Some(1), "{ctx}");
                        assert_eq!(after, None, "{ctx}: released but still there");
                    }
                    Release::Remaining => {
                        let b = live_before.expect("remaining: it held");
                        assert_eq!(after, Some(b - 1), "{ctx}: one hold removed");
                    }
                }
            }

            Op::Renew { key, owner, ttl } => {
                step.purged = model.purge(key);
                let name = owner_name(owner);
                let got = core.locks[key].renew(&name, ttl, now, &mut step.changes);
                assert_eq!(got, model.renew(key, owner, ttl), "{ctx}: core vs model");
                let was_live = before[key].get(&name).is_some_and(|h| now < h.2);
                assert_eq!(got, was_live, "{ctx}: renew iff live");
                if got {
                    let h = core.locks[key].holder(&name).expect("renewed holder");
                    assert_eq!(h.deadline, now.saturating_add(ttl), "{ctx}");
                    assert_eq!(
                        (h.holds, h.token),
                        (before[key][&name].0, before[key][&name].1),
                        "{ctx}: renew changes only the deadline"
                    );
                    step.answered_ok.insert(name);
                }
            }

            Op::Enqueue {
                key,
                kind,
                owner,
                ttl,
                try_first,
                part,
            } => {
                let id = next_id;
                next_id += 1;
                // A part is exclusive, and queued without a try (the shell
                // decides multi-key requests over all their keys).
                let part = part && !try_first;
                let kind = if part { Kind::Acquire } else { kind };
                let wait = MWait {
                    id,
                    kind,
                    owner,
                    ttl,
                    part,
                };
                let req = Request {
                    kind,
                    owner: owner_name(owner),
                    ttl,
                };
                if try_first {
                    let queued = !core.queues[key].is_empty();
                    step.purged = model.purge(key);
                    let got = grant(&mut core, &mut step, key, (kind, owner, ttl), queued);
                    let want = model.grant(key, kind, owner, ttl, queued);
                    assert_eq!(got, want, "{ctx}: core vs model");
                    check_attempt(
                        &core,
                        key,
                        (kind, owner, ttl),
                        queued,
                        got,
                        (&before[key], modes_before[key]),
                        ctx,
                    );
                    match got {
                        Attempt::Busy => {
                            core.queues[key].push(id, req);
                            model.keys[key].queue.push_back(wait);
                        }
                        Attempt::Granted(t) => {
                            check_grant_token(&before[key], owner, t, last_before, ctx);
                        }
                        _ => {}
                    }
                } else if part {
                    core.queues[key].push_part(id, req);
                    model.keys[key].queue.push_back(wait);
                } else {
                    core.queues[key].push(id, req);
                    model.keys[key].queue.push_back(wait);
                }
            }

            Op::Remove { key, pick } => {
                let queue = &mut model.keys[key].queue;
                if queue.is_empty() {
                    assert!(!core.queues[key].remove(u32::MAX), "{ctx}");
                } else {
                    let at = pick % queue.len();
                    let id = queue[at].id;
                    queue.remove(at);
                    assert!(core.queues[key].remove(id), "{ctx}: remove {id}");
                    assert!(!core.queues[key].remove(id), "{ctx}: removed twice");
                    removed_ids.insert(id);
                }
            }

            Op::RemoveId { key, id } => {
                let queue = &mut model.keys[key].queue;
                let at = queue.iter().position(|w| w.id == id);
                assert_eq!(core.queues[key].remove(id), at.is_some(), "{ctx}");
                if let Some(at) = at {
                    queue.remove(at);
                    removed_ids.insert(id);
                }
            }

            Op::Settle { key } => {
                let queued: Vec<(u32, Request)> = core.queues[key]
                    .iter()
                    .map(|w| (w.id, w.request.clone()))
                    .collect();
                step.purged = model.purge(key);
                let got = core.queues[key].settle(
                    &mut core.locks[key],
                    now,
                    &mut core.tokens,
                    &mut step.changes,
                );
                let want = model.settle(key);
                assert_eq!(got, want, "{ctx}: core vs model");
                // The answered waiters are the head of the queue, in order.
                assert!(got.len() <= queued.len(), "{ctx}");
                let mut last = last_before;
                let mut granted_now = BTreeSet::new();
                for (&(id, outcome), (queued_id, req)) in got.iter().zip(&queued) {
                    assert_eq!(id, *queued_id, "{ctx}: answered out of order");
                    assert!(
                        !removed_ids.contains(&id),
                        "{ctx}: removed waiter {id} answered"
                    );
                    assert!(answered_ids.insert(id), "{ctx}: waiter {id} answered twice");
                    assert_ne!(outcome, Attempt::Busy, "{ctx}: Busy answered");
                    if let Attempt::Granted(t) = outcome {
                        let h = core.locks[key]
                            .holder(&req.owner)
                            .expect("granted waiter holds");
                        assert_eq!(h.token, t, "{ctx}");
                        assert_eq!(core.locks[key].mode(), mode_of(req.kind), "{ctx}");
                        let repeat = before[key].get(&req.owner).is_some_and(|b| b.1 == t)
                            || granted_now.contains(&t);
                        granted_now.insert(t);
                        if !repeat {
                            // A new grant: above everything before, in order.
                            assert!(t > last && t <= MAX_TOKEN, "{ctx}: token {t} <= {last}");
                            last = t;
                        }
                        step.answered_ok.insert(req.owner.clone());
                    }
                }
                // The new head, if any, really cannot be granted now (a
                // multi-key part is never granted here, whatever the lock).
                let lock = &core.locks[key];
                if let Some(head) = core.queues[key].iter().next().filter(|w| !w.part) {
                    let owner = &head.request.owner;
                    assert!(
                        lock.live(now).all(|h| *h.owner != **owner),
                        "{ctx}: head holds"
                    );
                    assert!(lock.is_held(now), "{ctx}: free lock, waiter left waiting");
                    assert!(
                        !lock.admits(head.request.kind, now),
                        "{ctx}: head admissible"
                    );
                }
            }

            Op::Put {
                key,
                owner,
                mode,
                holds,
                token,
                deadline_delta,
            } => {
                step.effect = true;
                let name: Owner = owner.map_or_else(Box::default, owner_name);
                // A master sends a token it issued after everything this
                // server has seen, or the holder's own token again: with the
                // counter at its end there is no fresh token, so no put.
                let fresh = |k: u64| {
                    core.tokens
                        .last()
                        .checked_add(1 + k)
                        .filter(|&t| t <= MAX_TOKEN)
                };
                let token = match token {
                    PutToken::Zero => Some(0),
                    PutToken::Same => match core.locks[key].holder(&name) {
                        Some(h) => Some(h.token),
                        None => fresh(0),
                    },
                    PutToken::Fresh(k) => fresh(k),
                };
                if let Some(token) = token {
                    let deadline = if deadline_delta < 0 {
                        now.saturating_sub(deadline_delta.unsigned_abs())
                    } else {
                        now.saturating_add(deadline_delta.unsigned_abs())
                    };
                    let holder = Holder {
                        owner: name.clone(),
                        holds,
                        since: 0,
                        token,
                        deadline,
                    };
                    let got = core.locks[key].put(Kind::of(mode, None).unwrap(), holder.clone());
                    if got.is_ok() {
                        core.tokens.observe(token);
                    }
                    let want = model.put(
                        key,
                        owner,
                        MHold {
                            mode,
                            holds,
                            token,
                            deadline,
                        },
                    );
                    assert_eq!(got, want, "{ctx}: core vs model");
                    match got {
                        Ok(()) => {
                            assert_eq!(core.locks[key].mode(), mode, "{ctx}");
                            assert_eq!(
                                core.locks[key].holder(&name).map(|h| h.to_owned()),
                                Some(holder.clone()),
                                "{ctx}"
                            );
                            let r = core.replicas[key].put(Kind::of(mode, None).unwrap(), holder);
                            assert_eq!(r, Ok(()), "{ctx}: the replica refused a valid put");
                        }
                        Err(_) => assert_eq!(stored(&core.locks[key]), before[key], "{ctx}"),
                    }
                }
            }

            Op::Drop { key, owner } => {
                step.effect = true;
                let name = owner_name(owner);
                let present = before[key].contains_key(&name);
                assert_eq!(core.locks[key].remove(&name), present, "{ctx}");
                assert_eq!(model.keys[key].holders.remove(&owner).is_some(), present);
                assert_eq!(core.replicas[key].remove(&name), present, "{ctx}");
            }
        }

        check_state(&core, &model, ctx);
        check_tokens(
            &core,
            last_before,
            &before,
            &mut tokens_seen,
            &mut tokens_dead,
            ctx,
        );
        let key = op_key(&op);
        for (k, lock) in core.locks.iter().enumerate() {
            if Some(k) != key {
                assert_eq!(stored(lock), before[k], "{ctx}: key {k} changed");
            }
        }
        match key {
            Some(key) if !step.effect => check_changes(&mut core, key, &before[key], &step, ctx),
            _ => assert!(
                step.changes.is_empty(),
                "{ctx}: changes without a transition"
            ),
        }
        for k in 0..KEYS {
            assert_eq!(
                stored(&core.replicas[k]),
                stored(&core.locks[k]),
                "{ctx}: replica of key {k} differs"
            );
        }
        n += 1;
    }
}

fn op_key(op: &Op) -> Option<usize> {
    match *op {
        Op::Clock { .. } => None,
        Op::Grant { key, .. }
        | Op::Release { key, .. }
        | Op::Renew { key, .. }
        | Op::Enqueue { key, .. }
        | Op::Remove { key, .. }
        | Op::RemoveId { key, .. }
        | Op::Settle { key }
        | Op::Put { key, .. }
        | Op::Drop { key, .. } => Some(key),
    }
}

/// A grant request as the shell makes it.
fn grant(
    core: &mut Core,
    step: &mut Step,
    key: usize,
    (kind, owner, ttl): (Kind, usize, u64),
    queued: bool,
) -> Attempt {
    let req = Request {
        kind,
        owner: owner_name(owner),
        ttl,
    };
    let got =
        core.locks[key].try_acquire(&req, queued, core.now, &mut core.tokens, &mut step.changes);
    if matches!(got, Attempt::Granted(_)) {
        step.answered_ok.insert(req.owner);
    }
    got
}

/// What a grant's outcome says about the state, checked without the model.
/// `before`: the key's stored holders and mode before the step.
fn check_attempt(
    core: &Core,
    key: usize,
    (kind, owner, ttl): (Kind, usize, u64),
    queued: bool,
    got: Attempt,
    (before, mode_before): (&Stored, Mode),
    ctx: &Ctx,
) {
    let now = core.now;
    let lock = &core.locks[key];
    let name = owner_name(owner);
    let live_before: Vec<(&Owner, &(u32, u64, u64))> =
        before.iter().filter(|(_, h)| now < h.2).collect();
    let mine_before = before.get(&name).filter(|h| now < h.2);
    // Nothing but the purge of expired holders.
    let purged_only = || {
        let expect: Stored = before
            .iter()
            .filter(|(_, h)| now < h.2)
            .map(|(o, h)| (o.clone(), *h))
            .collect();
        assert_eq!(stored(lock), expect, "{ctx}: {got:?} changed the lock");
    };
    match got {
        Attempt::Granted(t) => {
            let h = lock.holder(&name).expect("a granted owner holds");
            assert!(h.is_live(now), "{ctx}: granted but not live");
            assert!(lock.live(now).any(|l| *l.owner == *name), "{ctx}");
            assert_eq!(h.token, t, "{ctx}: reply token differs from the stored one");
            assert_eq!(h.deadline, now.saturating_add(ttl), "{ctx}: deadline");
            assert_eq!(lock.mode(), mode_of(kind), "{ctx}: mode");
            match mine_before {
                Some(b) => {
                    let want = if reentrant(kind) { b.0 + 1 } else { b.0 };
                    assert_eq!((h.holds, h.token), (want, b.1), "{ctx}: re-entry");
                }
                None => {
                    assert_eq!(h.holds, 1, "{ctx}");
                    assert!(!queued, "{ctx}: a newcomer jumped the queue");
                    // Never on top of a live holder of the other mode, nor
                    // beside another exclusive holder.
                    let compatible = (kind == Kind::Read && mode_before == Mode::Shared)
                        || (mode_of(kind) == Mode::Semaphore
                            && mode_before == Mode::Semaphore
                            && lock.limit().is_some_and(|l| live_before.len() < l as usize));
                    assert!(
                        live_before.is_empty() || compatible,
                        "{ctx}: granted beside {live_before:?}"
                    );
                }
            }
        }
        Attempt::Busy => {
            assert!(mine_before.is_none(), "{ctx}: a holder's repeat refused");
            assert!(
                queued || !live_before.is_empty(),
                "{ctx}: refused on a free lock with nobody queued"
            );
            purged_only();
        }
        Attempt::Conflict(m) => {
            assert!(mine_before.is_some(), "{ctx}: conflict without holding");
            assert_ne!(m, mode_of(kind), "{ctx}");
            assert_eq!(lock.mode(), m, "{ctx}");
            purged_only();
        }
        Attempt::TooManyHolds => {
            assert_eq!(mine_before.map(|b| b.0), Some(u32::MAX), "{ctx}");
            purged_only();
        }
        Attempt::WrongKind(m) => {
            assert!(!live_before.is_empty(), "{ctx}: wrong kind of a free key");
            assert_eq!(
                m == Mode::Semaphore,
                mode_of(kind) != Mode::Semaphore,
                "{ctx}"
            );
            assert_eq!(lock.mode(), m, "{ctx}");
            purged_only();
        }
        Attempt::OtherLimit(l) => {
            assert!(!live_before.is_empty(), "{ctx}: other limit on a free key");
            assert_eq!(lock.limit(), Some(l), "{ctx}");
            assert_ne!(Kind::Semaphore(l), kind, "{ctx}");
            purged_only();
        }
        Attempt::TokensExhausted => {
            assert_eq!(core.tokens.last(), MAX_TOKEN, "{ctx}");
            purged_only();
        }
        Attempt::TooLarge => panic!("{ctx}: a lock of a few small owners is not 4 GiB"),
        Attempt::TooManyHolders(max) => {
            assert!(mine_before.is_none(), "{ctx}: a holder's repeat refused");
            assert!(live_before.len() >= max, "{ctx}: refused below the limit");
            purged_only();
        }
    }
}

/// A new grant's token is above every token before; a repeat's is its own.
fn check_grant_token(before: &Stored, owner: usize, t: u64, last_before: u64, ctx: &Ctx) {
    match before.get(&owner_name(owner)) {
        Some(b) if b.1 == t => {}
        _ => assert!(
            t > last_before && t <= MAX_TOKEN,
            "{ctx}: new token {t} not above {last_before}"
        ),
    }
}

/// Invariants of every key, and the core equal to the model.
fn check_state(core: &Core, model: &Model, ctx: &Ctx) {
    let now = core.now;
    assert_eq!(core.tokens.last(), model.last_token, "{ctx}: token counter");
    let mut live_tokens = BTreeSet::new();
    for (key, lock) in core.locks.iter().enumerate() {
        let m = &model.keys[key];
        assert_eq!(stored(lock), model_stored(m), "{ctx}: key {key} vs model");
        if let Some(h) = m.holders.values().next() {
            assert_eq!(lock.mode(), h.mode, "{ctx}: key {key} mode vs model");
        }
        let queue: Vec<(u32, Kind, Owner, u64, bool)> = core.queues[key]
            .iter()
            .map(|w| {
                (
                    w.id,
                    w.request.kind,
                    w.request.owner.clone(),
                    w.request.ttl,
                    w.part,
                )
            })
            .collect();
        let want: Vec<(u32, Kind, Owner, u64, bool)> = m
            .queue
            .iter()
            .map(|w| (w.id, w.kind, owner_name(w.owner), w.ttl, w.part))
            .collect();
        assert_eq!(queue, want, "{ctx}: key {key} queue vs model");
        let head_part = m.queue.front().filter(|w| w.part).map(|w| w.id);
        assert_eq!(core.queues[key].head_part(), head_part, "{ctx}: head part");
        assert_eq!(core.queues[key].len(), want.len(), "{ctx}");
        assert_eq!(core.queues[key].is_empty(), want.is_empty(), "{ctx}");

        // At most one exclusive holder, never beside a reader (one mode per lock).
        let holders: Vec<HolderRef> = lock.holders().collect();
        if lock.mode() == Mode::Exclusive {
            assert!(holders.len() <= 1, "{ctx}: two exclusive holders: {lock:?}");
        }
        let owners: BTreeSet<&[u8]> = holders.iter().map(|h| h.owner).collect();
        assert_eq!(owners.len(), holders.len(), "{ctx}: duplicate owner");
        for h in &holders {
            assert!(!h.owner.is_empty(), "{ctx}: empty owner stored");
            assert!(h.holds >= 1, "{ctx}: zero holds");
            assert!(
                h.token >= 1 && h.token <= MAX_TOKEN,
                "{ctx}: token {}",
                h.token
            );
        }
        // `live` never reports an expired holder; is_held agrees.
        let live: Vec<HolderRef> = lock.live(now).collect();
        assert!(
            live.iter().all(|h| h.deadline > now),
            "{ctx}: expired holder live"
        );
        assert_eq!(
            live.len(),
            holders.iter().filter(|h| h.deadline > now).count(),
            "{ctx}"
        );
        assert_eq!(lock.is_held(now), !live.is_empty(), "{ctx}");
        for h in &live {
            assert!(
                live_tokens.insert(h.token),
                "{ctx}: live token {} twice",
                h.token
            );
        }
        // Deadlines and census.
        assert_eq!(
            lock.latest_deadline(),
            holders.iter().map(|h| h.deadline).max(),
            "{ctx}"
        );
        assert_eq!(
            lock.earliest_deadline(),
            holders.iter().map(|h| h.deadline).min(),
            "{ctx}"
        );
        let census = lock.census();
        assert_eq!(
            census.iter().map(|(_, n)| n).sum::<usize>(),
            holders.len(),
            "{ctx}"
        );
        assert_eq!(lock.memory_usage() == 0, holders.is_empty(), "{ctx}");
        assert_eq!(lock.is_empty(), holders.is_empty(), "{ctx}");
        // Admission agrees with the state.
        let limit = lock.limit().unwrap_or(0);
        let semaphores = [Kind::Semaphore(limit), Kind::Semaphore(limit + 1)];
        for kind in [Kind::Acquire, Kind::Racquire, Kind::Read]
            .into_iter()
            .chain(semaphores)
        {
            let admits = live.is_empty()
                || (lock.mode() == Mode::Shared && kind == Kind::Read)
                || (kind == Kind::Semaphore(limit) && live.len() < limit as usize);
            assert_eq!(lock.admits(kind, now), admits, "{ctx}: admits {kind:?}");
        }
        if lock.mode() == Mode::Semaphore {
            assert!(holders.len() <= limit as usize, "{ctx}: past the limit");
            assert!(
                holders.iter().all(|h| h.holds == 1),
                "{ctx}: one permit each"
            );
        }
        // What is stored can be reloaded: from_holders and put rebuild it.
        let rebuilt =
            Lock::from_holders(lock.kind(), holders.iter().map(|h| h.to_owned()).collect());
        assert_eq!(
            rebuilt.as_ref().map(stored),
            Ok(stored(lock)),
            "{ctx}: reload"
        );
    }
}

/// The token counter never goes back; every token stored for the first time
/// is above the counter before the step; a token no lock holds any more never
/// comes back.
fn check_tokens(
    core: &Core,
    last_before: u64,
    before: &[Stored],
    seen: &mut BTreeSet<u64>,
    dead: &mut BTreeSet<u64>,
    ctx: &Ctx,
) {
    let last = core.tokens.last();
    assert!(
        last >= last_before,
        "{ctx}: counter went back {last_before} -> {last}"
    );
    assert!(last <= MAX_TOKEN, "{ctx}");
    let now_stored: BTreeSet<u64> = core
        .locks
        .iter()
        .flat_map(|l| l.holders().map(|h| h.token))
        .collect();
    let stored_before: BTreeSet<u64> = before
        .iter()
        .flat_map(|s| s.values().map(|h| h.1))
        .collect();
    let mut fresh = 0u64;
    for &t in &now_stored {
        assert!(!dead.contains(&t), "{ctx}: dropped token {t} came back");
        if seen.insert(t) {
            assert!(
                t > last_before,
                "{ctx}: new token {t} not above {last_before}"
            );
            fresh += 1;
        }
    }
    // The counter moves by issuing or observing, never skipping backwards.
    assert!(
        fresh <= last - last_before,
        "{ctx}: more new tokens than issued"
    );
    for t in stored_before.difference(&now_stored) {
        dead.insert(*t);
    }
}

/// `Changes` lists every owner whose stored state changed (plus, possibly,
/// owners answered with an equal state); the purge count matches; a replica
/// fed with exactly the listed owners' final state (drops first, as
/// replication.rs sends them) stays equal.
fn check_changes(core: &mut Core, key: usize, before: &Stored, step: &Step, ctx: &Ctx) {
    let after = stored(&core.locks[key]);
    let owners: BTreeSet<&Owner> = before.keys().chain(after.keys()).collect();
    let differ: BTreeSet<Owner> = owners
        .into_iter()
        .filter(|o| before.get(*o) != after.get(*o))
        .cloned()
        .collect();
    let listed: BTreeSet<Owner> = step.changes.owners().map(Owner::from).collect();
    assert_eq!(
        listed.len(),
        step.changes.owners().count(),
        "{ctx}: repeats in Changes"
    );
    assert!(
        differ.is_subset(&listed),
        "{ctx}: changed {differ:?} but Changes lists {listed:?}"
    );
    let extra: Vec<&Owner> = listed.difference(&differ).collect();
    assert!(
        extra.iter().all(|o| step.answered_ok.contains(*o)),
        "{ctx}: Changes lists unchanged {extra:?}"
    );
    assert_eq!(step.changes.expired(), step.purged, "{ctx}: expired count");
    assert_eq!(step.changes.is_empty(), listed.is_empty(), "{ctx}");

    let master = &core.locks[key];
    let replica = &mut core.replicas[key];
    for owner in step.changes.owners() {
        if master.holder(owner).is_none() {
            assert!(
                replica.remove(owner),
                "{ctx}: drop of an owner the replica lacks"
            );
        }
    }
    for owner in step.changes.owners() {
        if let Some(h) = master.holder(owner) {
            assert_eq!(
                replica.put(master.kind(), h.to_owned()),
                Ok(()),
                "{ctx}: replica put"
            );
        }
    }
    if !master.is_empty() {
        assert_eq!(replica.mode(), master.mode(), "{ctx}: replica mode");
    }
}

// ---------------------------------------------------------------------------
// The bounded run inside `cargo test`.
// ---------------------------------------------------------------------------

/// A small xorshift generator: no dependency, reproducible from its seed.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Random bytes, biased so that decoded inputs reach busy states: short
    /// runs, small numbers, and repeats of recent bytes.
    pub fn input(&mut self) -> Vec<u8> {
        let len = match self.next_u64() % 4 {
            0 => self.next_u64() % 32,
            1 | 2 => self.next_u64() % 256,
            _ => self.next_u64() % 2048,
        } as usize;
        let small = self.next_u64().is_multiple_of(3);
        let mut data = Vec::with_capacity(len);
        for i in 0..len {
            let r = self.next_u64();
            let b = match r % 8 {
                0 if i > 8 => data[i - 1 - (r >> 8) as usize % 8],
                1 | 2 if small => (r >> 8) as u8 % 8,
                _ => (r >> 8) as u8,
            };
            data.push(b);
        }
        data
    }
}
