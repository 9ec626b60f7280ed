//! What a transition sees: the lock (empty when the key does not exist), the
//! token counter, the change list to fill and the time. `store::update` makes
//! one for each transition; `waiting::answer_waiters` grants waiters inside it.

use std::ffi::CStr;

use lock_core::{Changes, Lock, Tokens};

pub struct Txn<'a> {
    pub lock: &'a mut Lock,
    pub tokens: &'a mut Tokens,
    pub changes: &'a mut Changes,
    pub now: u64,
    /// Keyspace events to fire once the key is written back.
    pub events: Vec<&'static CStr>,
}
