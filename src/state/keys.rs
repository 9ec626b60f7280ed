//! Raw access to a lock key, kept small: open, read the lock, store, delete,
//! set the absolute expiry. The `redis-module` wrapper has no absolute expiry
//! and panics on missing API entries; this file returns errors instead.

use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::os::raw::{c_int, c_longlong, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};

use redis_module::{raw, Context};

use crate::redis::errors::LockError;
use crate::redis::ffi::{api, call, Str};
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
            // SAFETY: the name the key was opened with lives while it is open.
            named(unsafe { Str::from_raw(self.name) }.as_slice(), alone);
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

/// The names lock values have, as a counting filter: two of 131,072
/// one-byte counters per name (a hash of the name alone: a lock keeps its
/// name through `SWAPDB` and `MOVE`), each counting the lock values that
/// have a name hashing there. Every way a lock gets a name counts it
/// ([`named`]: a store, a load or `RESTORE`, the new name of `RENAME` and
/// `MOVE`, `events`), every unlink uncounts it ([`unnamed`]), so a name
/// with a zero counter holds no lock, for certain: what the keyspace
/// callback asks before anything else about another key's write
/// ([`may_be_lock`]). Counts left behind by values Redis dropped without
/// unlinking them (a flush, a load's discarded database, a `RESTORE`
/// already expired) only make it answer "maybe" more often, until no lock
/// is left: the next name counted then starts from zeros. A counter at
/// 255 stays there. 128 KiB, static (its pages resident as names touch
/// them): with 1,000 locks, one name in 4,000 that is not one is looked up
/// for nothing; with 10,000, one in 50.
struct NameFilter {
    counts: [AtomicU8; NameFilter::SLOTS],
    /// Counted minus uncounted: counts left behind while not zero with no
    /// lock left.
    sum: AtomicUsize,
    /// A lock got a name this could not read: every name may be one until
    /// no lock is left.
    unsure: AtomicBool,
}

static NAMES: NameFilter = NameFilter {
    counts: [const { AtomicU8::new(0) }; NameFilter::SLOTS],
    sum: AtomicUsize::new(0),
    unsure: AtomicBool::new(false),
};

impl NameFilter {
    const SLOTS: usize = 1 << 17;

    /// The name's two counters: one folded multiply per eight bytes (a
    /// name of up to eight bytes read as two overlapping halves, of up to
    /// three as its first, middle and last byte: no loop over bytes), its
    /// length mixed in.
    #[inline(always)]
    fn slots(name: &[u8]) -> [usize; 2] {
        const K: u64 = 0x9E37_79B9_7F4A_7C15;
        let mix = |h: u64, w: u64| {
            let full = u128::from(h ^ w).wrapping_mul(u128::from(K));
            (full as u64) ^ ((full >> 64) as u64)
        };
        let word = |b: Option<&[u8]>| {
            u64::from_le_bytes(
                b.and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .unwrap_or([0; 8]),
            )
        };
        let half = |b: Option<&[u8]>| {
            u64::from(u32::from_le_bytes(
                b.and_then(|b| <[u8; 4]>::try_from(b).ok())
                    .unwrap_or([0; 4]),
            ))
        };
        let byte = |i: usize| u64::from(name.get(i).copied().unwrap_or(0));
        let n = name.len();
        let seed = 0x6c6f_636b_0000_0000 ^ n as u64;
        let h = match n {
            0 => mix(seed, 0),
            1..=3 => mix(seed, byte(0) << 16 | byte(n / 2) << 8 | byte(n - 1)),
            4..=8 => mix(seed, half(name.get(..4)) << 32 | half(name.get(n - 4..))),
            _ => {
                let mut h = seed;
                let mut words = name.chunks_exact(8);
                for w in &mut words {
                    h = mix(h, word(Some(w)));
                }
                if !words.remainder().is_empty() {
                    h = mix(h, word(name.get(n - 8..)));
                }
                h
            }
        };
        [
            (h >> 47) as usize,
            ((h >> 30) as usize) & (NameFilter::SLOTS - 1),
        ]
    }

    fn counter(&self, slot: usize) -> Option<&AtomicU8> {
        self.counts.get(slot)
    }
}

/// A lock value now has the name `name` (in some database); `alone`: no
/// other lock value exists (`stats::lock_keys` is 0).
pub fn named(name: &[u8], alone: bool) {
    let f = &NAMES;
    if alone && (f.sum.load(Ordering::Relaxed) != 0 || f.unsure.load(Ordering::Relaxed)) {
        // No lock is left: what stayed counted was left behind.
        for c in &f.counts {
            c.store(0, Ordering::Relaxed);
        }
        f.sum.store(0, Ordering::Relaxed);
        f.unsure.store(false, Ordering::Relaxed);
    }
    // Main thread only (stores, loads, unlinks, events): loads and stores.
    for slot in NameFilter::slots(name) {
        if let Some(c) = f.counter(slot) {
            // Saturating: a counter at 255 stays there.
            let n = c.load(Ordering::Relaxed);
            c.store(n.saturating_add(1), Ordering::Relaxed);
        }
    }
    f.sum
        .store(f.sum.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// A lock value whose name could not be read got one: [`may_be_lock`]
/// says yes to every name until no lock is left.
pub fn named_unknown() {
    NAMES.unsure.store(true, Ordering::Relaxed);
    NAMES.sum.fetch_add(1, Ordering::Relaxed);
}

/// A lock value left the name `name` (the type's unlink).
pub fn unnamed(name: &[u8]) {
    let f = &NAMES;
    let mut kept = false;
    for slot in NameFilter::slots(name) {
        if let Some(c) = f.counter(slot) {
            match c.load(Ordering::Relaxed) {
                // Saturated: kept (left behind, for [`named`] to clear).
                u8::MAX => kept = true,
                // Never counted (which cannot be): unsure from now on.
                0 => f.unsure.store(true, Ordering::Relaxed),
                n => c.store(n - 1, Ordering::Relaxed),
            }
        }
    }
    if !kept {
        let sum = f.sum.load(Ordering::Relaxed);
        f.sum.store(sum.saturating_sub(1), Ordering::Relaxed);
    }
}

/// Whether `name` may hold a lock (in some database): no, for certain,
/// when one of its counters is zero. Loads, a hash, no call.
#[inline]
pub fn may_be_lock(name: &[u8]) -> bool {
    let f = &NAMES;
    let [a, b] = NameFilter::slots(name);
    let zero = |slot: usize| {
        f.counter(slot)
            .is_some_and(|c| c.load(Ordering::Relaxed) == 0)
    };
    !(zero(a) || zero(b)) || f.unsure.load(Ordering::Relaxed)
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

    /// One test: the filter is the process's.
    #[test]
    fn the_name_filter_never_says_no_to_a_counted_name() {
        let names: Vec<Vec<u8>> = (0..2000)
            .map(|i| format!("lock:{i}").into_bytes())
            .chain([b"".to_vec(), b"a".to_vec(), b"ab\0".to_vec()])
            .chain([b"a name longer than sixteen bytes".to_vec()])
            .collect();
        for n in &names {
            named(n, false);
        }
        assert!(names.iter().all(|n| may_be_lock(n)));
        // Others, of every length class, mostly not (1 in about 1,000 may
        // share both counters with 2,000 names).
        let others: Vec<Vec<u8>> = (0..2000)
            .map(|i| format!("cache:{i}:{}", "x".repeat(i % 20)).into_bytes())
            .collect();
        let maybe = others.iter().filter(|n| may_be_lock(n)).count();
        assert!(maybe < 20, "{maybe} of 2,000 other names may be locks");
        // Uncounted, they are gone; counted again, back.
        for n in &names {
            unnamed(n);
        }
        assert!(names.iter().all(|n| !may_be_lock(n)));
        assert!(!NAMES.unsure.load(Ordering::Relaxed));
        // A counter at 255 stays there.
        for _ in 0..300 {
            named(b"hot", false);
        }
        for _ in 0..300 {
            unnamed(b"hot");
        }
        assert!(may_be_lock(b"hot"));
        // Left behind: cleared by the next name counted alone.
        named(b"fresh", true);
        assert!(!may_be_lock(b"hot") && may_be_lock(b"fresh"));
        unnamed(b"fresh");
        // A name uncounted that was never counted: every name may be one,
        // until the next alone.
        unnamed(b"never");
        assert!(may_be_lock(b"anything"));
        named(b"fresh", true);
        assert!(!may_be_lock(b"anything"));
        unnamed(b"fresh");
    }
}
