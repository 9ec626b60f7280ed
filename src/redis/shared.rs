//! State the module's callbacks share (Redis calls them all on its main
//! thread; the mutex only makes a static well-formed), each with flags that
//! follow it: read without the mutex by the hot paths (is anyone waiting,
//! is any key indexed), set from the state whenever its lock is let go.

use std::cell::{Cell, UnsafeCell};
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

/// `state`'s lock, held; `follow` sets its flags from it when let go.
pub struct Locked<T: 'static> {
    guard: MutexGuard<'static, T>,
    follow: fn(&T),
}

/// Locks `state` (a poisoned lock is taken as it is: a panic was caught,
/// the state is whole); `follow` runs when the returned lock is let go.
pub fn lock<T>(state: &'static Mutex<T>, follow: fn(&T)) -> Locked<T> {
    Locked {
        guard: state.lock().unwrap_or_else(|p| p.into_inner()),
        follow,
    }
}

impl<T> Deref for Locked<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for Locked<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T> Drop for Locked<T> {
    fn drop(&mut self) {
        (self.follow)(&self.guard);
    }
}

/// A value read and written on Redis's main thread only (its commands and
/// callbacks; a module thread that holds the server's lock is serialized
/// with it), by plain loads and stores: for the flags a callback reads
/// first on every write of every client, whose compare a plain load folds
/// into one instruction (an atomic load stays a load, then a test).
pub struct MainCell<T: Copy>(UnsafeCell<T>);

// SAFETY: read and written on the main thread only (see the type's
// documentation): never two accesses at once.
unsafe impl<T: Copy> Sync for MainCell<T> {}

impl<T: Copy> MainCell<T> {
    pub const fn new(v: T) -> Self {
        MainCell(UnsafeCell::new(v))
    }

    /// Its value (main thread only).
    #[inline(always)]
    pub fn get(&self) -> T {
        // SAFETY: main thread only: no write at the same time.
        unsafe { *self.0.get() }
    }

    /// Sets it (main thread only).
    #[inline(always)]
    pub fn set(&self, v: T) {
        // SAFETY: main thread only: no other access at the same time.
        unsafe { *self.0.get() = v }
    }
}

thread_local! {
    /// Whether this is Redis's main thread ([`on_main_thread`]).
    static MAIN: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as Redis's main thread (the module's load
/// runs there).
pub fn main_thread_is_this() {
    MAIN.with(|m| m.set(true));
}

/// Whether the caller runs on Redis's main thread (a type's free may run
/// on the thread that frees a flushed database's values).
pub fn on_main_thread() -> bool {
    MAIN.with(Cell::get)
}
