//! The one checker: applies an [`Op`] to the core (as the shell drives it)
//! and to the reference model ([`crate::model`]), compares every result and
//! every stored state, and checks the contract's invariants after every
//! step. Both drivers feed it: the property test (`lock-core/tests/model.rs`,
//! operations from [`crate::op::strategy`]) and the fuzz runner
//! ([`crate::fuzz::run`]: the cargo-fuzz target and the bounded run inside
//! `cargo test`, operations decoded from bytes by [`crate::op::decode`]).
//!
//! A step panics (with the step, the operation and the reason) on the first
//! broken invariant. Besides comparing with the model, it checks,
//! independently of it: at most one exclusive holder and never beside a
//! live reader; no duplicate owner, holds >= 1, token >= 1; a new grant's
//! token is above every token issued or observed before, and live tokens
//! are unique across keys; a dropped token never comes back; `live` never
//! reports an expired holder and a grant is live at once; a holder's repeat
//! is answered at once (its own token), even behind waiters, and a
//! newcomer never jumps the queue; a refusal, a conflict or a failed `put`
//! changes nothing but the purge of expired holders; the queue answers its
//! head in order, never a removed or answered waiter, and stops only at a
//! head that really cannot be granted (held, or at the run's holder limit:
//! `Start::max_holders`); a release or a renewal with a token acts on the
//! grant carrying it only; `Changes` lists every owner whose
//! stored state changed (and a replica fed with exactly those is equal to
//! the master); only the operated key changes; a lock rebuilt from its
//! holders (`from_holders`, `put`) is equal to it; and nothing panics.
//!
//! Sessions (v4): grants with `SESSION` (refused before any transaction
//! when the session is not live), sessions opened, renewed, shortened and
//! closed; before every transaction on a key the core ends the holders whose
//! session ended from the deadlines it is given (`Lock::end_sessions`),
//! against the model's own ending; a session holder's deadline is its
//! session's id (`session_deadline`), kept by a repeat naming none, moved by
//! one naming another, untouched by a renewal; the replica follows.
//!
//! The clock may run backwards (a wall clock can be stepped back): a holder
//! past its deadline that no transition has dropped yet is then live again.
//! That is allowed; what must hold is that no transition ever grants on top
//! of a live holder, and that a holder once dropped never returns.

use std::collections::{BTreeMap, BTreeSet};

use lock_core::tokens::{Tokens, MAX_TOKEN};
use lock_core::{
    Attempt, Changes, Holder, HolderRef, Kind, Lock, Mode, Owner, Queue, Release, Request,
};

use crate::model::{reentrant, MHold, MKey, MWait, Model};
use crate::op::{owner_name, Op, PutToken, Start, Tok, Who, KEYS, MAX_NOW, SESSIONS};
use lock_core::lock::{session_deadline, session_of};

/// Runs `ops` from `start` against the core and the model, checking every
/// step. Panics on the first broken invariant.
pub fn check(start: Start, ops: &[Op]) {
    let mut run = Run::new(start);
    for op in ops {
        run.step(op);
    }
}

/// Where a check failed: shown only when one does.
struct Ctx<'a> {
    n: usize,
    /// The operation as given, and with its owner resolved.
    given: &'a Op,
    op: &'a Op,
    now: u64,
    start: Start,
}

impl std::fmt::Display for Ctx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "step {}: {:?} ", self.n, self.op)?;
        if self.given != self.op {
            write!(f, "(given as {:?}) ", self.given)?;
        }
        write!(f, "at now={} (start {:?})", self.now, self.start)
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

/// The token of a resolved operation.
fn token_of(token: Tok) -> Option<u64> {
    match token {
        Tok::None => None,
        Tok::Given(t) => Some(t),
        Tok::Own | Tok::Behind(_) => unreachable!("resolved before the step"),
    }
}

/// The owner of a resolved operation.
fn owner_of(who: Who) -> usize {
    match who {
        Who::Owner(owner) => owner,
        Who::Holder(_) => unreachable!("resolved before the step"),
    }
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

/// The state before a step, for the checks after it.
struct Before {
    stored: Vec<Stored>,
    modes: Vec<Mode>,
    last_token: u64,
}

/// A run in progress: the core, the model and what the checks remember
/// across steps.
pub struct Run {
    start: Start,
    core: Core,
    model: Model,
    n: usize,
    next_id: u32,
    removed_ids: BTreeSet<u32>,
    answered_ids: BTreeSet<u32>,
    /// Every token ever stored in a lock, and those no lock holds any more.
    tokens_seen: BTreeSet<u64>,
    tokens_dead: BTreeSet<u64>,
}

impl Run {
    pub fn new(start: Start) -> Run {
        // Tokens are replied as signed 64-bit integers.
        assert_eq!(MAX_TOKEN, i64::MAX as u64);
        Run {
            start,
            core: Core {
                now: start.now,
                tokens: Tokens::starting_after(start.last_token),
                locks: vec![Lock::default(); KEYS],
                queues: (0..KEYS).map(|_| Queue::default()).collect(),
                replicas: vec![Lock::default(); KEYS],
            },
            model: Model::new(KEYS, start.now, start.last_token, start.max_holders),
            n: 0,
            next_id: 0,
            removed_ids: BTreeSet::new(),
            answered_ids: BTreeSet::new(),
            tokens_seen: BTreeSet::new(),
            tokens_dead: BTreeSet::new(),
        }
    }

    /// Applies `op` to the core and the model and checks everything.
    pub fn step(&mut self, given: &Op) {
        let op = given.resolve(&self.model);
        let ctx = &Ctx {
            n: self.n,
            given,
            op: &op,
            now: self.core.now,
            start: self.start,
        };
        self.end_sessions(&op, ctx);
        let before = Before {
            stored: self.core.locks.iter().map(stored).collect(),
            modes: self.core.locks.iter().map(Lock::mode).collect(),
            last_token: self.core.tokens.last(),
        };
        let mut step = Step::default();
        self.apply(&op, &before, &mut step, ctx);

        let core = &mut self.core;
        check_state(core, &self.model, ctx);
        check_tokens(
            core,
            &before,
            &mut self.tokens_seen,
            &mut self.tokens_dead,
            ctx,
        );
        let key = op.key();
        for (k, lock) in core.locks.iter().enumerate() {
            if Some(k) != key {
                assert_eq!(stored(lock), before.stored[k], "{ctx}: key {k} changed");
            }
        }
        match key {
            Some(key) if !step.effect => check_changes(core, key, &before.stored[key], &step, ctx),
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
        self.n += 1;
    }

    /// What every transaction on a key does first, as the shell runs it
    /// (a grant, a release, a renewal, a visit): the holders whose session
    /// ended end, the core deciding from the sessions' deadlines it is
    /// given. The replica follows; their tokens never come back.
    fn end_sessions(&mut self, op: &Op, ctx: &Ctx) {
        let key = match *op {
            Op::Grant { key, .. }
            | Op::Release { key, .. }
            | Op::Renew { key, .. }
            | Op::Settle { key }
            | Op::Enqueue {
                key,
                try_first: true,
                ..
            } => key,
            Op::SessionGrant { key, session, .. } if self.session_live(session) => key,
            _ => return,
        };
        let (now, table) = (self.core.now, self.model.sessions.clone());
        let mut changes = Changes::default();
        let lock = &mut self.core.locks[key];
        let ended = lock.end_sessions(|id| table.get(&id).copied(), now, &mut changes);
        assert_eq!(
            ended,
            self.model.end_sessions(key),
            "{ctx}: sessions' holders ended"
        );
        assert_eq!(changes.expired(), ended, "{ctx}");
        assert!(
            lock.holders().all(|h| h
                .session()
                .is_none_or(|id| table.get(&id).is_some_and(|d| now < *d))),
            "{ctx}: a holder of an ended session left"
        );
        for e in changes.ended() {
            assert_ne!(e.session, 0, "{ctx}: only session holders end here");
            self.tokens_dead.insert(e.token);
        }
        for owner in changes.owners() {
            assert!(lock.holder(owner).is_none(), "{ctx}");
            assert!(
                self.core.replicas[key].remove(owner),
                "{ctx}: replica lacks {owner:?}"
            );
        }
    }

    /// Whether session `i` of [`SESSIONS`] is live now.
    fn session_live(&self, i: usize) -> bool {
        let id = SESSIONS[i % SESSIONS.len()];
        self.model
            .sessions
            .get(&id)
            .is_some_and(|d| self.core.now < *d)
    }

    /// The operation itself, on both, with the checks of its results.
    fn apply(&mut self, op: &Op, before: &Before, step: &mut Step, ctx: &Ctx) {
        let now = self.core.now;
        match *op {
            Op::Clock { forward, ms } => {
                let core = &mut self.core;
                core.now = if forward {
                    now.saturating_add(ms).min(MAX_NOW)
                } else {
                    now.saturating_sub(ms)
                };
                self.model.now = core.now;
            }

            Op::Grant {
                key,
                kind,
                who,
                ttl,
            } => {
                self.grant(step, key, (kind, owner_of(who), ttl), 0, before, ctx);
            }

            Op::SessionGrant {
                key,
                kind,
                who,
                ttl,
                session,
            } => {
                // Not live: NOSESSION before any transaction, nothing changed.
                if self.session_live(session) {
                    let id = SESSIONS[session];
                    self.grant(step, key, (kind, owner_of(who), ttl), id, before, ctx);
                }
            }

            Op::SessionSet { session, ttl } => {
                let deadline = now.saturating_add(ttl);
                self.model.sessions.insert(SESSIONS[session], deadline);
            }

            Op::SessionEnd { session } => {
                self.model.sessions.remove(&SESSIONS[session]);
            }

            Op::Release { key, who, token } => {
                let owner = owner_of(who);
                let token = token_of(token);
                step.purged = self.model.purge(key);
                let name = owner_name(owner);
                let got = self.core.locks[key].release(&name, token, now, &mut step.changes);
                let want = self.model.release(key, owner, token);
                assert_eq!(got, want, "{ctx}: core vs model");
                // With a token, only the grant carrying it counts.
                let live_before = before.stored[key]
                    .get(&name)
                    .filter(|h| now < h.2 && token.is_none_or(|t| t == h.1))
                    .map(|h| h.0);
                let after = self.core.locks[key].holder(&name).map(|h| h.holds);
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

            Op::Renew {
                key,
                who,
                ttl,
                token,
            } => {
                let owner = owner_of(who);
                let token = token_of(token);
                step.purged = self.model.purge(key);
                let name = owner_name(owner);
                let got = self.core.locks[key].renew(&name, ttl, token, now, &mut step.changes);
                let want = self.model.renew(key, owner, ttl, token);
                assert_eq!(got, want, "{ctx}: core vs model");
                let mine_before = before.stored[key]
                    .get(&name)
                    .filter(|h| token.is_none_or(|t| t == h.1));
                assert_eq!(
                    got,
                    mine_before.is_some_and(|h| now < h.2),
                    "{ctx}: renew iff live"
                );
                if got {
                    let h = self.core.locks[key].holder(&name).expect("renewed holder");
                    // A session holder's renewal changes nothing.
                    let want = match mine_before
                        .map(|b| b.2)
                        .filter(|d| session_of(*d).is_some())
                    {
                        Some(d) => d,
                        None => now.saturating_add(ttl).min(lock_core::lock::MAX_DEADLINE),
                    };
                    assert_eq!(h.deadline, want, "{ctx}");
                    assert_eq!(
                        Some((h.holds, h.token)),
                        mine_before.map(|b| (b.0, b.1)),
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
                let id = self.next_id;
                self.next_id += 1;
                // A part is exclusive, and queued without a try (the shell
                // decides multi-key requests over all their keys).
                let part = part && !try_first;
                let kind = if part { Kind::Acquire } else { kind };
                let req = Request {
                    kind,
                    owner: owner_name(owner),
                    ttl,
                    session: 0,
                };
                // Refused busy or at the holder limit, it waits (v4).
                if try_first
                    && !self
                        .grant(step, key, (kind, owner, ttl), 0, before, ctx)
                        .waits()
                {
                    return;
                }
                if part {
                    self.core.queues[key].push_part(id, req);
                } else {
                    self.core.queues[key].push(id, req);
                }
                self.model.keys[key].queue.push_back(MWait {
                    id,
                    kind,
                    owner,
                    ttl,
                    part,
                });
            }

            Op::Remove { key, pick } => {
                let queue = &mut self.model.keys[key].queue;
                if queue.is_empty() {
                    assert!(!self.core.queues[key].remove(u32::MAX), "{ctx}");
                } else {
                    let at = pick % queue.len();
                    let id = queue[at].id;
                    queue.remove(at);
                    assert!(self.core.queues[key].remove(id), "{ctx}: remove {id}");
                    assert!(!self.core.queues[key].remove(id), "{ctx}: removed twice");
                    self.removed_ids.insert(id);
                }
            }

            Op::RemoveId { key, id } => {
                let queue = &mut self.model.keys[key].queue;
                let at = queue.iter().position(|w| w.id == id);
                assert_eq!(self.core.queues[key].remove(id), at.is_some(), "{ctx}");
                if let Some(at) = at {
                    queue.remove(at);
                    self.removed_ids.insert(id);
                }
            }

            Op::Settle { key } => self.settle(step, key, before, ctx),

            Op::Put(put) => {
                let (key, owner, mode, holds) = (put.key, put.owner, put.mode, put.holds);
                step.effect = true;
                let core = &mut self.core;
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
                let token = match put.token {
                    PutToken::Zero => Some(0),
                    PutToken::Same => match core.locks[key].holder(&name) {
                        Some(h) => Some(h.token),
                        None => fresh(0),
                    },
                    PutToken::Fresh(k) => fresh(k),
                };
                let Some(token) = token else { return };
                let delta = put.deadline_delta;
                let deadline = if delta < 0 {
                    now.saturating_sub(delta.unsigned_abs())
                } else {
                    now.saturating_add(delta.unsigned_abs())
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
                let want = self.model.put(
                    key,
                    owner,
                    MHold {
                        mode,
                        holds,
                        token,
                        deadline,
                        session: 0,
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
                    Err(_) => assert_eq!(stored(&core.locks[key]), before.stored[key], "{ctx}"),
                }
            }

            Op::Drop { key, who } => {
                step.effect = true;
                let owner = owner_of(who);
                let name = owner_name(owner);
                let present = before.stored[key].contains_key(&name);
                assert_eq!(self.core.locks[key].remove(&name), present, "{ctx}");
                let in_model = self.model.keys[key].holders.remove(&owner).is_some();
                assert_eq!(in_model, present, "{ctx}");
                assert_eq!(self.core.replicas[key].remove(&name), present, "{ctx}");
            }
        }
    }

    /// A grant request as the shell makes it (`queued_ahead` = the key has
    /// waiters), on the core and the model, and what its outcome says.
    fn grant(
        &mut self,
        step: &mut Step,
        key: usize,
        (kind, owner, ttl): (Kind, usize, u64),
        session: u64,
        before: &Before,
        ctx: &Ctx,
    ) -> Attempt {
        let core = &mut self.core;
        let queued = !core.queues[key].is_empty();
        assert_eq!(queued, !self.model.keys[key].queue.is_empty(), "{ctx}");
        step.purged = self.model.purge(key);
        let req = Request {
            kind,
            owner: owner_name(owner),
            ttl,
            session,
        };
        let got = core.locks[key].try_acquire_within(
            &req,
            queued,
            core.now,
            &mut core.tokens,
            &mut step.changes,
            self.start.max_holders,
        );
        let want = self.model.grant_in(key, kind, owner, ttl, session, queued);
        assert_eq!(got, want, "{ctx}: core vs model");
        check_attempt(
            core,
            key,
            (kind, owner, ttl, session),
            queued,
            got,
            (&before.stored[key], before.modes[key]),
            ctx,
        );
        if let Attempt::Granted(t) = got {
            check_grant_token(&before.stored[key], owner, t, before.last_token, ctx);
            step.answered_ok.insert(req.owner);
        }
        got
    }

    /// A visit: the queue answers its head, in order, and stops only at a
    /// head that cannot be granted.
    fn settle(&mut self, step: &mut Step, key: usize, before: &Before, ctx: &Ctx) {
        let core = &mut self.core;
        let now = core.now;
        let queued: Vec<(u32, Request)> = core.queues[key]
            .iter()
            .map(|w| (w.id, w.request.clone()))
            .collect();
        step.purged = self.model.purge(key);
        let max = self.start.max_holders;
        let got = core.queues[key].settle_within(
            &mut core.locks[key],
            now,
            &mut core.tokens,
            &mut step.changes,
            max,
        );
        let want = self.model.settle(key);
        assert_eq!(got, want, "{ctx}: core vs model");
        // The answered waiters are the head of the queue, in order, so
        // nobody behind a waiting request is answered.
        assert!(got.len() <= queued.len(), "{ctx}");
        let mut last = before.last_token;
        let mut granted_now = BTreeSet::new();
        for (&(id, outcome), (queued_id, req)) in got.iter().zip(&queued) {
            assert_eq!(id, *queued_id, "{ctx}: answered out of order");
            assert!(
                !self.removed_ids.contains(&id),
                "{ctx}: removed waiter {id} answered"
            );
            assert!(
                self.answered_ids.insert(id),
                "{ctx}: waiter {id} answered twice"
            );
            assert!(!outcome.waits(), "{ctx}: {outcome:?} answered");
            if let Attempt::Granted(t) = outcome {
                let h = core.locks[key]
                    .holder(&req.owner)
                    .expect("granted waiter holds");
                assert_eq!(h.token, t, "{ctx}");
                assert_eq!(core.locks[key].mode(), req.kind.mode(), "{ctx}");
                let repeat = before.stored[key].get(&req.owner).is_some_and(|b| b.1 == t)
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
        // The new head, if any, really cannot be granted now (a multi-key
        // part is never granted here, whatever the lock): readers at the
        // head went together up to the holder limit, and a waiting writer
        // blocks the rest.
        let lock = &core.locks[key];
        if let Some(head) = core.queues[key].iter().next().filter(|w| !w.part) {
            let owner = &head.request.owner;
            assert!(
                lock.live(now).all(|h| *h.owner != **owner),
                "{ctx}: head holds"
            );
            assert!(lock.is_held(now), "{ctx}: free lock, waiter left waiting");
            let full = lock.live(now).count() >= max;
            assert!(
                full || !lock.admits(head.request.kind, now),
                "{ctx}: head admissible"
            );
            if head.request.kind == Kind::Read && !full {
                assert_eq!(lock.mode(), Mode::Exclusive, "{ctx}: a reader left waiting");
            }
        }
    }
}

/// What a grant's outcome says about the state, checked without the model.
/// `before`: the key's stored holders and mode before the step.
fn check_attempt(
    core: &Core,
    key: usize,
    (kind, owner, ttl, session): (Kind, usize, u64, u64),
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
    // A holder's repeat is answered at once, even behind waiters: with its
    // own token, or refused for its mode (an upgrade or downgrade is an
    // error); never queued.
    if let Some(&(holds, token, _)) = mine_before {
        let semaphores = (mode_before == Mode::Semaphore) == (kind.mode() == Mode::Semaphore);
        if semaphores && mode_before != kind.mode() {
            assert_eq!(got, Attempt::Conflict(mode_before), "{ctx}: up/downgrade");
        }
        if mode_before == kind.mode() && !matches!(got, Attempt::OtherLimit(_)) {
            let want = if reentrant(kind) && holds == u32::MAX {
                Attempt::TooManyHolds
            } else {
                Attempt::Granted(token)
            };
            assert_eq!(got, want, "{ctx}: a holder's repeat");
        }
    }
    match got {
        Attempt::Granted(t) => {
            let h = lock.holder(&name).expect("a granted owner holds");
            assert!(h.is_live(now), "{ctx}: granted but not live");
            assert!(lock.live(now).any(|l| *l.owner == *name), "{ctx}");
            assert_eq!(h.token, t, "{ctx}: reply token differs from the stored one");
            // Its own lease; its session's (named, or kept by a repeat
            // that names none).
            let kept = mine_before
                .map(|b| b.2)
                .filter(|d| session == 0 && session_of(*d).is_some());
            let want = match (session, kept) {
                (0, Some(d)) => d,
                (0, None) => now.saturating_add(ttl).min(lock_core::lock::MAX_DEADLINE),
                (s, _) => session_deadline(s),
            };
            assert_eq!(h.deadline, want, "{ctx}: deadline");
            assert_eq!(lock.mode(), kind.mode(), "{ctx}: mode");
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
                        || (kind.mode() == Mode::Semaphore
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
            assert_ne!(m, kind.mode(), "{ctx}");
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
                kind.mode() != Mode::Semaphore,
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
    assert_eq!(now, model.now, "{ctx}: clock");
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
        // Session holders' ends come from their session, not the lock.
        // The lock keeps a bound (no walk): never above the earliest.
        let earliest = holders
            .iter()
            .map(|h| h.deadline)
            .min()
            .filter(|d| session_of(*d).is_none());
        if let Some(e) = earliest {
            assert!(
                lock.earliest_deadline().is_some_and(|b| b <= e),
                "{ctx}: bound {:?} past the earliest {e}",
                lock.earliest_deadline()
            );
        }
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
        assert_eq!(rebuilt.as_ref(), Ok(lock), "{ctx}: reload");
        let mut put_back = Lock::default();
        for h in &holders {
            assert_eq!(put_back.put(lock.kind(), h.to_owned()), Ok(()), "{ctx}");
        }
        if lock.is_empty() {
            assert!(put_back.is_empty(), "{ctx}");
        } else {
            assert_eq!(&put_back, lock, "{ctx}: put back");
        }
    }
}

/// The token counter never goes back; every token stored for the first time
/// is above the counter before the step; a token no lock holds any more never
/// comes back.
fn check_tokens(
    core: &Core,
    before: &Before,
    seen: &mut BTreeSet<u64>,
    dead: &mut BTreeSet<u64>,
    ctx: &Ctx,
) {
    let last_before = before.last_token;
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
        .stored
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
    // Every grant that ended is reported, by its token, once (what the
    // shell finds a holder's binding by).
    let mut gone: Vec<u64> = before
        .iter()
        .filter(|(o, h)| after.get(*o).is_none_or(|a| a.1 != h.1))
        .map(|(_, h)| h.1)
        .collect();
    let mut ended: Vec<u64> = step.changes.ended().map(|e| e.token).collect();
    gone.sort_unstable();
    ended.sort_unstable();
    assert_eq!(ended, gone, "{ctx}: the grants that ended");

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
