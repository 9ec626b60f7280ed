//! One lock key's state and its transitions.
//!
//! A [`Lock`] is either empty (the key does not exist), held exclusively by one
//! owner, shared by any number of readers, or a semaphore held by up to its
//! limit of owners (one permit each). Every holder has its own hold
//! count, fencing token and absolute deadline (unix milliseconds). Time is
//! always an argument: a holder whose deadline is `<= now` holds nothing.
//!
//! Every transition records the owners whose state it changed in a
//! [`Changes`] list, so the shell can replicate exactly those (see
//! `replication.rs`).
//!
//! The holders live in one packed heap block ([`crate::block`]): the value
//! Redis stores for a key is that block, one allocation per lock.

use crate::block::{self, Block, HolderRef, TooLarge};
use crate::hash::Keyed;
pub use crate::mode::{Census, Mode};
use crate::tokens::Tokens;

/// A holder's identity: a non-empty, binary-safe string chosen by the client.
pub type Owner = Box<[u8]>;

/// What a grant command asks for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// `LOCK.ACQUIRE`: exclusive; a repeat by the holder is an idempotent retry.
    Acquire,
    /// `LOCK.RACQUIRE`: exclusive and reentrant; a repeat adds a hold.
    Racquire,
    /// `LOCK.READ`: shared and reentrant per reader.
    Read,
    /// `LOCK.SEMAPHORE` with this limit: one permit per owner; a repeat by
    /// a holder resets its deadline (its holds stay 1).
    Semaphore(u32),
}

impl Kind {
    pub fn mode(self) -> Mode {
        match self {
            Kind::Acquire | Kind::Racquire => Mode::Exclusive,
            Kind::Read => Mode::Shared,
            Kind::Semaphore(_) => Mode::Semaphore,
        }
    }

    /// The kind that describes a stored state of `mode` (exclusive:
    /// reentrant, so stored hold counts are kept): a semaphore's with its
    /// `limit`, the others' without one; `None` otherwise.
    pub fn of(mode: Mode, limit: Option<u32>) -> Option<Kind> {
        match (mode, limit) {
            (Mode::Exclusive, None) => Some(Kind::Racquire),
            (Mode::Shared, None) => Some(Kind::Read),
            (Mode::Semaphore, Some(limit)) => Some(Kind::Semaphore(limit)),
            (Mode::Exclusive | Mode::Shared, Some(_)) | (Mode::Semaphore, None) => None,
        }
    }

    /// The keyspace event a grant of this kind fires.
    pub fn event(self) -> &'static std::ffi::CStr {
        match self {
            Kind::Acquire => c"lock.acquire",
            Kind::Racquire => c"lock.racquire",
            Kind::Read => c"lock.read",
            Kind::Semaphore(_) => c"lock.semaphore",
        }
    }

    /// Whether a repeat by a holder adds a hold (reentrant kinds).
    fn adds_holds(self) -> bool {
        matches!(self, Kind::Racquire | Kind::Read)
    }
}

/// The largest semaphore limit.
pub const MAX_LIMIT: u32 = 1_000_000;

/// One holder of a lock, owned: what a file or the replication stream
/// brings ([`Lock::put`], [`Lock::from_holders`]). A lock's own holders are
/// read as [`HolderRef`]s.
#[derive(Clone, Debug)]
pub struct Holder {
    pub owner: Owner,
    pub holds: u32,
    /// When it was granted (or loaded, or received from the master), unix
    /// milliseconds modulo 2^32: only for the hold-time statistics, so not
    /// part of the state (equality ignores it).
    pub since: u32,
    pub token: u64,
    /// Absolute deadline, unix milliseconds; the holder holds while `now < deadline`.
    pub deadline: u64,
}

impl PartialEq for Holder {
    fn eq(&self, other: &Holder) -> bool {
        self.as_ref() == other.as_ref()
    }
}

impl Eq for Holder {}

impl Holder {
    pub fn as_ref(&self) -> HolderRef<'_> {
        HolderRef {
            owner: &self.owner,
            holds: self.holds,
            since: self.since,
            token: self.token,
            deadline: self.deadline,
        }
    }
}

/// A holder's deadline that follows a session, in the packed block's
/// encoding ([`crate::block`]).
pub use crate::block::{session_deadline, session_of, SESSION_BIT};
/// A lock's hold times summed up ([`Lock::held_at_deadlines`]).
pub use crate::block::{Held, HELD_BOUNDS_MS};

/// The latest deadline a holder's own lease can have: below
/// [`SESSION_BIT`] (a lease `now + ttl` past it ends there).
pub const MAX_DEADLINE: u64 = SESSION_BIT - 1;

/// The end of a lease of `ttl` ms granted at `now`.
pub fn lease_end(now: u64, ttl: u64) -> u64 {
    now.saturating_add(ttl).min(MAX_DEADLINE)
}

/// `now` (unix ms) as a holder's `since`.
pub fn since(now: u64) -> u32 {
    (now & u64::from(u32::MAX)) as u32
}

impl<'a> HolderRef<'a> {
    /// How long it has been held at `end` (unix ms), right for holds under
    /// 24 days (`since` wraps at 49). An `end` before `since` (a lease that
    /// had ended before it was loaded or received) is 0, never a wrap.
    pub fn held_ms(&self, end: u64) -> u32 {
        block::held_ms(self.since, end)
    }

    /// Live by its own deadline (a session holder always is: whether its
    /// session is live is [`HolderRef::is_live_with`]'s question, and
    /// [`Lock::end_sessions`] ends those whose session ended).
    pub fn is_live(&self, now: u64) -> bool {
        now < self.deadline
    }

    /// The session it follows, if any.
    pub fn session(&self) -> Option<u64> {
        session_of(self.deadline)
    }

    /// Whether it follows a connection lease (`BIND`): its entry names its
    /// own token as its session (no session id is ever a token), and the
    /// shell's lease table has its deadline (`crate::lease`).
    pub fn is_follower(&self) -> bool {
        self.session() == Some(self.token)
    }

    /// Its lease's end: its own deadline, or its session's
    /// (`deadline_of(id)`, `None` for an ended or unknown session: 0).
    pub fn deadline_with(&self, deadline_of: impl Fn(u64) -> Option<u64>) -> u64 {
        match self.session() {
            Some(id) => deadline_of(id).unwrap_or(0),
            None => self.deadline,
        }
    }

    /// Live at `now`, its session's deadline given by `deadline_of`.
    pub fn is_live_with(&self, now: u64, deadline_of: impl Fn(u64) -> Option<u64>) -> bool {
        now < self.deadline_with(deadline_of)
    }

    pub fn to_owned(&self) -> Holder {
        Holder {
            owner: self.owner.into(),
            holds: self.holds,
            since: self.since,
            token: self.token,
            deadline: self.deadline,
        }
    }
}

impl PartialEq<Holder> for HolderRef<'_> {
    fn eq(&self, other: &Holder) -> bool {
        *self == other.as_ref()
    }
}

/// A grant request: what is asked, by whom, for how long (owned: it can
/// wait in a queue). [`Ask`] is the same, borrowed.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Request {
    pub kind: Kind,
    pub owner: Owner,
    pub ttl: u64,
    /// The session the holder follows (`SESSION id`), 0 for none.
    pub session: u64,
}

/// A grant request with a borrowed owner: what a command asks before it
/// has to wait (nothing copied).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Ask<'a> {
    pub kind: Kind,
    pub owner: &'a [u8],
    pub ttl: u64,
    /// The session the holder follows (`SESSION id`), 0 for none.
    pub session: u64,
}

impl<'a> From<&'a Request> for Ask<'a> {
    fn from(r: &'a Request) -> Ask<'a> {
        Ask {
            kind: r.kind,
            owner: &r.owner,
            ttl: r.ttl,
            session: r.session,
        }
    }
}

impl Ask<'_> {
    /// The request, owned, to keep in a queue.
    pub fn to_request(&self) -> Request {
        Request {
            kind: self.kind,
            owner: self.owner.into(),
            ttl: self.ttl,
            session: self.session,
        }
    }
}

/// The outcome of a grant request.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Attempt {
    /// Granted (or re-entered): the holder's fencing token.
    Granted(u64),
    /// Held by others, or others wait ahead: refused now (or wait).
    Busy,
    /// The owner already holds this key in the given, other, mode.
    Conflict(Mode),
    /// The key is held as a semaphore and a lock was asked for, or the
    /// other way round (the mode it is held in).
    WrongKind(Mode),
    /// The key is a semaphore with another limit (the one it has).
    OtherLimit(u32),
    /// The owner's hold count would overflow.
    TooManyHolds,
    /// No fencing token is left to issue.
    TokensExhausted,
    /// The lock would pass 4 GiB.
    TooLarge,
    /// The lock has as many holders as a lock may have (the limit carried:
    /// [`max_holders`]); a new holder is refused, a holder's repeat is not.
    TooManyHolders(usize),
}

impl Attempt {
    /// Whether a request with `WAIT` waits out this refusal in the queue:
    /// held by others or others queued ahead ([`Attempt::Busy`]), or the
    /// key at its holder limit ([`Attempt::TooManyHolders`], contract v4:
    /// only a request without `WAIT` gets the limit's error). A queue's
    /// head refused so keeps its place ([`crate::Queue::settle`]).
    pub fn waits(self) -> bool {
        matches!(self, Attempt::Busy | Attempt::TooManyHolders(_))
    }
}

/// The default of [`max_holders`].
pub const DEFAULT_MAX_HOLDERS: usize = 1000;

/// The most expired holders one [`Lock::purge`] of an indexed lock drops
/// (a slice: well under a millisecond), and the most entries it looks at.
#[cfg(not(test))]
pub const PURGE_MOST: usize = 1024;
#[cfg(not(test))]
pub const PURGE_LOOK: usize = 16 * 1024;
/// (A few in the core's own tests: every purge of an indexed lock of a few
/// holders goes in slices.)
#[cfg(test)]
pub const PURGE_MOST: usize = 2;
#[cfg(test)]
pub const PURGE_LOOK: usize = 5;

/// The most holders one lock may have: a grant that would add one past it
/// is refused ([`Attempt::TooManyHolders`]). The one setting the core reads
/// (the shell sets it from `lock.max-holders`): every operation on a key is
/// linear in its holders at worst, and this keeps each one short.
static MAX_HOLDERS: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(DEFAULT_MAX_HOLDERS);

/// The most holders one lock may have now (see [`set_max_holders`]).
#[inline]
pub fn max_holders() -> usize {
    MAX_HOLDERS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Sets [`max_holders`] (at least 1).
pub fn set_max_holders(max: usize) {
    MAX_HOLDERS.store(max.max(1), std::sync::atomic::Ordering::Relaxed);
}

/// The reply to `LOCK.RELEASE`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Release {
    /// The owner's last hold is gone.
    Last,
    /// One hold removed; the owner still holds.
    Remaining,
    /// The owner held nothing here.
    NotHeld,
}

/// Owners up to this long are recorded in [`Changes`] without an allocation.
const INLINE_OWNER: usize = 48;

/// A holder that ended in a transition: how long it had held (ms;
/// released: until then, expired: until its deadline) and its grant's
/// token (what a binding to its connection is found by).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    pub held: u32,
    pub token: u64,
    /// The session it followed, 0 for none.
    pub session: u64,
}

/// Owners whose state a transition changed, in order, without repeats, and
/// how many of them left because their lease expired. Most transitions
/// change one owner: it is kept inline (no allocation when it is no longer
/// than a UUID or so).
#[derive(Debug)]
pub struct Changes {
    first: [u8; INLINE_OWNER],
    /// Length of the inline owner; `None` when there is none.
    first_len: Option<u8>,
    more: Vec<Owner>,
    expired: usize,
    /// The holders that ended, as their hold times and tokens: the first
    /// one inline (most transitions end at most one holder: no allocation
    /// for it), the rest in `ended_more`.
    ended_first: Option<Ended>,
    ended_more: Vec<Ended>,
    /// Holders that began to follow a session here (a grant naming it, a
    /// repeat moving to it): `(from, to)`, 0 for no session. Ends are in
    /// `ended`.
    joined: Vec<(u64, u64)>,
    /// Own deadlines set on followers of a connection lease (a repeat or a
    /// RENEW of a bound holder): `(token, deadline)`.
    own: Vec<(u64, u64)>,
    /// Where each listed owner is, by the hash of its bytes, once more
    /// than [`INDEXED_FROM`] are listed: a touch of a lock's every holder
    /// (a refresh, a purge of many) costs linear time, not quadratic.
    index: Option<Box<OwnerIndex>>,
    /// The entries of the holders a settle added ([`Lock::grant_in_turn`]),
    /// and the lock's shape after the last: [`Lock::look_up_changed`]
    /// finds them there while the shape is still that one.
    placed: Vec<usize>,
    placed_shape: Option<Shape>,
    /// Expired holders a grant set aside ([`Lock::set_aside_for`]).
    aside: Option<Box<Aside>>,
}

/// Owners listed in [`Changes`] from which on a repeat is found by hash
/// rather than by comparing each listed owner.
const INDEXED_FROM: usize = 8;

/// No position (the end of a chain in [`OwnerIndex`]).
const NO_POSITION: u32 = u32::MAX;

/// The owners of a [`Changes`] list by hash: for each hash, the latest
/// position with it, and for each position the previous one with the same
/// hash (a chain, compared byte for byte: exact whatever collides). Owners
/// are chosen by clients: the hash is keyed at random ([`Keyed`]); the
/// table of hashes takes them as they are ([`AsIs`]).
#[derive(Debug, Default)]
struct OwnerIndex {
    latest: std::collections::HashMap<u64, u32, AsIs>,
    previous: Vec<u32>,
}

impl OwnerIndex {
    /// An index with room for `n` owners (no growth while they are added).
    fn with_capacity(n: usize) -> OwnerIndex {
        OwnerIndex {
            latest: std::collections::HashMap::with_capacity_and_hasher(n, AsIs),
            previous: Vec::with_capacity(n),
        }
    }

    fn hash(&self, owner: &[u8]) -> u64 {
        std::hash::BuildHasher::hash_one(&Keyed::default(), owner)
    }

    /// Records that the owner at the next position has this hash.
    fn add(&mut self, hash: u64) {
        let position = u32::try_from(self.previous.len()).unwrap_or(NO_POSITION);
        let previous = self.latest.insert(hash, position).unwrap_or(NO_POSITION);
        self.previous.push(previous);
    }

    /// The positions listed with this hash, latest first.
    fn positions(&self, hash: u64) -> impl Iterator<Item = usize> + '_ {
        let first = self.latest.get(&hash).copied().unwrap_or(NO_POSITION);
        std::iter::successors(Some(first), move |p| {
            self.previous.get(*p as usize).copied()
        })
        .take_while(|p| *p != NO_POSITION)
        .map(|p| p as usize)
    }
}

/// The table of [`OwnerIndex`]: its keys are keyed hashes already.
#[derive(Debug, Default, Clone, Copy)]
struct AsIs;

impl std::hash::BuildHasher for AsIs {
    type Hasher = AsIsHasher;
    fn build_hasher(&self) -> AsIsHasher {
        AsIsHasher(0)
    }
}

struct AsIsHasher(u64);

impl std::hash::Hasher for AsIsHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = x;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl Default for Changes {
    fn default() -> Changes {
        Changes {
            first: [0; INLINE_OWNER],
            first_len: None,
            more: Vec::new(),
            expired: 0,
            ended_first: None,
            ended_more: Vec::new(),
            joined: Vec::new(),
            own: Vec::new(),
            index: None,
            placed: Vec::new(),
            placed_shape: None,
            aside: None,
        }
    }
}

/// The expired holders of a lock a grant set aside whole
/// ([`Lock::set_aside_for`]), to end in slices: each ended as a purge
/// ends it, at its own deadline, once ([`Aside::end_some`]). None of them
/// holds the key any more; its key holds the new holder meanwhile.
#[derive(Debug)]
pub struct Aside {
    lock: Lock,
    now: u64,
}

impl Aside {
    /// Ends the next slice of them into `changes`, as [`Lock::purge`] at
    /// the time they were set aside: whether some are left.
    pub fn end_some(&mut self, changes: &mut Changes) -> bool {
        self.lock.purge(self.now, changes) && !self.lock.is_empty()
    }

    /// How many are left to end.
    pub fn len(&self) -> usize {
        self.lock.holder_count()
    }

    pub fn is_empty(&self) -> bool {
        self.lock.is_empty()
    }
}

impl Changes {
    /// Lists `owner` as changed, unless it is listed already: constant
    /// time (expected), whatever the length of the list.
    pub fn touch(&mut self, owner: &[u8]) {
        if let Some(index) = self.index.as_deref() {
            let hash = index.hash(owner);
            if index
                .positions(hash)
                .any(|p| self.owner_at(p) == Some(owner))
            {
                return;
            }
            self.more.push(owner.into());
            if let Some(index) = self.index.as_deref_mut() {
                index.add(hash);
            }
            return;
        }
        if self.owners().any(|o| o == owner) {
            return;
        }
        if self.more.len() >= INDEXED_FROM {
            self.build_index();
            self.touch(owner);
            return;
        }
        if self.first_len.is_none() && self.more.is_empty() {
            let n = u8::try_from(owner.len());
            if let (Ok(n), Some(slot)) = (n, self.first.get_mut(..owner.len())) {
                slot.copy_from_slice(owner);
                self.first_len = Some(n);
                return;
            }
        }
        self.more.push(owner.into());
    }

    pub fn is_empty(&self) -> bool {
        self.first_len.is_none() && self.more.is_empty()
    }

    /// Whether `owner` is listed (constant time once the list is long).
    pub fn contains(&self, owner: &[u8]) -> bool {
        match self.index.as_deref() {
            Some(index) => index
                .positions(index.hash(owner))
                .any(|p| self.owner_at(p) == Some(owner)),
            None => self.owners().any(|o| o == owner),
        }
    }

    /// How many owners are listed.
    pub fn len(&self) -> usize {
        usize::from(self.first_len.is_some()) + self.more.len()
    }

    /// The listed owner at `position` (in [`Changes::owners`]'s order).
    fn owner_at(&self, position: usize) -> Option<&[u8]> {
        match (self.first_len, position) {
            (Some(n), 0) => self.first.get(..usize::from(n)),
            (Some(_), p) => self.more.get(p - 1).map(|o| o.as_ref()),
            (None, p) => self.more.get(p).map(|o| o.as_ref()),
        }
    }

    /// Indexes the owners listed so far (the list has grown long).
    #[cold]
    fn build_index(&mut self) {
        let mut index = OwnerIndex::default();
        for owner in self.owners() {
            let hash = index.hash(owner);
            index.add(hash);
        }
        self.index = Some(Box::new(index));
    }

    /// The owners changed, in the order they were first changed.
    pub fn owners(&self) -> impl Iterator<Item = &[u8]> + Clone {
        let first = self
            .first_len
            .and_then(|n| self.first.get(..usize::from(n)));
        first
            .into_iter()
            .chain(self.more.iter().map(|o| o.as_ref()))
    }

    /// Holders dropped because their deadline had passed.
    pub fn expired(&self) -> usize {
        self.expired
    }

    /// The expired holders a grant here set aside, to end in later
    /// slices ([`Aside::end_some`]), taken out.
    #[inline]
    pub fn take_aside(&mut self) -> Option<Box<Aside>> {
        self.aside.take()
    }

    /// The holders that ended here: how long each had held and its grant.
    pub fn ended(&self) -> impl Iterator<Item = Ended> + '_ {
        self.ended_first
            .into_iter()
            .chain(self.ended_more.iter().copied())
    }

    /// Holders that began to follow a session here: `(from, to)`, 0 for
    /// no session (a new holder comes from 0).
    pub fn joined(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.joined.iter().copied()
    }

    /// Own deadlines set here on holders that follow a connection lease
    /// ([`HolderRef::is_follower`]): `(token, deadline)`. The holder's
    /// entry does not change (it names its lease follower): the shell's
    /// lease table keeps the deadline (`lease::Leases::set_own`).
    pub fn own(&self) -> &[(u64, u64)] {
        &self.own
    }

    /// How long each holder that ended here had held, ms (released: until
    /// now; expired: until its deadline).
    pub fn held(&self) -> impl Iterator<Item = u32> + '_ {
        self.ended().map(|e| e.held)
    }

    fn end(&mut self, h: &HolderRef<'_>, until: u64) {
        let ended = Ended {
            held: h.held_ms(until),
            token: h.token,
            session: h.session().unwrap_or(0),
        };
        if self.ended_first.is_none() {
            self.ended_first = Some(ended);
        } else {
            self.ended_more.push(ended);
        }
    }
}

/// Why a state read from a file or the replication stream was refused.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Invalid {
    EmptyOwner,
    ZeroHolds,
    ZeroToken,
    DuplicateOwner,
    /// Two holders with one token: no server issues a token twice.
    DuplicateToken,
    SecondExclusiveHolder,
    ModeMismatch,
    /// A semaphore's limit out of range, or holders past it.
    BadLimit,
    /// The lock would pass 4 GiB.
    TooLarge,
    /// A saved block that is not whole (cut short, too long, unknown kind).
    Corrupt,
    /// More holders than a lock may have ([`Lock::from_saved_within`]).
    TooManyHolders,
}

impl From<TooLarge> for Invalid {
    fn from(_: TooLarge) -> Invalid {
        Invalid::TooLarge
    }
}

/// A lock read back from a file or a RESTORE payload, with what its load
/// needs to know of it, found by the walk that checked it.
#[derive(Debug)]
pub struct Loaded {
    pub lock: Lock,
    /// The highest token any holder carries (the lowest is at least 1: a
    /// lock never holds token 0).
    pub highest_token: u64,
    /// [`Lock::sweep_at`].
    pub sweep_at: Option<u64>,
    /// The latest deadline any holder carries (of its own: a session
    /// holder's is its session's).
    pub latest_deadline: u64,
    /// The highest session id a holder follows (0: none does).
    pub highest_session: u64,
}

impl Loaded {
    fn new(lock: Lock, survey: block::Survey) -> Loaded {
        let (earliest, latest) = (survey.earliest_deadline, survey.latest_deadline);
        Loaded {
            lock,
            highest_token: survey.highest_token,
            // With session holders the key never expires by itself: its
            // own leases are swept.
            sweep_at: (earliest < latest || (survey.highest_session != 0 && latest != 0))
                .then_some(earliest),
            latest_deadline: latest,
            highest_session: survey.highest_session,
        }
    }
}

/// `a == b`, their last bytes compared first: owners of one key often share
/// a prefix and a length (`reader-1234`), and a walk comparing one owner
/// with each holder's calls `memcmp` only for the few that end alike.
#[inline]
fn same_owner(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.last() == b.last() && a == b
}

/// What an apply ([`Lock::apply_set`], [`Lock::apply_drop`]) found on its
/// one walk of the holders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The session the owner's holder followed before (`None`: it had no
    /// holder, or one of its own lease).
    pub followed: Option<u64>,
    /// The earliest and the latest deadline of the holders after
    /// (`None`: none is left).
    pub deadlines: Option<(u64, u64)>,
}

impl Applied {
    /// [`Lock::latest_deadline`] of the lock after.
    pub fn latest_deadline(&self) -> Option<u64> {
        self.deadlines.map(|(_, hi)| hi)
    }

    /// [`Lock::sweep_at`] of the lock after.
    pub fn sweep_at(&self) -> Option<u64> {
        let (earliest, latest) = self.deadlines?;
        (earliest != latest && session_of(earliest).is_none()).then_some(earliest)
    }
}

/// The state of one lock key. Empty means free (the key should not exist).
#[derive(Default)]
pub struct Lock {
    block: Block,
}

impl Clone for Lock {
    fn clone(&self) -> Lock {
        let mut copy = Block::default();
        let (tag, limit) = (self.tag(), self.block.limit());
        for (_, h) in self.block.entries() {
            // The copy is no larger than the original, which fit.
            let _ = copy.push(tag, limit, h);
        }
        Lock { block: copy }
    }
}

impl PartialEq for Lock {
    fn eq(&self, other: &Lock) -> bool {
        self.mode() == other.mode()
            && self.block.limit() == other.block.limit()
            && self.holder_count() == other.holder_count()
            && self.holders().zip(other.holders()).all(|(a, b)| a == b)
    }
}

impl Eq for Lock {}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("mode", &self.mode())
            .field("limit", &self.block.limit())
            .field("holders", &self.holders().collect::<Vec<_>>())
            .finish()
    }
}

/// A lock's shape ([`Lock::shape`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    at: usize,
    bytes: usize,
    holders: usize,
}

/// A lock's holders by owner, for many look-ups in a row while holders are
/// added or changed but none removed ([`Lock::grant_in_turn`]): each
/// holder's entry offset by the hash of its owner (offsets stay put when
/// holders are added or changed).
/// Built on the second request (`Default`: nothing built yet).
#[derive(Debug, Default)]
pub struct HolderIndex {
    first_done: bool,
    pub(crate) table: Option<HolderTable>,
    /// No holder's deadline is earlier (0: not known): kept by the grants
    /// through the index, set by [`crate::Settling::pause`]; a settle
    /// resumed before it has nothing to purge.
    pub(crate) earliest: u64,
}

#[derive(Debug)]
pub(crate) struct HolderTable {
    owners: OwnerIndex,
    /// The entry offset of each indexed holder, in the order indexed.
    offsets: Vec<usize>,
}

impl HolderTable {
    fn of(lock: &Lock) -> HolderTable {
        let mut index = HolderTable {
            owners: OwnerIndex::with_capacity(lock.holder_count()),
            offsets: Vec::with_capacity(lock.holder_count()),
        };
        for (at, h) in lock.block.entries() {
            index.add(h.owner, at);
        }
        index
    }

    fn add(&mut self, owner: &[u8], at: usize) {
        let hash = self.owners.hash(owner);
        self.owners.add(hash);
        self.offsets.push(at);
    }

    /// The entry offset of `owner`'s holder in `lock`, if it has one.
    fn find(&self, lock: &Lock, owner: &[u8]) -> Option<usize> {
        self.owners
            .positions(self.owners.hash(owner))
            .filter_map(|p| self.offsets.get(p).copied())
            .find(|at| lock.block.holder_at(*at).is_some_and(|h| h.owner == owner))
    }
}

#[cfg(test)]
impl Lock {
    /// [`Lock::purge`] called until no expired holder is left.
    pub(crate) fn purge_all(&mut self, now: u64, changes: &mut Changes) {
        while self.purge(now, changes) {}
    }

    /// Whether a [`Lock::purge`] at `now` left expired holders for the
    /// next one (an indexed lock's, in slices).
    pub(crate) fn purge_left(&self, now: u64) -> bool {
        self.block.is_indexed() && now >= self.block.low()
    }
}

#[cfg(test)]
impl HolderIndex {
    /// Whether the index finds every holder of `lock` where a rebuild
    /// finds it, and indexes no more holders than `lock` has (nothing built
    /// yet agrees with anything).
    pub(crate) fn agrees_with(&self, lock: &Lock) -> bool {
        let Some(ix) = self.table.as_ref() else {
            return true;
        };
        let rebuilt = HolderTable::of(lock);
        ix.offsets.len() == lock.holder_count()
            && lock
                .holders()
                .all(|h| ix.find(lock, h.owner) == rebuilt.find(lock, h.owner))
    }
}

/// Owners (or holders) up to this many are looked up one by one
/// ([`Lock::look_up`]).
const LOOK_UP_FEW: usize = 8;

/// What a grant request would get, decided before anything changes.
enum Verdict {
    /// The owner holds the key already: a repeat (its entry's offset, holds,
    /// since and token).
    Repeat {
        at: usize,
        holds: u32,
        since: u32,
        token: u64,
    },
    /// A new holder.
    New,
    /// Refused (busy, or an error).
    Refused(Attempt),
}

/// A holder's own rules, whatever the others (a non-empty owner, a hold,
/// a token; a semaphore's limit in range and one permit): the block's
/// `limit` field (0 but for a semaphore).
fn own_rules(kind: Kind, holder: &HolderRef<'_>) -> Result<u32, Invalid> {
    if holder.owner.is_empty() {
        return Err(Invalid::EmptyOwner);
    }
    if holder.holds == 0 {
        return Err(Invalid::ZeroHolds);
    }
    if holder.token == 0 {
        return Err(Invalid::ZeroToken);
    }
    match kind {
        Kind::Semaphore(limit) if !(1..=MAX_LIMIT).contains(&limit) || holder.holds != 1 => {
            Err(Invalid::BadLimit)
        }
        Kind::Semaphore(limit) => Ok(limit),
        _ => Ok(0),
    }
}

impl Lock {
    /// Builds a lock from stored holders, checking every invariant. `kind`
    /// carries a semaphore's limit (any kind of the mode does for the others).
    pub fn from_holders(kind: Kind, holders: Vec<Holder>) -> Result<Lock, Invalid> {
        let mut lock = Lock::default();
        if holders.len() > LOOK_UP_FEW {
            return Lock::from_many(kind, &holders);
        }
        for holder in holders {
            if lock.holder(&holder.owner).is_some() {
                return Err(Invalid::DuplicateOwner);
            }
            lock.put(kind, holder)?;
        }
        Ok(lock)
    }

    /// [`Lock::from_holders`] of many holders: owners and tokens each once
    /// checked through hash sets, each holder's own rules one by one, then
    /// the block built in one pass (linear time, where a holder put at a
    /// time would compare it with every holder before it).
    #[cold]
    fn from_many(kind: Kind, holders: &[Holder]) -> Result<Lock, Invalid> {
        let mut owners = std::collections::HashSet::with_capacity(holders.len());
        let mut tokens = std::collections::HashSet::with_capacity(holders.len());
        for h in holders {
            let limit = own_rules(kind, &h.as_ref())?;
            if !owners.insert(&h.owner[..]) {
                return Err(Invalid::DuplicateOwner);
            }
            if !tokens.insert(h.token) {
                return Err(Invalid::DuplicateToken);
            }
            if kind.mode() == Mode::Exclusive && owners.len() > 1 {
                return Err(Invalid::SecondExclusiveHolder);
            }
            if owners.len() > limit as usize && kind.mode() == Mode::Semaphore {
                return Err(Invalid::BadLimit);
            }
        }
        let mut lock = Lock::default();
        let limit = match kind {
            Kind::Semaphore(limit) => limit,
            _ => 0,
        };
        for h in holders {
            lock.block.push(kind.mode().tag(), limit, h.as_ref())?;
        }
        Ok(lock)
    }

    fn tag(&self) -> u8 {
        self.block.tag().unwrap_or(block::EXCLUSIVE)
    }

    /// The mode it is held in (exclusive when empty).
    pub fn mode(&self) -> Mode {
        self.block
            .tag()
            .and_then(Mode::from_tag)
            .unwrap_or(Mode::Exclusive)
    }

    /// The kind that describes this lock's state as stored and replicated:
    /// its mode, and a semaphore's limit.
    pub fn kind(&self) -> Kind {
        // A limit exactly when it is a semaphore: always a kind.
        Kind::of(self.mode(), self.limit()).unwrap_or(Kind::Racquire)
    }

    /// A semaphore's limit; `None` for a lock.
    pub fn limit(&self) -> Option<u32> {
        (self.mode() == Mode::Semaphore).then(|| self.block.limit())
    }

    /// Every stored holder in grant order, expired ones included (they go
    /// at the next purge).
    #[inline]
    pub fn holders(&self) -> impl Iterator<Item = HolderRef<'_>> + Clone {
        self.block.entries().map(|(_, h)| h)
    }

    /// The first stored holder in grant order (a lock of one holder's
    /// only one): `holders().next()`, read in place.
    #[inline]
    pub fn first_holder(&self) -> Option<HolderRef<'_>> {
        self.block.first_holder()
    }

    pub fn holder_count(&self) -> usize {
        self.block.count()
    }

    /// Where its block is and how many holders and bytes it has: a settle's
    /// index kept across slices ([`crate::Settling::resume`]) is used only
    /// on the same shape (holders added or removed change it).
    /// No later than the earliest deadline at which a holder can expire
    /// by its own lease (`u64::MAX` when none can: those following a
    /// session end with it): the bound [`Lock::earliest_deadline`] gives,
    /// no walk.
    pub(crate) fn earliest_of_all(&self) -> u64 {
        self.block.low()
    }

    pub(crate) fn shape(&self) -> Shape {
        let bytes = self.block.as_bytes();
        Shape {
            at: bytes.as_ptr() as usize,
            bytes: bytes.len(),
            holders: self.block.count(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.block.is_empty()
    }

    /// The lock let go of (its key's value freed: a `DEL`, Redis's expiry
    /// of it): a large block's memory freed where
    /// [`crate::set_free_elsewhere`] says, not here.
    pub fn let_go(mut self) {
        self.block.clear();
    }

    /// The holders that still hold at `now`.
    pub fn live(&self, now: u64) -> impl Iterator<Item = HolderRef<'_>> + Clone {
        self.holders().filter(move |h| h.is_live(now))
    }

    pub fn is_held(&self, now: u64) -> bool {
        // Before the bound on the earliest deadline, every holder is live;
        // after it, some is while the latest deadline (kept, or an indexed
        // block's) is to come (a session's holder's is: it has the
        // session's bit).
        if now < self.block.low() {
            return !self.is_empty();
        }
        if self.block.is_indexed() {
            return self.block.latest().is_some_and(|d| now < d);
        }
        self.live(now).next().is_some()
    }

    /// How long each holder will have held at its own deadline, summed up
    /// ([`Held`]): what the statistics record of a lock whose every
    /// lease ran out. An indexed lock keeps it (no walk), the others walk
    /// their holders (fewer than [`block::INDEX_FROM`]).
    pub fn held_at_deadlines(&self) -> Held {
        if let Some(held) = self.block.held() {
            return held;
        }
        let mut held = Held::default();
        for h in self.holders() {
            held.record(u64::from(h.held_ms(h.deadline)));
        }
        held
    }

    /// How many holders are live at `now`: the stored count before the
    /// bound on the earliest deadline (no walk); past it, an indexed
    /// lock's count less its expired holders, counted from its deadlines
    /// in order ([`Block::expired_count`]: no walk of the holders), else
    /// by a walk (of fewer than [`block::INDEX_FROM`] holders).
    fn live_count(&self, now: u64) -> usize {
        if now < self.block.low() {
            return self.block.count();
        }
        match self.block.expired_count(now) {
            Some(expired) => self.block.count().saturating_sub(expired),
            None => self.live(now).count(),
        }
    }

    pub fn holder(&self, owner: &[u8]) -> Option<HolderRef<'_>> {
        self.entry(owner).map(|(_, h)| h)
    }

    /// Each of `owners` with its holder here (`None`: it holds nothing
    /// here), in order: by one look-up each for a few owners or a small
    /// lock, else through a table of the owners built once, the holders
    /// gone through once (linear time in the owners and the holders, never
    /// their product; a table of the owners, not of the holders: a slice of
    /// a long queue's grants changes a few hundred of a lock's 10,000).
    pub fn look_up<'a, 'o>(
        &'a self,
        owners: impl Iterator<Item = &'o [u8]> + Clone,
    ) -> Vec<(&'o [u8], Option<HolderRef<'a>>)> {
        let few = owners.clone().nth(LOOK_UP_FEW).is_none();
        if few || self.holder_count() <= LOOK_UP_FEW || self.block.is_indexed() {
            return owners.map(|o| (o, self.holder(o))).collect();
        }
        let listed: Vec<&'o [u8]> = owners.collect();
        // Each owner's first place in the list (an owner listed twice is
        // found once and given to both).
        let mut first: std::collections::HashMap<&[u8], usize, Keyed> =
            std::collections::HashMap::with_capacity_and_hasher(listed.len(), Keyed::default());
        for (i, o) in listed.iter().enumerate() {
            first.entry(*o).or_insert(i);
        }
        let mut found: Vec<Option<HolderRef<'a>>> = vec![None; listed.len()];
        let mut left = first.len();
        for h in self.holders() {
            if left == 0 {
                break;
            }
            if let Some(slot) = first.get(h.owner).and_then(|&i| found.get_mut(i)) {
                if slot.is_none() {
                    *slot = Some(h);
                    left -= 1;
                }
            }
        }
        listed
            .iter()
            .map(|o| {
                let holder = first.get(o).and_then(|&i| found.get(i).copied().flatten());
                (*o, holder)
            })
            .collect()
    }

    /// [`Lock::look_up`] of the owners `changes` lists: the holders a
    /// settle added ([`Lock::grant_in_turn`]) found at their entries while
    /// the lock has the shape the last one left (each checked to be its
    /// owner's), the others looked up; time linear in the changes, not in
    /// the holders, for a slice of a queue's grants on a lock of many.
    pub fn look_up_changed<'a, 'c>(
        &'a self,
        changes: &'c Changes,
    ) -> Vec<(&'c [u8], Option<HolderRef<'a>>)> {
        if changes.placed.is_empty() || changes.placed_shape != Some(self.shape()) {
            return self.look_up(changes.owners());
        }
        let mut at: std::collections::HashMap<&[u8], HolderRef<'a>, Keyed> =
            std::collections::HashMap::with_capacity_and_hasher(
                changes.placed.len(),
                Keyed::default(),
            );
        for h in changes
            .placed
            .iter()
            .filter_map(|&p| self.block.holder_at(p))
        {
            at.insert(h.owner, h);
        }
        let rest = changes.owners().filter(|o| !at.contains_key(o));
        let found = self.look_up(rest);
        let mut found = found.into_iter().peekable();
        let mut all = Vec::with_capacity(changes.len());
        for o in changes.owners() {
            match at.get(o) {
                Some(h) if h.owner == o => all.push((o, Some(*h))),
                _ => match found.next() {
                    Some(f) => all.push(f),
                    None => all.push((o, self.holder(o))),
                },
            }
        }
        all
    }

    /// The owner's entry (offset and state), live or not: through the
    /// block's index when it has one (constant time), else by a walk (of
    /// fewer than [`block::INDEX_FROM`] holders).
    fn entry(&self, owner: &[u8]) -> Option<(usize, HolderRef<'_>)> {
        match self.block.find(owner) {
            Some(found) => {
                let at = found?;
                Some((at, self.block.holder_at(at)?))
            }
            None => self.block.scan(owner),
        }
    }

    /// The earliest and the latest deadline of its holders, in one pass (an
    /// exclusive lock's one holder read directly).
    fn deadlines(&self) -> Option<(u64, u64)> {
        if let Some(d) = self.block.sole_deadline() {
            return Some((d, d));
        }
        self.holders().fold(None, |acc, h| match acc {
            None => Some((h.deadline, h.deadline)),
            Some((lo, hi)) => Some((lo.min(h.deadline), hi.max(h.deadline))),
        })
    }

    /// The latest deadline of any holder: the key's Redis expiry. Kept in
    /// the block by every change to a holder (no walk of the holders, but
    /// after the last holder at the latest left: see [`Lock::keep_latest`]).
    pub fn latest_deadline(&self) -> Option<u64> {
        self.block.latest()
    }

    /// [`Lock::latest_deadline`], kept in the block when it took a walk
    /// (the last holder at the latest left since it was last kept): the
    /// write-back of a transaction asks once, so a transaction walks the
    /// holders for it at most once, and only one that removed or shortened
    /// the lease of the last holder at the latest.
    pub fn keep_latest(&mut self) -> Option<u64> {
        self.block.keep_latest()
    }

    /// When this lock next changes by itself, or earlier: a bound on the
    /// earliest deadline of its holders (holders following a session
    /// aside: their session's end comes to the key from the session), kept
    /// without a walk ([`Block::low`]). `None` only when no holder has a
    /// lease of its own. A visit planned at it may come early, never late:
    /// an early visit's purge finds nothing expired, and its one walk makes
    /// the bound exact ([`Lock::purge`]), so the visit planned after it is
    /// at the earliest itself.
    pub fn earliest_deadline(&self) -> Option<u64> {
        Some(self.block.low()).filter(|&d| d != u64::MAX)
    }

    /// When this lock must be visited although nobody asks: the earliest
    /// deadline, when some holder's lease ends before the key expires (readers
    /// expiring apart). `None` when the key's own expiry is all it needs.
    /// No walk: the bound of [`Lock::earliest_deadline`] (early, never
    /// late), `None` when it is the latest deadline (then every holder's
    /// lease ends together with the key).
    pub fn sweep_at(&self) -> Option<u64> {
        let low = self.earliest_deadline()?;
        match self.block.latest_known() {
            Some(latest) if latest == low => None,
            _ => Some(low),
        }
    }

    /// Lists every holder as changed, so the whole state is written back and
    /// replicated (after something outside the module altered the key).
    pub fn touch_all(&self, changes: &mut Changes) {
        for h in self.holders() {
            changes.touch(h.owner);
        }
    }

    /// Drops every holder whose deadline has passed. No walk while `now` is
    /// before the bound on the earliest deadline ([`Block::low`]); past it,
    /// one walk when nothing expired (the bound made exact on the way), and
    /// the drop's walks when something did (the bound made exact by its
    /// [`Block::retain`]).
    ///
    /// A lock of [`block::INDEX_FROM`] holders or more drops them a slice
    /// at a time ([`Block::purge_some`]: at most [`PURGE_MOST`] a call,
    /// [`PURGE_LOOK`] entries looked at): true when expired holders are
    /// left for the next call (the visit's next turn). Until then every
    /// read treats them as absent (they are not live), a request of their
    /// owner ends its own first ([`Lock::expire_own`]), the holder limits
    /// count the live holders ([`Lock::live_count`]), and a request that
    /// needs the lock empty of them when none is live has them set aside
    /// ([`Lock::set_aside_for`]): every reply is the lock purged whole's.
    #[inline]
    pub fn purge(&mut self, now: u64, changes: &mut Changes) -> bool {
        if now < self.block.low() {
            return false;
        }
        self.purge_past_low(now, changes)
    }

    /// [`Lock::purge`] past the bound on the earliest deadline.
    #[inline(never)]
    fn purge_past_low(&mut self, now: u64, changes: &mut Changes) -> bool {
        if now < self.block.exact_low() {
            // Nothing expired: a purge under way whose last expired holders
            // left by their owners' requests is over.
            self.block.purge_over();
            return false;
        }
        let mut ends = |h: &HolderRef<'_>| {
            if h.is_live(now) {
                return false;
            }
            changes.touch(h.owner);
            changes.expired += 1;
            changes.end(h, h.deadline);
            true
        };
        if !self.block.purge_some(PURGE_MOST, PURGE_LOOK, &mut ends)
            && !self.block.is_indexed()
            && now >= self.block.low()
        {
            // The index went as the lock fell below its size: the rest in
            // one go (a few hundred holders at most).
            self.block.purge_some(PURGE_MOST, PURGE_LOOK, &mut ends);
        }
        now >= self.block.low()
    }

    /// After a [`Lock::purge`] that left expired holders: the owner's
    /// holder, when it is one of them, ended as the purge ends it (so its
    /// request finds it gone, as after a whole purge). Whether it was.
    #[cold]
    #[inline(never)]
    fn expire_own(&mut self, owner: &[u8], now: u64, changes: &mut Changes) -> bool {
        let Some((at, h)) = self.entry(owner).filter(|(_, h)| !h.is_live(now)) else {
            return false;
        };
        changes.touch(h.owner);
        changes.expired += 1;
        changes.end(&h, h.deadline);
        self.block.remove(at);
        true
    }

    /// Does any holder follow a session?
    pub fn has_sessions(&self) -> bool {
        self.holders().any(|h| h.session().is_some())
    }

    /// Ends every holder whose session has ended at `now`: `deadline_of(id)`
    /// is the session's deadline, `None` when it ended (closed) or is
    /// unknown. They end as a lease ends (counted as expired), at their
    /// session's end. How many ended.
    pub fn end_sessions(
        &mut self,
        deadline_of: impl Fn(u64) -> Option<u64>,
        now: u64,
        changes: &mut Changes,
    ) -> usize {
        let over = |h: &HolderRef<'_>| h.session().is_some() && !h.is_live_with(now, &deadline_of);
        if !self.holders().any(|h| over(&h)) {
            return 0;
        }
        let mut n = 0;
        for h in self.holders().filter(|h| over(h)) {
            changes.touch(h.owner);
            changes.expired += 1;
            changes.end(&h, h.deadline_with(&deadline_of).min(now));
            n += 1;
        }
        self.block.retain(|h| !over(h));
        n
    }

    /// Its holders live at `now` with the sessions' deadlines of
    /// `deadline_of` (what LOCK.INFO, a check and a guard read).
    pub fn live_with<'a>(
        &'a self,
        now: u64,
        deadline_of: impl Fn(u64) -> Option<u64> + Clone + 'a,
    ) -> impl Iterator<Item = HolderRef<'a>> + Clone + 'a {
        self.holders()
            .filter(move |h| h.is_live_with(now, deadline_of.clone()))
    }

    /// Gives every holder following a session its session's deadline as
    /// its own lease (`deadline_of(id)`; 0, ended, for an unknown one):
    /// a copy made by DUMP/RESTORE or MIGRATE, where the session is not.
    /// How many it changed.
    pub fn materialize_sessions(&mut self, deadline_of: impl Fn(u64) -> Option<u64>) -> usize {
        let held: Vec<(usize, u32, u32, u64, u64)> = self
            .block
            .entries()
            .filter_map(|(at, h)| {
                let id = h.session()?;
                Some((at, h.holds, h.since, h.token, deadline_of(id).unwrap_or(0)))
            })
            .collect();
        for &(at, holds, since, token, deadline) in &held {
            self.block.set(at, holds, since, token, deadline);
        }
        held.len()
    }

    /// The holder of grant `token` follows its connection's lease from now
    /// on (`BIND`): its entry names its token as its session, and its own
    /// deadline (returned) goes to the shell's lease table. `None`, and
    /// nothing changed, when no holder has that token or it follows a
    /// session (a follower already: its own deadline is the table's).
    ///
    /// A holder a settle's grant just added ([`Lock::grant_in_turn`]) is
    /// found at its entry, with no scan of the holders (a slice of bound
    /// grants costs its grants, not a pass over the key's holders each).
    pub fn follow(&mut self, token: u64, changes: &mut Changes) -> Option<u64> {
        let placed = changes
            .placed
            .last()
            .copied()
            .filter(|_| changes.placed_shape == Some(self.shape()))
            .filter(|&at| self.block.holder_at(at).is_some_and(|h| h.token == token));
        // Else the grant's owner is among those it changed: an indexed
        // lock finds it through them (no walk of its holders).
        let changed = || {
            changes
                .owners()
                .filter_map(|o| self.entry(o))
                .find(|(_, h)| h.token == token)
        };
        let at = match placed {
            Some(at) => at,
            None => match self.block.is_indexed().then(changed).flatten() {
                Some((at, _)) => at,
                None => self.block.entries().find(|(_, h)| h.token == token)?.0,
            },
        };
        let own = self.follow_at(at, token)?;
        if let Some(h) = self.block.holder_at(at) {
            changes.touch(h.owner);
        }
        Some(own)
    }

    /// The holder at entry `at` (grant `token`) follows its connection's
    /// lease ([`Lock::follow`]).
    fn follow_at(&mut self, at: usize, token: u64) -> Option<u64> {
        let h = self.block.holder_at(at)?;
        if h.session().is_some() {
            return None;
        }
        let (holds, since, own) = (h.holds, h.since, h.deadline);
        self.block
            .set(at, holds, since, token, session_deadline(token));
        Some(own)
    }

    /// [`Lock::follow`] with no change recorded: for a grant whose holder
    /// the caller replicates whole anyway (a first grant's one holder,
    /// `Lock::first`), so that a bound grant on a free key allocates
    /// nothing more than an unbound one.
    pub fn follow_granted(&mut self, token: u64) -> Option<u64> {
        let (at, h) = self.block.entries().find(|(_, h)| h.token == token)?;
        if h.session().is_some() {
            return None;
        }
        let (holds, since, own) = (h.holds, h.since, h.deadline);
        self.block
            .set(at, holds, since, token, session_deadline(token));
        Some(own)
    }

    /// [`Lock::materialize_sessions`] for the holders following one of
    /// `ids` only (the others keep their session).
    pub fn materialize_sessions_of(
        &mut self,
        ids: &[u64],
        deadline_of: impl Fn(u64) -> Option<u64>,
    ) -> usize {
        self.materialize_sessions(|id| match ids.contains(&id) {
            true => deadline_of(id),
            false => Some(session_deadline(id)),
        })
    }

    /// The sessions its holders follow, each once.
    pub fn sessions(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.holders().filter_map(|h| h.session()).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Would a request of `kind` by someone not holding the lock be granted
    /// now (as far as the holders go)?
    pub fn admits(&self, kind: Kind, now: u64) -> bool {
        if !self.is_held(now) {
            return true;
        }
        match (self.mode(), kind) {
            (Mode::Shared, Kind::Read) => true,
            (Mode::Semaphore, Kind::Semaphore(limit)) => {
                // The stored count first: below the limit, no walk.
                let permits = self.block.limit() as usize;
                limit == self.block.limit()
                    && (self.block.count() < permits || self.live_count(now) < permits)
            }
            _ => false,
        }
    }

    /// What `req` would get at `now` with `queued_ahead` (see
    /// [`Lock::try_acquire`]), without changing anything.
    fn verdict(&self, req: Ask<'_>, queued_ahead: bool, now: u64, max: usize) -> Verdict {
        let mine = self.entry(req.owner);
        self.verdict_of(req, mine, queued_ahead, now, max)
    }

    /// [`Lock::verdict`] with the owner's entry, live or not, found
    /// already (`mine`), and `max` holders at most.
    fn verdict_of(
        &self,
        req: Ask<'_>,
        mine: Option<(usize, HolderRef<'_>)>,
        queued_ahead: bool,
        now: u64,
        max: usize,
    ) -> Verdict {
        let mode = self.mode();
        if self.is_held(now) {
            let semaphore = mode == Mode::Semaphore;
            if semaphore != (req.kind.mode() == Mode::Semaphore) {
                return Verdict::Refused(Attempt::WrongKind(mode));
            }
            if let Kind::Semaphore(limit) = req.kind {
                if limit != self.block.limit() {
                    return Verdict::Refused(Attempt::OtherLimit(self.block.limit()));
                }
            }
        }
        if let Some((at, holder)) = mine.filter(|(_, h)| h.is_live(now)) {
            if mode != req.kind.mode() {
                return Verdict::Refused(Attempt::Conflict(mode));
            }
            if req.kind.adds_holds() && holder.holds == u32::MAX {
                return Verdict::Refused(Attempt::TooManyHolds);
            }
            return Verdict::Repeat {
                at,
                holds: holder.holds,
                since: holder.since,
                token: holder.token,
            };
        }
        if queued_ahead || !self.admits(req.kind, now) {
            return Verdict::Refused(Attempt::Busy);
        }
        // The stored count first (expired holders included): below the
        // limit, no count of the live ones.
        if self.block.count() >= max && self.live_count(now) >= max {
            return Verdict::Refused(Attempt::TooManyHolders(max));
        }
        Verdict::New
    }

    /// Sets aside, whole and in constant time, the expired holders a
    /// purge in slices has not dropped yet when none of its holders is
    /// live at `now` and they are not of `kind`'s shape (another mode, a
    /// semaphore's other limit, or a writer's: it needs the lock empty):
    /// the lock is empty for the new holder, as on the lock purged whole,
    /// and the holders set aside go into `changes` ([`Changes::take_aside`])
    /// to be ended in later slices ([`Aside::end_some`]). Holders of its
    /// shape stay: the live count, not the stored one, decides
    /// ([`Lock::live_count`]).
    #[cold]
    #[inline(never)]
    fn set_aside_for(&mut self, kind: Kind, now: u64, changes: &mut Changes) {
        let fits = match (self.mode(), kind) {
            (Mode::Shared, Kind::Read) => true,
            (Mode::Semaphore, Kind::Semaphore(limit)) => limit == self.block.limit(),
            _ => false,
        };
        if fits || self.is_empty() || self.is_held(now) {
            return;
        }
        let lock = std::mem::take(self);
        match changes.aside {
            None => changes.aside = Some(Box::new(Aside { lock, now })),
            // (One a transaction: a second, never seen, ends at once.)
            Some(_) => {
                let mut aside = Aside { lock, now };
                while aside.end_some(changes) {}
            }
        }
    }

    /// What [`Lock::try_acquire`] would answer, without changing anything:
    /// `Granted(0)` stands for a new grant (a repeat's token is its own).
    /// Used to decide every key of a multi-key request before granting any.
    pub fn check<'r>(&self, req: impl Into<Ask<'r>>, queued_ahead: bool, now: u64) -> Attempt {
        let req = req.into();
        match self.verdict(req, queued_ahead, now, max_holders()) {
            Verdict::Repeat { token, .. } => Attempt::Granted(token),
            Verdict::New => Attempt::Granted(0),
            Verdict::Refused(attempt) => attempt,
        }
    }

    /// A grant request arriving at `now`. `queued_ahead` says whether other
    /// requests wait for this key: a non-holder never jumps ahead of them,
    /// while a current holder's repeat is answered at once.
    pub fn try_acquire<'r>(
        &mut self,
        req: impl Into<Ask<'r>>,
        queued_ahead: bool,
        now: u64,
        tokens: &mut Tokens,
        changes: &mut Changes,
    ) -> Attempt {
        self.try_acquire_within(req, queued_ahead, now, tokens, changes, max_holders())
    }

    /// [`Lock::try_acquire`] with at most `max` holders (in place of
    /// [`max_holders`]).
    pub fn try_acquire_within<'r>(
        &mut self,
        req: impl Into<Ask<'r>>,
        queued_ahead: bool,
        now: u64,
        tokens: &mut Tokens,
        changes: &mut Changes,
        max: usize,
    ) -> Attempt {
        let req = req.into();
        let left = self.purge(now, changes);
        self.acquire_purged(req, left, queued_ahead, now, tokens, changes, max)
    }

    /// [`Lock::try_acquire_within`] on a lock purged at `now`, which left
    /// expired holders (`left`): the owner's own ended first; a new holder
    /// of another shape than theirs, none of them live, has them set
    /// aside ([`Lock::set_aside_for`]).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn acquire_purged(
        &mut self,
        req: Ask<'_>,
        left: bool,
        queued_ahead: bool,
        now: u64,
        tokens: &mut Tokens,
        changes: &mut Changes,
        max: usize,
    ) -> Attempt {
        if left {
            self.expire_own(req.owner, now, changes);
        }
        let verdict = self.verdict(req, queued_ahead, now, max);
        if left && matches!(verdict, Verdict::New) {
            self.set_aside_for(req.kind, now, changes);
        }
        self.carry_out(req, verdict, now, tokens, changes).0
    }

    /// Requests granted one after another at one `now`, a queue's head
    /// (see [`crate::Queue::settle`]): each as [`Lock::try_acquire`] with
    /// nobody queued ahead answers it, the lock purged at `now` first. Their
    /// owners are found through `index`, built on the second request and
    /// kept up to date here: granting `k` requests to a lock of `n` holders
    /// costs time linear in `k + n`, not their product. At most `max`
    /// holders ([`max_holders`] in the shell).
    pub fn grant_in_turn(
        &mut self,
        req: Ask<'_>,
        now: u64,
        tokens: &mut Tokens,
        changes: &mut Changes,
        index: &mut HolderIndex,
        max: usize,
    ) -> Attempt {
        if !index.first_done {
            // Most settles grant one request: no index for it.
            index.first_done = true;
            // The settle purged the lock at `now` already: no slice more.
            let left = self.block.is_indexed() && now >= self.block.low();
            return self.acquire_purged(req, left, false, now, tokens, changes, max);
        }
        if self.block.is_indexed() && now >= self.block.low() {
            // A purge in slices left expired holders: the owner's own ends
            // first (entries may move: the table is built anew after).
            if self.expire_own(req.owner, now, changes) {
                index.table = None;
            }
            let verdict = self.verdict(req, false, now, max);
            if matches!(verdict, Verdict::New) {
                self.set_aside_for(req.kind, now, changes);
            }
            let (attempt, added) = self.carry_out(req, verdict, now, tokens, changes);
            if let Some(h) = added.and_then(|at| self.block.holder_at(at)) {
                index.earliest = index.earliest.min(h.deadline);
            }
            index.table = None;
            return attempt;
        }
        let ix = index.table.get_or_insert_with(|| HolderTable::of(self));
        // Nothing expires twice at one `now`: the lock was purged at it.
        let mine = ix
            .find(self, req.owner)
            .and_then(|at| Some((at, self.block.holder_at(at)?)));
        let verdict = self.verdict_of(req, mine, false, now, max);
        let repeat = match verdict {
            Verdict::Repeat { at, .. } => Some(at),
            _ => None,
        };
        let (attempt, added) = self.carry_out(req, verdict, now, tokens, changes);
        if let Some(at) = added {
            ix.add(req.owner, at);
            changes.placed.push(at);
            changes.placed_shape = Some(self.shape());
        }
        if let Some(h) = added.or(repeat).and_then(|at| self.block.holder_at(at)) {
            index.earliest = index.earliest.min(h.deadline);
        }
        attempt
    }

    /// Does what `verdict` decided for `req`: the attempt, and the offset
    /// of the entry of a holder it added.
    fn carry_out(
        &mut self,
        req: Ask<'_>,
        verdict: Verdict,
        now: u64,
        tokens: &mut Tokens,
        changes: &mut Changes,
    ) -> (Attempt, Option<usize>) {
        let attempt = match verdict {
            Verdict::Refused(attempt) => attempt,
            Verdict::Repeat {
                at,
                holds,
                since,
                token,
            } => {
                let holds = match req.kind.adds_holds() {
                    true => holds.saturating_add(1),
                    false => holds,
                };
                // A session holder's repeat keeps its session, or moves to
                // the one it names.
                let was = self
                    .block
                    .holder_at(at)
                    .and_then(|h| h.session())
                    .unwrap_or(0);
                let deadline = match (req.session, was) {
                    (0, 0) => lease_end(now, req.ttl),
                    // A follower's repeat sets its own deadline in its
                    // lease (its entry stays).
                    (0, s) if s == token => {
                        changes.own.push((token, lease_end(now, req.ttl)));
                        session_deadline(s)
                    }
                    (0, s) | (s, _) => session_deadline(s),
                };
                self.block.set(at, holds, since, token, deadline);
                if req.session != 0 && req.session != was {
                    changes.joined.push((was, req.session));
                }
                changes.touch(req.owner);
                Attempt::Granted(token)
            }
            Verdict::New => match self.add_holder(req, now, tokens) {
                Ok((token, at)) => {
                    changes.touch(req.owner);
                    if req.session != 0 {
                        changes.joined.push((0, req.session));
                    }
                    return (Attempt::Granted(token), Some(at));
                }
                Err(refused) => refused,
            },
        };
        (attempt, None)
    }

    /// Adds `req`'s owner as a new holder with a new token (the verdict was
    /// `New`): the token, or the refusal (no token left, a block past its
    /// size) with nothing added.
    fn add_holder(
        &mut self,
        req: Ask<'_>,
        now: u64,
        tokens: &mut Tokens,
    ) -> Result<(u64, usize), Attempt> {
        let Some(token) = tokens.issue() else {
            return Err(Attempt::TokensExhausted);
        };
        let limit = match req.kind {
            Kind::Semaphore(limit) => limit,
            _ => 0,
        };
        let holder = HolderRef {
            owner: req.owner,
            holds: 1,
            since: since(now),
            token,
            deadline: match req.session {
                0 => lease_end(now, req.ttl),
                s => session_deadline(s),
            },
        };
        match self.block.push(req.kind.mode().tag(), limit, holder) {
            Ok(at) => Ok((token, at)),
            Err(_) => Err(Attempt::TooLarge),
        }
    }

    /// A grant request on a free key (no lock there, nobody waiting for it):
    /// the new lock and its holder's token. What [`Lock::try_acquire`] on an
    /// empty lock with nobody queued answers and leaves, without its purge,
    /// verdict or change list: the owner is the one change. A shell's fast
    /// path for the most common grant; refusals are those of an empty lock
    /// (no token left, a block past its size).
    #[inline]
    pub fn first<'r>(
        req: impl Into<Ask<'r>>,
        now: u64,
        tokens: &mut Tokens,
    ) -> Result<(Lock, u64), Attempt> {
        let mut lock = Lock::default();
        let (token, _) = lock.add_holder(req.into(), now, tokens)?;
        Ok((lock, token))
    }

    /// The owner's entry (offset and state), live or not, when its grant
    /// carries `token` (any grant of the owner's when `None`): `TOKEN` on
    /// `LOCK.RELEASE` and `LOCK.RENEW`, a binding's grant. Another grant to
    /// the same owner name (the old one ended, a new one began) is not it.
    fn grant_of(&self, owner: &[u8], token: Option<u64>) -> Option<(usize, HolderRef<'_>)> {
        self.entry(owner)
            .filter(|(_, h)| token.is_none_or(|t| t == h.token))
    }

    /// `LOCK.RELEASE`: removes one of the owner's holds; with `token`, only
    /// of its grant carrying that token ([`Release::NotHeld`], and nothing
    /// changed but the purge, when the owner holds under another).
    pub fn release(
        &mut self,
        owner: &[u8],
        token: Option<u64>,
        now: u64,
        changes: &mut Changes,
    ) -> Release {
        if self.purge(now, changes) {
            self.expire_own(owner, now, changes);
        }
        let Some((at, h)) = self.grant_of(owner, token) else {
            return Release::NotHeld;
        };
        changes.touch(owner);
        if h.holds > 1 {
            let (holds, since, token, deadline) = (h.holds - 1, h.since, h.token, h.deadline);
            self.block.set(at, holds, since, token, deadline);
            return Release::Remaining;
        }
        changes.end(&h, now);
        self.block.remove(at);
        Release::Last
    }

    /// Removes every hold of the owner's grant with this `token` (its
    /// connection closed, or it never heard of the grant); false when that
    /// grant no longer holds (released, expired, or since granted anew).
    pub fn release_all(
        &mut self,
        owner: &[u8],
        token: u64,
        now: u64,
        changes: &mut Changes,
    ) -> bool {
        if self.purge(now, changes) {
            self.expire_own(owner, now, changes);
        }
        let Some((at, h)) = self.grant_of(owner, Some(token)) else {
            return false;
        };
        changes.end(&h, now);
        changes.touch(owner);
        self.block.remove(at);
        true
    }

    /// `LOCK.RENEW`: the owner's deadline becomes `now + ttl`; false when it
    /// holds nothing (with `token`: nothing under that token).
    pub fn renew(
        &mut self,
        owner: &[u8],
        ttl: u64,
        token: Option<u64>,
        now: u64,
        changes: &mut Changes,
    ) -> bool {
        if self.purge(now, changes) {
            self.expire_own(owner, now, changes);
        }
        match self.grant_of(owner, token).filter(|(_, h)| h.is_live(now)) {
            // A follower's own deadline is in its lease table.
            Some((_, h)) if h.is_follower() => {
                changes.own.push((h.token, lease_end(now, ttl)));
                true
            }
            // The session is the one renewal: nothing changes.
            Some((_, h)) if h.session().is_some() => true,
            Some((at, h)) => {
                let (holds, since, token) = (h.holds, h.since, h.token);
                self.block.set(at, holds, since, token, lease_end(now, ttl));
                changes.touch(owner);
                true
            }
            None => false,
        }
    }

    /// The lock's only holder, when it has exactly one and that is `owner`
    /// (under `token`, when given), live at `now`: its offset and state.
    #[inline]
    fn sole(&self, owner: &[u8], token: Option<u64>, now: u64) -> Option<(usize, HolderRef<'_>)> {
        if self.block.count() != 1 {
            return None;
        }
        self.grant_of(owner, token)
            .filter(|(_, h)| h.is_live(now) && h.session().is_none())
    }

    /// [`Lock::release`] in its commonest case, in one step: the lock's only
    /// holder is `owner`, live at `now`, holding once. The lock is emptied
    /// and the hold returned as it ended (what `release` records in
    /// [`Changes::ended`]; it touches only `owner` and expires nothing).
    /// `None`, and nothing changed, in every other case: `release` decides
    /// those.
    pub fn release_sole(&mut self, owner: &[u8], token: Option<u64>, now: u64) -> Option<Ended> {
        let (_, h) = self.sole(owner, token, now)?;
        if h.holds != 1 {
            return None;
        }
        let ended = Ended {
            held: h.held_ms(now),
            token: h.token,
            session: 0,
        };
        self.block = Block::default();
        Some(ended)
    }

    /// [`Lock::release_sole`] for a holder that follows its connection's
    /// lease ([`HolderRef::is_follower`]), live by the deadline
    /// `deadline_of` gives its token: the lock's only holder, holding once.
    /// The [`Ended`] names its token as its session.
    pub fn release_sole_follower(
        &mut self,
        owner: &[u8],
        token: Option<u64>,
        now: u64,
        deadline_of: impl Fn(u64) -> Option<u64>,
    ) -> Option<Ended> {
        if self.block.count() != 1 {
            return None;
        }
        let (_, h) = self.grant_of(owner, token)?;
        if !h.is_follower() || h.holds != 1 || !h.is_live_with(now, &deadline_of) {
            return None;
        }
        let ended = Ended {
            held: h.held_ms(now),
            token: h.token,
            session: h.token,
        };
        self.block = Block::default();
        Some(ended)
    }

    /// [`Lock::renew`] in its commonest case, in one step: the lock's only
    /// holder is `owner`, live at `now`. Its lease ends at `now + ttl`,
    /// returned (the lock's one deadline; `renew` touches only `owner` and
    /// expires nothing). `None`, and nothing changed, in every other case.
    pub fn renew_sole(
        &mut self,
        owner: &[u8],
        ttl: u64,
        token: Option<u64>,
        now: u64,
    ) -> Option<u64> {
        let (at, h) = self.sole(owner, token, now)?;
        let (holds, since, token) = (h.holds, h.since, h.token);
        let deadline = lease_end(now, ttl);
        self.block.set(at, holds, since, token, deadline);
        Some(deadline)
    }

    /// Ends no lease after `latest` (a load's bound on deadlines, unix ms):
    /// how many leases it shortened.
    pub fn clamp_deadlines(&mut self, latest: u64) -> usize {
        let late: Vec<(usize, u32, u32, u64)> = self
            .block
            .entries()
            .filter(|(_, h)| h.deadline > latest && h.session().is_none())
            .map(|(at, h)| (at, h.holds, h.since, h.token))
            .collect();
        for &(at, holds, since, token) in &late {
            self.block.set(at, holds, since, token, latest);
        }
        late.len()
    }

    /// How many holders hold exclusively, share, and hold a semaphore's
    /// permits (expired ones not yet dropped included).
    pub fn census(&self) -> Census {
        Census::of(self.mode(), self.block.count())
    }

    /// Bytes of heap this lock's holders take (its one block, and a large
    /// block's index, about; the key and
    /// Redis's value object are Redis's to count).
    pub fn memory_usage(&self) -> usize {
        self.block.capacity() + self.block.index_bytes()
    }

    /// Sets one holder's exact state (a replicated effect or a loaded record).
    /// `kind` says the mode, and a semaphore's limit.
    pub fn put(&mut self, kind: Kind, holder: Holder) -> Result<(), Invalid> {
        self.put_ref(kind, holder.as_ref())
    }

    /// [`Lock::put`] of a borrowed holder.
    pub fn put_ref(&mut self, kind: Kind, holder: HolderRef<'_>) -> Result<(), Invalid> {
        let mode = kind.mode();
        let limit = own_rules(kind, &holder)?;
        if self
            .holders()
            .any(|h| h.token == holder.token && h.owner != holder.owner)
        {
            return Err(Invalid::DuplicateToken);
        }
        let existing = self.entry(holder.owner);
        let others = self.block.count() - usize::from(existing.is_some());
        let same_shape =
            !self.block.is_empty() && mode == self.mode() && limit == self.block.limit();
        if others > 0 && !same_shape {
            return Err(Invalid::ModeMismatch);
        }
        if others > 0 && mode == Mode::Exclusive {
            return Err(Invalid::SecondExclusiveHolder);
        }
        if mode == Mode::Semaphore && others >= limit as usize {
            return Err(Invalid::BadLimit);
        }
        // The same grant changed (renewed, re-entered): it was held since
        // as before.
        let since = match existing {
            Some((_, h)) if h.token == holder.token => h.since,
            _ => holder.since,
        };
        match existing {
            Some((at, _)) if same_shape => {
                self.block
                    .set(at, holder.holds, since, holder.token, holder.deadline);
            }
            _ => {
                // The only holder, in another shape (or a new one): the
                // block is built anew.
                if let Some((at, _)) = existing {
                    self.block.remove(at);
                }
                self.block
                    .push(mode.tag(), limit, HolderRef { since, ..holder })?;
            }
        }
        Ok(())
    }

    /// Sets one holder's exact state as the master's stream carries it,
    /// whatever this copy held before: holders it cannot coexist with (another
    /// mode or limit, or another exclusive holder) are dropped first. The
    /// holder itself must still be valid.
    pub fn force(&mut self, kind: Kind, holder: Holder) -> Result<(), Invalid> {
        Lock::default().put(kind, holder.clone())?;
        let owner: &[u8] = &holder.owner;
        if kind.mode() == Mode::Exclusive || kind.mode() != self.mode() || self.kind() != kind {
            self.block.retain(|h| h.owner == owner);
        }
        // A stale holder with this grant's token cannot be right either.
        self.block
            .retain(|h| h.owner == owner || h.token != holder.token);
        // A semaphore past its limit (this copy missed releases): the
        // earliest deadlines go first.
        // Ties go in grant order. One sort and one pass, however many go.
        if let Kind::Semaphore(limit) = kind {
            let mut others: Vec<(u64, usize)> = self
                .holders()
                .enumerate()
                .filter(|(_, h)| h.owner != owner)
                .map(|(i, h)| (h.deadline, i))
                .collect();
            let excess = (others.len() + 1).saturating_sub(limit as usize);
            if excess > 0 {
                others.sort_unstable();
                let mut going: Vec<usize> = others.iter().take(excess).map(|(_, i)| *i).collect();
                going.sort_unstable();
                let mut going = going.into_iter().peekable();
                let mut i = 0;
                self.block.retain(|_| {
                    let go = going.next_if_eq(&i).is_some();
                    i += 1;
                    !go
                });
            }
        }
        self.put(kind, holder)
    }

    /// [`Lock::force`] as a replica applies it (`LOCK.SYNC`), in one walk of
    /// the holders in the common case (the same shape, no other holder with
    /// its token, a semaphore within its limit): the owner's entry set in
    /// place or the holder appended, and what the apply needs after it (the
    /// session the owner's holder followed before, the deadlines' extremes
    /// after) from the same walk, where a `force`, a look-up, `sweep_at` and
    /// `latest_deadline` walked the holders once each. Any other case goes
    /// through `force` itself (state and result are `force`'s either way).
    pub fn apply_set(&mut self, kind: Kind, holder: Holder) -> Result<Applied, Invalid> {
        let limit = own_rules(kind, &holder.as_ref())?;
        let same_shape =
            !self.block.is_empty() && kind.mode() == self.mode() && limit == self.block.limit();
        let mut mine: Option<(usize, u32, u64, u64)> = None;
        let mut clash = false;
        let mut others: Option<(u64, u64)> = None;
        let mut low = u64::MAX;
        let mut count = 0usize;
        for (at, h) in self.block.entries() {
            if same_owner(h.owner, &holder.owner) {
                mine = Some((at, h.since, h.token, h.deadline));
                continue;
            }
            count += 1;
            low = low.min(block::own(h.deadline));
            clash |= h.token == holder.token;
            others = Some(match others {
                None => (h.deadline, h.deadline),
                Some((lo, hi)) => (lo.min(h.deadline), hi.max(h.deadline)),
            });
        }
        let followed = mine.and_then(|(.., deadline)| session_of(deadline));
        let fits = match kind {
            Kind::Semaphore(limit) => count < limit as usize,
            _ => kind.mode() != Mode::Exclusive || count == 0,
        };
        if clash || !fits || (count > 0 && !same_shape) || (mine.is_some() && !same_shape) {
            self.force(kind, holder)?;
            return Ok(Applied {
                followed,
                deadlines: self.deadlines(),
            });
        }
        self.put_applied(mine, kind, limit, &holder)?;
        let d = holder.deadline;
        // The bound on the earliest made exact from the same walk.
        self.block.set_low(low.min(block::own(d)));
        let deadlines = Some(others.map_or((d, d), |(lo, hi)| (lo.min(d), hi.max(d))));
        Ok(Applied {
            followed,
            deadlines,
        })
    }

    /// An applied holder put in place: over the owner's own entry (`mine`:
    /// where, since, token, deadline; its since kept for the same token),
    /// else pushed.
    fn put_applied(
        &mut self,
        mine: Option<(usize, u32, u64, u64)>,
        kind: Kind,
        limit: u32,
        holder: &Holder,
    ) -> Result<(), Invalid> {
        match mine {
            Some((at, since, token, _)) => {
                let since = if token == holder.token {
                    since
                } else {
                    holder.since
                };
                self.block
                    .set(at, holder.holds, since, holder.token, holder.deadline);
            }
            None => {
                self.block.push(kind.mode().tag(), limit, holder.as_ref())?;
            }
        }
        Ok(())
    }

    /// [`Lock::apply_set`] with no walk of an indexed lock's holders when
    /// no other holder can carry the holder's token: `fresh` (the caller
    /// knows the token newer than every token it has seen: a new grant's),
    /// or the owner's own holder carries it (a renewal). The owner found
    /// through the index, the deadlines' extremes read from it; the state
    /// and the result are [`Lock::apply_set`]'s, which any other case
    /// (a lock without an index, a change of shape, a semaphore full, a
    /// token that may clash) goes through.
    pub fn apply_set_new(
        &mut self,
        kind: Kind,
        holder: Holder,
        fresh: bool,
    ) -> Result<Applied, Invalid> {
        if !self.block.is_indexed() {
            return self.apply_set(kind, holder);
        }
        let limit = own_rules(kind, &holder.as_ref())?;
        let same_shape = kind.mode() == self.mode() && limit == self.block.limit();
        let mine = self
            .entry(&holder.owner)
            .map(|(at, h)| (at, h.since, h.token, h.deadline));
        let fresh = fresh || mine.is_some_and(|(_, _, token, _)| token == holder.token);
        let count = self.block.count() - usize::from(mine.is_some());
        let fits = match kind {
            Kind::Semaphore(limit) => count < limit as usize,
            _ => kind.mode() != Mode::Exclusive || count == 0,
        };
        if !fresh || !fits || !same_shape {
            return self.apply_set(kind, holder);
        }
        self.put_applied(mine, kind, limit, &holder)?;
        self.block.exact_low();
        Ok(Applied {
            followed: mine.and_then(|(.., deadline)| session_of(deadline)),
            deadlines: self.block.extremes().flatten().or_else(|| self.deadlines()),
        })
    }

    /// [`Lock::remove`] as a replica applies it (`LOCK.SYNC ... DROP`), with
    /// what [`Lock::apply_set`] reports, in one walk.
    pub fn apply_drop(&mut self, owner: &[u8]) -> Applied {
        if self.block.is_indexed() {
            // The owner found and the deadlines' extremes read through the
            // block's index: no walk.
            let mine = self.entry(owner).map(|(at, h)| (at, h.deadline));
            if let Some((at, _)) = mine {
                self.block.remove(at);
                self.block.exact_low();
            }
            return Applied {
                followed: mine.and_then(|(_, deadline)| session_of(deadline)),
                deadlines: self.block.extremes().flatten().or_else(|| self.deadlines()),
            };
        }
        let mut mine: Option<(usize, u64)> = None;
        let mut others: Option<(u64, u64)> = None;
        let mut low = u64::MAX;
        for (at, h) in self.block.entries() {
            if mine.is_none() && same_owner(h.owner, owner) {
                mine = Some((at, h.deadline));
                continue;
            }
            low = low.min(block::own(h.deadline));
            others = Some(match others {
                None => (h.deadline, h.deadline),
                Some((lo, hi)) => (lo.min(h.deadline), hi.max(h.deadline)),
            });
        }
        if let Some((at, _)) = mine {
            self.block.remove(at);
            self.block.set_low(low);
        }
        Applied {
            followed: mine.and_then(|(_, deadline)| session_of(deadline)),
            deadlines: others,
        }
    }

    /// Removes one holder whatever its holds (a replicated effect); false when absent.
    pub fn remove(&mut self, owner: &[u8]) -> bool {
        match self.entry(owner) {
            Some((at, _)) => {
                self.block.remove(at);
                true
            }
            None => false,
        }
    }

    /// The lock as RDB encoding 3 saves it: its block's bytes (holders'
    /// `since` and the block's lengths are set anew on load), without the
    /// kept latest deadline (a shared or semaphore block's, copied).
    pub fn saved(&self) -> std::borrow::Cow<'_, [u8]> {
        self.block.saved()
    }

    /// A lock saved by [`Lock::saved`] (the buffer read back, taken over:
    /// a shared or semaphore block's moved up for its kept latest), checked as [`Lock::from_holders`] checks holders;
    /// every holder's `since` is `now`. The block is walked once, and what
    /// that walk found comes back with the lock ([`Loaded`]).
    pub fn from_saved(buf: Vec<u8>, now: u64) -> Result<Loaded, Invalid> {
        let (block, survey) = Block::from_saved(buf, since(now)).ok_or(Invalid::Corrupt)?;
        let lock = Lock { block };
        let kind = lock.kind();
        if let Kind::Semaphore(limit) = kind {
            // Past its permits only by holders expired at `now` (saved
            // between two slices of a purge: they go at its first visit).
            let past =
                |l: &Lock| l.holder_count() > limit as usize && l.live_count(now) > limit as usize;
            if !(1..=MAX_LIMIT).contains(&limit) || past(&lock) {
                return Err(Invalid::BadLimit);
            }
        }
        // Each holder's own rules, from the walk's extremes.
        if survey.empty_owner {
            return Err(Invalid::EmptyOwner);
        }
        if survey.fewest_holds == 0 {
            return Err(Invalid::ZeroHolds);
        }
        if survey.lowest_token == 0 {
            return Err(Invalid::ZeroToken);
        }
        if matches!(kind, Kind::Semaphore(_)) && survey.most_holds != 1 {
            return Err(Invalid::BadLimit);
        }
        // Owners and tokens each once: pairwise for a few holders, hashed
        // for many (a semaphore may have a million).
        let n = lock.holder_count();
        if n == 1 {
            // Nothing to compare (an exclusive lock, the commonest).
        } else if n > 16 {
            let mut owners = std::collections::HashSet::with_capacity(n);
            let mut tokens = std::collections::HashSet::with_capacity(n);
            for h in lock.holders() {
                if !owners.insert(h.owner) {
                    return Err(Invalid::DuplicateOwner);
                }
                if !tokens.insert(h.token) {
                    return Err(Invalid::DuplicateToken);
                }
            }
        } else {
            for (i, a) in lock.holders().enumerate() {
                for b in lock.holders().skip(i + 1) {
                    if a.owner == b.owner {
                        return Err(Invalid::DuplicateOwner);
                    }
                    if a.token == b.token {
                        return Err(Invalid::DuplicateToken);
                    }
                }
            }
        }
        Ok(Loaded::new(lock, survey))
    }

    /// How many holders a block saved by [`Lock::saved`] says it has, read
    /// from its header alone (no walk): what a load compares with the
    /// holder limit before anything else. `None` when it has no header.
    pub fn saved_count(buf: &[u8]) -> Option<usize> {
        Block::saved_count(buf)
    }

    /// [`Lock::from_saved`], refusing a lock of more than `max` holders
    /// (`Invalid::TooManyHolders`) before its holders are walked.
    pub fn from_saved_within(buf: Vec<u8>, now: u64, max: usize) -> Result<Loaded, Invalid> {
        if Lock::saved_count(&buf).is_some_and(|n| n > max) {
            return Err(Invalid::TooManyHolders);
        }
        Lock::from_saved(buf, now)
    }

    /// The lock with what a load needs to know of it ([`Loaded`]), by a
    /// walk of its holders (a lock built from an older encoding's fields).
    pub fn loaded(self) -> Loaded {
        let survey = self.block.survey();
        Loaded::new(self, survey)
    }

    /// The address Redis keeps as the key's value: the lock's one block
    /// (null when empty, which no key stores). Back with [`Lock::from_raw`].
    #[inline]
    pub fn into_raw(self) -> *mut u8 {
        self.block.into_raw()
    }

    /// The lock whose block is at `ptr` (empty for null).
    ///
    /// # Safety
    ///
    /// `ptr` is null or came from [`Lock::into_raw`] and is not owned by
    /// another `Lock` now; the returned lock owns the block until it goes
    /// back through `into_raw` (dropping it frees the block).
    #[inline]
    pub unsafe fn from_raw(ptr: *mut u8) -> Lock {
        // SAFETY: the caller's promise.
        Lock {
            block: unsafe { Block::from_raw(ptr) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A saved block whose second holder breaks one of a holder's own rules
    /// is refused for it: the load's one walk sees every holder, not only
    /// the first.
    #[test]
    fn a_saved_lock_is_refused_for_any_holder_breaking_a_rule() {
        let two = |kind: Kind| {
            let holders = vec![
                Holder {
                    owner: b"a"[..].into(),
                    holds: 1,
                    since: 0,
                    token: 7,
                    deadline: 9,
                },
                Holder {
                    owner: b"b"[..].into(),
                    holds: 1,
                    since: 0,
                    token: 8,
                    deadline: 10,
                },
            ];
            Lock::from_holders(kind, holders).unwrap().saved().to_vec()
        };
        // The second entry: after the header and the first entry (24 fixed
        // bytes, the owner's length, one byte of owner).
        let second = |header: usize| header + 26;
        let shared = two(Kind::Read);
        let at = second(13);
        assert!(Lock::from_saved(shared.clone(), 1).is_ok());
        let mut zero_token = shared.clone();
        zero_token[at..at + 8].fill(0);
        assert_eq!(
            Lock::from_saved(zero_token, 1).unwrap_err(),
            Invalid::ZeroToken
        );
        let mut zero_holds = shared.clone();
        zero_holds[at + 16..at + 20].fill(0);
        assert_eq!(
            Lock::from_saved(zero_holds, 1).unwrap_err(),
            Invalid::ZeroHolds
        );
        let mut same_token = shared.clone();
        same_token[at..at + 8].copy_from_slice(&7u64.to_le_bytes());
        assert_eq!(
            Lock::from_saved(same_token, 1).unwrap_err(),
            Invalid::DuplicateToken
        );
        let semaphore = two(Kind::Semaphore(2));
        let at = second(17);
        let mut two_holds = semaphore.clone();
        two_holds[at + 16..at + 20].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(
            Lock::from_saved(two_holds, 1).unwrap_err(),
            Invalid::BadLimit
        );
        // An empty owner: the second entry's owner cut out, its length 0.
        let mut empty = shared.clone();
        empty.truncate(empty.len() - 1);
        if let Some(len) = empty.last_mut() {
            *len = 0;
        }
        assert_eq!(Lock::from_saved(empty, 1).unwrap_err(), Invalid::EmptyOwner);
    }

    #[test]
    fn hold_times_of_released_and_expired_holders() {
        let mut lock = Lock::default();
        let mut tokens = Tokens::starting_after(0);
        let mut c = Changes::default();
        let req = |o: &str| Request {
            kind: Kind::Acquire,
            owner: o.as_bytes().into(),
            ttl: 1_000,
            session: 0,
        };
        let t0 = u64::from(u32::MAX) - 100; // since wraps in between
        assert!(matches!(
            lock.try_acquire(&req("a"), false, t0, &mut tokens, &mut c),
            Attempt::Granted(_)
        ));
        assert_eq!(lock.release(b"a", None, t0 + 250, &mut c), Release::Last);
        assert_eq!(c.held().collect::<Vec<_>>(), [250]);
        let mut c = Changes::default();
        let t1 = t0 + 300;
        assert!(matches!(
            lock.try_acquire(&req("b"), false, t1, &mut tokens, &mut c),
            Attempt::Granted(_)
        ));
        lock.purge(t1 + 5_000, &mut c);
        assert_eq!(
            c.held().collect::<Vec<_>>(),
            [1_000],
            "an expired lease counts until its deadline"
        );
    }

    fn req(kind: Kind, owner: &str, ttl: u64) -> Request {
        Request {
            kind,
            owner: owner.as_bytes().into(),
            ttl,
            session: 0,
        }
    }

    fn acquire(lock: &mut Lock, tokens: &mut Tokens, r: Request, now: u64) -> Attempt {
        lock.try_acquire(&r, false, now, tokens, &mut Changes::default())
    }

    #[test]
    fn exclusive_grant_refuse_and_idempotent_retry() {
        let mut lock = Lock::default();
        let mut tokens = Tokens::starting_after(10);
        let a = acquire(&mut lock, &mut tokens, req(Kind::Acquire, "a", 100), 1000);
        assert_eq!(a, Attempt::Granted(11));
        assert_eq!(
            acquire(&mut lock, &mut tokens, req(Kind::Acquire, "b", 100), 1001),
            Attempt::Busy
        );
        // Retry by the holder: same token, deadline reset, holds unchanged.
        assert_eq!(
            acquire(&mut lock, &mut tokens, req(Kind::Acquire, "a", 500), 1050),
            Attempt::Granted(11)
        );
        let h = lock.holder(b"a").map(|h| h.to_owned());
        assert_eq!(h.map(|h| (h.holds, h.deadline)), Some((1, 1550)));
    }

    #[test]
    fn expiry_is_at_the_deadline() {
        let mut lock = Lock::default();
        let mut tokens = Tokens::starting_after(0);
        acquire(&mut lock, &mut tokens, req(Kind::Acquire, "a", 100), 1000);
        assert!(lock.is_held(1099));
        assert!(!lock.is_held(1100));
        let mut changes = Changes::default();
        assert_eq!(
            lock.release(b"a", None, 1100, &mut changes),
            Release::NotHeld
        );
        assert!(lock.is_empty());
        assert_eq!(changes.owners().count(), 1, "the purge is a change");
        assert_eq!(
            acquire(&mut lock, &mut tokens, req(Kind::Acquire, "b", 100), 1100),
            Attempt::Granted(2)
        );
    }

    #[test]
    fn reentrant_holds_count_down() {
        let mut lock = Lock::default();
        let mut tokens = Tokens::starting_after(0);
        for _ in 0..3 {
            assert_eq!(
                acquire(&mut lock, &mut tokens, req(Kind::Racquire, "a", 100), 0),
                Attempt::Granted(1)
            );
        }
        // ACQUIRE by the same owner adds nothing.
        acquire(&mut lock, &mut tokens, req(Kind::Acquire, "a", 100), 0);
        let mut c = Changes::default();
        assert_eq!(lock.release(b"a", None, 1, &mut c), Release::Remaining);
        assert_eq!(lock.release(b"a", None, 1, &mut c), Release::Remaining);
        assert_eq!(lock.release(b"a", None, 1, &mut c), Release::Last);
        assert_eq!(lock.release(b"a", None, 1, &mut c), Release::NotHeld);
    }

    #[test]
    fn readers_share_and_exclude_writers() {
        let mut lock = Lock::default();
        let mut tokens = Tokens::starting_after(0);
        assert_eq!(
            acquire(&mut lock, &mut tokens, req(Kind::Read, "r1", 100), 0),
            Attempt::Granted(1)
        );
        assert_eq!(
            acquire(&mut lock, &mut tokens, req(Kind::Read, "r2", 200), 0),
            Attempt::Granted(2)
        );
        assert_eq!(
            acquire(&mut lock, &mut tokens, req(Kind::Acquire, "w", 100), 0),
            Attempt::Busy
        );
        // r1 expires, r2 still holds: still shared.
        assert_eq!(lock.live(150).count(), 1);
        assert_eq!(
            acquire(&mut lock, &mut tokens, req(Kind::Acquire, "w", 100), 150),
            Attempt::Busy
        );
        assert_eq!(
            acquire(&mut lock, &mut tokens, req(Kind::Acquire, "w", 100), 200),
            Attempt::Granted(3)
        );
        assert_eq!(
            acquire(&mut lock, &mut tokens, req(Kind::Read, "r3", 100), 201),
            Attempt::Busy
        );
    }

    #[test]
    fn mode_change_is_a_conflict_and_changes_nothing() {
        let mut lock = Lock::default();
        let mut tokens = Tokens::starting_after(0);
        acquire(&mut lock, &mut tokens, req(Kind::Read, "a", 100), 0);
        let before = lock.clone();
        assert_eq!(
            acquire(&mut lock, &mut tokens, req(Kind::Acquire, "a", 100), 1),
            Attempt::Conflict(Mode::Shared)
        );
        assert_eq!(lock, before);
        let mut lock = Lock::default();
        acquire(&mut lock, &mut tokens, req(Kind::Racquire, "b", 100), 0);
        assert_eq!(
            acquire(&mut lock, &mut tokens, req(Kind::Read, "b", 100), 1),
            Attempt::Conflict(Mode::Exclusive)
        );
    }

    #[test]
    fn holders_are_answered_even_with_waiters_ahead() {
        let mut lock = Lock::default();
        let mut tokens = Tokens::starting_after(0);
        acquire(&mut lock, &mut tokens, req(Kind::Read, "r", 100), 0);
        let mut c = Changes::default();
        let again = lock.try_acquire(&req(Kind::Read, "r", 100), true, 1, &mut tokens, &mut c);
        assert_eq!(again, Attempt::Granted(1));
        let other = lock.try_acquire(&req(Kind::Read, "s", 100), true, 1, &mut tokens, &mut c);
        assert_eq!(other, Attempt::Busy, "a newcomer never jumps the queue");
    }

    #[test]
    fn renew_sets_the_deadline_from_now() {
        let mut lock = Lock::default();
        let mut tokens = Tokens::starting_after(0);
        acquire(&mut lock, &mut tokens, req(Kind::Read, "a", 100), 0);
        acquire(&mut lock, &mut tokens, req(Kind::Read, "b", 100), 0);
        let mut c = Changes::default();
        assert!(lock.renew(b"a", 1000, None, 50, &mut c));
        assert_eq!(lock.holder(b"a").map(|h| h.deadline), Some(1050));
        assert_eq!(lock.holder(b"b").map(|h| h.deadline), Some(100));
        assert!(
            !lock.renew(b"b", 1000, None, 100, &mut c),
            "expired: nothing to renew"
        );
        assert!(!lock.renew(b"zz", 1000, None, 100, &mut c));
    }

    #[test]
    fn a_token_names_one_grant_and_another_changes_nothing() {
        let mut tokens = Tokens::starting_after(0);
        for kind in [
            Kind::Acquire,
            Kind::Racquire,
            Kind::Read,
            Kind::Semaphore(3),
        ] {
            let mut lock = Lock::default();
            let Attempt::Granted(old) = acquire(&mut lock, &mut tokens, req(kind, "a", 10), 0)
            else {
                panic!("granted")
            };
            // The grant ends behind its holder's back; a new one to the same
            // owner name follows.
            lock.purge(10, &mut Changes::default());
            let Attempt::Granted(new) = acquire(&mut lock, &mut tokens, req(kind, "a", 100), 10)
            else {
                panic!("granted")
            };
            acquire(&mut lock, &mut tokens, req(kind, "b", 100), 10);
            let before = lock.clone();
            let mut c = Changes::default();
            assert_eq!(lock.release(b"a", Some(old), 11, &mut c), Release::NotHeld);
            assert!(!lock.renew(b"a", 500, Some(old), 11, &mut c));
            assert_eq!(lock.release_sole(b"a", Some(old), 11), None);
            assert_eq!(lock.renew_sole(b"a", 500, Some(old), 11), None);
            assert!(c.is_empty() && lock == before, "{kind:?}: nothing changed");
            assert!(lock.renew(b"a", 500, Some(new), 11, &mut c));
            assert_eq!(lock.holder(b"a").map(|h| h.deadline), Some(511));
            assert_eq!(lock.release(b"a", Some(new), 11, &mut c), Release::Last);
            let shared = kind.mode() != Mode::Exclusive;
            assert_eq!(lock.holder(b"b").is_some(), shared, "{kind:?}: b untouched");
        }
        // A reentrant grant: each hold given back under its token.
        let mut lock = Lock::default();
        let Attempt::Granted(t) = acquire(&mut lock, &mut tokens, req(Kind::Racquire, "a", 10), 0)
        else {
            panic!("granted")
        };
        acquire(&mut lock, &mut tokens, req(Kind::Racquire, "a", 10), 0);
        let mut c = Changes::default();
        assert_eq!(lock.release(b"a", Some(t + 1), 1, &mut c), Release::NotHeld);
        assert_eq!(lock.release(b"a", Some(t), 1, &mut c), Release::Remaining);
        assert_eq!(
            lock.release_sole(b"a", Some(t), 1).map(|e| e.token),
            Some(t)
        );
        assert!(lock.is_empty());
    }

    #[test]
    fn a_block_moved_whole_is_the_same_lock() {
        // What active defragmentation does to a key's value (`persistence`):
        // the one block copied whole to a new allocation, the old one freed.
        let mut lock = Lock::default();
        let mut tokens = Tokens::starting_after(0);
        for o in ["r1", "r2", "r3"] {
            acquire(&mut lock, &mut tokens, req(Kind::Read, o, 100), 0);
        }
        let before = lock.clone();
        let size = lock.memory_usage();
        let layout = std::alloc::Layout::from_size_align(size, 1).unwrap();
        let old = lock.into_raw();
        // SAFETY: a copy of the whole block to a new one of the same size,
        // the old one freed, the new one taken back once.
        let moved = unsafe {
            let new = std::alloc::alloc(layout);
            std::ptr::copy_nonoverlapping(old, new, size);
            std::alloc::dealloc(old, layout);
            Lock::from_raw(new)
        };
        assert_eq!(moved, before, "moved whole, nothing changed");
    }

    #[test]
    fn a_semaphore_admits_up_to_its_limit_one_permit_each() {
        let mut lock = Lock::default();
        let mut tokens = Tokens::starting_after(0);
        let sem = |o: &str| req(Kind::Semaphore(2), o, 100);
        assert_eq!(
            acquire(&mut lock, &mut tokens, sem("a"), 0),
            Attempt::Granted(1)
        );
        assert_eq!(
            acquire(&mut lock, &mut tokens, sem("b"), 0),
            Attempt::Granted(2)
        );
        assert_eq!(acquire(&mut lock, &mut tokens, sem("c"), 0), Attempt::Busy);
        // A holder's repeat: same token, deadline reset, still one permit.
        assert_eq!(
            acquire(&mut lock, &mut tokens, sem("a"), 50),
            Attempt::Granted(1)
        );
        assert_eq!(
            lock.holder(b"a").map(|h| (h.holds, h.deadline)),
            Some((1, 150))
        );
        assert_eq!((lock.mode(), lock.limit()), (Mode::Semaphore, Some(2)));
        let before = lock.clone();
        let other = req(Kind::Semaphore(3), "c", 100);
        assert_eq!(
            acquire(&mut lock, &mut tokens, other, 1),
            Attempt::OtherLimit(2)
        );
        for kind in [Kind::Acquire, Kind::Racquire, Kind::Read] {
            assert_eq!(
                acquire(&mut lock, &mut tokens, req(kind, "a", 100), 1),
                Attempt::WrongKind(Mode::Semaphore)
            );
        }
        assert_eq!(lock, before, "refusals change nothing");
        let mut c = Changes::default();
        assert_eq!(lock.release(b"b", None, 2, &mut c), Release::Last);
        assert_eq!(
            acquire(&mut lock, &mut tokens, sem("c"), 2),
            Attempt::Granted(3)
        );
        // Once every permit is gone, the next grant sets the limit anew.
        assert_eq!(
            acquire(&mut lock, &mut tokens, req(Kind::Semaphore(5), "d", 1), 200),
            Attempt::Granted(4)
        );
        assert_eq!(lock.limit(), Some(5));
        let mut lock = Lock::default();
        acquire(&mut lock, &mut tokens, req(Kind::Read, "r", 100), 0);
        assert_eq!(
            acquire(&mut lock, &mut tokens, sem("s"), 1),
            Attempt::WrongKind(Mode::Shared)
        );
        assert_eq!(lock.limit(), None);
    }

    #[test]
    fn check_decides_without_changing_anything() {
        let mut lock = Lock::default();
        let mut tokens = Tokens::starting_after(0);
        let r = req(Kind::Acquire, "a", 100);
        assert_eq!(lock.check(&r, false, 0), Attempt::Granted(0));
        acquire(&mut lock, &mut tokens, r.clone(), 0);
        let before = lock.clone();
        assert_eq!(
            lock.check(&r, false, 1),
            Attempt::Granted(1),
            "a repeat keeps its token"
        );
        assert_eq!(
            lock.check(&req(Kind::Acquire, "b", 100), false, 1),
            Attempt::Busy
        );
        assert_eq!(
            lock.check(&req(Kind::Read, "a", 100), false, 1),
            Attempt::Conflict(Mode::Exclusive)
        );
        assert_eq!(
            lock.check(&req(Kind::Acquire, "b", 100), false, 100),
            Attempt::Granted(0)
        );
        assert_eq!(lock, before);
    }

    #[test]
    fn semaphore_states_are_checked_on_load() {
        let h = |o: &str, t: u64, holds: u32| Holder {
            owner: o.as_bytes().into(),
            holds,
            since: 0,
            token: t,
            deadline: 10,
        };
        let two = Lock::from_holders(Kind::Semaphore(2), vec![h("a", 1, 1), h("b", 2, 1)]);
        assert_eq!(two.map(|l| l.kind()), Ok(Kind::Semaphore(2)));
        assert_eq!(
            Lock::from_holders(Kind::Semaphore(1), vec![h("a", 1, 1), h("b", 2, 1)]),
            Err(Invalid::BadLimit)
        );
        assert_eq!(
            Lock::from_holders(Kind::Semaphore(2), vec![h("a", 1, 2)]),
            Err(Invalid::BadLimit)
        );
        assert_eq!(
            Lock::from_holders(Kind::Semaphore(0), vec![h("a", 1, 1)]),
            Err(Invalid::BadLimit)
        );
        assert_eq!(Kind::of(Mode::Semaphore, None), None, "needs its limit");
        assert_eq!(Kind::of(Mode::Shared, Some(2)), None, "has no limit");
        // The master's stream wins: a replica past the limit drops its
        // earliest holders, a change of limit drops the others.
        let mut lock =
            Lock::from_holders(Kind::Semaphore(2), vec![h("a", 1, 1), h("b", 2, 1)]).unwrap();
        assert_eq!(lock.force(Kind::Semaphore(2), h("c", 3, 1)), Ok(()));
        assert_eq!(lock.holder_count(), 2);
        assert!(lock.holder(b"c").is_some());
        assert_eq!(lock.force(Kind::Semaphore(3), h("d", 4, 1)), Ok(()));
        assert_eq!((lock.holder_count(), lock.limit()), (1, Some(3)));
    }

    #[test]
    fn release_all_takes_every_hold_of_that_grant_only() {
        let mut lock = Lock::default();
        let mut tokens = Tokens::starting_after(0);
        for _ in 0..3 {
            acquire(&mut lock, &mut tokens, req(Kind::Racquire, "a", 100), 0);
        }
        let mut c = Changes::default();
        assert!(
            !lock.release_all(b"a", 99, 1, &mut c),
            "another grant's token"
        );
        assert!(c.is_empty());
        assert!(lock.release_all(b"a", 1, 1, &mut c));
        assert!(lock.is_empty());
        assert_eq!(c.owners().count(), 1);
        assert!(!lock.release_all(b"a", 1, 1, &mut c));
    }

    #[test]
    fn a_follower_names_its_token_reports_its_own_deadlines_and_releases_in_one_step() {
        let mut lock = Lock::default();
        let mut tokens = Tokens::starting_after(0);
        acquire(&mut lock, &mut tokens, req(Kind::Acquire, "a", 100), 0);
        let mut c = Changes::default();
        // It follows its connection's lease: its entry names its token.
        assert_eq!(lock.follow(1, &mut c), Some(100));
        assert_eq!(lock.follow(1, &mut c), None, "a follower already");
        let h = lock.holder(b"a").unwrap();
        assert!(h.is_follower());
        assert_eq!(h.session(), Some(1));
        // A RENEW and a repeat report the own deadline they set; the entry
        // stays.
        let mut c = Changes::default();
        assert!(lock.renew(b"a", 50, None, 10, &mut c));
        assert_eq!(c.own(), &[(1, 60)]);
        let mut c = Changes::default();
        let r = req(Kind::Acquire, "a", 70);
        let attempt = lock.try_acquire(&r, false, 20, &mut tokens, &mut c);
        assert_eq!(attempt, Attempt::Granted(1));
        assert_eq!(c.own(), &[(1, 90)]);
        assert!(lock.holder(b"a").unwrap().is_follower());
        // Its release in one step, live by its lease's deadline only.
        assert_eq!(lock.release_sole(b"a", None, 30), None);
        let dead = |_: u64| Some(30);
        assert_eq!(lock.release_sole_follower(b"a", None, 30, dead), None);
        let live = |_: u64| Some(95);
        let ended = lock.release_sole_follower(b"a", Some(1), 30, live).unwrap();
        assert_eq!((ended.token, ended.session), (1, 1));
        assert!(lock.is_empty());
    }

    #[test]
    fn force_overrides_whatever_state_conflicts() {
        let h = |o: &str, t: u64| Holder {
            owner: o.as_bytes().into(),
            holds: 1,
            since: 0,
            token: t,
            deadline: 10,
        };
        let mut lock = Lock::from_holders(Kind::Racquire, vec![h("a", 1)]).unwrap();
        assert_eq!(lock.force(Kind::Racquire, h("b", 2)), Ok(()));
        assert_eq!(
            lock.holders().map(|h| h.to_owned()).collect::<Vec<_>>(),
            [h("b", 2)]
        );
        assert_eq!(lock.force(Kind::Read, h("r", 3)), Ok(()));
        assert_eq!(
            (
                lock.mode(),
                lock.holders().map(|h| h.to_owned()).collect::<Vec<_>>()
            ),
            (Mode::Shared, vec![h("r", 3)])
        );
        assert_eq!(lock.force(Kind::Read, h("s", 4)), Ok(()));
        assert_eq!(lock.holder_count(), 2, "readers coexist");
        assert_eq!(lock.force(Kind::Read, h("t", 4)), Ok(()));
        assert_eq!(lock.holder_count(), 2, "the stale holder of token 4 went");
        let before = lock.clone();
        assert_eq!(
            lock.force(Kind::Racquire, h("", 5)),
            Err(Invalid::EmptyOwner)
        );
        assert_eq!(
            lock.force(Kind::Racquire, h("w", 0)),
            Err(Invalid::ZeroToken)
        );
        assert_eq!(lock, before, "an invalid effect changes nothing");
    }

    #[test]
    fn sweep_only_when_holders_expire_apart() {
        let h = |o: &str, d: u64| Holder {
            owner: o.as_bytes().into(),
            holds: 1,
            since: 0,
            token: d,
            deadline: d,
        };
        assert_eq!(Lock::default().sweep_at(), None);
        let one = Lock::from_holders(Kind::Racquire, vec![h("a", 10)]).unwrap();
        assert_eq!(one.sweep_at(), None);
        let apart = Lock::from_holders(Kind::Read, vec![h("a", 10), h("b", 20)]).unwrap();
        assert_eq!(apart.sweep_at(), Some(10));
        let mut b = h("b", 20);
        b.token = 99;
        let together = Lock::from_holders(Kind::Read, vec![h("a", 20), b]).unwrap();
        assert_eq!(together.sweep_at(), None);
    }

    proptest::proptest! {
        /// However long the list (past the point where it is indexed by
        /// hash), every owner touched is listed once, in the order first
        /// touched, and `contains` says so exactly.
        #[test]
        fn changes_list_each_owner_once_in_first_touched_order(
            touches in proptest::collection::vec(
                proptest::collection::vec(0u8..4, 0..70), 0..200)
        ) {
            let mut c = Changes::default();
            let mut want: Vec<Vec<u8>> = Vec::new();
            for o in &touches {
                c.touch(o);
                if !want.contains(o) {
                    want.push(o.clone());
                }
            }
            let got: Vec<Vec<u8>> = c.owners().map(|o| o.to_vec()).collect();
            proptest::prop_assert_eq!(&got, &want);
            proptest::prop_assert_eq!(c.len(), want.len());
            for o in &touches {
                proptest::prop_assert!(c.contains(o));
            }
            proptest::prop_assert!(!c.contains(b"not touched"));
        }
    }

    fn reader(o: usize, token: u64, deadline: u64) -> Holder {
        Holder {
            owner: format!("r{o}").into_bytes().into(),
            holds: 1,
            since: 0,
            token,
            deadline,
        }
    }

    #[test]
    fn a_refresh_and_a_purge_of_many_holders_list_each_once() {
        let n = 5_000;
        let holders = (0..n).map(|i| reader(i, i as u64 + 1, 10 + (i % 2) as u64));
        let lock = Lock::from_holders(Kind::Read, holders.collect()).unwrap();
        let mut c = Changes::default();
        c.touch(b"r7");
        lock.touch_all(&mut c);
        let want: Vec<Vec<u8>> = std::iter::once(7)
            .chain((0..n).filter(|i| *i != 7))
            .map(|i| format!("r{i}").into_bytes())
            .collect();
        assert_eq!(c.owners().map(|o| o.to_vec()).collect::<Vec<_>>(), want);
        let mut purged = lock.clone();
        let mut c = Changes::default();
        purged.purge_all(10, &mut c);
        assert_eq!(
            (c.expired(), c.len(), purged.holder_count()),
            (n / 2, n / 2, n / 2)
        );
        let found = purged.look_up(c.owners());
        assert!(found.iter().all(|(_, h)| h.is_none()), "all dropped");
        let found = lock.look_up(c.owners());
        assert!(found.iter().all(|(o, h)| h.is_some_and(|h| h.owner == *o)));
    }

    /// `look_up` gives what one `holder` look-up per owner gives, in the
    /// owners' order, repeats and owners holding nothing included.
    #[test]
    fn a_look_up_of_many_owners_is_each_owners_holder() {
        let holders = (0..300).map(|i| reader(i, i as u64 + 1, 100));
        let lock = Lock::from_holders(Kind::Read, holders.collect()).unwrap();
        let names: Vec<Vec<u8>> = [5, 400, 17, 5, 299, 0, 301, 17, 150, 42, 1000]
            .iter()
            .map(|i| format!("r{i}").into_bytes())
            .collect();
        let owners = names.iter().map(|n| n.as_slice());
        let found = lock.look_up(owners.clone());
        let naive: Vec<_> = owners.map(|o| (o, lock.holder(o))).collect();
        assert_eq!(found.len(), naive.len());
        for ((o, h), (p, g)) in found.iter().zip(&naive) {
            assert_eq!(o, p);
            assert_eq!(h.map(|h| h.token), g.map(|g| g.token), "{o:?}");
        }
        assert_eq!(found.iter().filter(|(_, h)| h.is_some()).count(), 8);
    }

    /// The changes of a settle's grants are found at their entries while
    /// the lock keeps the shape they left, else looked up: either way what
    /// one `holder` look-up per owner gives.
    #[test]
    fn a_look_up_of_a_settles_changes_is_each_owners_holder() {
        let mut tokens = Tokens::starting_after(1_000);
        let holders = (0..300).map(|i| reader(i, i as u64 + 1, 100));
        let mut lock = Lock::from_holders(Kind::Read, holders.collect()).unwrap();
        for after in [None, Some("release"), Some("purge")] {
            let mut c = Changes::default();
            // r0 ends before the grants (listed, not placed).
            lock.release(b"r0", None, 1, &mut c);
            let mut index = HolderIndex::default();
            for i in 0..40 {
                let owner = format!("n{i}-{after:?}");
                let r = req(Kind::Read, &owner, 100);
                let a = lock.grant_in_turn(Ask::from(&r), 1, &mut tokens, &mut c, &mut index, 1000);
                assert!(matches!(a, Attempt::Granted(_)));
            }
            match after {
                Some("release") => {
                    lock.release(b"r7", None, 1, &mut c);
                }
                Some("purge") => lock.purge_all(101, &mut c),
                _ => {}
            }
            let found = lock.look_up_changed(&c);
            let naive: Vec<_> = c.owners().map(|o| (o, lock.holder(o))).collect();
            assert_eq!(found.len(), naive.len());
            for ((o, h), (p, g)) in found.iter().zip(&naive) {
                assert_eq!(o, p);
                assert_eq!(h.map(|h| h.token), g.map(|g| g.token), "{o:?}");
            }
            lock = Lock::from_holders(
                Kind::Read,
                (0..300).map(|i| reader(i, i as u64 + 1, 100)).collect(),
            )
            .unwrap();
        }
    }

    #[test]
    fn grants_past_the_holder_limit_are_refused_and_change_nothing() {
        let mut tokens = Tokens::starting_after(0);
        for kind in [Kind::Read, Kind::Semaphore(10)] {
            let mut lock = Lock::default();
            for o in ["a", "b", "c"] {
                let mut c = Changes::default();
                let got =
                    lock.try_acquire_within(&req(kind, o, 100), false, 0, &mut tokens, &mut c, 3);
                assert!(matches!(got, Attempt::Granted(_)));
            }
            let before = lock.clone();
            let mut c = Changes::default();
            let got =
                lock.try_acquire_within(&req(kind, "d", 100), false, 1, &mut tokens, &mut c, 3);
            assert_eq!(got, Attempt::TooManyHolders(3));
            assert!(c.is_empty() && lock == before, "nothing changed");
            // A holder's repeat is not a new holder.
            let got =
                lock.try_acquire_within(&req(kind, "b", 100), false, 1, &mut tokens, &mut c, 3);
            assert!(matches!(got, Attempt::Granted(_)));
            // Expired holders do not count.
            let mut c = Changes::default();
            let got =
                lock.try_acquire_within(&req(kind, "d", 100), false, 100, &mut tokens, &mut c, 3);
            assert!(matches!(got, Attempt::Granted(_)), "{got:?}");
            assert_eq!(
                lock.check(&req(kind, "e", 100), false, 100),
                Attempt::Granted(0)
            );
        }
        // An exclusive lock whose holder expired is free at a limit of 1.
        let mut lock = Lock::default();
        let mut c = Changes::default();
        lock.try_acquire_within(
            &req(Kind::Acquire, "a", 10),
            false,
            0,
            &mut tokens,
            &mut c,
            1,
        );
        let got = lock.try_acquire_within(
            &req(Kind::Acquire, "b", 10),
            false,
            10,
            &mut tokens,
            &mut c,
            1,
        );
        assert!(matches!(got, Attempt::Granted(_)));
    }

    /// A lock of thousands of readers (its index sharded, owners of many
    /// lengths so removals leave tombstones between live entries): after
    /// every grant, release and repeat in a random order, each owner's
    /// holder is the one a walk finds, the index agrees with the entries,
    /// and a save and load gives the same lock.
    #[test]
    fn an_indexed_lock_of_thousands_finds_each_owner_as_a_walk_does() {
        let n = 3_000usize;
        let mut lock = Lock::default();
        let mut tokens = Tokens::starting_after(0);
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut next = |m: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m as u64) as usize
        };
        let name = |o: usize| format!("r{}{o}", "x".repeat(o % 5)).into_bytes();
        fn read(owner: &[u8], ttl: u64) -> Ask<'_> {
            Ask {
                kind: Kind::Read,
                owner,
                ttl,
                session: 0,
            }
        }
        for o in 0..n {
            let mut c = Changes::default();
            let got =
                lock.try_acquire_within(read(&name(o), 1000), false, 1, &mut tokens, &mut c, n);
            assert!(matches!(got, Attempt::Granted(_)));
        }
        assert!(lock.block.is_indexed());
        for step in 0..6 * n {
            let o = next(n + n / 2);
            let owner = name(o);
            let mut c = Changes::default();
            match next(3) {
                0 => {
                    lock.release(&owner, None, 2, &mut c);
                }
                1 => {
                    let ask = read(&owner, 1000 + step as u64);
                    lock.try_acquire_within(ask, false, 2, &mut tokens, &mut c, usize::MAX);
                }
                _ => {
                    lock.renew(&owner, 500 + step as u64, None, 2, &mut c);
                }
            }
            if step % 500 == 0 || step < 50 {
                assert!(lock.block.index_agrees(), "step {step}");
                let saved = lock.saved().into_owned();
                let loaded = Lock::from_saved(saved, 2).unwrap().lock;
                assert_eq!(loaded, lock);
            }
            let walked = lock.holders().find(|h| h.owner == &owner[..]);
            assert_eq!(lock.holder(&owner), walked);
        }
        assert!(lock.block.index_agrees());
        for o in 0..n + n / 2 {
            let mut c = Changes::default();
            let token = lock.holder(&name(o)).map_or(0, |h| h.token);
            lock.release_all(&name(o), token, 2, &mut c);
            assert!(lock.block.index_agrees());
        }
        assert!(lock.is_empty());
    }

    #[test]
    fn many_holders_are_built_checked_and_forced_as_few_are() {
        let n = 100;
        let many: Vec<Holder> = (0..n)
            .map(|i| reader(i, i as u64 + 1, 50 + (i % 7) as u64))
            .collect();
        let lock = Lock::from_holders(Kind::Read, many.clone()).unwrap();
        let mut one_by_one = Lock::default();
        for h in many.clone() {
            one_by_one.put(Kind::Read, h).unwrap();
        }
        assert_eq!(lock, one_by_one);
        let mut twice = many.clone();
        twice.push(reader(3, 999, 1));
        assert_eq!(
            Lock::from_holders(Kind::Read, twice),
            Err(Invalid::DuplicateOwner)
        );
        let mut same_token = many.clone();
        same_token.push(reader(n, 5, 1));
        assert_eq!(
            Lock::from_holders(Kind::Read, same_token),
            Err(Invalid::DuplicateToken)
        );
        assert_eq!(
            Lock::from_holders(Kind::Racquire, many.clone()),
            Err(Invalid::SecondExclusiveHolder)
        );
        assert_eq!(
            Lock::from_holders(Kind::Semaphore(99), many.clone()),
            Err(Invalid::BadLimit)
        );
        let sem = Lock::from_holders(Kind::Semaphore(100), many.clone()).unwrap();
        assert_eq!(sem.holder_count(), n);
        // A semaphore forced to take one more at its limit drops the
        // earliest deadline, first granted first: as one at a time would.
        let mut forced = sem.clone();
        forced
            .force(Kind::Semaphore(100), reader(n, 1_000, 9))
            .unwrap();
        let mut want = sem.clone();
        let earliest = many.iter().min_by_key(|h| h.deadline).unwrap();
        want.remove(&earliest.owner);
        want.put(Kind::Semaphore(100), reader(n, 1_000, 9)).unwrap();
        assert_eq!(forced, want);
    }

    #[test]
    fn a_queue_of_many_readers_is_granted_in_turn_exactly() {
        let mut tokens = Tokens::starting_after(0);
        let mut lock = Lock::default();
        let mut c = Changes::default();
        for i in 0..20 {
            lock.try_acquire(
                &req(Kind::Read, &format!("h{i}"), 100),
                false,
                0,
                &mut tokens,
                &mut c,
            );
        }
        let mut plain = lock.clone();
        let mut plain_tokens = tokens;
        let asks: Vec<Request> = (0..40)
            .map(|i| req(Kind::Read, &format!("{}{}", ["h", "w"][i % 2], i / 2), 200))
            .collect();
        let mut index = HolderIndex::default();
        let (mut ca, mut cb) = (Changes::default(), Changes::default());
        for r in &asks {
            let a = lock.grant_in_turn(
                Ask::from(r),
                5,
                &mut tokens,
                &mut ca,
                &mut index,
                max_holders(),
            );
            let b = plain.try_acquire(r, false, 5, &mut plain_tokens, &mut cb);
            assert_eq!(a, b);
        }
        assert_eq!(lock, plain);
        assert!(ca.owners().eq(cb.owners()));
    }

    #[test]
    fn a_saved_lock_past_the_limit_is_refused_before_its_walk() {
        let many: Vec<Holder> = (0..20).map(|i| reader(i, i as u64 + 1, 50)).collect();
        let saved = Lock::from_holders(Kind::Read, many)
            .unwrap()
            .saved()
            .to_vec();
        assert_eq!(Lock::saved_count(&saved), Some(20));
        assert!(Lock::from_saved_within(saved.clone(), 1, 20).is_ok());
        assert_eq!(
            Lock::from_saved_within(saved, 1, 19).unwrap_err(),
            Invalid::TooManyHolders
        );
    }

    #[test]
    fn put_checks_invariants() {
        let h = |o: &str, t: u64| Holder {
            owner: o.as_bytes().into(),
            holds: 1,
            since: 0,
            token: t,
            deadline: 10,
        };
        assert!(Lock::from_holders(Kind::Read, vec![h("a", 1), h("b", 2)]).is_ok());
        assert_eq!(
            Lock::from_holders(Kind::Read, vec![h("a", 1), h("b", 1)]),
            Err(Invalid::DuplicateToken)
        );
        assert_eq!(
            Lock::from_holders(Kind::Racquire, vec![h("a", 1), h("b", 2)]),
            Err(Invalid::SecondExclusiveHolder)
        );
        assert_eq!(
            Lock::from_holders(Kind::Read, vec![h("", 1)]),
            Err(Invalid::EmptyOwner)
        );
        let mut lock = Lock::from_holders(Kind::Read, vec![h("a", 1)]).unwrap_or_default();
        assert_eq!(
            lock.put(Kind::Racquire, h("b", 3)),
            Err(Invalid::ModeMismatch)
        );
        // Replacing the only holder may change the mode.
        assert_eq!(lock.put(Kind::Racquire, h("a", 4)), Ok(()));
        assert_eq!(lock.mode(), Mode::Exclusive);
    }

    /// The earliest of the holders' own deadlines by a walk (those
    /// following a session aside): what the kept bound must never pass.
    fn walked_earliest(lock: &Lock) -> Option<u64> {
        lock.holders()
            .filter(|h| h.session().is_none())
            .map(|h| h.deadline)
            .min()
    }

    /// The latest deadline by a walk of the holders: what the kept one in
    /// the block must always be.
    fn walked_latest(lock: &Lock) -> Option<u64> {
        lock.holders().map(|h| h.deadline).max()
    }

    /// A change to a shared lock or a semaphore's holders, as the shell
    /// makes them (commands, a settle's grants, expiry, sessions, leases,
    /// a replica's `LOCK.SYNC`, a load).
    #[derive(Clone, Debug)]
    enum KeptOp {
        Grant {
            owner: u8,
            ttl: u64,
            session: u8,
        },
        Settle(Vec<(u8, u64)>),
        Release(u8),
        ReleaseAll(u8),
        ReleaseSole(u8),
        Renew {
            owner: u8,
            ttl: u64,
        },
        RenewSole {
            owner: u8,
            ttl: u64,
        },
        Later(u64),
        Purge,
        Follow(u8),
        EndSessions(u8),
        Materialize(u8),
        Clamp(u64),
        ApplySet {
            owner: u8,
            ttl: u64,
        },
        ApplyDrop(u8),
        Remove(u8),
        SaveLoad,
        Clone,
        /// Redis's value and back (`into_raw`, `from_raw`).
        Raw,
    }

    fn kept_op() -> impl proptest::strategy::Strategy<Value = KeptOp> {
        use proptest::prelude::*;
        let owner = 0u8..10;
        let ttl = 1u64..40;
        prop_oneof![
            4 => (owner.clone(), ttl.clone(), 0u8..8).prop_map(|(owner, ttl, session)| {
                KeptOp::Grant { owner, ttl, session }
            }),
            2 => proptest::collection::vec((owner.clone(), ttl.clone()), 1..6).prop_map(KeptOp::Settle),
            2 => owner.clone().prop_map(KeptOp::Release),
            1 => owner.clone().prop_map(KeptOp::ReleaseAll),
            1 => owner.clone().prop_map(KeptOp::ReleaseSole),
            2 => (owner.clone(), ttl.clone()).prop_map(|(owner, ttl)| KeptOp::Renew { owner, ttl }),
            1 => (owner.clone(), ttl.clone()).prop_map(|(owner, ttl)| KeptOp::RenewSole { owner, ttl }),
            2 => (0u64..25).prop_map(KeptOp::Later),
            1 => Just(KeptOp::Purge),
            1 => owner.clone().prop_map(KeptOp::Follow),
            1 => any::<u8>().prop_map(KeptOp::EndSessions),
            1 => any::<u8>().prop_map(KeptOp::Materialize),
            1 => (0u64..40).prop_map(KeptOp::Clamp),
            1 => (owner.clone(), ttl).prop_map(|(owner, ttl)| KeptOp::ApplySet { owner, ttl }),
            1 => owner.clone().prop_map(KeptOp::ApplyDrop),
            1 => owner.prop_map(KeptOp::Remove),
            1 => Just(KeptOp::SaveLoad),
            1 => Just(KeptOp::Clone),
            1 => Just(KeptOp::Raw),
        ]
    }

    /// Does `op` to `lock` at `*now`.
    fn do_kept_op(lock: &mut Lock, kind: Kind, op: &KeptOp, now: &mut u64, tokens: &mut Tokens) {
        let name = |o: u8| format!("o{o}").into_bytes();
        let mut c = Changes::default();
        let t = *now;
        match op {
            KeptOp::Grant {
                owner,
                ttl,
                session,
            } => {
                // Sessions 1 and 2 (their holders' deadlines name them).
                let session = match session {
                    1 | 2 => u64::from(*session),
                    _ => 0,
                };
                let owner = name(*owner);
                let ask = Ask {
                    kind,
                    owner: &owner,
                    ttl: *ttl,
                    session,
                };
                lock.try_acquire_within(ask, false, t, tokens, &mut c, 100);
            }
            KeptOp::Settle(asks) => {
                lock.purge(t, &mut c);
                let mut index = HolderIndex::default();
                for (i, (owner, ttl)) in asks.iter().enumerate() {
                    let owner = name(*owner);
                    let ask = Ask {
                        kind,
                        owner: &owner,
                        ttl: *ttl,
                        session: 0,
                    };
                    let granted = lock.grant_in_turn(ask, t, tokens, &mut c, &mut index, 100);
                    // Some bound: they follow their connection's lease.
                    if let (Attempt::Granted(token), true) = (granted, i % 2 == 1) {
                        lock.follow(token, &mut c);
                    }
                }
            }
            KeptOp::Release(o) => {
                lock.release(&name(*o), None, t, &mut c);
            }
            KeptOp::ReleaseAll(o) => {
                let token = lock.holder(&name(*o)).map_or(0, |h| h.token);
                lock.release_all(&name(*o), token, t, &mut c);
            }
            KeptOp::ReleaseSole(o) => {
                lock.release_sole(&name(*o), None, t);
            }
            KeptOp::Renew { owner, ttl } => {
                lock.renew(&name(*owner), *ttl, None, t, &mut c);
            }
            KeptOp::RenewSole { owner, ttl } => {
                lock.renew_sole(&name(*owner), *ttl, None, t);
            }
            KeptOp::Later(ms) => *now += ms,
            KeptOp::Purge => {
                lock.purge(t, &mut c);
            }
            KeptOp::Follow(i) => {
                let n = lock.holder_count().max(1);
                let token = lock.holders().nth(usize::from(*i) % n).map(|h| h.token);
                if let Some(token) = token {
                    lock.follow(token, &mut c);
                }
            }
            KeptOp::EndSessions(live) => {
                let live = *live;
                lock.end_sessions(
                    |id| (live & (1 << (id % 8)) != 0).then_some(t + 50),
                    t,
                    &mut c,
                );
            }
            KeptOp::Materialize(d) => {
                let d = u64::from(*d);
                lock.materialize_sessions(|id| (id % 3 != 0).then_some(t + d + id));
            }
            KeptOp::Clamp(d) => {
                lock.clamp_deadlines(t + d);
            }
            KeptOp::ApplySet { owner, ttl } => {
                if let Some(token) = tokens.issue() {
                    let h = Holder {
                        owner: name(*owner).into(),
                        holds: 1,
                        since: 0,
                        token,
                        deadline: t + ttl,
                    };
                    let _ = lock.apply_set(kind, h);
                }
            }
            KeptOp::ApplyDrop(o) => {
                lock.apply_drop(&name(*o));
            }
            KeptOp::Remove(o) => {
                lock.remove(&name(*o));
            }
            KeptOp::SaveLoad => {
                let saved = lock.saved().into_owned();
                if !saved.is_empty() {
                    let loaded = Lock::from_saved(saved, t).expect("a saved lock loads");
                    *lock = loaded.lock;
                }
            }
            KeptOp::Clone => *lock = lock.clone(),
            // SAFETY: the block `into_raw` gave, taken back once.
            KeptOp::Raw => *lock = unsafe { Lock::from_raw(std::mem::take(lock).into_raw()) },
        }
    }

    proptest::proptest! {
        /// The latest deadline kept in a shared or semaphore block (for the
        /// key's expiry, without a walk of its holders) is, after every
        /// change of any kind, the latest deadline a walk of its holders
        /// finds; and when it took a walk, keeping it leaves it right.
        #[test]
        fn the_kept_latest_deadline_is_always_the_walked_one(
            semaphore in proptest::bool::ANY,
            ops in proptest::collection::vec(kept_op(), 1..120),
        ) {
            let kind = match semaphore {
                true => Kind::Semaphore(6),
                false => Kind::Read,
            };
            let mut lock = Lock::default();
            let mut tokens = Tokens::starting_after(0);
            let mut now = 1_000;
            for op in &ops {
                do_kept_op(&mut lock, kind, op, &mut now, &mut tokens);
                proptest::prop_assert_eq!(lock.first_holder(), lock.holders().next());
                let mut owners: Vec<&[u8]> = lock.holders().map(|h| h.owner).collect();
                owners.sort();
                let n = owners.len();
                owners.dedup();
                proptest::prop_assert_eq!(owners.len(), n, "dup after {:?}", op);
                let walked = walked_latest(&lock);
                proptest::prop_assert_eq!(lock.latest_deadline(), walked, "after {:?}", op);
                let mut held = Held::default();
                for h in lock.holders() {
                    held.record(u64::from(h.held_ms(h.deadline)));
                }
                proptest::prop_assert_eq!(lock.held_at_deadlines(), held);
                // The owners' index finds exactly what a walk finds.
                proptest::prop_assert!(lock.block.index_agrees(), "index after {:?}", op);
                for o in 0u8..12 {
                    let o = format!("o{o}").into_bytes();
                    let walked = lock.holders().find(|h| h.owner == &o[..]);
                    proptest::prop_assert_eq!(lock.holder(&o), walked);
                }
                proptest::prop_assert_eq!(lock.keep_latest(), walked);
                proptest::prop_assert_eq!(lock.latest_deadline(), walked);
                // What is saved is the block as RDB encoding 3 always had it.
                let saved = lock.saved();
                let bytes = lock.block.as_bytes();
                match lock.mode() {
                    _ if lock.is_empty() => proptest::prop_assert!(saved.is_empty()),
                    Mode::Exclusive => proptest::prop_assert_eq!(&saved[..], bytes),
                    // (Without an indexed block's tombstones.)
                    _ if lock.block.is_indexed() => {
                        proptest::prop_assert!(saved.len() + 28 <= bytes.len())
                    }
                    _ => proptest::prop_assert_eq!(saved.len() + 28, bytes.len()),
                }
            }
        }

        /// The bound on the earliest deadline kept in the block (no walk)
        /// against the walked definition, after every change of any kind:
        /// never above the earliest of the holders' own deadlines; `None`
        /// only when no holder has one; every "nothing expired" or "held"
        /// it answers without a walk true; a visit planned by it
        /// (`earliest_deadline`, `sweep_at`) never late; and after a purge
        /// at `now` the next planned visit is after `now` (an early visit
        /// does not come again at once: its walk made the bound exact).
        #[test]
        fn the_kept_earliest_bound_is_never_above_the_walked_earliest(
            semaphore in proptest::bool::ANY,
            ops in proptest::collection::vec(kept_op(), 1..120),
        ) {
            let kind = match semaphore {
                true => Kind::Semaphore(6),
                false => Kind::Read,
            };
            let mut lock = Lock::default();
            let mut tokens = Tokens::starting_after(0);
            let mut now = 1_000;
            for op in &ops {
                do_kept_op(&mut lock, kind, op, &mut now, &mut tokens);
                let walked = walked_earliest(&lock);
                let bound = lock.earliest_deadline();
                match (bound, walked) {
                    (None, Some(e)) => proptest::prop_assert!(false, "none, {} walked, after {:?}", e, op),
                    (Some(b), Some(e)) => proptest::prop_assert!(b <= e, "{} > {} after {:?}", b, e, op),
                    _ => {}
                }
                proptest::prop_assert!(lock.earliest_of_all() <= walked.unwrap_or(u64::MAX));
                // Never late: a sweep the walk asks for is planned no later.
                let walked_sweep = walked.filter(|&e| Some(e) != walked_latest(&lock));
                if let Some(e) = walked_sweep {
                    proptest::prop_assert!(lock.sweep_at().is_some_and(|s| s <= e), "after {:?}", op);
                }
                // The answers taken from the bound are the walked ones.
                for t in [now, now + 7, now + 30, now.saturating_sub(5)] {
                    proptest::prop_assert_eq!(lock.is_held(t), lock.holders().any(|h| h.is_live(t)));
                    proptest::prop_assert_eq!(lock.live_count(t), lock.holders().filter(|h| h.is_live(t)).count());
                }
                // A purge that finds nothing expired changes nothing; after
                // any purge, nothing is expired and the next visit is later.
                let mut after = lock.clone();
                let mut c = Changes::default();
                after.purge_all(now, &mut c);
                proptest::prop_assert!(after.holders().all(|h| h.is_live(now)));
                proptest::prop_assert_eq!(c.expired, lock.holders().filter(|h| !h.is_live(now)).count());
                proptest::prop_assert!(after.earliest_deadline().is_none_or(|d| d > now));
                proptest::prop_assert!(after.sweep_at().is_none_or(|d| d > now));
                proptest::prop_assert_eq!(after.earliest_deadline(), walked_earliest(&after));
            }
        }
    }

    proptest::proptest! {
        /// [`Lock::apply_set_new`] (an indexed lock's owner found through
        /// its index, no walk) leaves the state and answers what
        /// [`Lock::apply_set`] does, for any effect a replica may be sent
        /// (owners, tokens and modes clashing), `fresh` as `LOCK.SYNC`
        /// tells it: the token above every token applied so far.
        #[test]
        fn an_apply_through_the_index_is_the_walked_apply(
            ops in proptest::collection::vec(
                (0u8..6, 0u8..12, 1u32..3, 1u64..40, 0u64..3, proptest::bool::weighted(0.15)),
                1..100,
            ),
        ) {
            let fields = |l: &Lock| -> Vec<(Vec<u8>, u32, u32, u64, u64)> {
                l.holders()
                    .map(|h| (h.owner.to_vec(), h.holds, h.since, h.token, h.deadline))
                    .collect()
            };
            let (mut walked, mut indexed) = (Lock::default(), Lock::default());
            let mut seen = 0u64;
            for (k, owner, holds, token, d, drop) in ops {
                let owner = format!("o{owner}").into_bytes();
                if drop {
                    proptest::prop_assert_eq!(indexed.apply_drop(&owner), walked.apply_drop(&owner));
                    continue;
                }
                let kind = match k {
                    0 => Kind::Acquire,
                    1 => Kind::Semaphore(8),
                    _ => Kind::Read,
                };
                let h = Holder { owner: owner.into(), holds, since: 0, token, deadline: 1_000 + d };
                let want = walked.apply_set(kind, h.clone());
                let got = indexed.apply_set_new(kind, h, token > seen);
                seen = seen.max(token);
                proptest::prop_assert_eq!(got, want);
                proptest::prop_assert_eq!(fields(&indexed), fields(&walked));
                proptest::prop_assert_eq!(indexed.latest_deadline(), walked.latest_deadline());
            }
        }
    }

    /// The purge before slices: every expired holder ended, then dropped,
    /// in one go (the reference of the sliced one).
    fn purge_in_one_go(lock: &mut Lock, now: u64, changes: &mut Changes) {
        for h in lock.holders().filter(|h| !h.is_live(now)) {
            changes.touch(h.owner);
            changes.expired += 1;
            changes.end(&h, h.deadline);
        }
        lock.block.retain(|h| h.is_live(now));
    }

    type Seen = Vec<(Vec<u8>, u32, u64, u64)>;

    fn seen(lock: &Lock, now: u64) -> Seen {
        lock.live(now)
            .map(|h| (h.owner.to_vec(), h.holds, h.token, h.deadline))
            .collect()
    }

    /// An indexed lock of `n` readers with these deadlines, some released
    /// (tombstones, a sweep perhaps under way).
    fn indexed_readers(deadlines: &[u64], released: &[usize]) -> Lock {
        let holders = deadlines
            .iter()
            .enumerate()
            .map(|(i, d)| reader(i, i as u64 + 1, *d));
        let mut lock = Lock::from_holders(Kind::Read, holders.collect()).unwrap();
        for r in released {
            lock.release(format!("r{r}").as_bytes(), None, 0, &mut Changes::default());
        }
        lock
    }

    proptest::proptest! {
        /// A purge in slices, called until it says none is left, leaves
        /// what the purge in one go leaves (holders, in order) and lists
        /// the same changes (owners, expiries, ends).
        #[test]
        fn a_purge_in_slices_equals_the_purge_in_one_go(
            deadlines in proptest::collection::vec(1u64..40, 4..80),
            released in proptest::collection::vec(0usize..80, 0..20),
            now in 0u64..45,
        ) {
            let mut sliced = indexed_readers(&deadlines, &released);
            proptest::prop_assume!(sliced.block.is_indexed());
            let mut whole = sliced.clone();
            let (mut a, mut b) = (Changes::default(), Changes::default());
            let mut calls = 0;
            while sliced.purge(now, &mut a) {
                calls += 1;
                proptest::prop_assert!(calls <= deadlines.len());
            }
            purge_in_one_go(&mut whole, now, &mut b);
            let all = |l: &Lock| -> Seen {
                l.holders().map(|h| (h.owner.to_vec(), h.holds, h.token, h.deadline)).collect()
            };
            proptest::prop_assert_eq!(all(&sliced), all(&whole));
            proptest::prop_assert_eq!(a.expired(), b.expired());
            proptest::prop_assert_eq!(a.owners().collect::<Vec<_>>(), b.owners().collect::<Vec<_>>());
            proptest::prop_assert_eq!(a.ended().collect::<Vec<_>>(), b.ended().collect::<Vec<_>>());
            proptest::prop_assert!(sliced.holders().all(|h| h.is_live(now)));
            // (The earliest is a bound, made exact by a purge that finds
            // something: never above the walked one.)
            proptest::prop_assert!(sliced.earliest_deadline() <= walked_earliest(&sliced));
            proptest::prop_assert_eq!(sliced.latest_deadline(), whole.latest_deadline());
            proptest::prop_assert_eq!(sliced.held_at_deadlines(), whole.held_at_deadlines());
            proptest::prop_assert!(sliced.block.is_empty() || !sliced.block.is_indexed() || sliced.block.index_agrees());
            // More than a slice's worth expired: it took more than one call.
            let expired = a.expired();
            if sliced.block.is_indexed() && expired > PURGE_MOST {
                proptest::prop_assert!(calls >= 1);
            }
        }

        /// Between any two slices of a purge, a request on the lock is
        /// answered exactly as on the lock purged whole, and leaves it the
        /// same once the purge is done: a new reader (at the holder limit
        /// and below it), a writer, a semaphore (at its permits, below
        /// them, another limit), a repeat, a renewal, a release (its
        /// owner's holder expired or live), a check; what reads see (held,
        /// live holders, the live count) too. The ends reported over all
        /// the slices (holders set aside included) are the purge in one
        /// go's: each holder once, at its own deadline.
        #[test]
        fn requests_between_slices_see_the_lock_purged_whole(
            deadlines in proptest::collection::vec(1u64..40, 4..60),
            released in proptest::collection::vec(0usize..60, 0..10),
            now in 1u64..45,
            slices in 1usize..4,
            op in 0usize..10,
            who in 0usize..70,
            last_live in proptest::bool::ANY,
            semaphore in proptest::bool::ANY,
            spare in 0usize..3,
        ) {
            let mut deadlines = deadlines;
            if last_live {
                // One holder goes on past `now`.
                deadlines.push(100);
            }
            let permits = deadlines.len() as u32;
            let mut sliced = match semaphore {
                false => indexed_readers(&deadlines, &released),
                true => {
                    let holders = deadlines.iter().enumerate().map(|(i, d)| reader(i, i as u64 + 1, *d));
                    let mut lock = Lock::from_holders(Kind::Semaphore(permits), holders.collect()).unwrap();
                    for r in &released {
                        lock.release(format!("r{r}").as_bytes(), None, 0, &mut Changes::default());
                    }
                    lock
                }
            };
            let mut whole = sliced.clone();
            let (mut a, mut b) = (Changes::default(), Changes::default());
            for _ in 0..slices {
                sliced.purge(now, &mut a);
            }
            whole.purge_all(now, &mut b);
            proptest::prop_assert_eq!(sliced.is_held(now), whole.is_held(now));
            proptest::prop_assert_eq!(seen(&sliced, now), seen(&whole, now));
            proptest::prop_assert_eq!(sliced.live_count(now), whole.live_count(now));
            // The holder limit at the live count (`spare` 0) or above it.
            let max = (whole.live_count(now) + spare).max(1);
            let owner = format!("r{who}");
            let (mut ta, mut tb) = (Tokens::starting_after(1000), Tokens::starting_after(1000));
            let one = |lock: &mut Lock, tokens: &mut Tokens, c: &mut Changes| -> String {
                let o = owner.as_bytes();
                let mut ask = |kind: Kind| {
                    format!("{:?}", lock.try_acquire_within(&req(kind, &owner, 10), false, now, tokens, c, max))
                };
                match op {
                    0 => ask(Kind::Read),
                    1 => ask(Kind::Acquire),
                    2 => ask(Kind::Semaphore(permits)),
                    3 => ask(Kind::Semaphore(permits + 1)),
                    4 => ask(Kind::Racquire),
                    5 => format!("{:?}", lock.release(o, None, now, c)),
                    6 => format!("{:?}", lock.renew(o, 20, None, now, c)),
                    7 => format!("{:?}", lock.release_all(o, (who + 1) as u64, now, c)),
                    8 => format!("{:?}", lock.check(&req(Kind::Acquire, &owner, 10), false, now)),
                    _ => format!("{:?}", lock.check(&req(Kind::Read, &owner, 10), false, now)),
                }
            };
            let got = one(&mut sliced, &mut ta, &mut a);
            let want = one(&mut whole, &mut tb, &mut b);
            proptest::prop_assert_eq!(&got, &want);
            proptest::prop_assert_eq!(seen(&sliced, now), seen(&whole, now));
            proptest::prop_assert_eq!(sliced.is_held(now), whole.is_held(now));
            proptest::prop_assert_eq!(sliced.live_count(now), whole.live_count(now));
            // The rest of the purge, and the holders set aside ended a
            // slice at a time.
            let mut aside = a.take_aside();
            proptest::prop_assert!(b.take_aside().is_none(), "nothing expired is left to set aside");
            if let Some(aside) = aside.as_deref_mut() {
                proptest::prop_assert!(aside.lock.holders().all(|h| !h.is_live(now)));
                while aside.end_some(&mut a) {}
                proptest::prop_assert!(aside.is_empty());
            }
            sliced.purge_all(now, &mut a);
            whole.purge_all(now, &mut b);
            {
                let all = |l: &Lock| -> Seen {
                    l.holders().map(|h| (h.owner.to_vec(), h.holds, h.token, h.deadline)).collect()
                };
                proptest::prop_assert_eq!(all(&sliced), all(&whole));
                proptest::prop_assert_eq!(a.expired(), b.expired());
                let mut ea: Vec<_> = a.ended().collect();
                let mut eb: Vec<_> = b.ended().collect();
                ea.sort_by_key(|e| e.token);
                eb.sort_by_key(|e| e.token);
                proptest::prop_assert_eq!(ea, eb);
            }
        }
    }
}
