//! Raw access to a lock key, kept small: open, read the lock, store, delete,
//! set the absolute expiry. The `redis-module` wrapper has no absolute expiry
//! and panics on missing API entries; this file returns errors instead.

use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::os::raw::{c_char, c_int, c_longlong, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use redis_module::{raw, Context};

use crate::redis::errors::LockError;
use crate::redis::ffi::{api, call, name_of, Str};
use crate::redis::shared::MainCell;
use lock_core::Lock;

/// The lock data type, as Redis created it (set once at load, from `lib`).
static LOCK_TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(std::ptr::null_mut());

/// Records the lock data type Redis created at load.
pub fn set_type(t: *mut raw::RedisModuleType) {
    LOCK_TYPE.store(t, Ordering::Relaxed);
}

fn lock_type() -> *mut raw::RedisModuleType {
    LOCK_TYPE.load(Ordering::Relaxed)
}

/// An open key, closed on drop. `None` inside: a missing key opened read-only
/// (Redis returns no handle for it).
pub struct LockKey {
    key: Option<NonNull<raw::RedisModuleKey>>,
    /// Its name, as Redis passed it to the command (for [`named`]).
    name: *mut raw::RedisModuleString,
}

impl LockKey {
    pub fn open(ctx: &Context, name: Str<'_>, writable: bool) -> Result<LockKey, LockError> {
        let mode = if writable {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        };
        LockKey::open_raw(ctx, name.raw(), mode, writable)
    }

    fn open_raw(
        ctx: &Context,
        name: *mut raw::RedisModuleString,
        mode: u32,
        writable: bool,
    ) -> Result<LockKey, LockError> {
        let mode = c_int::try_from(mode).map_err(|_| LockError::Internal)?;
        let key = call!(RedisModule_OpenKey(ctx.ctx, name, mode));
        let key = NonNull::new(key.cast::<raw::RedisModuleKey>());
        if key.is_none() && writable {
            return Err(LockError::Internal);
        }
        Ok(LockKey { key, name })
    }

    fn raw(&self) -> *mut raw::RedisModuleKey {
        self.key.map_or(std::ptr::null_mut(), NonNull::as_ptr)
    }

    /// The block of the lock stored here: `None` when the key does not
    /// exist, `WRONGTYPE` when it holds something else.
    fn value(&self) -> Result<Option<*mut u8>, LockError> {
        if self.key.is_none() {
            return Ok(None);
        }
        let key_type = call!(RedisModule_KeyType(self.raw()));
        if key_type == raw::REDISMODULE_KEYTYPE_EMPTY as c_int {
            return Ok(None);
        }
        if key_type != raw::REDISMODULE_KEYTYPE_MODULE as c_int {
            return Err(LockError::WrongType);
        }
        let its = call!(RedisModule_ModuleTypeGetType(self.raw()));
        if its != lock_type() {
            return Err(LockError::WrongType);
        }
        let value = call!(RedisModule_ModuleTypeGetValue(self.raw()));
        Ok(Some(value.cast::<u8>()))
    }

    /// Whether the key does not exist: one `RM_KeyType`. What a key that
    /// exists holds (a lock, or another type: `WRONGTYPE`) is for
    /// [`LockKey::lock`] and [`LockKey::lock_mut`] to say.
    pub fn is_empty(&self) -> bool {
        self.key.is_none()
            || call!(RedisModule_KeyType(self.raw())) == raw::REDISMODULE_KEYTYPE_EMPTY as c_int
    }

    /// The lock stored here, to read; `None` when the key does not exist,
    /// `WRONGTYPE` when it holds something else.
    pub fn lock(&self) -> Result<Option<LockRef<'_>>, LockError> {
        Ok(self.value()?.map(|block| LockRef {
            // SAFETY: a value of our type is a lock's block (`transitions`); it
            // stays the key's (never dropped here) while the key is open.
            lock: ManuallyDrop::new(unsafe { Lock::from_raw(block) }),
            _key: std::marker::PhantomData,
        }))
    }

    /// The lock stored here, to change (the key must be open for writing):
    /// when it is dropped, the key's value follows the lock's block wherever
    /// it moved (null when the lock emptied: delete the key next).
    pub fn lock_mut(&mut self) -> Result<Option<LockMut<'_>>, LockError> {
        Ok(self.value()?.map(|block| LockMut {
            // SAFETY: as in `lock`; the block goes back to the key on drop.
            lock: ManuallyDrop::new(unsafe { Lock::from_raw(block) }),
            stored: block,
            key: self.raw(),
            _key: std::marker::PhantomData,
        }))
    }

    /// Stores a new lock in an empty key; `alone`: no other lock exists
    /// (`stats::lock_keys` is 0: for [`named`]).
    pub fn store(&self, lock: Lock, alone: bool) -> Result<(), LockError> {
        let block = lock.into_raw();
        let status = call!(RedisModule_ModuleTypeSetValue(
            self.raw(),
            lock_type(),
            block.cast::<c_void>()
        ));
        if status == raw::REDISMODULE_OK as c_int {
            // The name the key was opened with lives while it is open.
            named(name_of(self.name), alone);
            Ok(())
        } else {
            // SAFETY: Redis did not take the block; it is still ours to free.
            drop(unsafe { Lock::from_raw(block) });
            Err(LockError::Internal)
        }
    }

    pub fn delete(&self) {
        call!(RedisModule_DeleteKey(self.raw()));
    }

    /// The key expires at `deadline_ms` (unix ms): when its last holder does.
    /// A lock with a holder following a session (whose deadline is its
    /// session's: `lock_core::lock::SESSION_BIT`) never expires by itself:
    /// the session's end visits it.
    pub fn expire_at(&self, deadline_ms: u64) {
        let at = match lock_core::lock::session_of(deadline_ms) {
            Some(_) => c_longlong::from(raw::REDISMODULE_NO_EXPIRE),
            None => c_longlong::try_from(deadline_ms).unwrap_or(c_longlong::MAX),
        };
        call!(RedisModule_SetAbsExpire(self.raw(), at));
    }
}

/// A stored lock, read in place.
pub struct LockRef<'k> {
    lock: ManuallyDrop<Lock>,
    _key: std::marker::PhantomData<&'k LockKey>,
}

impl Deref for LockRef<'_> {
    type Target = Lock;

    fn deref(&self) -> &Lock {
        &self.lock
    }
}

/// A stored lock, changed in place; the key's value is set to where its
/// block is when this is dropped.
pub struct LockMut<'k> {
    lock: ManuallyDrop<Lock>,
    /// The block the key holds now.
    stored: *mut u8,
    key: *mut raw::RedisModuleKey,
    _key: std::marker::PhantomData<&'k mut LockKey>,
}

impl Deref for LockMut<'_> {
    type Target = Lock;

    fn deref(&self) -> &Lock {
        &self.lock
    }
}

impl DerefMut for LockMut<'_> {
    fn deref_mut(&mut self) -> &mut Lock {
        &mut self.lock
    }
}

impl Drop for LockMut<'_> {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the lock is not used after.
        let lock = unsafe { ManuallyDrop::take(&mut self.lock) };
        let block = lock.into_raw();
        if block != self.stored {
            // The old block is gone (grown, shrunk or emptied): the key must
            // not keep its address.
            let mut old = std::ptr::null_mut();
            call!(RedisModule_ModuleTypeReplaceValue(
                self.key,
                lock_type(),
                block.cast::<c_void>(),
                &mut old
            ));
        }
    }
}

/// The names lock values have, as a table of one-byte fingerprints (a
/// cuckoo filter: buckets of eight, each name in one of two buckets that
/// its hash picks, the second found from the first and the fingerprint
/// alone, so an entry can move without its name): what the keyspace
/// callback asks before anything else about another key's write
/// ([`may_be_lock`]). A name of a lock value has an entry (`named`: a
/// store, a load or `RESTORE`, the new name of `RENAME` and `MOVE`); an
/// unlink takes one entry of its bucket pair and fingerprint away
/// (`unnamed`), and entries that agree on both stand for each other, so a
/// name whose pair holds no entry of its fingerprint is no lock's, for
/// certain. An entry with no room anywhere, or an unlink with no entry,
/// makes the table unsure (every name a "maybe") until it is rebuilt.
///
/// The table grows and shrinks with the number of names (a power of two
/// of buckets, from 16,384, 128 KiB, static; a name's share 1 to 2 bytes
/// above that), rebuilt from the lock keys themselves: a scan of every
/// database in slices of half a millisecond a turn of the event loop,
/// names counted meanwhile going into both tables. The same rebuild takes
/// away what values Redis dropped without an unlink left behind (a
/// `FLUSHDB` of one database, a load's discarded database, a `RESTORE`
/// already expired): after a `FLUSHDB` while entries are left, and
/// whenever the table is full; a `FLUSHALL`, or a lock stored while no
/// other exists, empties it at once. About 16 names in 255 times the
/// share of slots in use are "maybe" for nothing: 1 in 60 to 1 in 20
/// once the table has grown, fewer below 57,000 lock names.
struct Table {
    buckets: *mut AtomicU64,
    mask: usize,
}

/// Buckets of the smallest table, [`INITIAL`].
const MIN_BUCKETS: usize = 1 << 14;

/// The table while no more is needed (no allocation).
static INITIAL: [AtomicU64; MIN_BUCKETS] = [const { AtomicU64::new(0) }; MIN_BUCKETS];

/// The table in use: its buckets and their number less one (a power of
/// two less one). Main thread only (stores, loads, unlinks, events, the
/// rebuild's turns): the two change together, between callbacks.
static BUCKETS: AtomicPtr<AtomicU64> = AtomicPtr::new(INITIAL.as_ptr().cast_mut());
static MASK: AtomicUsize = AtomicUsize::new(MIN_BUCKETS - 1);
/// Entries in it (names counted and not yet uncounted).
static ENTRIES: AtomicUsize = AtomicUsize::new(0);
/// Why the keyspace callback must look past its quick answers (an event
/// by its address, a name by its probe), one bit a reason, so that it
/// reads one byte for all of them first: no lock exists ([`NO_LOCKS`]),
/// the filter is unsure ([`UNSURE`]), or the callback's own reasons
/// (`events`: a lock left a name, is being moved, or was deleted). Main
/// thread only (a plain load: its compare is one instruction).
pub static ATTENTION: MainCell<u8> = MainCell::new(NO_LOCKS);
/// [`ATTENTION`]'s bit: the table may miss a name (an entry found no
/// room, an unlink found none): every name may be a lock's until it is
/// rebuilt.
pub const UNSURE: u8 = 1;
/// [`ATTENTION`]'s bit: no lock value exists (the count of lock keys,
/// `stats`, fell to 0 on the main thread; cleared when it leaves 0 there),
/// so that the callback's first compare sends its events to the count.
/// It may be clear while none does (the last ones freed on the thread
/// that frees a flushed database's values), which only sends events
/// through the name's probe, empty then; the callback answers by the
/// count itself, never by this bit.
pub const NO_LOCKS: u8 = 2;

/// Sets or clears `bits` of [`ATTENTION`] (main thread only), and
/// [`QUICK_EVENT`] with it.
pub fn attend(bits: u8, on: bool) {
    let a = ATTENTION.get();
    let a = if on { a | bits } else { a & !bits };
    ATTENTION.set(a);
    QUICK_EVENT.set(match a {
        0 => QUICK_EVENT_LEARNT.get(),
        _ => std::ptr::null(),
    });
}

/// The keyspace event the callback tests for first, by its name's
/// address (`events`: the server's `expire` literal, once seen), while
/// [`ATTENTION`] is 0; null otherwise: one compare says both that nothing
/// needs attention and that the event is this one. Main thread only.
pub static QUICK_EVENT: MainCell<*const c_char> = MainCell::new(std::ptr::null());
/// [`QUICK_EVENT`]'s address, whatever [`ATTENTION`] says.
pub static QUICK_EVENT_LEARNT: MainCell<*const c_char> = MainCell::new(std::ptr::null());

/// Keeps `event` as [`QUICK_EVENT`]'s address (main thread only).
pub fn learn_quick_event(event: *const c_char) {
    QUICK_EVENT_LEARNT.set(event);
    attend(0, false);
}

/// Whether some lock value exists now (`stats`' count left 0, or fell to
/// it on the main thread), for [`NO_LOCKS`].
pub fn locks_exist(some: bool) {
    attend(NO_LOCKS, !some);
}

fn unsure() -> bool {
    ATTENTION.get() & UNSURE != 0
}

/// The table a rebuild fills (null: none under way), as the three above.
static NEXT: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());
static NEXT_MASK: AtomicUsize = AtomicUsize::new(0);
static NEXT_ENTRIES: AtomicUsize = AtomicUsize::new(0);
static NEXT_UNSURE: AtomicBool = AtomicBool::new(false);

/// The keyspace callback's first look ([`probe_no_inside`]), before the table: for each of 65,536
/// slots, how many names counted in the table have that slot
/// ([`probe_slot`], from a name's length and its first and last words, or
/// a short name's bytes),
/// 255 when more (stuck there until the table is emptied or rebuilt). A
/// slot at 0 holds no lock's name: most other names are answered there,
/// in one load, while the lock names are few beside the slots (1 in 22 of
/// them "maybe" with 3,000 lock names, about 1 in 6 with 10,000); the rest
/// go on to the table. It follows the table's events (a name counted, an
/// unlink, a rebuild's scan into [`PROBE_NEXT`], copied over at its end,
/// emptied with it), so a counted name's slot is never 0. Static: 64 KiB,
/// and as much for a rebuild, whatever the number of locks.
static PROBE: Probe = [const { MainCell::new(0) }; PROBE_SLOTS];
/// The probe a rebuild fills, beside [`NEXT`].
static PROBE_NEXT: Probe = [const { MainCell::new(0) }; PROBE_SLOTS];
const PROBE_SLOTS: usize = 1 << 16;
/// A probe's counts (main thread only: plain loads, the callback's
/// compare one instruction).
type Probe = [MainCell<u8>; PROBE_SLOTS];

/// A name's slot in [`PROBE`]: its length, first and last words (a name
/// of up to 7 bytes: its bytes as one big-endian word), one multiply.
/// Names that differ only between those share a slot (the table tells
/// them apart).
#[inline(always)]
fn probe_slot(name: &[u8]) -> usize {
    // SAFETY: the name's own bytes.
    unsafe { probe_slot_at(name.as_ptr(), name.len()) }
}

/// [`probe_slot`] of the `n` bytes at `p`.
///
/// # Safety
///
/// `p` is valid for reads of `n` bytes.
#[inline(always)]
unsafe fn probe_slot_at(p: *const u8, n: usize) -> usize {
    let x = if n >= 8 {
        // SAFETY: `n >= 8`: both words are in the name.
        unsafe { long_probe_word(p, n) }
    } else {
        let mut x = 0u64;
        for i in 0..n {
            // SAFETY: `i < n`.
            x = x << 8 | u64::from(unsafe { *p.add(i) });
        }
        x
    };
    probe_slot_of(x, n)
}

/// The probe's word of the name of `n` bytes at `p`, read in place:
/// `None` for a short name not `inside` its string object (read in one
/// load only when it is: [`short_probe_word_inside`]).
///
/// # Safety
///
/// `p` is valid for reads of `n` bytes, and with `inside` of the 8 bytes
/// before `p + n`.
#[inline(always)]
unsafe fn probe_word_in_place(p: *const u8, n: usize, inside: bool) -> Option<u64> {
    if n < 8 {
        if !inside {
            std::hint::cold_path();
            return None;
        }
        // SAFETY: the 8 bytes before `p + n`, the caller's.
        Some(unsafe { short_probe_word_inside(p, n) })
    } else {
        // SAFETY: `n >= 8`: both words are in the name.
        Some(unsafe { long_probe_word(p, n) })
    }
}

/// The probe's word of a name of `n < 8` bytes at `p` inside its string
/// object, in one load: the word that ends with it, byte-swapped, the
/// bytes before the name masked off (its bytes as one big-endian word, as
/// [`probe_slot`] makes it).
///
/// # Safety
///
/// `p` is valid for reads of `n` bytes, and so are the 8 bytes before
/// `p + n` (the name is in its string object, after at least 8 bytes of
/// it).
#[inline(always)]
unsafe fn short_probe_word_inside(p: *const u8, n: usize) -> u64 {
    /// The low `8 * n` bits, for a name of `n` bytes under 8.
    static LOW_BYTES: [u64; 8] = [
        0,
        0xff,
        0xffff,
        0xff_ffff,
        0xffff_ffff,
        0xff_ffff_ffff,
        0xffff_ffff_ffff,
        0xff_ffff_ffff_ffff,
    ];
    // SAFETY: the caller's; the bytes before the name's are masked off
    // (`n < 8`: in the table).
    let w = unsafe {
        p.wrapping_add(n)
            .wrapping_sub(8)
            .cast::<u64>()
            .read_unaligned()
    };
    u64::from_be(w) & LOW_BYTES.get(n).copied().unwrap_or(0)
}

/// The probe's word of a name of `n >= 8` bytes at `p`: its first and
/// last words.
///
/// # Safety
///
/// `p` is valid for reads of `n >= 8` bytes.
#[inline(always)]
unsafe fn long_probe_word(p: *const u8, n: usize) -> u64 {
    // SAFETY: the caller's.
    unsafe { word_at(p, 0) ^ word_at(p, n - 8).rotate_left(29) }
}

/// A slot from a name's word `x` and its length `n`: one multiply.
#[inline(always)]
fn probe_slot_of(x: u64, n: usize) -> usize {
    ((x ^ n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as usize
}

/// The little-endian word at byte `i` of `p`.
///
/// # Safety
///
/// `p` is valid for reads of `i + 8` bytes.
#[inline(always)]
unsafe fn word_at(p: *const u8, i: usize) -> u64 {
    u64::from_le(unsafe { p.add(i).cast::<u64>().read_unaligned() })
}

/// A name of up to 7 bytes (`n`, at `p`) as one word: of 4 to 7 bytes
/// its two overlapping halves, of 1 to 3 its first, middle and last
/// byte, of none 0 (its length is mixed in beside it).
///
/// # Safety
///
/// `p` is valid for reads of `n` bytes.
#[inline(always)]
unsafe fn short_word(p: *const u8, n: usize) -> u64 {
    // SAFETY: every read is of bytes `0..n`, checked by the branch it is in.
    let half = |i: usize| {
        u64::from(u32::from_le(unsafe {
            p.add(i).cast::<u32>().read_unaligned()
        }))
    };
    let byte = |i: usize| u64::from(unsafe { *p.add(i) });
    if n >= 4 {
        half(0) << 32 | half(n - 4)
    } else if n > 0 {
        byte(0) << 16 | byte(n / 2) << 8 | byte(n - 1)
    } else {
        0
    }
}

/// Counts `name` in `probe` (stuck at 255).
fn probe_add(probe: &Probe, name: &[u8]) {
    if let Some(c) = probe.get(probe_slot(name)) {
        c.set(c.get().saturating_add(1));
    }
}

/// Uncounts `name` from [`PROBE`] (a slot at 255 stays; one at 0 was
/// never counted: the table turns unsure for it).
fn probe_remove(name: &[u8]) {
    if let Some(c) = PROBE.get(probe_slot(name)) {
        let n = c.get();
        if n != 0 && n != u8::MAX {
            c.set(n - 1);
        }
    }
}

/// Whether [`PROBE`] says no lock has `name`: its slot at 0.
#[cfg(test)]
fn probe_no(name: &[u8]) -> bool {
    PROBE.get(probe_slot(name)).is_none_or(|c| c.get() == 0)
}

/// Whether [`PROBE`] says no lock has the name of `n` bytes at `p`, read
/// in place: its slot at 0 (the keyspace callback's first look;
/// [`table_no`] its second). `inside`: the name is in its string object
/// after at least 8 bytes of it (an embedded string's: a short name read
/// in one load, [`probe_word_in_place`]); a short name elsewhere (not a
/// request's: those are embedded) is left to the table (`false`: no call,
/// no loop on the callback's straight line).
///
/// # Safety
///
/// `p` is valid for reads of `n` bytes, and with `inside` of the 8 bytes
/// before `p + n`.
#[inline(always)]
pub unsafe fn probe_no_inside(p: *const u8, n: usize, inside: bool) -> bool {
    // SAFETY: the caller's.
    let Some(x) = (unsafe { probe_word_in_place(p, n, inside) }) else {
        return false;
    };
    PROBE.get(probe_slot_of(x, n)).is_none_or(|c| c.get() == 0)
}

fn probe_clear(probe: &Probe) {
    for c in probe {
        c.set(0);
    }
}

/// A name's hash: its length and its bytes, eight at a time (a name of 17
/// to 32 bytes is four overlapping words, of up to sixteen two, of four to
/// eight two overlapping halves, of up to three its first, middle and last
/// byte), each mixed in by one folded multiply. Names past 32 bytes out of
/// line ([`table_no`] leaves them to the slow path).
#[inline(always)]
fn name_hash(name: &[u8]) -> u64 {
    let n = name.len();
    // SAFETY: every word read is of bytes `0..n`: at `i` with `i + 8 <= n`,
    // checked by the branch it is in.
    let word = |i: usize| unsafe { word_at(name.as_ptr(), i) };
    let seed = SEED ^ n as u64;
    if n > 32 {
        long_hash(name)
    } else if n > 16 {
        // Four overlapping words.
        mix(
            mix(mix(mix(seed, word(0)), word(8)), word(n - 16)),
            word(n - 8),
        )
    } else if n >= 8 {
        mix(mix(seed, word(0)), word(n - 8))
    } else {
        // SAFETY: the name's own bytes.
        mix(seed, unsafe { short_word(name.as_ptr(), n) })
    }
}

const SEED: u64 = 0x6c6f_636b_0000_0000;

/// One word mixed into [`name_hash`]: the module's folded multiply
/// ([`lock_core::hash`]), by a constant rather than [`Keyed`]'s
/// per-process keys. This hash runs on every other client's TTL write: a
/// constant is an immediate operand where a key is a load after a check
/// that the lazy seed is set, and the words are read by length class,
/// without `Keyed`'s loop (a collision here costs a look at the key,
/// never a wrong answer).
///
/// [`Keyed`]: lock_core::hash::Keyed
#[inline(always)]
fn mix(h: u64, w: u64) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    lock_core::hash::folded_multiply(h ^ w, K)
}

/// [`name_hash`] of a name of more than 32 bytes.
#[inline(never)]
fn long_hash(name: &[u8]) -> u64 {
    let n = name.len();
    let mut h = SEED ^ n as u64;
    let mut words = name.chunks_exact(8);
    for w in &mut words {
        h = mix(
            h,
            u64::from_le_bytes(<[u8; 8]>::try_from(w).unwrap_or([0; 8])),
        );
    }
    if !words.remainder().is_empty() {
        let tail = name
            .get(n.saturating_sub(8)..)
            .and_then(|t| <[u8; 8]>::try_from(t).ok());
        h = mix(h, u64::from_le_bytes(tail.unwrap_or([0; 8])));
    }
    h
}

/// Eight copies of a byte.
const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// A hash's fingerprint (never 0: an empty slot) and first bucket.
#[inline(always)]
fn place(h: u64, mask: usize) -> (u8, usize) {
    let fp = (h >> 56) as u8;
    (fp | u8::from(fp == 0), (h as usize) & mask)
}

/// The other bucket of a fingerprint's pair: the first found from the
/// second as the second from the first.
#[inline(always)]
fn other(bucket: usize, fp: u8, mask: usize) -> usize {
    bucket ^ (usize::from(fp).wrapping_mul(0x5bd1_e995) & mask)
}

/// The slots of `w` holding `fp`, as their high bits (the lowest one
/// exact; none when no slot holds it).
#[inline(always)]
fn matches(w: u64, fp: u8) -> u64 {
    let x = w ^ (u64::from(fp) * ONES);
    x.wrapping_sub(ONES) & !x & HIGHS
}

impl Table {
    fn get(&self, i: usize) -> &AtomicU64 {
        // SAFETY: `i <= mask` (every index is masked) and the table has
        // `mask + 1` buckets, alive while it is installed or filled.
        unsafe { &*self.buckets.add(i & self.mask) }
    }

    fn contains(&self, h: u64) -> bool {
        let (fp, a) = place(h, self.mask);
        let b = other(a, fp, self.mask);
        matches(self.get(a).load(Ordering::Relaxed), fp)
            | matches(self.get(b).load(Ordering::Relaxed), fp)
            != 0
    }

    /// Puts `fp` in an empty slot of bucket `i`, if it has one.
    fn put(&self, i: usize, fp: u8) -> bool {
        let w = self.get(i).load(Ordering::Relaxed);
        let empty = matches(w, 0);
        if empty == 0 {
            return false;
        }
        let shift = empty.trailing_zeros() - 7;
        self.get(i)
            .store(w | u64::from(fp) << shift, Ordering::Relaxed);
        true
    }

    /// Adds an entry for hash `h`; false when one entry (maybe another
    /// name's, moved to make room) found none: the table is unsure.
    fn insert(&self, h: u64) -> bool {
        let (mut fp, mut i) = place(h, self.mask);
        if self.put(i, fp) || self.put(other(i, fp, self.mask), fp) {
            return true;
        }
        // Both full: move entries along their pairs to make room.
        for kick in 0..128u32 {
            let slot = ((h >> 8) as u32).wrapping_add(kick) % 8 * 8;
            let w = self.get(i).load(Ordering::Relaxed);
            let out = (w >> slot) as u8;
            self.get(i).store(
                w & !(0xff << slot) | u64::from(fp) << slot,
                Ordering::Relaxed,
            );
            fp = out;
            i = other(i, fp, self.mask);
            if self.put(i, fp) {
                return true;
            }
        }
        false
    }

    /// Takes away one entry agreeing with hash `h`; false when there is
    /// none.
    fn remove(&self, h: u64) -> bool {
        let (fp, a) = place(h, self.mask);
        for i in [a, other(a, fp, self.mask)] {
            let w = self.get(i).load(Ordering::Relaxed);
            let found = matches(w, fp);
            if found != 0 {
                let shift = found.trailing_zeros() - 7;
                self.get(i).store(w & !(0xff << shift), Ordering::Relaxed);
                return true;
            }
        }
        false
    }

    /// A new table of `buckets` (a power of two) empty buckets; `None`
    /// when the heap refuses it.
    fn alloc(buckets: usize) -> Option<Table> {
        let mut v: Vec<AtomicU64> = Vec::new();
        v.try_reserve_exact(buckets).ok()?;
        v.extend((0..buckets).map(|_| AtomicU64::new(0)));
        let slice = Box::into_raw(v.into_boxed_slice());
        Some(Table {
            buckets: slice.cast::<AtomicU64>(),
            mask: buckets - 1,
        })
    }

    /// Frees a table [`Table::alloc`] made (never [`INITIAL`]).
    fn free(buckets: *mut AtomicU64, mask: usize) {
        if buckets.is_null() || std::ptr::eq(buckets, INITIAL.as_ptr()) {
            return;
        }
        let slice = std::ptr::slice_from_raw_parts_mut(buckets, mask + 1);
        // SAFETY: made by `alloc` with this many buckets, installed once,
        // freed once (it is not installed any more).
        drop(unsafe { Box::from_raw(slice) });
    }
}

/// The table in use.
#[inline(always)]
fn live() -> Table {
    Table {
        buckets: BUCKETS.load(Ordering::Relaxed),
        mask: MASK.load(Ordering::Relaxed),
    }
}

/// The buckets a table for `names` names gets: at most half its slots in
/// use, at least [`MIN_BUCKETS`].
fn buckets_for(names: usize) -> usize {
    (names / 4 + 1).next_power_of_two().max(MIN_BUCKETS)
}

/// A lock value now has the name `name` (in some database); `alone`: no
/// other lock value exists (`stats::lock_keys` is 0).
pub fn named(name: &[u8], alone: bool) {
    if alone && (ENTRIES.load(Ordering::Relaxed) != 0 || unsure()) {
        // No lock is left: what stayed counted was left behind.
        clear();
    }
    let h = name_hash(name);
    let t = live();
    let room = t.insert(h);
    if !room {
        attend(UNSURE, true);
    }
    probe_add(&PROBE, name);
    let n = ENTRIES.load(Ordering::Relaxed) + 1;
    ENTRIES.store(n, Ordering::Relaxed);
    let next = NEXT.load(Ordering::Relaxed);
    if !next.is_null() {
        let t = Table {
            buckets: next,
            mask: NEXT_MASK.load(Ordering::Relaxed),
        };
        if !t.insert(h) {
            NEXT_UNSURE.store(true, Ordering::Relaxed);
        }
        probe_add(&PROBE_NEXT, name);
        NEXT_ENTRIES.store(NEXT_ENTRIES.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    } else if !room || n > (t.mask + 1) * 7 {
        // One that found no room, or more than seven entries a bucket.
        rebuild::start(n);
    }
}

/// A lock value whose name could not be read got one: [`may_be_lock`]
/// says yes to every name until the table is rebuilt.
pub fn named_unknown() {
    attend(UNSURE, true);
    ENTRIES.store(ENTRIES.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    if NEXT.load(Ordering::Relaxed).is_null() {
        rebuild::start(ENTRIES.load(Ordering::Relaxed));
    } else {
        NEXT_UNSURE.store(true, Ordering::Relaxed);
    }
}

/// A lock value left the name `name` (the type's unlink). A table being
/// rebuilt keeps the entry (more entries only make "maybe" more frequent).
pub fn unnamed(name: &[u8]) {
    let t = live();
    if !t.remove(name_hash(name)) {
        // Never counted (left out of a full table: unsure already).
        attend(UNSURE, true);
    }
    probe_remove(name);
    let n = ENTRIES.load(Ordering::Relaxed).saturating_sub(1);
    ENTRIES.store(n, Ordering::Relaxed);
    if t.mask >= MIN_BUCKETS
        && n.saturating_mul(2) <= t.mask
        && NEXT.load(Ordering::Relaxed).is_null()
    {
        // Under one entry in sixteen slots: a smaller table will do.
        rebuild::start(n);
    }
}

/// Whether `name` may hold a lock (in some database): no, for certain,
/// when neither bucket of its pair holds its fingerprint. A hash, two
/// loads, no call.
#[inline(always)]
pub fn may_be_lock(name: &[u8]) -> bool {
    live().contains(name_hash(name)) || unsure()
}

/// The keyspace callback's fast path: true when `name` is certainly no
/// lock's, by its slot in [`PROBE`] (any length), else (a name of at most
/// 32 bytes) by the table; false for a name that may be a lock's
/// ([`may_be_lock`] tells), or a longer one the probe does not answer,
/// whatever [`ATTENTION`] says (its caller read it). The callback makes
/// the two looks itself, the second out of line (`events::on_generic`).
#[cfg(test)]
fn quick_no(name: &[u8]) -> bool {
    probe_no(name) || table_no(name)
}

/// The keyspace callback's look past the probe, out of line (the keyspace callback's
/// common path keeps no register of its own).
#[inline(never)]
pub fn table_no(name: &[u8]) -> bool {
    name.len() <= 32 && !live().contains(name_hash(name))
}

/// Empties the table (no lock is left): back to [`INITIAL`], no rebuild.
fn clear() {
    rebuild::cancel();
    let (old, mask) = (
        BUCKETS.load(Ordering::Relaxed),
        MASK.load(Ordering::Relaxed),
    );
    for b in &INITIAL {
        b.store(0, Ordering::Relaxed);
    }
    BUCKETS.store(INITIAL.as_ptr().cast_mut(), Ordering::Relaxed);
    MASK.store(MIN_BUCKETS - 1, Ordering::Relaxed);
    Table::free(old, mask);
    probe_clear(&PROBE);
    ENTRIES.store(0, Ordering::Relaxed);
    attend(UNSURE, false);
}

/// A database was emptied without an unlink of its locks (`all`: every
/// database; `freed`: it held locks, or may have, its values freed
/// later; `left`: the lock keys left, `None` when not known yet): every
/// name goes at once when all did or none is left, nothing changes when
/// the flush freed no lock, else the table is rebuilt from the locks left.
pub fn flushed(all: bool, freed: bool, left: Option<usize>) {
    if all || left == Some(0) {
        clear();
    } else if freed && (ENTRIES.load(Ordering::Relaxed) != 0 || unsure()) {
        rebuild::cancel();
        rebuild::start(left.unwrap_or_else(|| ENTRIES.load(Ordering::Relaxed)));
    }
}

/// Two databases swapped: a scan under way may have passed one of them
/// already, so it starts over.
pub fn swapped() {
    if !NEXT.load(Ordering::Relaxed).is_null() {
        rebuild::cancel();
        rebuild::start(ENTRIES.load(Ordering::Relaxed));
    }
}

/// The filter's bytes beyond the static table (`INFO lock`).
pub fn filter_memory() -> usize {
    let mask = MASK.load(Ordering::Relaxed);
    let next = match NEXT.load(Ordering::Relaxed).is_null() {
        true => 0,
        false => NEXT_MASK.load(Ordering::Relaxed) + 1,
    };
    let live = match std::ptr::eq(BUCKETS.load(Ordering::Relaxed), INITIAL.as_ptr()) {
        true => 0,
        false => mask + 1,
    };
    (live + next) * 8
}

/// Rebuilding the table from the lock keys: a scan of every database, a
/// slice a turn of the event loop, on a context of its own.
mod rebuild {
    use std::cell::Cell;
    use std::os::raw::c_void;
    use std::sync::atomic::{AtomicPtr, Ordering};
    use std::time::{Duration, Instant};

    use redis_module::raw;

    use super::{Table, ENTRIES, NEXT, NEXT_ENTRIES, NEXT_MASK, NEXT_UNSURE};
    use crate::redis::catch;
    use crate::redis::ffi::{api, call, name_of};

    /// The module's context for the scan (detached: its selected database
    /// is the scan's alone).
    static CTX: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());

    /// A turn's share of the scan.
    const SLICE: Duration = Duration::from_micros(500);

    thread_local! {
        /// The scan under way: its cursor and database (main thread only).
        static CURSOR: Cell<*mut raw::RedisModuleScanCursor> =
            const { Cell::new(std::ptr::null_mut()) };
        static DB: Cell<i32> = const { Cell::new(0) };
        /// A turn is planned ([`turn`]).
        static PLANNED: Cell<bool> = const { Cell::new(false) };
    }

    /// At load: the scan's own context.
    pub fn init(ctx: *mut raw::RedisModuleCtx) {
        let own = api!(RedisModule_GetDetachedThreadSafeContext(ctx)).unwrap_or_default();
        CTX.store(own, Ordering::Relaxed);
    }

    /// Starts a rebuild (none is under way): a new table for about `names`
    /// lock names, filled by the scan and with the names counted since.
    pub fn start(names: usize) {
        let ctx = CTX.load(Ordering::Relaxed);
        if ctx.is_null() || !NEXT.load(Ordering::Relaxed).is_null() {
            return;
        }
        let Some(t) = Table::alloc(super::buckets_for(names)) else {
            return;
        };
        let Some(cursor) = api!(RedisModule_ScanCursorCreate()).filter(|c| !c.is_null()) else {
            Table::free(t.buckets, t.mask);
            return;
        };
        NEXT_MASK.store(t.mask, Ordering::Relaxed);
        NEXT_ENTRIES.store(0, Ordering::Relaxed);
        NEXT_UNSURE.store(false, Ordering::Relaxed);
        super::probe_clear(&super::PROBE_NEXT);
        NEXT.store(t.buckets, Ordering::Relaxed);
        CURSOR.with(|c| c.set(cursor));
        DB.with(|d| d.set(0));
        api!(RedisModule_SelectDb(ctx, 0));
        plan(ctx);
    }

    fn plan(ctx: *mut raw::RedisModuleCtx) {
        if PLANNED.with(|p| p.replace(true)) {
            return;
        }
        let done = api!(RedisModule_CreateTimer(
            ctx,
            0,
            Some(turn),
            std::ptr::null_mut()
        ));
        if done.is_none() {
            PLANNED.with(|p| p.set(false));
        }
    }

    /// Drops the rebuild under way, if any.
    pub fn cancel() {
        let next = NEXT.swap(std::ptr::null_mut(), Ordering::Relaxed);
        Table::free(next, NEXT_MASK.load(Ordering::Relaxed));
        let cursor = CURSOR.with(|c| c.replace(std::ptr::null_mut()));
        if !cursor.is_null() {
            api!(RedisModule_ScanCursorDestroy(cursor));
        }
    }

    /// One slice of the scan; at its end, the new table replaces the old.
    extern "C" fn turn(_ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
        catch::callback("the name filter's rebuild", (), || {
            PLANNED.with(|p| p.set(false));
            let ctx = CTX.load(Ordering::Relaxed);
            let cursor = CURSOR.with(Cell::get);
            if cursor.is_null() || NEXT.load(Ordering::Relaxed).is_null() {
                return;
            }
            let started = Instant::now();
            let mut steps = 0u32;
            loop {
                let more = api!(RedisModule_Scan(
                    ctx,
                    cursor,
                    Some(found),
                    std::ptr::null_mut()
                ));
                if more != Some(1) {
                    let db = DB.with(|d| d.get()) + 1;
                    if api!(RedisModule_SelectDb(ctx, db)) != Some(raw::REDISMODULE_OK as i32) {
                        finish();
                        return;
                    }
                    DB.with(|d| d.set(db));
                    api!(RedisModule_ScanCursorRestart(cursor));
                }
                steps += 1;
                if steps.is_multiple_of(16) && started.elapsed() >= SLICE {
                    break;
                }
            }
            plan(ctx);
        })
    }

    /// A key the scan found: a lock's name goes into the new table.
    unsafe extern "C" fn found(
        _ctx: *mut raw::RedisModuleCtx,
        name: *mut raw::RedisModuleString,
        key: *mut raw::RedisModuleKey,
        _data: *mut c_void,
    ) {
        if key.is_null() || name.is_null() {
            return;
        }
        if call!(RedisModule_ModuleTypeGetType(key)) != super::lock_type() {
            return;
        }
        let next = NEXT.load(Ordering::Relaxed);
        if next.is_null() {
            return;
        }
        let t = Table {
            buckets: next,
            mask: NEXT_MASK.load(Ordering::Relaxed),
        };
        let name = name_of(name);
        if !t.insert(super::name_hash(name)) {
            NEXT_UNSURE.store(true, Ordering::Relaxed);
        }
        super::probe_add(&super::PROBE_NEXT, name);
        NEXT_ENTRIES.store(NEXT_ENTRIES.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// The scan passed every database: the new table is the one in use.
    fn finish() {
        let cursor = CURSOR.with(|c| c.replace(std::ptr::null_mut()));
        if !cursor.is_null() {
            api!(RedisModule_ScanCursorDestroy(cursor));
        }
        let mut next = NEXT.swap(std::ptr::null_mut(), Ordering::Relaxed);
        if next.is_null() {
            return;
        }
        let mut next_mask = NEXT_MASK.load(Ordering::Relaxed);
        let initial = super::INITIAL.as_ptr().cast_mut();
        if next_mask + 1 == super::MIN_BUCKETS {
            // The smallest size: back into the static table, no heap.
            let t = Table {
                buckets: next,
                mask: next_mask,
            };
            for (i, b) in super::INITIAL.iter().enumerate() {
                b.store(t.get(i).load(Ordering::Relaxed), Ordering::Relaxed);
            }
            Table::free(next, next_mask);
            next = initial;
            next_mask = super::MIN_BUCKETS - 1;
        }
        for (live, next) in super::PROBE.iter().zip(&super::PROBE_NEXT) {
            live.set(next.get());
        }
        let old = super::BUCKETS.swap(next, Ordering::Relaxed);
        let old_mask = super::MASK.swap(next_mask, Ordering::Relaxed);
        let entries = NEXT_ENTRIES.load(Ordering::Relaxed);
        ENTRIES.store(entries, Ordering::Relaxed);
        let unsure = NEXT_UNSURE.load(Ordering::Relaxed);
        super::attend(super::UNSURE, unsure);
        Table::free(old, old_mask);
        // Names counted meanwhile overfilled it (a load, a burst of
        // grants): again, larger, if the lock keys now ask for more.
        let mask = super::MASK.load(Ordering::Relaxed);
        if (unsure || entries > (mask + 1) * 7) && super::buckets_for(entries) > mask + 1 {
            start(entries);
        }
    }
}

/// At load: the rebuild's own context.
pub fn start(ctx: *mut raw::RedisModuleCtx) {
    rebuild::init(ctx);
}

/// Whether `name` holds a lock, looked up with as few side effects as the
/// server allows (Redis 7.2+: no LRU touch, no hit counted, no lazy expiry;
/// Redis 7.0 ignores the flags it does not know and counts a keyspace hit).
pub fn is_lock(ctx: &Context, name: *mut raw::RedisModuleString) -> bool {
    open_quietly(ctx, name)
        .and_then(|key| key.value().map(|v| v.is_some()))
        .unwrap_or(false)
}

/// `name` opened to read with as few side effects as the server allows.
fn open_quietly(ctx: &Context, name: *mut raw::RedisModuleString) -> Result<LockKey, LockError> {
    let known = api!(RedisModule_GetOpenKeyModesAll()).unwrap_or(0);
    let noeffects = raw::REDISMODULE_OPEN_KEY_NOEFFECTS & u32::try_from(known).unwrap_or(0);
    let mode = raw::REDISMODULE_READ | raw::REDISMODULE_OPEN_KEY_NOTOUCH | noeffects;
    LockKey::open_raw(ctx, name, mode, false)
}

/// The tokens of the holders of the lock at `name` (none when it holds
/// something else or nothing), looked up as [`is_lock`] does.
pub fn tokens(ctx: &Context, name: *mut raw::RedisModuleString) -> Vec<u64> {
    let Ok(key) = open_quietly(ctx, name) else {
        return Vec::new();
    };
    match key.lock() {
        Ok(Some(lock)) => lock.holders().map(|h| h.token).collect(),
        _ => Vec::new(),
    }
}

/// The session each holder of the lock at `name` follows (one entry a
/// holder; none for holders with their own lease), looked up as
/// [`is_lock`] does.
pub fn sessions(ctx: &Context, name: *mut raw::RedisModuleString) -> Vec<u64> {
    let Ok(key) = open_quietly(ctx, name) else {
        return Vec::new();
    };
    match key.lock() {
        Ok(Some(lock)) => lock.holders().filter_map(|h| h.session()).collect(),
        _ => Vec::new(),
    }
}

impl Drop for LockKey {
    fn drop(&mut self) {
        if self.key.is_some() {
            call!(RedisModule_CloseKey(self.raw()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(names: usize) -> Table {
        Table::alloc(buckets_for(names)).expect("a table")
    }

    /// Names of every length class: empty, shorter than a half word,
    /// than a word, between one and two words, longer; binary, with NULs.
    fn odd_names() -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = (0..=40).map(|n| vec![b'x'; n]).collect();
        v.extend((0..=40).map(|n| vec![0u8; n]));
        v.extend((0..=20).map(|n| (0..n as u8).collect()));
        v.push(b"a\0b".to_vec());
        v.push(b"\0\0\0\xff\xfe".to_vec());
        v.push(b"a name longer than sixteen bytes".to_vec());
        v
    }

    #[test]
    fn a_counted_name_is_never_answered_no() {
        let t = table(0);
        let names: Vec<Vec<u8>> = (0..20_000)
            .map(|i| format!("lock:{i}").into_bytes())
            .chain(odd_names())
            .collect();
        for n in &names {
            assert!(t.insert(name_hash(n)));
        }
        assert!(names.iter().all(|n| t.contains(name_hash(n))));
        // Half of them uncounted: the other half still there.
        for n in names.iter().step_by(2) {
            assert!(t.remove(name_hash(n)));
        }
        assert!(names
            .iter()
            .skip(1)
            .step_by(2)
            .all(|n| t.contains(name_hash(n))));
        for n in names.iter().skip(1).step_by(2) {
            assert!(t.remove(name_hash(n)));
        }
        // All gone: nothing is left in any bucket.
        assert!((0..=t.mask).all(|i| t.get(i).load(Ordering::Relaxed) == 0));
        Table::free(t.buckets, t.mask);
    }

    /// Names that agree on bucket and fingerprint stand for each other: one
    /// counted twice (two databases), or two such names, stay until both
    /// are uncounted.
    #[test]
    fn entries_agreeing_on_hash_stand_for_each_other() {
        let t = table(0);
        // Two different names with the same bucket pair and fingerprint.
        let base = name_hash(b"k");
        let (fp, b) = place(base, t.mask);
        let twin = (0u64..)
            .map(|i| format!("twin:{i}").into_bytes())
            .find(|n| {
                let (f, c) = place(name_hash(n), t.mask);
                f == fp && (c == b || c == other(b, fp, t.mask))
            })
            .expect("a twin");
        assert!(t.insert(base) && t.insert(name_hash(&twin)) && t.insert(base));
        assert!(t.remove(base));
        assert!(t.contains(base) && t.contains(name_hash(&twin)));
        assert!(t.remove(name_hash(&twin)));
        assert!(t.contains(base));
        assert!(t.remove(base));
        assert!(!t.contains(base));
        Table::free(t.buckets, t.mask);
    }

    /// A table made full: entries move along their pairs to make room;
    /// when none is left, `insert` says so (the table turns unsure), and
    /// every name inserted before is still found.
    #[test]
    fn a_full_table_says_so_and_loses_nothing_before() {
        let t = Table::alloc(64).expect("a table");
        let mut put = Vec::new();
        for i in 0.. {
            let h = name_hash(format!("n{i}").as_bytes());
            if !t.insert(h) {
                break;
            }
            put.push(h);
        }
        // Cuckoo moves fill most of the 512 slots before the first refusal.
        assert!(
            put.len() > 400,
            "{} entries before the first refusal",
            put.len()
        );
        Table::free(t.buckets, t.mask);
        let t = Table::alloc(64).expect("a table");
        for h in &put {
            assert!(t.insert(*h));
        }
        assert!(put.iter().all(|h| t.contains(*h)));
        Table::free(t.buckets, t.mask);
    }

    /// The share of other names answered "maybe" (a key opened for
    /// nothing) with 1,000 to 1,000,000 lock names, in the table that many
    /// grew (128 KiB up to 114,688 names, then rebuilt at twice, ...):
    /// other names of the same shape as the locks', and of other shapes
    /// and lengths.
    #[test]
    fn few_other_names_are_looked_up_for_nothing_at_every_scale() {
        for locks in [1_000usize, 10_000, 100_000, 1_000_000] {
            // The table as it grew to hold them: rebuilt for the names it
            // held each time more than seven a bucket were in use.
            let mut buckets = MIN_BUCKETS;
            while locks > buckets * 7 {
                buckets = buckets_for(buckets * 7 + 1);
            }
            let t = Table::alloc(buckets).expect("a table");
            for i in 0..locks {
                assert!(t.insert(name_hash(format!("lock:order:{i}").as_bytes())));
            }
            let slots = (t.mask + 1) * 8;
            let others = 100_000;
            let same_shape = (0..others)
                .filter(|i| t.contains(name_hash(format!("lock:order:{}", locks + i).as_bytes())))
                .count();
            let other_shapes = (0..others)
                .filter(|i| {
                    t.contains(name_hash(
                        format!("cache:{i}:{}", "y".repeat(i % 30)).as_bytes(),
                    ))
                })
                .count();
            let rate = |n: usize| n as f64 / others as f64;
            // About 16 slots looked at, 1 in 255 matching by chance each.
            let expect = 16.0 * locks as f64 / slots as f64 / 255.0;
            eprintln!(
                "{locks} locks, {} KiB ({:.2} B a lock): same shape {:.4}, other shapes {:.4}, expected {expect:.4}",
                slots / 1024,
                slots as f64 / locks as f64,
                rate(same_shape),
                rate(other_shapes)
            );
            assert!(
                rate(same_shape) < expect * 1.3 + 0.001,
                "{locks}: {same_shape}"
            );
            assert!(
                rate(other_shapes) < expect * 1.3 + 0.001,
                "{locks}: {other_shapes}"
            );
            // At most seven entries in eight slots: never more than 1 in
            // 15 for nothing.
            assert!(rate(same_shape) < 1.0 / 15.0);
            Table::free(t.buckets, t.mask);
        }
    }

    /// The share of other names the first probe leaves to the table, with
    /// 3,000 and 10,000 lock names counted in it: about the share of its
    /// slots in use (1 - e^(-names/65,536)), for names of the locks' shape
    /// and of others.
    #[test]
    fn the_probe_answers_most_other_names() {
        for locks in [3_000usize, 10_000] {
            let probe: Vec<MainCell<u8>> = (0..PROBE_SLOTS).map(|_| MainCell::new(0)).collect();
            let probe: &Probe = probe.as_slice().try_into().expect("slots");
            for i in 0..locks {
                probe_add(probe, format!("lock:order:{i}").as_bytes());
            }
            let maybe = |name: String| probe[probe_slot(name.as_bytes())].get() != 0;
            let others = 100_000;
            let same = (0..others)
                .filter(|i| maybe(format!("lock:order:{}", locks + i)))
                .count();
            let other = (0..others)
                .filter(|i| maybe(format!("cache:{i}:{}", "y".repeat(i % 30))))
                .count();
            let expect = 1.0 - (-(locks as f64) / PROBE_SLOTS as f64).exp();
            let rate = |n: usize| n as f64 / others as f64;
            eprintln!(
                "{locks} lock names: same shape {:.4}, other shapes {:.4}, expected {expect:.4}",
                rate(same),
                rate(other)
            );
            assert!(rate(same) < expect * 1.3, "{locks}: {same}");
            assert!(rate(other) < expect * 1.3, "{locks}: {other}");
        }
    }

    /// A name read inside its string object (one load that ends with it,
    /// the bytes before it masked off) falls in the slot its bytes alone
    /// give, whatever precedes it, at every length; and short names of
    /// one shape spread over the slots (the probe's word of a name under 8
    /// bytes is its bytes, big-endian: its last bytes reach every bit of
    /// the multiply).
    #[test]
    fn a_name_read_inside_its_object_has_its_own_slot() {
        for n in 0..=40usize {
            let name: Vec<u8> = (0..n).map(|i| b'a' + (i * 7 % 26) as u8).collect();
            for before in [[0u8; 8], [0xff; 8], *b"\x01\x02\x03\x04\x05\x06\x07\x08"] {
                let mut object = before.to_vec();
                object.extend_from_slice(&name);
                // SAFETY: 8 bytes precede the name in `object`.
                let word = unsafe { probe_word_in_place(object.as_ptr().add(8), n, true) };
                let inside = probe_slot_of(word.expect("read inside"), n);
                assert_eq!(inside, probe_slot(&name), "{n} bytes after {before:?}");
            }
        }
        for (shape, count) in [("k:{}", 10_000usize), ("{}", 10_000), ("ab{}", 1_000)] {
            let slots: std::collections::HashSet<usize> = (0..count)
                .map(|i| probe_slot(shape.replace("{}", &i.to_string()).as_bytes()))
                .collect();
            assert!(
                slots.len() > count * 9 / 10,
                "{shape}: {} slots",
                slots.len()
            );
        }
    }

    /// The process's filter, as the module uses it (no server: no rebuild,
    /// the table never grows here). One test: the filter is the process's.
    #[test]
    fn the_process_filter_never_says_no_to_a_counted_name() {
        let names: Vec<Vec<u8>> = (0..2000)
            .map(|i| format!("lock:{i}").into_bytes())
            .chain(odd_names())
            .collect();
        for n in &names {
            named(n, false);
        }
        assert!(names.iter().all(|n| may_be_lock(n)));
        assert!(names.iter().all(|n| !quick_no(n)));
        let others = (0..2000)
            .filter(|i| may_be_lock(format!("cache:{i}:{}", "x".repeat(i % 20)).as_bytes()))
            .count();
        assert!(others < 10, "{others} of 2,000 other names may be locks");
        for n in &names {
            unnamed(n);
        }
        assert!(names.iter().all(|n| !may_be_lock(n)));
        // The probe is back to empty: every name answered there.
        assert!(names.iter().all(|n| probe_no(n)));
        assert!(!unsure());
        // A name counted 300 times (300 databases) is there until the last
        // is uncounted: more copies than its pair has slots make the table
        // unsure.
        for _ in 0..300 {
            named(b"hot", false);
        }
        assert!(unsure());
        // Left behind: cleared by the next name counted alone.
        named(b"fresh", true);
        assert!(!may_be_lock(b"hot") && may_be_lock(b"fresh"));
        assert!(!unsure());
        for _ in 0..16 {
            named(b"hot", false);
        }
        assert!(!unsure());
        for _ in 0..15 {
            unnamed(b"hot");
        }
        assert!(may_be_lock(b"hot"));
        unnamed(b"hot");
        assert!(!may_be_lock(b"hot"));
        unnamed(b"fresh");
        // A name uncounted that was never counted: every name may be one,
        // until the next alone.
        unnamed(b"never");
        assert!(may_be_lock(b"anything"));
        named(b"fresh", true);
        assert!(!may_be_lock(b"anything"));
        unnamed(b"fresh");
        // A flush of every database: nothing left.
        named(b"a", false);
        flushed(true, true, None);
        assert!(!may_be_lock(b"a"));
    }
}
