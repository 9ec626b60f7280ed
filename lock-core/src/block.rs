//! A lock's holders packed in one heap block: the value Redis stores for a
//! lock key is the block's address, so a lock costs one allocation and no
//! pointer chasing. An exclusive lock with a UUID owner fits 64 bytes.
//!
//! ```text
//! exclusive:  [0]                                        entry (exactly one)
//! shared:     [1] count:u32 len:u32 cap:u32              kept entry...
//! semaphore:  [2] count:u32 len:u32 cap:u32 limit:u32    kept entry...
//! kept:       latest:u64 at-latest:u32 low:u64
//! entry:      token:u64 deadline:u64 holds:u32 since:u32 owner-length owner
//! owner-length: one byte below 255, else 255 and a u32
//! ```
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

use std::mem::ManuallyDrop;

use crate::mode::Mode;

/// The tags of the modes' blocks, from the mode table.
pub const EXCLUSIVE: u8 = Mode::Exclusive.tag();
pub const SHARED: u8 = Mode::Shared.tag();
pub const SEMAPHORE: u8 = Mode::Semaphore.tag();

/// token, deadline, holds, since.
const FIXED: usize = 24;
/// The header of shared and semaphore blocks (before `limit`).
const COUNTED: usize = 13;
const LIMIT_AT: usize = COUNTED;
/// The kept latest deadline and how many holders have it, and the bound
/// on the earliest (`kept`).
const KEPT: usize = 20;
/// Where `low` is in `kept`.
const LOW_AT: usize = 12;
/// Owner lengths from this one on take a byte and a u32.
const LONG: u8 = 255;

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
fn entry_at(buf: &[u8], at: usize) -> Option<(HolderRef<'_>, usize)> {
    let token = u64_at(buf, at)?;
    let deadline = u64_at(buf, at + 8)?;
    let holds = u32_at(buf, at + 16)?;
    let since = u32_at(buf, at + 20)?;
    let first = *buf.get(at + FIXED)?;
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

/// The holders of one lock, packed (see the file's comment).
#[derive(Default)]
pub struct Block {
    buf: Vec<u8>,
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
    pub fn entries(&self) -> Entries<'_> {
        let at = self.tag().map_or(0, header_len);
        Entries {
            buf: &self.buf,
            at,
            left: self.count(),
        }
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

    /// Appends a holder. The first one sets the block's kind (`tag`, and a
    /// semaphore's `limit`); later ones must come to a shared or semaphore
    /// block (an exclusive block holds exactly one).
    /// The entry's offset comes back.
    pub fn push(&mut self, tag: u8, limit: u32, h: HolderRef<'_>) -> Result<usize, TooLarge> {
        let header = if self.buf.is_empty() {
            header_len(tag)
        } else {
            0
        };
        let need = self
            .buf
            .len()
            .checked_add(header + entry_len(h.owner.len()))
            .filter(|n| u32::try_from(*n).is_ok())
            .ok_or(TooLarge)?;
        if self.buf.is_empty() {
            // Exactly what it needs: most locks have one holder.
            self.buf = Vec::with_capacity(need);
            self.buf.push(tag);
            if tag != EXCLUSIVE {
                self.buf.extend_from_slice(&[0; COUNTED - 1]);
            }
            if tag == SEMAPHORE {
                self.buf.extend_from_slice(&limit.to_le_bytes());
            }
            if tag != EXCLUSIVE {
                self.buf.extend_from_slice(&[0; KEPT]);
            }
        } else if need > self.buf.capacity() {
            // Half as much again: a lock granted to many holders one by one
            // is copied a bounded number of times per holder (linear in
            // all, not quadratic), and carries at most a third spare.
            let cap = self.buf.capacity();
            let grown = need.max(cap.saturating_add(cap / 2)).min(u32::MAX as usize);
            self.buf.reserve_exact(grown - self.buf.len());
        }
        // The fixed part and the owner's length in one copy, then the owner.
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
                put_u32(
                    &mut fixed,
                    FIXED + 1,
                    u32::try_from(owner_len).map_err(|_| TooLarge)?,
                );
                FIXED + 5
            }
        };
        let at = self.buf.len();
        self.buf
            .extend_from_slice(fixed.get(..fixed_len).unwrap_or(&[]));
        self.buf.extend_from_slice(h.owner);
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
        Ok(at)
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
        let low = self
            .entries()
            .map(|(_, h)| own(h.deadline))
            .min()
            .unwrap_or(u64::MAX);
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
        entry_at(&self.buf, at).map(|(h, _)| h)
    }

    /// Removes the entry at `at` (the others keep their order).
    pub fn remove(&mut self, at: usize) {
        let Some((h, end)) = entry_at(&self.buf, at) else {
            return;
        };
        let deadline = h.deadline;
        let n = self.count().saturating_sub(1);
        if n == 0 {
            self.clear();
            return;
        }
        self.buf.drain(at..end);
        self.set_count(n);
        self.kept_out(deadline);
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

    /// No holder left: the memory goes too.
    pub fn clear(&mut self) {
        self.buf = Vec::new();
    }

    /// The address Redis stores as the key's value (the block now belongs
    /// to it); null when there is no holder. Take it back with
    /// [`Block::from_raw`].
    pub fn into_raw(mut self) -> *mut u8 {
        match self.tag() {
            None => return std::ptr::null_mut(),
            Some(EXCLUSIVE) => self.buf.shrink_to_fit(),
            Some(_) => {
                let (len, cap) = (self.buf.len(), self.buf.capacity());
                put_u32(&mut self.buf, 5, u32::try_from(len).unwrap_or(u32::MAX));
                put_u32(&mut self.buf, 9, u32::try_from(cap).unwrap_or(u32::MAX));
            }
        }
        ManuallyDrop::new(self.buf).as_mut_ptr()
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
        saved.extend_from_slice(self.buf.get(at + KEPT..).unwrap_or(&[]));
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
        let mut block = Block { buf };
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
        Block {
            buf: unsafe { Vec::from_raw_parts(ptr, len, cap) },
        }
    }
}

/// Holders in order, with their offsets (see [`Block::entries`]).
#[derive(Clone)]
pub struct Entries<'a> {
    buf: &'a [u8],
    at: usize,
    left: usize,
}

impl<'a> Iterator for Entries<'a> {
    type Item = (usize, HolderRef<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        let at = self.at;
        let Some((h, next)) = entry_at(self.buf, at) else {
            self.left = 0;
            return None;
        };
        self.left -= 1;
        self.at = next;
        Some((at, h))
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
