//! State the module's callbacks share (Redis calls them all on its main
//! thread; the mutex only makes a static well-formed), each with flags that
//! follow it: read without the mutex by the hot paths (is anyone waiting,
//! is any key indexed), set from the state whenever its lock is let go.

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
