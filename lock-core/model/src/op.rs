//! The one operation type both drivers feed to the checker
//! ([`crate::check`]): the property test generates it (the proptest
//! strategies below, feature `proptest`, so that a failure shrinks to a
//! short list of readable operations) and the fuzz target decodes it from
//! bytes ([`decode`]).

use lock_core::tokens::MAX_TOKEN;
use lock_core::{Kind, Mode, Owner};

use crate::model::Model;

/// How many lock keys a run drives.
pub const KEYS: usize = 3;
/// How many distinct owners (plus the empty owner, used only by bad `put`s).
pub const OWNERS: usize = 5;
/// The clock never goes beyond this (deadlines then never saturate to `now`).
pub const MAX_NOW: u64 = 1 << 62;
/// A realistic wall clock (unix ms, 2023).
const WALL_CLOCK: u64 = 1_700_000_000_000;

/// Owner names: short, binary (NUL, 0xff), and long.
pub fn owner_name(i: usize) -> Owner {
    match i % OWNERS {
        0 => b"a".to_vec().into_boxed_slice(),
        1 => b"b".to_vec().into_boxed_slice(),
        2 => vec![0u8, 0xff, b'c'].into_boxed_slice(),
        3 => vec![b'd'; 70].into_boxed_slice(),
        _ => b"A".to_vec().into_boxed_slice(),
    }
}

/// Who sends a command: any owner, or one of the key's live holders at the
/// time of the step (so that releases, renewals, re-entries and drops hit
/// holders often).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    Owner(usize),
    /// The live holder at `pick` modulo their number (in owner order); any
    /// owner (`pick` modulo [`OWNERS`]) when nobody holds.
    Holder(usize),
}

impl Who {
    /// The owner this stands for in `model`'s state of `key`.
    pub fn resolve(self, model: &Model, key: usize) -> usize {
        match self {
            Who::Owner(owner) => owner % OWNERS,
            Who::Holder(pick) => {
                let live: Vec<usize> = model.keys[key]
                    .holders
                    .iter()
                    .filter(|(_, h)| model.now < h.deadline)
                    .map(|(&o, _)| o)
                    .collect();
                if live.is_empty() {
                    pick % OWNERS
                } else {
                    live[pick % live.len()]
                }
            }
        }
    }
}

/// The `TOKEN` a release or a renewal sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tok {
    /// None: any grant of the owner's.
    None,
    /// The owner's own stored grant's token (live or not; the last issued
    /// when it has none).
    Own,
    /// The token issued `k` grants ago (another holder's, an ended grant's,
    /// or the owner's own).
    Behind(u64),
    /// This token (what `Own` and `Behind` resolve to).
    Given(u64),
}

impl Tok {
    /// The token sent by `owner` on `key` in `model`'s state.
    pub fn resolve(self, model: &Model, key: usize, owner: usize) -> Option<u64> {
        match self {
            Tok::None => None,
            Tok::Own => Some(
                model.keys[key]
                    .holders
                    .get(&owner)
                    .map_or(model.last_token, |h| h.token),
            ),
            Tok::Behind(k) => Some(model.last_token.saturating_sub(k)),
            Tok::Given(t) => Some(t),
        }
    }
}

/// One operation on the core (and the model).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// ACQUIRE / RACQUIRE / READ / SEMAPHORE without WAIT, as the shell runs
    /// it (`queued_ahead` = the key has waiters).
    Grant {
        key: usize,
        kind: Kind,
        who: Who,
        ttl: u64,
    },
    Release {
        key: usize,
        who: Who,
        token: Tok,
    },
    Renew {
        key: usize,
        who: Who,
        ttl: u64,
        token: Tok,
    },
    /// The clock moves forward (`true`) or backward.
    Clock {
        forward: bool,
        ms: u64,
    },
    /// A request with WAIT: tried at once and queued when busy (as the
    /// shell does), or queued unconditionally (`try_first` false: exercises
    /// `settle` on queues the shell would not build, e.g. a holder's repeat).
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
    /// Removing a waiter id that may be long gone (answered or removed).
    RemoveId {
        key: usize,
        id: u32,
    },
    /// A visit of the key: purge, then grant from the head of the queue.
    Settle {
        key: usize,
    },
    /// A replicated `LOCK.SYNC SET` (or a loaded record).
    Put(Put),
    /// A replicated `LOCK.SYNC DROP`.
    Drop {
        key: usize,
        who: Who,
    },
}

impl Op {
    /// The key the operation acts on (none for the clock).
    pub fn key(&self) -> Option<usize> {
        match *self {
            Op::Clock { .. } => None,
            Op::Grant { key, .. }
            | Op::Release { key, .. }
            | Op::Renew { key, .. }
            | Op::Enqueue { key, .. }
            | Op::Remove { key, .. }
            | Op::RemoveId { key, .. }
            | Op::Settle { key }
            | Op::Put(Put { key, .. })
            | Op::Drop { key, .. } => Some(key),
        }
    }

    /// The operation with its [`Who`] resolved against `model` (an owner,
    /// never a holder pick) and its key and owners in range.
    pub fn resolve(&self, model: &Model) -> Op {
        let mut op = self.clone();
        match &mut op {
            Op::Release { key, who, token }
            | Op::Renew {
                key, who, token, ..
            } => {
                *key %= KEYS;
                let owner = who.resolve(model, *key);
                *who = Who::Owner(owner);
                *token = match token.resolve(model, *key, owner) {
                    Some(t) => Tok::Given(t),
                    None => Tok::None,
                };
            }
            Op::Grant { key, who, .. } | Op::Drop { key, who } => {
                *key %= KEYS;
                *who = Who::Owner(who.resolve(model, *key));
            }
            Op::Enqueue { key, owner, .. } => {
                *key %= KEYS;
                *owner %= OWNERS;
            }
            Op::Put(Put { key, owner, .. }) => {
                *key %= KEYS;
                *owner = owner.map(|o| o % OWNERS);
            }
            Op::Remove { key, .. } | Op::RemoveId { key, .. } | Op::Settle { key } => *key %= KEYS,
            Op::Clock { .. } => {}
        }
        op
    }
}

/// A replicated `LOCK.SYNC SET`: `owner` None is the empty owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Put {
    pub key: usize,
    pub owner: Option<usize>,
    pub mode: Mode,
    pub holds: u32,
    pub token: PutToken,
    /// Deadline relative to now (may be in the past).
    pub deadline_delta: i64,
}

/// The token a [`Put`] carries: `Fresh(k)` (k above the counter), `Same`
/// (the owner's stored token, else fresh) or `Zero`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutToken {
    Fresh(u64),
    Same,
    Zero,
}

/// The start of a run: the token counter, the clock and the holder limit
/// (`lock.max-holders`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Start {
    pub last_token: u64,
    pub now: u64,
    pub max_holders: usize,
}

/// `lock.max-holders`'s default: never reached by [`OWNERS`] owners.
pub const DEFAULT_MAX_HOLDERS: usize = lock_core::lock::DEFAULT_MAX_HOLDERS;

// ---------------------------------------------------------------------------
// Decoding bytes (the fuzz target, the bounded fuzz run).
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

    /// Any owner, or (a byte from 0xb0 up) a pick among the live holders.
    fn who(&mut self) -> Who {
        match self.byte() {
            b @ 0..=0xaf => Who::Owner(usize::from(b) % OWNERS),
            b => Who::Holder(usize::from(b)),
        }
    }

    /// No token mostly; the owner's own, or a recent one.
    fn tok(&mut self) -> Tok {
        match self.byte() % 8 {
            0..=3 => Tok::None,
            4 | 5 => Tok::Own,
            _ => Tok::Behind(u64::from(self.byte() % 4)),
        }
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
    // Now and then a holder limit the owners reach.
    let max_holders = match input.byte() % 4 {
        0 => 1 + usize::from(input.byte() % 3),
        _ => DEFAULT_MAX_HOLDERS,
    };
    Start {
        last_token,
        now,
        max_holders,
    }
}

fn decode_op(input: &mut Input) -> Op {
    match input.byte() % 20 {
        0..=2 => Op::Grant {
            key: input.key(),
            kind: input.kind(),
            who: input.who(),
            ttl: input.ttl(),
        },
        3 | 4 => Op::Release {
            key: input.key(),
            who: input.who(),
            token: input.tok(),
        },
        5 => Op::Renew {
            key: input.key(),
            who: input.who(),
            ttl: input.ttl(),
            token: input.tok(),
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
        16 | 17 => Op::Put(Put {
            key: input.key(),
            owner: match input.byte() % 16 {
                0 => None,
                n => Some(usize::from(n) % OWNERS),
            },
            mode: if input.byte().is_multiple_of(2) {
                Mode::Exclusive
            } else {
                Mode::Shared
            },
            holds: match input.byte() % 8 {
                0 => 0,
                1 => u32::MAX,
                2 => u32::MAX - 1,
                n => u32::from(n),
            },
            token: match input.byte() % 8 {
                0 => PutToken::Zero,
                1..=3 => PutToken::Same,
                _ => PutToken::Fresh(u64::from(input.byte() % 4)),
            },
            deadline_delta: match input.byte() % 4 {
                0 => -(input.u16() as i64),
                1 => input.u32() as i64,
                _ => i64::from(input.byte() % 64) - 8,
            },
        }),
        _ => Op::Drop {
            key: input.key(),
            who: input.who(),
        },
    }
}

/// Decodes a whole fuzz input: the start, then operations until the bytes
/// run out.
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
// Generating operations (the property test).
// ---------------------------------------------------------------------------

/// Proptest strategies for [`Start`] and [`Op`]: mostly the requests the
/// shell makes on a clock that moves forward by a few milliseconds, over few
/// keys and owners so that states with several readers, holds and waiters
/// arise often; replicated effects, semaphores, multi-key parts, backward
/// jumps and long or saturating ttls less often.
#[cfg(feature = "proptest")]
pub mod strategy {
    use proptest::prelude::*;

    use super::{Op, Put, PutToken, Start, Tok, Who, DEFAULT_MAX_HOLDERS, KEYS, OWNERS};
    use lock_core::tokens::MAX_TOKEN;
    use lock_core::{Kind, Mode};

    /// The counter, sometimes close to exhaustion (`TokensExhausted` must
    /// refuse and change nothing), a clock far from the epoch, and now and
    /// then a holder limit of 1 to 3 (readers and permits wait for it).
    pub fn start() -> impl Strategy<Value = Start> {
        let last_token = prop_oneof![
            4 => 0u64..1000,
            1 => (MAX_TOKEN - 6)..=MAX_TOKEN,
        ];
        let max_holders = prop_oneof![
            2 => Just(DEFAULT_MAX_HOLDERS),
            1 => 1usize..=3,
        ];
        (last_token, 1_000_000u64..2_000_000, max_holders).prop_map(
            |(last_token, now, max_holders)| Start {
                last_token,
                now,
                max_holders,
            },
        )
    }

    /// Key 0 is the busiest; keys 1 and 2 still see every operation.
    fn key() -> impl Strategy<Value = usize> {
        prop_oneof![2 => Just(0usize), 1 => 1..KEYS]
    }

    fn owner() -> impl Strategy<Value = usize> {
        0..OWNERS
    }

    fn who() -> impl Strategy<Value = Who> {
        prop_oneof![
            3 => owner().prop_map(Who::Owner),
            2 => (0..64usize).prop_map(Who::Holder),
        ]
    }

    /// Readers a little more often: shared states with several readers.
    pub fn kind() -> impl Strategy<Value = Kind> {
        prop_oneof![
            2 => Just(Kind::Acquire),
            2 => Just(Kind::Racquire),
            4 => Just(Kind::Read),
            1 => (1u32..=3).prop_map(Kind::Semaphore),
        ]
    }

    /// `TOKEN`: none half the time, else the owner's own or a recent one
    /// (another holder's, an ended grant's).
    fn tok() -> impl Strategy<Value = Tok> {
        prop_oneof![
            4 => Just(Tok::None),
            2 => Just(Tok::Own),
            2 => (0u64..4).prop_map(Tok::Behind),
        ]
    }

    fn ttl() -> impl Strategy<Value = u64> {
        prop_oneof![
            20 => 1u64..=50,
            1 => Just(2_592_000_000u64),
            1 => (0u64..4).prop_map(|k| u64::MAX - k), // saturates the deadline
        ]
    }

    fn put() -> impl Strategy<Value = Op> {
        let owner = prop_oneof![1 => Just(None), 8 => owner().prop_map(Some)];
        let mode = prop_oneof![Just(Mode::Exclusive), Just(Mode::Shared)];
        let holds = prop_oneof![
            1 => Just(0u32),
            1 => Just(u32::MAX),
            1 => Just(u32::MAX - 1),
            6 => 1u32..4,
        ];
        let token = prop_oneof![
            1 => Just(PutToken::Zero),
            3 => Just(PutToken::Same),
            4 => (0u64..4).prop_map(PutToken::Fresh),
        ];
        (key(), owner, mode, holds, token, -20i64..60).prop_map(
            |(key, owner, mode, holds, token, deadline_delta)| {
                Op::Put(Put {
                    key,
                    owner,
                    mode,
                    holds,
                    token,
                    deadline_delta,
                })
            },
        )
    }

    pub fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => (key(), kind(), who(), ttl())
                .prop_map(|(key, kind, who, ttl)| Op::Grant { key, kind, who, ttl }),
            3 => (key(), who(), tok()).prop_map(|(key, who, token)| Op::Release { key, who, token }),
            2 => (key(), who(), ttl(), tok())
                .prop_map(|(key, who, ttl, token)| Op::Renew { key, who, ttl, token }),
            // Time moves by 0..=40 ms, small steps more often than large
            // ones; now and then it is stepped back.
            2 => prop_oneof![0u64..=5, 0u64..=40]
                .prop_map(|ms| Op::Clock { forward: true, ms }),
            1 => (0u64..=40).prop_map(|ms| Op::Clock { forward: false, ms }),
            4 => (key(), kind(), owner(), ttl(), prop::bool::weighted(0.8), prop::bool::weighted(0.2))
                .prop_map(|(key, kind, owner, ttl, try_first, part)| Op::Enqueue {
                    key, kind, owner, ttl, try_first, part,
                }),
            1 => (key(), 0..64usize).prop_map(|(key, pick)| Op::Remove { key, pick }),
            1 => (key(), 0u32..64).prop_map(|(key, id)| Op::RemoveId { key, id }),
            3 => key().prop_map(|key| Op::Settle { key }),
            1 => put(),
            1 => (key(), who()).prop_map(|(key, who)| Op::Drop { key, who }),
        ]
    }
}
