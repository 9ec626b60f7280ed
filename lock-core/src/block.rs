//! A lock's holders packed in one heap block: the value Redis stores for a
//! lock key is the block's address, so a lock costs one allocation and no
//! pointer chasing. An exclusive lock with a UUID owner fits 64 bytes.
//!
//! ```text
//! exclusive:  [0]                                        entry (exactly one)
//! shared:     [1] count:u32 len:u32 cap:u32              kept entry...
//! semaphore:  [2] count:u32 len:u32 cap:u32 limit:u32    kept entry...
//! kept:       latest:u64 at-latest:u32 low:u64 index:u64
//! entry:      token:u64 deadline:u64 holds:u32 since:u32 owner-length owner
//! owner-length: one byte below 255, else 255 and a u32
//! ```
//!
//! `index` is the address of the block's [`Index`] while the block is
//! Redis's (0: none; written and read only in a block of [`INDEXED_LEN`]
//! bytes or more, which every indexed block is: a smaller lock's paths
//! never touch it), a lock of [`INDEX_FROM`] holders or more: its owners
//! by hash and its deadlines in order, so a look-up, a removal and the
//! earliest and latest deadlines cost no walk of the holders. An indexed
//! block removes an entry by marking it (a tombstone: `holds` 0, skipped
//! by every read), not by moving the entries after it; the marks are
//! swept out when they outweigh the live entries ([`Block::remove`]).
//!
//! `kept` is the latest deadline of the holders and how many have it (0:
//! not known, found by a walk when asked, [`Block::keep_latest`]), kept by
//! every change below, so that a key's expiry is known without a walk of
//! its holders. It is not saved: [`Block::saved`] leaves it out (the saved
//! form is the block of RDB encoding 3 as it always was) and
//! [`Block::from_saved`] puts it back from its walk.
//!
//! `low` is a lower bound on the earliest of the holders' own deadlines
//! (those following a session aside; `u64::MAX`: none has one of its own),
//! [`Block::low`]: lowered by every holder that comes or whose deadline
//! changes, never raised but by a walk that finds it exactly (a
//! [`Block::retain`], a load, [`Block::exact_low`]). The earliest cannot
//! be kept exactly without a walk (holders leave in any order); a bound
//! answers "has any holder expired?" without one while it is in the future.
//!
//! Numbers are little-endian and unaligned. An exclusive block is allocated
//! to its exact length, so its length and capacity follow from its owner's
//! length; the others record both (`len`, `cap`) for [`Block::from_raw`],
//! written by [`Block::into_raw`]. An empty block (no holder) owns no
//! memory: Redis never stores one.
//!
//! Every read is bounds-checked and yields `None` past the end, never a
//! panic; the block is only ever written by this file.

use std::collections::BTreeMap;
use std::mem::ManuallyDrop;

use crate::hash::Keyed;
use crate::mode::Mode;
use crate::shards::Sharded;

/// The tags of the modes' blocks, from the mode table.
pub const EXCLUSIVE: u8 = Mode::Exclusive.tag();
pub const SHARED: u8 = Mode::Shared.tag();
pub const SEMAPHORE: u8 = Mode::Semaphore.tag();

/// token, deadline, holds, since.
const FIXED: usize = 24;
/// The header of shared and semaphore blocks (before `limit`).
const COUNTED: usize = 13;
const LIMIT_AT: usize = COUNTED;
/// The kept latest deadline and how many holders have it, the bound on
/// the earliest, and the index's address (`kept`).
const KEPT: usize = 28;
/// Where `low` is in `kept`.
const LOW_AT: usize = 12;
/// Where the index's address is in `kept`.
const INDEX_AT: usize = 20;
/// A shared or semaphore block is indexed from this many holders on
/// ([`Index`]); below it a look-up walks at most this many entries.
#[cfg(not(test))]
pub(crate) const INDEX_FROM: usize = 1024;
/// (A few in the core's own tests: every test of a lock of a few holders
/// runs on an indexed block, property tests included.)
#[cfg(test)]
pub(crate) const INDEX_FROM: usize = 4;
/// An indexed block that falls below this many holders drops its index
/// (after its tombstones are swept out).
const INDEX_UNTIL: usize = INDEX_FROM / 2;
/// Owner lengths from this one on take a byte and a u32.
const LONG: u8 = 255;
/// A block shorter than this has no index: an indexed block has at least
/// [`INDEX_UNTIL`] holders of at least `FIXED + 1` bytes each. Its index
/// word is neither written by [`Block::into_raw`] nor read by
/// [`Block::from_raw`] (the paths of nearly every lock never touch it).
const INDEXED_LEN: usize = INDEX_UNTIL * (FIXED + 1);

/// One holder as the block stores it, borrowed. Equality is of the state:
/// `since` (a statistic) aside.
#[derive(Clone, Copy, Debug)]
pub struct HolderRef<'a> {
    pub owner: &'a [u8],
    pub holds: u32,
    /// When it was granted, unix ms modulo 2^32 (hold-time statistics only).
    pub since: u32,
    pub token: u64,
    /// Absolute deadline, unix milliseconds; it holds while `now < deadline`.
    pub deadline: u64,
}

impl PartialEq for HolderRef<'_> {
    fn eq(&self, other: &HolderRef<'_>) -> bool {
        self.owner == other.owner
            && self.holds == other.holds
            && self.token == other.token
            && self.deadline == other.deadline
    }
}

impl Eq for HolderRef<'_> {}

/// The block is past what its `u32` lengths can describe.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TooLarge;

fn header_len(tag: u8) -> usize {
    match tag {
        EXCLUSIVE => 1,
        _ => saved_header_len(tag) + KEPT,
    }
}

/// The header as saved (`kept` left out), and where `kept` starts.
fn saved_header_len(tag: u8) -> usize {
    match tag {
        EXCLUSIVE => 1,
        SEMAPHORE => COUNTED + 4,
        _ => COUNTED,
    }
}

fn owner_len_len(owner_len: usize) -> usize {
    if owner_len < usize::from(LONG) {
        1
    } else {
        5
    }
}

/// The bytes an entry with an owner of this length takes.
fn entry_len(owner_len: usize) -> usize {
    FIXED + owner_len_len(owner_len) + owner_len
}

#[inline]
fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(buf.get(at..at + 4)?.try_into().ok()?))
}

#[inline]
fn u64_at(buf: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(buf.get(at..at + 8)?.try_into().ok()?))
}

#[inline]
fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    if let Some(b) = buf.get_mut(at..at + 4) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

#[inline]
fn put_u64(buf: &mut [u8], at: usize, v: u64) {
    if let Some(b) = buf.get_mut(at..at + 8) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

/// The entry at `at` and where the next one starts.
#[inline]
fn entry_at(buf: &[u8], at: usize) -> Option<(HolderRef<'_>, usize)> {
    // The fixed part and the owner's length's first byte checked at once.
    let fixed: &[u8; FIXED + 1] = buf.get(at..at + FIXED + 1)?.try_into().ok()?;
    let token = u64_at(fixed, 0)?;
    let deadline = u64_at(fixed, 8)?;
    let holds = u32_at(fixed, 16)?;
    let since = u32_at(fixed, 20)?;
    let first = *fixed.get(FIXED)?;
    let (len, start) = if first < LONG {
        (usize::from(first), at + FIXED + 1)
    } else {
        (
            usize::try_from(u32_at(buf, at + FIXED + 1)?).ok()?,
            at + FIXED + 5,
        )
    };
    let owner = buf.get(start..start + len)?;
    let holder = HolderRef {
        owner,
        holds,
        since,
        token,
        deadline,
    };
    Some((holder, start + len))
}

/// What a walk over a block's holders finds: the extremes of their
/// numbers and whether an owner is empty. Enough to check every holder's
/// own rules, to know the highest token and to index the lock, without
/// walking it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Survey {
    pub empty_owner: bool,
    pub fewest_holds: u32,
    pub most_holds: u32,
    pub lowest_token: u64,
    pub highest_token: u64,
    /// Of the holders' own deadlines (those following a session aside).
    pub earliest_deadline: u64,
    pub latest_deadline: u64,
    /// The highest session id a holder follows (0: none does).
    pub highest_session: u64,
}

impl Survey {
    /// The survey of no holder: every extreme at its neutral end.
    pub const EMPTY: Survey = Survey {
        empty_owner: false,
        fewest_holds: u32::MAX,
        most_holds: 0,
        lowest_token: u64::MAX,
        highest_token: 0,
        earliest_deadline: u64::MAX,
        latest_deadline: 0,
        highest_session: 0,
    };

    #[inline]
    fn add(&mut self, h: &HolderRef<'_>) {
        self.empty_owner |= h.owner.is_empty();
        self.fewest_holds = self.fewest_holds.min(h.holds);
        self.most_holds = self.most_holds.max(h.holds);
        self.lowest_token = self.lowest_token.min(h.token);
        self.highest_token = self.highest_token.max(h.token);
        match h.session() {
            Some(id) => self.highest_session = self.highest_session.max(id),
            None => {
                self.earliest_deadline = self.earliest_deadline.min(h.deadline);
                self.latest_deadline = self.latest_deadline.max(h.deadline);
            }
        }
    }
}

/// The latest deadline and how many have it, `acc` and one more deadline
/// `d` taken together.
#[inline]
fn at_latest(acc: Option<(u64, u32)>, d: u64) -> Option<(u64, u32)> {
    match acc {
        Some((latest, n)) if d < latest => Some((latest, n)),
        Some((latest, n)) if d == latest => Some((latest, n.saturating_add(1))),
        _ => Some((d, 1)),
    }
}

/// The bit of a holder's deadline that says it follows a session: the
/// rest of the deadline is the session's id (a number drawn like a token,
/// at most [`crate::tokens::MAX_TOKEN`]). Real deadlines (unix ms, bounded
/// by `lock.max-ttl`) never reach it. A session holder's lease is its
/// session's: the core is told the sessions' deadlines (the lock's `end_sessions`,
/// [`HolderRef::deadline_with`]); it reads no table and no clock.
pub const SESSION_BIT: u64 = 1 << 63;

/// The deadline a holder following session `id` stores.
pub const fn session_deadline(id: u64) -> u64 {
    SESSION_BIT | id
}

/// The session a stored deadline names, if it names one.
pub const fn session_of(deadline: u64) -> Option<u64> {
    if deadline & SESSION_BIT != 0 {
        Some(deadline & !SESSION_BIT)
    } else {
        None
    }
}

/// A holder's own deadline for the bound on the earliest (`u64::MAX` for
/// one following a session: it never expires by its own deadline).
#[inline]
pub(crate) fn own(d: u64) -> u64 {
    match session_of(d) {
        Some(_) => u64::MAX,
        None => d,
    }
}

/// A hash of an owner's bytes, keyed at random ([`Keyed`]): owners are
/// chosen by clients.
fn owner_hash(owner: &[u8]) -> u32 {
    (std::hash::BuildHasher::hash_one(&Keyed::default(), owner) >> 32) as u32
}

/// The hasher of [`Index`]'s table: its keys are keyed hashes already,
/// spread over 64 bits (the shard is chosen from the high ones).
#[derive(Debug, Default, Clone, Copy)]
struct Spread;

impl std::hash::BuildHasher for Spread {
    type Hasher = SpreadHasher;
    fn build_hasher(&self) -> SpreadHasher {
        SpreadHasher(0)
    }
}

struct SpreadHasher(u64);

impl std::hash::Hasher for SpreadHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
        self.0 = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_u32(&mut self, x: u32) {
        self.0 = u64::from(x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A large block's holders by owner and by deadline (see the file's
/// comment): kept by every change to the block, never saved (a load
/// builds it on its walk). Each owner's entry offset under the owner's
/// hash, exact whatever collides (an owner whose hash another listed
/// owner has is in `collided`, compared byte for byte); the table grows a
/// shard at a time ([`Sharded`]). The deadlines, each with how many
/// holders have it, in order: the earliest and the latest without a walk.
#[derive(Debug, Default)]
pub(crate) struct Index {
    owners: Sharded<u32, u32, Spread>,
    collided: Vec<(u32, u32)>,
    deadlines: BTreeMap<u64, u32>,
    /// Bytes of tombstones in the block, and of a sweep's gap.
    dead: usize,
    /// A sweep under way ([`Block::sweep_marks`]).
    sweep: Option<Sweep>,
    /// How long each holder will have held at its deadline, summed up.
    held: Held,
    /// A purge under way ([`Block::purge_some`]): where its walk goes on
    /// (an entry's offset, or the block's end). No sweep moves an entry
    /// while it is under way.
    purging: Option<usize>,
    /// `(at, n)`: `n` holders have a deadline at or before `at` (kept by
    /// every deadline added or dropped; moved to the `now` asked by
    /// [`Index::past`], over the deadlines in between): how many holders
    /// have expired, without a walk of the holders.
    past: std::cell::Cell<(u64, usize)>,
}

/// A sweep of an indexed block's tombstones under way: the live entries
/// before `write` are swept up, the bytes from `write` to `read` are a gap
/// every read skips, the entries from `read` on are still to sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sweep {
    write: usize,
    read: usize,
}

/// Bytes of marks from which a block dropping its index copies its live
/// entries out ([`Block::compact`]) rather than sweeping the marks.
const COMPACT_FROM: usize = 64 * 1024;

/// Entries a removal moves at most while a sweep is under way.
#[cfg(not(test))]
const SWEEP_STEP: usize = 1024;
#[cfg(test)]
const SWEEP_STEP: usize = 2;

/// The bounds of the hold-time statistics' buckets, ms: a holder's hold
/// time is in the first bucket whose bound it does not pass, or in the
/// last, past them all.
pub const HELD_BOUNDS_MS: [u64; 5] = [1, 10, 100, 1_000, 10_000];

/// How long a set of holders will have held at their deadlines
/// ([`HolderRef::held_ms`] of each at its own deadline), summed up: how
/// many, the sum, and how many in each bucket of [`HELD_BOUNDS_MS`] (the
/// last: past them all). What the statistics record when a lock's every
/// lease ran out, without a walk of its holders.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub count: u64,
    pub sum_ms: u64,
    pub buckets: [u64; 6],
}

impl Held {
    /// The bucket of a hold time of `ms`.
    pub fn bucket(ms: u64) -> usize {
        HELD_BOUNDS_MS
            .iter()
            .position(|b| ms <= *b)
            .unwrap_or(HELD_BOUNDS_MS.len())
    }

    fn add(&mut self, since: u32, deadline: u64) {
        self.record(u64::from(held_ms(since, deadline)));
    }

    /// One hold time of `ms` more.
    pub fn record(&mut self, ms: u64) {
        self.count += 1;
        self.sum_ms = self.sum_ms.wrapping_add(ms);
        if let Some(b) = self.buckets.get_mut(Held::bucket(ms)) {
            *b += 1;
        }
    }

    fn take(&mut self, since: u32, deadline: u64) {
        let ms = u64::from(held_ms(since, deadline));
        self.count = self.count.saturating_sub(1);
        self.sum_ms = self.sum_ms.wrapping_sub(ms);
        if let Some(b) = self.buckets.get_mut(Held::bucket(ms)) {
            *b = b.saturating_sub(1);
        }
    }
}

/// How long a holder granted at `since` has held at `end` (unix ms),
/// right for holds under 24 days (`since` wraps at 49): an `end` before
/// `since` is 0, never a wrap ([`HolderRef::held_ms`]).
pub fn held_ms(since: u32, end: u64) -> u32 {
    let held = ((end & u64::from(u32::MAX)) as u32).wrapping_sub(since);
    if held > i32::MAX as u32 {
        0
    } else {
        held
    }
}

impl Index {
    fn find(&self, buf: &[u8], owner: &[u8]) -> Option<usize> {
        let h = owner_hash(owner);
        let first = *self.owners.get(&h)? as usize;
        if owner_at(buf, first) == Some(owner) {
            return Some(first);
        }
        self.collided
            .iter()
            .filter(|(hh, _)| *hh == h)
            .map(|(_, at)| *at as usize)
            .find(|at| owner_at(buf, *at) == Some(owner))
    }

    fn add(&mut self, owner: &[u8], at: usize, since: u32, deadline: u64) {
        self.held.add(since, deadline);
        let h = owner_hash(owner);
        let at = u32::try_from(at).unwrap_or(u32::MAX);
        if self.owners.contains_key(&h) {
            self.collided.push((h, at));
        } else {
            self.owners.insert(h, at);
        }
        self.add_deadline(deadline);
    }

    /// The holder `h` at `at` left.
    fn gone(&mut self, h: &HolderRef<'_>, at: usize) {
        self.moved(h.owner, at, None);
        self.drop_deadline(h.deadline);
        self.held.take(h.since, h.deadline);
    }

    /// The entry of `owner` moved from `from` to `to` (`None`: it left).
    fn moved(&mut self, owner: &[u8], from: usize, to: Option<usize>) {
        let h = owner_hash(owner);
        let (from, to) = (
            u32::try_from(from).unwrap_or(u32::MAX),
            to.map(|t| u32::try_from(t).unwrap_or(u32::MAX)),
        );
        if self.owners.get(&h) == Some(&from) {
            match to {
                Some(to) => {
                    self.owners.insert(h, to);
                }
                None => {
                    self.owners.remove(&h);
                    if let Some(i) = self.collided.iter().position(|(hh, _)| *hh == h) {
                        let (_, at) = self.collided.swap_remove(i);
                        self.owners.insert(h, at);
                    }
                    self.owners.shrink_piece_of(&h);
                }
            }
            return;
        }
        if let Some(i) = self
            .collided
            .iter()
            .position(|(hh, at)| *hh == h && *at == from)
        {
            match to {
                Some(to) => {
                    if let Some(c) = self.collided.get_mut(i) {
                        c.1 = to;
                    }
                }
                None => {
                    self.collided.swap_remove(i);
                }
            }
        }
    }

    fn add_deadline(&mut self, d: u64) {
        *self.deadlines.entry(d).or_insert(0) += 1;
        let (at, n) = self.past.get();
        if d <= at {
            self.past.set((at, n + 1));
        }
    }

    fn drop_deadline(&mut self, d: u64) {
        if let Some(n) = self.deadlines.get_mut(&d) {
            *n -= 1;
            if *n == 0 {
                self.deadlines.remove(&d);
            }
            let (at, past) = self.past.get();
            if d <= at {
                self.past.set((at, past.saturating_sub(1)));
            }
        }
    }

    /// How many holders have a deadline at or before `now` (expired, as
    /// [`HolderRef::is_live`] says; a session's holder never
    /// is): the count kept at the last `now` asked, moved over the
    /// deadlines in order between the two (each distinct deadline passed
    /// once as time goes on: a few a millisecond at most, however many
    /// holders share them), no walk of the holders.
    fn past(&self, now: u64) -> usize {
        use std::ops::Bound::{Excluded, Included};
        let (at, n) = self.past.get();
        let sum = |lo: u64, hi: u64| -> usize {
            self.deadlines
                .range((Excluded(lo), Included(hi)))
                .map(|(_, c)| *c as usize)
                .sum()
        };
        let n = match now.cmp(&at) {
            std::cmp::Ordering::Equal => return n,
            std::cmp::Ordering::Greater => n + sum(at, now),
            std::cmp::Ordering::Less => n.saturating_sub(sum(now, at)),
        };
        self.past.set((now, n));
        n
    }

    /// The earliest of the holders' own deadlines ([`own`]; `u64::MAX`:
    /// none has one).
    fn earliest_own(&self) -> u64 {
        self.deadlines
            .first_key_value()
            .map_or(u64::MAX, |(d, _)| own(*d))
    }

    fn latest(&self) -> Option<(u64, u32)> {
        self.deadlines.last_key_value().map(|(d, n)| (*d, *n))
    }

    /// Bytes of heap it takes, about: its maps' room (an entry and a
    /// control byte each, and the maps themselves: [`Sharded`]'s 48 bytes
    /// a shard), the side list's, and the deadlines' tree (12 bytes an
    /// entry in nodes of 11, about two thirds full).
    fn bytes(&self) -> usize {
        std::mem::size_of::<Index>()
            + self.owners.pieces() * 48
            + self.owners.capacity() * 9
            + self.collided.capacity() * 8
            + self.deadlines.len() * 20
    }
}

/// Gives back a large block's room when it is at most half full (down to
/// half again what it holds, at most 4 MiB at a time): a lock that empties
/// one removal at a time frees its memory as it goes, not all at its last
/// release.
fn give_back(buf: &mut Vec<u8>) {
    let cap = buf.capacity();
    if cap > GIVE_BACK_FROM && buf.len() < cap / 2 {
        buf.shrink_to((buf.len() + buf.len() / 2).max(cap.saturating_sub(GIVE_BACK_STEP)));
    }
}

/// The most a block gives back at once ([`give_back`]).
const GIVE_BACK_STEP: usize = 4 << 20;

/// Blocks larger than this give back room ([`give_back`]).
const GIVE_BACK_FROM: usize = 1 << 16;

/// Where memory a block lets go of is freed when it is large
/// ([`set_free_elsewhere`]); unset, where it is let go of.
static FREE_ELSEWHERE: std::sync::OnceLock<fn(Garbage)> = std::sync::OnceLock::new();

/// Memory from which a block's room or index let go of is freed by the
/// hook of [`set_free_elsewhere`] (tens of megabytes at a million
/// holders: milliseconds to give back to the system).
const FREE_ELSEWHERE_FROM: usize = 1 << 20;

/// Memory a block let go of (its entries' room, its index): freed when
/// dropped, wherever that is.
pub struct Garbage {
    _buf: Vec<u8>,
    _index: IndexBox,
}

impl Garbage {
    /// Bytes it holds, about.
    pub fn bytes(&self) -> usize {
        self._buf.capacity() + self._index.as_deref().map_or(0, Index::bytes)
    }
}

/// Sets where a block's large memory is freed once let go of (a purge's
/// last slice, a block compacted or emptied): `free` is handed each
/// [`Garbage`] of [`FREE_ELSEWHERE_FROM`] bytes or more (the shell drops
/// it on a thread of its own: the event loop does not wait for the
/// system to take the pages back). Set once; later calls change nothing.
pub fn set_free_elsewhere(free: fn(Garbage)) {
    let _ = FREE_ELSEWHERE.set(free);
}

/// `buf` and `index`, let go of: handed to the hook of
/// [`set_free_elsewhere`] when large, else freed here.
#[inline]
fn let_go(buf: Vec<u8>, index: IndexBox) {
    if buf.capacity() < FREE_ELSEWHERE_FROM && index.is_none() {
        return;
    }
    let_go_large(Garbage {
        _buf: buf,
        _index: index,
    });
}

#[cold]
#[inline(never)]
fn let_go_large(garbage: Garbage) {
    match FREE_ELSEWHERE.get() {
        Some(free) if garbage.bytes() >= FREE_ELSEWHERE_FROM => free(garbage),
        _ => drop(garbage),
    }
}

/// The owner of the entry at `at`.
fn owner_at(buf: &[u8], at: usize) -> Option<&[u8]> {
    entry_at(buf, at).map(|(h, _)| h.owner)
}

/// The holders of one lock, packed (see the file's comment), and a large
/// one's [`Index`].
#[derive(Default)]
pub struct Block {
    buf: Vec<u8>,
    index: IndexBox,
}

/// A block's [`Index`], owned: its address (0: none). An
/// `Option<Box<Index>>` whose drop is one inlined check on the paths of
/// every lock (the index freed out of line), and which is no bigger.
#[derive(Default)]
struct IndexBox(usize);

impl IndexBox {
    fn new(index: Index) -> IndexBox {
        IndexBox(Box::into_raw(Box::new(index)) as usize)
    }

    #[inline]
    fn is_some(&self) -> bool {
        self.0 != 0
    }

    #[inline]
    fn is_none(&self) -> bool {
        self.0 == 0
    }

    #[inline]
    fn as_deref(&self) -> Option<&Index> {
        // SAFETY: a non-zero address is a live index this box owns.
        (self.0 != 0).then(|| unsafe { &*(self.0 as *const Index) })
    }

    #[inline]
    fn as_deref_mut(&mut self) -> Option<&mut Index> {
        // SAFETY: as in `as_deref`, borrowed mutably with the box.
        (self.0 != 0).then(|| unsafe { &mut *(self.0 as *mut Index) })
    }

    /// The index's address, given away (0: none); the box is empty after.
    fn give_away(&mut self) -> usize {
        std::mem::take(&mut self.0)
    }

    /// The index at `address` (0: none), taken over.
    ///
    /// # Safety
    ///
    /// `address` is 0 or came from [`IndexBox::give_away`] and is
    /// owned by no other box.
    unsafe fn from_address(address: usize) -> IndexBox {
        IndexBox(address)
    }

    #[cold]
    fn free(&mut self) {
        // SAFETY: a non-zero address is an index this box owns, from
        // `Box::into_raw`; it is zeroed so it is freed once.
        drop(unsafe { Box::from_raw(std::mem::take(&mut self.0) as *mut Index) });
    }
}

impl Drop for IndexBox {
    #[inline]
    fn drop(&mut self) {
        if self.0 != 0 {
            self.free();
        }
    }
}

impl Block {
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The kind of block (`EXCLUSIVE`, `SHARED`, `SEMAPHORE`); `None` when empty.
    pub fn tag(&self) -> Option<u8> {
        self.buf.first().copied()
    }

    /// A semaphore's limit; 0 for the other blocks.
    pub fn limit(&self) -> u32 {
        match self.tag() {
            Some(SEMAPHORE) => u32_at(&self.buf, LIMIT_AT).unwrap_or(0),
            _ => 0,
        }
    }

    pub fn count(&self) -> usize {
        match self.tag() {
            None => 0,
            Some(EXCLUSIVE) => 1,
            Some(_) => u32_at(&self.buf, 1).map_or(0, |n| n as usize),
        }
    }

    fn set_count(&mut self, n: usize) {
        if self.tag().is_some_and(|t| t != EXCLUSIVE) {
            put_u32(&mut self.buf, 1, u32::try_from(n).unwrap_or(u32::MAX));
        }
    }

    /// The deadline of a block's only holder (an exclusive block's, or a
    /// shared or semaphore block's with one holder), read in place; `None`
    /// for the other blocks.
    pub fn sole_deadline(&self) -> Option<u64> {
        let tag = self.tag()?;
        if self.count() != 1 {
            return None;
        }
        u64_at(&self.buf, header_len(tag) + 8)
    }

    /// The holders in grant order, each with its entry's offset.
    #[inline]
    pub fn entries(&self) -> Entries<'_> {
        let at = self.tag().map_or(0, header_len);
        let gap = match self.index.as_deref().and_then(|i| i.sweep) {
            Some(sw) => (sw.write, sw.read),
            None => (usize::MAX, usize::MAX),
        };
        Entries {
            buf: &self.buf,
            at,
            left: self.count(),
            gap,
        }
    }

    /// The first holder in grant order (a lock of one holder's only one):
    /// an unindexed block's first entry read in place, which is live (only
    /// an indexed block has tombstones or a gap); an indexed block's by
    /// [`Block::entries`].
    #[inline]
    pub fn first_holder(&self) -> Option<HolderRef<'_>> {
        if self.index.is_some() {
            return self.first_indexed();
        }
        let tag = self.tag()?;
        entry_at(&self.buf, header_len(tag)).map(|(h, _)| h)
    }

    /// [`Block::first_holder`] of an indexed block (out of line).
    #[cold]
    #[inline(never)]
    fn first_indexed(&self) -> Option<HolderRef<'_>> {
        self.entries().next().map(|(_, h)| h)
    }

    /// Bytes of heap this block holds.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Changes the numbers of the entry at `at` (the owner stays).
    pub fn set(&mut self, at: usize, holds: u32, since: u32, token: u64, deadline: u64) {
        let Some(old) = u64_at(&self.buf, at + 8) else {
            return;
        };
        if self.index.is_some() {
            self.set_indexed(at, since, old, deadline);
        }
        if old != deadline && self.tag() != Some(EXCLUSIVE) {
            // (In before out: a holder at the latest that moves later
            // stays known.)
            self.kept_in(deadline);
            self.kept_out(old);
            match self.count() {
                // The only holder: the bound is its deadline, exactly.
                1 => self.set_low(own(deadline)),
                _ => self.lower(deadline),
            }
        }
        put_u64(&mut self.buf, at, token);
        put_u64(&mut self.buf, at + 8, deadline);
        put_u32(&mut self.buf, at + 16, holds);
        put_u32(&mut self.buf, at + 20, since);
    }

    /// [`Block::set`]'s change to the index (out of the unindexed path).
    #[cold]
    fn set_indexed(&mut self, at: usize, since: u32, old: u64, deadline: u64) {
        let old_since = u32_at(&self.buf, at + 20).unwrap_or(since);
        if let Some(index) = self.index.as_deref_mut() {
            index.drop_deadline(old);
            index.add_deadline(deadline);
            index.held.take(old_since, old);
            index.held.add(since, deadline);
        }
    }

    /// Appends a holder. The first one sets the block's kind (`tag`, and a
    /// semaphore's `limit`); later ones must come to a shared or semaphore
    /// block (an exclusive block holds exactly one).
    /// The entry's offset comes back.
    pub fn push(&mut self, tag: u8, limit: u32, h: HolderRef<'_>) -> Result<usize, TooLarge> {
        if self.buf.is_empty() {
            return self.push_first(tag, limit, h);
        }
        let need = self
            .buf
            .len()
            .checked_add(entry_len(h.owner.len()))
            .filter(|n| u32::try_from(*n).is_ok())
            .ok_or(TooLarge)?;
        if need > self.buf.capacity() {
            // Half as much again: a lock granted to many holders one by one
            // is copied a bounded number of times per holder (linear in
            // all, not quadratic), and carries at most a third spare.
            let cap = self.buf.capacity();
            let grown = need.max(cap.saturating_add(cap / 2)).min(u32::MAX as usize);
            self.buf.reserve_exact(grown - self.buf.len());
        }
        let at = self.put_entry(h);
        if self.buf.first() == Some(&EXCLUSIVE) {
            // (An exclusive block holds one: nothing is kept of it.)
            return Ok(at);
        }
        let n = self.count() + 1;
        self.set_count(n);
        match n {
            1 => {
                self.set_kept(h.deadline, 1);
                self.set_low(own(h.deadline));
            }
            _ => {
                self.kept_in(h.deadline);
                self.lower(h.deadline);
            }
        }
        match self.index.as_deref_mut() {
            Some(index) => index.add(h.owner, at, h.since, h.deadline),
            None if n >= INDEX_FROM => self.build_index(),
            None => {}
        }
        Ok(at)
    }

    /// [`Block::push`] to an empty block, exactly what it needs (most
    /// locks have one holder): the header in one copy, its count, kept
    /// latest and bound those of its one holder (no index: it has one
    /// holder), then the entry.
    fn push_first(&mut self, tag: u8, limit: u32, h: HolderRef<'_>) -> Result<usize, TooLarge> {
        let header = header_len(tag);
        let need = header
            .checked_add(entry_len(h.owner.len()))
            .filter(|n| u32::try_from(*n).is_ok())
            .ok_or(TooLarge)?;
        self.buf = Vec::with_capacity(need);
        if tag == EXCLUSIVE {
            self.buf.push(tag);
        } else {
            let mut head = [0u8; COUNTED + 4 + KEPT];
            if let Some(t) = head.first_mut() {
                *t = tag;
            }
            put_u32(&mut head, 1, 1);
            if tag == SEMAPHORE {
                put_u32(&mut head, LIMIT_AT, limit);
            }
            let kept = saved_header_len(tag);
            put_u64(&mut head, kept, h.deadline);
            put_u32(&mut head, kept + 8, 1);
            put_u64(&mut head, kept + LOW_AT, own(h.deadline));
            self.buf
                .extend_from_slice(head.get(..header).unwrap_or(&[]));
        }
        Ok(self.put_entry(h))
    }

    /// Appends `h`'s entry (room made for it, its length checked by the
    /// caller); its offset comes back. The fixed part and the owner's
    /// length in one copy, then the owner.
    #[inline]
    fn put_entry(&mut self, h: HolderRef<'_>) -> usize {
        let owner_len = h.owner.len();
        let mut fixed = [0u8; FIXED + 5];
        put_u64(&mut fixed, 0, h.token);
        put_u64(&mut fixed, 8, h.deadline);
        put_u32(&mut fixed, 16, h.holds);
        put_u32(&mut fixed, 20, h.since);
        let fixed_len = match u8::try_from(owner_len) {
            Ok(n) if n < LONG => {
                if let Some(slot) = fixed.get_mut(FIXED) {
                    *slot = n;
                }
                FIXED + 1
            }
            _ => {
                if let Some(slot) = fixed.get_mut(FIXED) {
                    *slot = LONG;
                }
                // (The block's length fits a u32: the owner's does.)
                put_u32(
                    &mut fixed,
                    FIXED + 1,
                    u32::try_from(owner_len).unwrap_or(u32::MAX),
                );
                FIXED + 5
            }
        };
        let at = self.buf.len();
        self.buf
            .extend_from_slice(fixed.get(..fixed_len).unwrap_or(&[]));
        self.buf.extend_from_slice(h.owner);
        at
    }

    /// Indexes the block's holders (it has [`INDEX_FROM`] of them: a walk
    /// of that many, once).
    #[cold]
    fn build_index(&mut self) {
        let mut index = Index::default();
        // Counted from just before the earliest deadline (none past it):
        // the first count walks only the deadlines that passed since.
        if let Some(first) = self.entries().map(|(_, h)| h.deadline).min() {
            index.past.set((first.saturating_sub(1), 0));
        }
        for (at, h) in self.entries() {
            index.add(h.owner, at, h.since, h.deadline);
        }
        self.index = IndexBox::new(index);
    }

    /// Whether the block has an [`Index`].
    pub fn is_indexed(&self) -> bool {
        self.index.is_some()
    }

    /// The entry offset of `owner`'s holder through the index: `None` when
    /// the block has none (then a walk finds it), `Some(None)` when the
    /// owner has no holder here.
    pub fn find(&self, owner: &[u8]) -> Option<Option<usize>> {
        let index = self.index.as_deref()?;
        Some(index.find(&self.buf, owner))
    }

    /// The entry offset of `owner`'s holder by a walk of an unindexed
    /// block (which has no tombstone and no gap): each entry's owner
    /// length and last byte compared first, the rest of the entry not read.
    pub fn scan(&self, owner: &[u8]) -> Option<(usize, HolderRef<'_>)> {
        let tag = self.tag()?;
        if tag == EXCLUSIVE {
            // Its one entry, read whole.
            let (h, _) = entry_at(&self.buf, 1)?;
            return (h.owner.len() == owner.len()
                && h.owner.last() == owner.last()
                && h.owner == owner)
                .then_some((1, h));
        }
        let mut at = header_len(tag);
        for _ in 0..self.count() {
            let first = *self.buf.get(at + FIXED)?;
            let (len, start) = if first < LONG {
                (usize::from(first), at + FIXED + 1)
            } else {
                (
                    usize::try_from(u32_at(&self.buf, at + FIXED + 1)?).ok()?,
                    at + FIXED + 5,
                )
            };
            if len == owner.len() {
                let o = self.buf.get(start..start + len)?;
                if o.last() == owner.last() && o == owner {
                    return Some((at, entry_at(&self.buf, at)?.0));
                }
            }
            at = start + len;
        }
        None
    }

    /// How long each holder will have held at its own deadline, summed
    /// up, when the block keeps it (an indexed block: no walk); `None`:
    /// walk the holders.
    pub fn held(&self) -> Option<Held> {
        self.index.as_deref().map(|i| i.held)
    }

    /// The earliest and the latest deadline of the holders (`None`: no
    /// holder), when the block keeps them in order (an indexed block);
    /// `None`: walk the holders.
    pub fn extremes(&self) -> Option<Option<(u64, u64)>> {
        let d = &self.index.as_deref()?.deadlines;
        Some(
            d.first_key_value()
                .zip(d.last_key_value())
                .map(|((lo, _), (hi, _))| (*lo, *hi)),
        )
    }

    /// Bytes of heap the index takes, about (0 without one).
    pub fn index_bytes(&self) -> usize {
        self.index.as_deref().map_or(0, Index::bytes)
    }

    /// The kept latest deadline and how many holders have it (`None` for
    /// an exclusive or empty block).
    fn kept(&self) -> Option<(u64, u32)> {
        let at = saved_header_len(self.tag().filter(|t| *t != EXCLUSIVE)?);
        Some((u64_at(&self.buf, at)?, u32_at(&self.buf, at + 8)?))
    }

    fn set_kept(&mut self, latest: u64, n: u32) {
        if let Some(tag) = self.tag().filter(|t| *t != EXCLUSIVE) {
            let at = saved_header_len(tag);
            put_u64(&mut self.buf, at, latest);
            put_u32(&mut self.buf, at + 8, n);
        }
    }

    /// The bound on the earliest of the holders' own deadlines: at most
    /// that earliest, `u64::MAX` only when no holder has a deadline of its
    /// own (none expires by itself). O(1): an exclusive block's holder read
    /// in place, the others' kept `low`.
    pub fn low(&self) -> u64 {
        match self.tag() {
            None => u64::MAX,
            Some(EXCLUSIVE) => self.sole_deadline().map_or(u64::MAX, own),
            Some(tag) => u64_at(&self.buf, saved_header_len(tag) + LOW_AT).unwrap_or(0),
        }
    }

    /// Sets the bound on the earliest to `low`, the exact earliest of the
    /// holders' own deadlines a walk found ([`own`] of each).
    pub(crate) fn set_low(&mut self, low: u64) {
        if let Some(tag) = self.tag().filter(|t| *t != EXCLUSIVE) {
            put_u64(&mut self.buf, saved_header_len(tag) + LOW_AT, low);
        }
    }

    /// A holder with deadline `d` came (or a holder's deadline became `d`):
    /// the bound goes down to it.
    fn lower(&mut self, d: u64) {
        let d = own(d);
        if d < self.low() {
            self.set_low(d);
        }
    }

    /// The earliest of the holders' own deadlines by a walk (`u64::MAX`:
    /// none), kept as the bound: it is exact until the next change.
    pub fn exact_low(&mut self) -> u64 {
        let low = match self.index.as_deref() {
            Some(index) => index.earliest_own(),
            None => self
                .entries()
                .map(|(_, h)| own(h.deadline))
                .min()
                .unwrap_or(u64::MAX),
        };
        self.set_low(low);
        low
    }

    /// The kept latest deadline when it is known without a walk (an
    /// exclusive block's, or a kept one with holders at it).
    pub fn latest_known(&self) -> Option<u64> {
        if let Some(d) = self.sole_deadline() {
            return Some(d);
        }
        match self.kept() {
            None => self.sole_deadline(),
            Some((latest, n)) if n > 0 => Some(latest),
            Some(_) => None,
        }
    }

    /// A holder with deadline `d` came (or a holder's deadline became `d`).
    fn kept_in(&mut self, d: u64) {
        match self.kept() {
            Some((latest, n)) if n > 0 && d > latest => self.set_kept(d, 1),
            Some((latest, n)) if n > 0 && d == latest => self.set_kept(latest, n.saturating_add(1)),
            _ => {}
        }
    }

    /// A holder with deadline `d` left (or its deadline is no longer `d`):
    /// when it was the last at the latest, the latest is not known until
    /// it is asked for ([`Block::keep_latest`]).
    fn kept_out(&mut self, d: u64) {
        if let Some((latest, n)) = self.kept() {
            if n > 0 && d == latest {
                self.set_kept(latest, n - 1);
            }
        }
    }

    /// The latest deadline of the holders and how many have it, by a walk.
    fn walk_latest(&self) -> Option<(u64, u32)> {
        if let Some(index) = self.index.as_deref() {
            return index.latest();
        }
        self.entries()
            .fold(None, |acc, (_, h)| at_latest(acc, h.deadline))
    }

    /// The latest deadline of any holder (`None` when empty): an exclusive
    /// block's one, else the kept one; a walk only when the last holder at
    /// the latest left since it was last kept.
    pub fn latest(&self) -> Option<u64> {
        let latest = match self.kept() {
            None => self.sole_deadline(),
            Some((latest, n)) if n > 0 => Some(latest),
            Some(_) => self.walk_latest().map(|(latest, _)| latest),
        };
        #[cfg(debug_assertions)]
        {
            let walked = self.walk_latest().map(|(latest, _)| latest);
            debug_assert_eq!(latest, walked, "the kept latest deadline is the walked one");
        }
        latest
    }

    /// [`Block::latest`], kept when it took a walk (the next ask is O(1)).
    pub fn keep_latest(&mut self) -> Option<u64> {
        match self.kept() {
            Some((_, 0)) => {
                let (latest, n) = self.walk_latest()?;
                self.set_kept(latest, n - 1);
                Some(latest)
            }
            _ => self.latest(),
        }
    }

    /// The holder whose entry starts at `at` (an offset [`Block::entries`]
    /// or [`Block::push`] gave), if the block has one there.
    pub fn holder_at(&self, at: usize) -> Option<HolderRef<'_>> {
        if let Some(sw) = self.index.as_deref().and_then(|i| i.sweep) {
            if (sw.write..sw.read).contains(&at) {
                return None;
            }
        }
        entry_at(&self.buf, at)
            .map(|(h, _)| h)
            .filter(|h| h.holds != 0)
    }

    /// Removes the entry at `at` (the others keep their order). An
    /// indexed block marks it (no entry moves: constant time), or cuts it
    /// off when it is the last; its marks are swept out when they
    /// outweigh the live entries ([`Block::sweep_marks`]).
    pub fn remove(&mut self, at: usize) {
        let Some((h, end)) = entry_at(&self.buf, at) else {
            return;
        };
        if h.holds == 0 {
            return;
        }
        let deadline = h.deadline;
        let n = self.count().saturating_sub(1);
        if n == 0 {
            self.clear();
            return;
        }
        match self.index.as_deref_mut() {
            Some(index) => {
                index.gone(&h, at);
                if end == self.buf.len() {
                    self.buf.truncate(at);
                    // Cut back to a sweep's gap: the sweep is over.
                    if let Some(sw) = index.sweep.filter(|sw| sw.read == at) {
                        index.dead = index.dead.saturating_sub(at - sw.write);
                        self.buf.truncate(sw.write);
                        index.sweep = None;
                    }
                    // A purge's walk past the new end goes on from it.
                    if let Some(p) = index.purging.as_mut() {
                        *p = (*p).min(self.buf.len());
                    }
                } else {
                    index.dead += end - at;
                    put_u32(&mut self.buf, at + 16, 0);
                }
            }
            None => {
                self.buf.drain(at..end);
            }
        }
        self.set_count(n);
        self.kept_out(deadline);
        self.sweep_marks();
    }

    /// Sweeps an indexed block's tombstones out, a slice at a time: a
    /// sweep starts when they take more bytes than its live entries, and
    /// each removal after it moves [`SWEEP_STEP`] entries up over the
    /// swept space (a gap that reads skip: [`Sweep`]), each moved one's
    /// offset set anew in the index; the sweep ends when its gap reaches
    /// the block's end (cut off). A sweep starts after removals of at least
    /// as many bytes as it moves, and no removal moves more than a slice:
    /// constant time a removal. A block falling below [`INDEX_UNTIL`]
    /// holders finishes its sweep at once (a few hundred entries and the
    /// marks left) and drops its index.
    fn sweep_marks(&mut self) {
        let Some(tag) = self.tag() else {
            return;
        };
        let small = self.count() < INDEX_UNTIL;
        let header = header_len(tag);
        if small && self.index.as_deref().is_some_and(|i| i.dead > COMPACT_FROM) {
            return self.compact(header);
        }
        let Block { buf, index } = self;
        let Some(ix) = index.as_deref_mut() else {
            return;
        };
        // A purge under way walks the entries where they are (a block
        // dropping its index sweeps: the rest of its purge goes in one go).
        if ix.purging.is_some() && !small {
            return;
        }
        // (A block dropping its index sweeps until no mark is left: those
        // made behind a sweep under way take a second one.)
        for _ in 0..if small { 2 } else { 1 } {
            let len = buf.len();
            if ix.sweep.is_none()
                && ix.dead > 0
                && (small || 2 * ix.dead > len.saturating_sub(header))
            {
                ix.sweep = Some(Sweep {
                    write: header,
                    read: header,
                });
            }
            let Some(mut sw) = ix.sweep else {
                continue;
            };
            let mut left = if small { usize::MAX } else { SWEEP_STEP };
            while left > 0 && sw.read < buf.len() {
                let Some((h, end)) = entry_at(buf, sw.read) else {
                    break;
                };
                if h.holds != 0 {
                    if sw.write != sw.read {
                        ix.moved(h.owner, sw.read, Some(sw.write));
                        buf.copy_within(sw.read..end, sw.write);
                    }
                    sw.write += end - sw.read;
                }
                sw.read = end;
                left -= 1;
            }
            ix.sweep = Some(sw);
            if sw.read >= buf.len() {
                ix.dead = ix.dead.saturating_sub(buf.len() - sw.write);
                buf.truncate(sw.write);
                ix.sweep = None;
                give_back(buf);
            }
        }
        if small {
            let_go(Vec::new(), std::mem::take(index));
        }
    }

    /// A block falling below [`INDEX_UNTIL`] holders with many marks (a
    /// purge of many expired holders leaves them all): its few live
    /// entries copied, in order, to a block of their own, found through
    /// the index (no walk over the marks), and the index dropped.
    #[cold]
    fn compact(&mut self, header: usize) {
        let Some(ix) = self.index.as_deref() else {
            return;
        };
        let mut live: Vec<usize> = ix
            .owners
            .values()
            .chain(ix.collided.iter().map(|(_, at)| at))
            .map(|at| *at as usize)
            .collect();
        live.sort_unstable();
        let mut buf = Vec::with_capacity(header + live.len() * entry_len(16));
        buf.extend_from_slice(self.buf.get(..header).unwrap_or_default());
        for at in live {
            if let Some((h, end)) = entry_at(&self.buf, at) {
                if h.holds != 0 {
                    buf.extend_from_slice(self.buf.get(at..end).unwrap_or_default());
                }
            }
        }
        let_go(
            std::mem::replace(&mut self.buf, buf),
            std::mem::take(&mut self.index),
        );
    }

    /// Where the entry after the one ending at `end` starts: past a
    /// sweep's gap when it starts there.
    fn after(&self, end: usize) -> usize {
        match self.index.as_deref().and_then(|i| i.sweep) {
            Some(sw) if sw.write == end => sw.read,
            _ => end,
        }
    }

    /// Every entry, tombstones included, with where it ends (a sweep's gap
    /// skipped).
    fn slots(&self) -> impl Iterator<Item = (usize, HolderRef<'_>, usize)> + '_ {
        let first = self.tag().map_or(0, |t| self.after(header_len(t)));
        let mut at = Some(first);
        std::iter::from_fn(move || {
            let (h, end) = entry_at(&self.buf, at?)?;
            let this = at?;
            at = Some(self.after(end));
            Some((this, h, end))
        })
    }

    /// Keeps the holders `keep` says yes to, in order.
    pub fn retain(&mut self, mut keep: impl FnMut(&HolderRef<'_>) -> bool) {
        let Some(tag) = self.tag() else {
            return;
        };
        let mut read = header_len(tag);
        let mut write = read;
        let mut kept = 0;
        // The kept latest and the earliest found anew on the way (this
        // walks them all).
        let mut latest: Option<(u64, u32)> = None;
        let mut low = u64::MAX;
        if self.index.is_some() {
            return self.retain_indexed(keep);
        }
        for _ in 0..self.count() {
            let Some((h, end)) = entry_at(&self.buf, read) else {
                break;
            };
            if keep(&h) {
                latest = at_latest(latest, h.deadline);
                low = low.min(own(h.deadline));
                if write != read {
                    self.buf.copy_within(read..end, write);
                }
                write += end - read;
                kept += 1;
            }
            read = end;
        }
        if kept == 0 {
            self.clear();
            return;
        }
        self.buf.truncate(write);
        self.set_count(kept);
        if let Some((l, n)) = latest {
            self.set_kept(l, n);
        }
        self.set_low(low);
    }

    /// [`Block::retain`] of an indexed block: the holders not kept marked
    /// and taken out of the index (nothing moves), then the marks swept
    /// out if they outweigh the rest.
    fn retain_indexed(&mut self, mut keep: impl FnMut(&HolderRef<'_>) -> bool) {
        let gone: Vec<usize> = self
            .entries()
            .filter(|(_, h)| !keep(h))
            .map(|(at, _)| at)
            .collect();
        self.mark_gone(&gone);
    }

    /// Drops the holders `ends` says yes to (asked once of each, in
    /// order), a slice at a time on an indexed block: from where the last
    /// slice stopped, at most `most` of them and looking at `look` entries
    /// at most (tombstones included), each marked as [`Block::remove`]
    /// marks one; no sweep moves an entry until the walk reaches the end.
    /// Whether the walk goes on (it stopped before the end: the next call
    /// takes it from there). A block without an index drops them all at
    /// once ([`Block::retain`]).
    pub fn purge_some(
        &mut self,
        most: usize,
        look: usize,
        mut ends: impl FnMut(&HolderRef<'_>) -> bool,
    ) -> bool {
        let Some(tag) = self.tag() else {
            return false;
        };
        let Some(from) = self.index.as_deref().map(|i| i.purging) else {
            self.retain(|h| !ends(h));
            return false;
        };
        let mut at = from.unwrap_or_else(|| self.after(header_len(tag)));
        let mut gone = Vec::new();
        let mut looked = 0;
        while gone.len() < most && looked < look {
            let Some((h, end)) = entry_at(&self.buf, at) else {
                break;
            };
            if h.holds != 0 && ends(&h) {
                gone.push(at);
            }
            looked += 1;
            at = self.after(end);
        }
        let more = at < self.buf.len();
        if let Some(index) = self.index.as_deref_mut() {
            index.purging = more.then_some(at);
        }
        self.mark_gone(&gone);
        more && self.is_indexed()
    }

    /// How many holders have expired at `now` (their own deadline at or
    /// before it), when the block keeps its deadlines in order (an
    /// indexed block: no walk of the holders); `None`: walk them.
    pub fn expired_count(&self, now: u64) -> Option<usize> {
        self.index.as_deref().map(|i| i.past(now))
    }

    /// A purge under way ([`Block::purge_some`]) ends where it is: nothing
    /// it was to drop is left.
    pub fn purge_over(&mut self) {
        if self
            .index
            .as_deref_mut()
            .and_then(|i| i.purging.take())
            .is_some()
        {
            self.sweep_marks();
        }
    }

    /// The holders at `gone` marked (tombstones) and taken out of the
    /// index; the kept latest and the bound on the earliest set from the
    /// index; the marks swept out if they outweigh the rest.
    fn mark_gone(&mut self, gone: &[usize]) {
        let mut kept = self.count();
        for &at in gone {
            let Some((h, end)) = entry_at(&self.buf, at) else {
                continue;
            };
            if let Some(index) = self.index.as_deref_mut() {
                index.gone(&h, at);
                index.dead += end - at;
            }
            put_u32(&mut self.buf, at + 16, 0);
            kept -= 1;
        }
        if kept == 0 {
            self.clear();
            return;
        }
        self.set_count(kept);
        if let Some((l, n)) = self.index.as_deref().and_then(Index::latest) {
            self.set_kept(l, n);
        }
        let low = self.index.as_deref().map_or(u64::MAX, Index::earliest_own);
        self.set_low(low);
        self.sweep_marks();
    }

    /// No holder left: the memory goes too (a large block's where
    /// [`set_free_elsewhere`] says).
    pub fn clear(&mut self) {
        let_go(
            std::mem::take(&mut self.buf),
            std::mem::take(&mut self.index),
        );
    }

    /// The address Redis stores as the key's value (the block now belongs
    /// to it); null when there is no holder. Take it back with
    /// [`Block::from_raw`].
    #[inline]
    pub fn into_raw(self) -> *mut u8 {
        if self.is_empty() {
            return std::ptr::null_mut();
        }
        // Nothing of it is dropped: the block and its index are Redis's.
        let mut this = ManuallyDrop::new(self);
        match this.tag() {
            Some(EXCLUSIVE) => this.buf.shrink_to_fit(),
            Some(tag) => {
                let (len, cap) = (this.buf.len(), this.buf.capacity());
                put_u32(&mut this.buf, 5, u32::try_from(len).unwrap_or(u32::MAX));
                put_u32(&mut this.buf, 9, u32::try_from(cap).unwrap_or(u32::MAX));
                // The index goes with the block: its address in `kept`
                // (of a block long enough to have one, [`INDEXED_LEN`]).
                debug_assert!(len >= INDEXED_LEN || !this.index.is_some());
                if len >= INDEXED_LEN {
                    let index = this.index.give_away();
                    put_u64(
                        &mut this.buf,
                        saved_header_len(tag) + INDEX_AT,
                        index as u64,
                    );
                }
            }
            None => {}
        }
        this.buf.as_mut_ptr()
    }

    /// The block's bytes in memory (`kept` included).
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The block as RDB encoding 3 saves it: its bytes without `kept`
    /// (an exclusive block's as they are; the others copied).
    pub fn saved(&self) -> std::borrow::Cow<'_, [u8]> {
        let Some(tag) = self.tag().filter(|t| *t != EXCLUSIVE) else {
            return std::borrow::Cow::Borrowed(&self.buf);
        };
        let at = saved_header_len(tag);
        let mut saved = Vec::with_capacity(self.buf.len().saturating_sub(KEPT));
        saved.extend_from_slice(self.buf.get(..at).unwrap_or(&[]));
        match self.index.as_deref() {
            // Tombstones are not saved: the live entries, in order.
            Some(index) if index.dead > 0 => {
                for (at, h, end) in self.slots() {
                    if h.holds != 0 {
                        saved.extend_from_slice(self.buf.get(at..end).unwrap_or(&[]));
                    }
                }
            }
            _ => saved.extend_from_slice(self.buf.get(at + KEPT..).unwrap_or(&[])),
        }
        std::borrow::Cow::Owned(saved)
    }

    /// A block saved by [`Block::as_bytes`], checked to be whole: its kind
    /// known, every entry complete, exactly `count` of them filling it, one
    /// for an exclusive block. `since` is set for every holder; the rest of
    /// what a lock must be is [`crate::Lock::from_saved`]'s to check, from
    /// the [`Survey`] this walk takes on the way (a load walks a block once).
    pub fn from_saved(mut buf: Vec<u8>, since: u32) -> Option<(Block, Survey)> {
        let tag = *buf.first()?;
        if Mode::from_tag(tag).is_none() || buf.len() < saved_header_len(tag) {
            return None;
        }
        if tag != EXCLUSIVE {
            // `kept` back in place (not saved), found on the walk below.
            let at = saved_header_len(tag);
            buf.splice(at..at, [0; KEPT]);
        }
        let mut block = Block {
            buf,
            index: IndexBox::default(),
        };
        let count = block.count();
        // One walk: each entry complete (its `since` set as it is passed:
        // a block refused later is dropped whole), exactly `count` of them
        // filling the block.
        let mut survey = Survey::EMPTY;
        let mut latest: Option<(u64, u32)> = None;
        let mut at = header_len(tag);
        for _ in 0..count {
            let (h, next) = entry_at(&block.buf, at)?;
            survey.add(&h);
            latest = at_latest(latest, h.deadline);
            put_u32(&mut block.buf, at + 20, since);
            at = next;
        }
        if at != block.buf.len() || count == 0 {
            return None;
        }
        if let Some((l, n)) = latest {
            block.set_kept(l, n);
        }
        block.set_low(survey.earliest_deadline);
        if count >= INDEX_FROM && tag != EXCLUSIVE {
            block.build_index();
        }
        Some((block, survey))
    }

    /// The holder count a saved block's header gives (see
    /// [`Block::from_saved`], which checks it against the entries).
    pub fn saved_count(buf: &[u8]) -> Option<usize> {
        match *buf.first()? {
            EXCLUSIVE => Some(1),
            SHARED | SEMAPHORE => u32_at(buf, 1).map(|n| n as usize),
            _ => None,
        }
    }

    /// The [`Survey`] of this block's holders, by a walk of its own.
    pub fn survey(&self) -> Survey {
        let mut survey = Survey::EMPTY;
        for (_, h) in self.entries() {
            survey.add(&h);
        }
        survey
    }

    /// The block at `ptr`, back from [`Block::into_raw`]; empty for null.
    ///
    /// # Safety
    ///
    /// `ptr` is null, or came from [`Block::into_raw`] and was not taken
    /// back since (or was moved whole by a defragmenter to a block of the
    /// same size class); the block is then this `Block`'s until it goes back
    /// through `into_raw`.
    #[inline]
    pub unsafe fn from_raw(ptr: *mut u8) -> Block {
        if ptr.is_null() {
            return Block::default();
        }
        // SAFETY: a live block from `into_raw`: its header and, for an
        // exclusive block, its whole single entry are there to read.
        let (len, cap) = unsafe {
            if *ptr == EXCLUSIVE {
                let first = *ptr.add(1 + FIXED);
                let len = if first < LONG {
                    1 + FIXED + 1 + usize::from(first)
                } else {
                    let n = std::ptr::read_unaligned(ptr.add(2 + FIXED).cast::<[u8; 4]>());
                    1 + FIXED + 5 + u32::from_le_bytes(n) as usize
                };
                (len, len)
            } else {
                let len = std::ptr::read_unaligned(ptr.add(5).cast::<[u8; 4]>());
                let cap = std::ptr::read_unaligned(ptr.add(9).cast::<[u8; 4]>());
                (
                    u32::from_le_bytes(len) as usize,
                    u32::from_le_bytes(cap) as usize,
                )
            }
        };
        // SAFETY: the allocation `into_raw` gave away, with the length and
        // capacity it had then.
        let buf = unsafe { Vec::from_raw_parts(ptr, len, cap) };
        // (Only a block long enough to have an index has its word written.)
        let index = match buf.first() {
            Some(&tag) if tag != EXCLUSIVE && len >= INDEXED_LEN => {
                u64_at(&buf, saved_header_len(tag) + INDEX_AT).unwrap_or(0) as usize
            }
            _ => 0,
        };
        // SAFETY: a non-zero address there is the index `into_raw` gave
        // away with this block (a block is only ever written by this file).
        let index = unsafe { IndexBox::from_address(index) };
        Block { buf, index }
    }
}

#[cfg(test)]
impl Block {
    /// Whether an indexed block's index says what a walk of its entries
    /// says: each holder found at its entry by its owner, as many indexed
    /// as there are holders, the deadlines each with its walked count, the
    /// tombstones' bytes; an unindexed block has no tombstone.
    pub(crate) fn index_agrees(&self) -> bool {
        let Some(tag) = self.tag() else {
            return self.index.is_none();
        };
        let mut dead = 0;
        let mut last = header_len(tag);
        for (at, h, end) in self.slots() {
            if h.holds == 0 {
                dead += end - at;
            }
            last = end;
        }
        let Some(index) = self.index.as_deref() else {
            return dead == 0 && last == self.buf.len();
        };
        if let Some(sw) = index.sweep {
            dead += sw.read - sw.write;
            if !(header_len(tag) <= sw.write && sw.write <= sw.read && sw.read < self.buf.len()) {
                return false;
            }
        }
        if last != self.buf.len() {
            return false;
        }
        let mut deadlines = BTreeMap::new();
        let mut held = Held::default();
        for (_, h) in self.entries() {
            *deadlines.entry(h.deadline).or_insert(0u32) += 1;
            held.add(h.since, h.deadline);
        }
        index.dead == dead
            && index.held == held
            && index.owners.len() + index.collided.len() == self.count()
            && index.deadlines == deadlines
            && self
                .entries()
                .all(|(at, h)| index.find(&self.buf, h.owner) == Some(at))
    }
}

/// Holders in order, with their offsets (see [`Block::entries`]).
#[derive(Clone)]
pub struct Entries<'a> {
    buf: &'a [u8],
    at: usize,
    left: usize,
    /// A sweep's gap, skipped (`usize::MAX` twice: none).
    gap: (usize, usize),
}

impl<'a> Iterator for Entries<'a> {
    type Item = (usize, HolderRef<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        loop {
            if self.at == self.gap.0 {
                self.at = self.gap.1;
            }
            let at = self.at;
            let Some((h, next)) = entry_at(self.buf, at) else {
                self.left = 0;
                return None;
            };
            self.at = next;
            // A tombstone (an indexed block's removed entry) is no holder.
            if h.holds != 0 {
                self.left -= 1;
                return Some((at, h));
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(owner: &[u8], token: u64) -> HolderRef<'_> {
        HolderRef {
            owner,
            holds: 1,
            since: 7,
            token,
            deadline: 1000 + token,
        }
    }

    #[test]
    fn an_exclusive_lock_with_a_uuid_owner_fits_64_bytes() {
        let mut b = Block::default();
        let uuid = b"6ba7b810-9dad-11d1-80b4-00c04fd430c8";
        b.push(EXCLUSIVE, 0, h(uuid, 1)).unwrap();
        assert_eq!(b.capacity(), 62);
        let ptr = b.into_raw();
        let b = unsafe { Block::from_raw(ptr) };
        assert_eq!(b.capacity(), 62);
        assert_eq!(
            b.entries().map(|(_, h)| h).collect::<Vec<_>>(),
            [h(uuid, 1)]
        );
    }

    #[test]
    fn shared_blocks_round_trip_and_keep_order() {
        let mut b = Block::default();
        let long = vec![b'x'; 300];
        for (i, o) in [&b"a"[..], &long, b"c"].iter().enumerate() {
            b.push(SHARED, 0, h(o, i as u64 + 1)).unwrap();
        }
        let b = unsafe { Block::from_raw(b.into_raw()) };
        let owners: Vec<&[u8]> = b.entries().map(|(_, h)| h.owner).collect();
        assert_eq!(owners, [&b"a"[..], &long, b"c"]);
        let mut b = b;
        let second = b.entries().nth(1).unwrap().0;
        b.remove(second);
        let tokens: Vec<u64> = b.entries().map(|(_, h)| h.token).collect();
        assert_eq!((tokens, b.count()), (vec![1, 3], 2));
        b.retain(|h| h.token == 3);
        assert_eq!(b.count(), 1);
        b.retain(|_| false);
        assert!(b.is_empty() && b.into_raw().is_null());
    }

    #[test]
    fn semaphores_keep_their_limit_and_long_owners_their_bytes() {
        let mut b = Block::default();
        let long = vec![7u8; 70_000];
        b.push(SEMAPHORE, 9, h(&long, 5)).unwrap();
        b.push(SEMAPHORE, 9, h(b"", 6)).unwrap();
        let mut b = unsafe { Block::from_raw(b.into_raw()) };
        assert_eq!((b.limit(), b.count()), (9, 2));
        let first = b.entries().next().unwrap();
        assert_eq!(first.1.owner.len(), 70_000);
        b.set(first.0, 3, 4, 5, 6);
        let first = b.entries().next().unwrap().1;
        assert_eq!(
            (first.holds, first.since, first.token, first.deadline),
            (3, 4, 5, 6)
        );
        let long_exclusive = vec![1u8; 1000];
        let mut e = Block::default();
        e.push(EXCLUSIVE, 0, h(&long_exclusive, 1)).unwrap();
        let e = unsafe { Block::from_raw(e.into_raw()) };
        assert_eq!(e.entries().next().unwrap().1.owner, &long_exclusive[..]);
    }
}
