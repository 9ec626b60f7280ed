//! What a transition sees: the lock (empty when the key does not exist), the
//! token counter, the change list to fill and the time. `transitions::update` makes
//! one for each transition; `waiting::answer_waiters` grants waiters inside it.

use std::ffi::CStr;

use lock_core::{Changes, Lock, Tokens};

pub struct Txn<'a> {
    pub lock: &'a mut Lock,
    pub tokens: &'a mut Tokens,
    pub changes: &'a mut Changes,
    pub now: u64,
    /// Keyspace events to fire once the key is written back.
    pub events: Events,
}

/// Keyspace events in the order they are fired: most transitions fire one
/// (kept inline, no allocation), waiters granted together one each.
#[derive(Default)]
pub struct Events {
    first: Option<&'static CStr>,
    more: Vec<&'static CStr>,
}

impl Events {
    pub fn push(&mut self, event: &'static CStr) {
        match self.first {
            None => self.first = Some(event),
            Some(_) => self.more.push(event),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &'static CStr> + '_ {
        self.first.into_iter().chain(self.more.iter().copied())
    }
}
