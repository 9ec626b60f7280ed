//! The one reference model of the core, written independently of its
//! logic: per key, owner -> hold (expired ones kept until a transition on
//! the key drops them, as the core does), a FIFO of waiters (multi-key parts
//! included), and a semaphore's limit. The one checker ([`crate::check`])
//! holds the core to it, for the property tests (`lock-core/tests/model.rs`)
//! and the fuzz runner ([`crate::fuzz`], shared with the cargo-fuzz target).
//! A kind's mode is the core's own `Kind::mode` (a table, not logic).

use std::collections::{BTreeMap, VecDeque};

use lock_core::tokens::MAX_TOKEN;
use lock_core::{Attempt, Invalid, Kind, Mode, Owner, Release};

/// Whether a holder's repeat of `kind` adds a hold.
pub fn reentrant(kind: Kind) -> bool {
    matches!(kind, Kind::Racquire | Kind::Read)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MHold {
    pub mode: Mode,
    pub holds: u32,
    pub token: u64,
    pub deadline: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MWait {
    pub id: u32,
    pub kind: Kind,
    pub owner: usize,
    pub ttl: u64,
    pub part: bool,
}

#[derive(Default)]
pub struct MKey {
    /// A semaphore's limit, set by the grant that finds the key free.
    pub limit: u32,
    pub holders: BTreeMap<usize, MHold>,
    pub queue: VecDeque<MWait>,
}

pub struct Model {
    pub now: u64,
    pub last_token: u64,
    /// `lock.max-holders`: a new holder past it is refused
    /// (`TooManyHolders`), and waits when queued.
    pub max_holders: usize,
    pub keys: Vec<MKey>,
}

impl Model {
    /// Drops the holders whose deadline has passed; returns how many.
    pub fn purge(&mut self, key: usize) -> usize {
        let now = self.now;
        let before = self.keys[key].holders.len();
        self.keys[key].holders.retain(|_, h| now < h.deadline);
        before - self.keys[key].holders.len()
    }

    pub fn grant(
        &mut self,
        key: usize,
        kind: Kind,
        owner: usize,
        ttl: u64,
        queued: bool,
    ) -> Attempt {
        self.purge(key);
        let deadline = self.now.saturating_add(ttl);
        let limit = self.keys[key].limit;
        let holders = &mut self.keys[key].holders;
        if let Some(held) = holders.values().next().map(|h| h.mode) {
            if (held == Mode::Semaphore) != (kind.mode() == Mode::Semaphore) {
                return Attempt::WrongKind(held);
            }
            if matches!(kind, Kind::Semaphore(l) if l != limit) {
                return Attempt::OtherLimit(limit);
            }
        }
        if let Some(h) = holders.get_mut(&owner) {
            if h.mode != kind.mode() {
                return Attempt::Conflict(h.mode);
            }
            if reentrant(kind) {
                if h.holds == u32::MAX {
                    return Attempt::TooManyHolds;
                }
                h.holds += 1;
            }
            h.deadline = deadline;
            return Attempt::Granted(h.token);
        }
        if queued {
            return Attempt::Busy;
        }
        let compatible = match kind {
            Kind::Semaphore(_) => holders.len() < limit as usize || holders.is_empty(),
            _ => holders
                .values()
                .all(|h| h.mode == Mode::Shared && kind == Kind::Read),
        };
        if !compatible {
            return Attempt::Busy;
        }
        if holders.len() >= self.max_holders {
            return Attempt::TooManyHolders(self.max_holders);
        }
        if self.last_token >= MAX_TOKEN {
            return Attempt::TokensExhausted;
        }
        self.last_token += 1;
        let token = self.last_token;
        if holders.is_empty() {
            self.keys[key].limit = match kind {
                Kind::Semaphore(l) => l,
                _ => 0,
            };
        }
        let holders = &mut self.keys[key].holders;
        holders.insert(
            owner,
            MHold {
                mode: kind.mode(),
                holds: 1,
                token,
                deadline,
            },
        );
        Attempt::Granted(token)
    }

    /// With `token`, only the owner's grant that carries it.
    pub fn release(&mut self, key: usize, owner: usize, token: Option<u64>) -> Release {
        self.purge(key);
        let holders = &mut self.keys[key].holders;
        let ours = |h: &&mut MHold| token.is_none_or(|t| t == h.token);
        match holders.get_mut(&owner).filter(ours) {
            None => Release::NotHeld,
            Some(h) if h.holds > 1 => {
                h.holds -= 1;
                Release::Remaining
            }
            Some(_) => {
                holders.remove(&owner);
                Release::Last
            }
        }
    }

    /// With `token`, only the owner's grant that carries it.
    pub fn renew(&mut self, key: usize, owner: usize, ttl: u64, token: Option<u64>) -> bool {
        self.purge(key);
        let deadline = self.now.saturating_add(ttl);
        let ours = |h: &&mut MHold| token.is_none_or(|t| t == h.token);
        match self.keys[key].holders.get_mut(&owner).filter(ours) {
            Some(h) => {
                h.deadline = deadline;
                true
            }
            None => false,
        }
    }

    pub fn settle(&mut self, key: usize) -> Vec<(u32, Attempt)> {
        self.purge(key);
        let mut answered = Vec::new();
        while let Some(w) = self.keys[key].queue.front().copied().filter(|w| !w.part) {
            let outcome = self.grant(key, w.kind, w.owner, w.ttl, false);
            // Busy or at the holder limit: the head keeps its place.
            if matches!(outcome, Attempt::Busy | Attempt::TooManyHolders(_)) {
                break;
            }
            self.keys[key].queue.pop_front();
            answered.push((w.id, outcome));
        }
        answered
    }

    /// The outcome of `Lock::put` as the contract states it.
    pub fn put(&mut self, key: usize, owner: Option<usize>, hold: MHold) -> Result<(), Invalid> {
        let Some(owner) = owner else {
            return Err(Invalid::EmptyOwner);
        };
        if hold.holds == 0 {
            return Err(Invalid::ZeroHolds);
        }
        if hold.token == 0 {
            return Err(Invalid::ZeroToken);
        }
        let holders = &mut self.keys[key].holders;
        let others: Vec<Mode> = holders
            .iter()
            .filter(|(&o, _)| o != owner)
            .map(|(_, h)| h.mode)
            .collect();
        if others.iter().any(|&m| m != hold.mode) {
            return Err(Invalid::ModeMismatch);
        }
        if !others.is_empty() && hold.mode == Mode::Exclusive {
            return Err(Invalid::SecondExclusiveHolder);
        }
        holders.insert(owner, hold);
        self.last_token = self.last_token.max(hold.token.min(MAX_TOKEN));
        Ok(())
    }
}

impl Model {
    /// A model of `keys` free keys at `now`, the counter at `last_token`,
    /// at most `max_holders` holders a key.
    pub fn new(keys: usize, now: u64, last_token: u64, max_holders: usize) -> Model {
        Model {
            now,
            last_token,
            max_holders,
            keys: (0..keys).map(|_| MKey::default()).collect(),
        }
    }
}

/// Views for the property tests.
impl Model {
    /// The owner's hold on the key if it still holds at `now`.
    pub fn live(&self, key: usize, owner: usize) -> Option<MHold> {
        self.keys[key]
            .holders
            .get(&owner)
            .copied()
            .filter(|h| self.now < h.deadline)
    }

    /// owner -> (mode, holds, token, deadline) of the live holders, owners
    /// named by `name`.
    pub fn live_view(
        &self,
        key: usize,
        name: impl Fn(usize) -> Owner,
    ) -> BTreeMap<Owner, (Mode, u32, u64, u64)> {
        self.keys[key]
            .holders
            .iter()
            .filter(|(_, h)| self.now < h.deadline)
            .map(|(&o, h)| (name(o), (h.mode, h.holds, h.token, h.deadline)))
            .collect()
    }

    /// The queue as (id, kind, owner, ttl), owners named by `name`.
    pub fn queue_view(
        &self,
        key: usize,
        name: impl Fn(usize) -> Owner,
    ) -> Vec<(u32, Kind, Owner, u64)> {
        self.keys[key]
            .queue
            .iter()
            .map(|w| (w.id, w.kind, name(w.owner), w.ttl))
            .collect()
    }
}
