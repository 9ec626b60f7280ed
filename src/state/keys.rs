//! Raw access to a lock key, kept small: open, read the lock, store, delete,
//! set the absolute expiry. The `redis-module` wrapper has no absolute expiry
//! and panics on missing API entries; this file returns errors instead.

use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::os::raw::{c_int, c_longlong, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, Ordering};

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
        Ok(LockKey { key })
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

    /// Stores a new lock in an empty key.
    pub fn store(&self, lock: Lock) -> Result<(), LockError> {
        let block = lock.into_raw();
        let status = call!(RedisModule_ModuleTypeSetValue(
            self.raw(),
            lock_type(),
            block.cast::<c_void>()
        ));
        if status == raw::REDISMODULE_OK as c_int {
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
