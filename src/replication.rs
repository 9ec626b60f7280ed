//! Replication and the AOF: every change is sent as its effect, the exact
//! state of each changed holder with its absolute deadline, through the
//! internal command
//!
//! ```text
//! LOCK.SYNC key exclusive|shared:holds:token:deadline-unix-ms owner
//! LOCK.SYNC key semaphore:holds:token:deadline-unix-ms:limit owner
//! LOCK.SYNC key DROP owner
//! ```
//!
//! so a replica or an AOF replay never recomputes anything from its own clock.
//! A holder's numbers travel as one argument (a UUID-owned grant's fits a
//! string Redis keeps in one allocation): each argument of an effect costs
//! the server an object to build and free, on every write. Drops go first: a
//! replica never holds two modes at once, even midway. This file writes
//! effects; `sync` applies them (and still reads the older form, `LOCK.SYNC
//! key SET owner mode holds token deadline [limit]`, of AOF files and
//! masters from before 0.3).

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::Context;

use crate::ffi::{api, Str};
use lock_core::{Changes, HolderRef, Lock};

pub const SYNC_COMMAND: &CStr = c"LOCK.SYNC";

/// Whether this server is a replica: read at load, then set by every role
/// change (`events`), so a command on a master asks the server nothing.
static REPLICA: AtomicBool = AtomicBool::new(false);

pub fn set_replica(replica: bool) {
    REPLICA.store(replica, Ordering::Relaxed);
}

pub fn is_replica() -> bool {
    REPLICA.load(Ordering::Relaxed)
}

/// `LOCK.SYNC key state owner`, as `RedisModule_Replicate` and
/// `RedisModule_EmitAOF` format their arguments.
pub const SET_FORMAT: &CStr = c"sbb";
/// `LOCK.SYNC key DROP owner`.
pub const DROP_FORMAT: &CStr = c"scb";

/// A holder's state argument, `mode:holds:token:deadline[:limit]`, built
/// on the stack.
pub struct State {
    buf: [u8; STATE_MAX],
    len: usize,
}

/// `semaphore`, four numbers of at most 20 digits and their colons.
const STATE_MAX: usize = 9 + 4 * 21;

impl State {
    pub fn of(lock: &Lock, h: &HolderRef<'_>) -> State {
        let mut s = State {
            buf: [0; STATE_MAX],
            len: 0,
        };
        s.push(lock.mode().c_name().to_bytes());
        for n in [u64::from(h.holds), h.token, h.deadline] {
            s.byte(b':');
            s.number(n);
        }
        if let Some(limit) = lock.limit() {
            s.byte(b':');
            s.number(u64::from(limit));
        }
        s
    }

    fn push(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.byte(*b);
        }
    }

    fn byte(&mut self, b: u8) {
        if let Some(slot) = self.buf.get_mut(self.len) {
            *slot = b;
            self.len += 1;
        }
    }

    /// `n` in decimal, written in place: its digits counted first, then
    /// filled right to left two at a time (every effect spells three
    /// numbers).
    fn number(&mut self, n: u64) {
        const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
            2021222324252627282930313233343536373839\
            4041424344454647484950515253545556575859\
            6061626364656667686970717273747576777879\
            8081828384858687888990919293949596979899";
        let len = n.checked_ilog10().unwrap_or(0) as usize + 1;
        let Some(out) = self.buf.get_mut(self.len..self.len + len) else {
            return;
        };
        let mut n = n;
        let mut i = len;
        while i >= 2 {
            let pair = (n % 100) as usize * 2;
            n /= 100;
            i -= 2;
            if let (Some(hi), Some(lo)) = (PAIRS.get(pair), PAIRS.get(pair + 1)) {
                if let Some(d) = out.get_mut(i) {
                    *d = *hi;
                }
                if let Some(d) = out.get_mut(i + 1) {
                    *d = *lo;
                }
            }
        }
        if i == 1 {
            if let Some(d) = out.get_mut(0) {
                *d = b'0' + n as u8;
            }
        }
        self.len += len;
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }
}

/// Sends the effect of one transition to replicas and the AOF, straight
/// through `RedisModule_Replicate` (no argument strings are built here).
pub fn replicate(ctx: &Context, key: Str<'_>, lock: &Lock, changes: &Changes) {
    let c = ctx.ctx;
    for owner in changes.owners() {
        if lock.holder(owner).is_none() {
            api!(RedisModule_Replicate(
                c,
                SYNC_COMMAND.as_ptr(),
                DROP_FORMAT.as_ptr(),
                key.raw(),
                c"DROP".as_ptr(),
                owner.as_ptr(),
                owner.len()
            ));
        }
    }
    for owner in changes.owners() {
        if let Some(holder) = lock.holder(owner) {
            let state = State::of(lock, &holder);
            let state = state.as_bytes();
            api!(RedisModule_Replicate(
                c,
                SYNC_COMMAND.as_ptr(),
                SET_FORMAT.as_ptr(),
                key.raw(),
                state.as_ptr(),
                state.len(),
                owner.as_ptr(),
                owner.len()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::{Holder, Kind, Mode};

    #[test]
    fn states_spell_every_number_and_a_uuid_grant_fits_one_allocation() {
        let holder = |token, holds| Holder {
            owner: b"6ba7b810-9dad-11d1-80b4-00c04fd430c8"[..].into(),
            holds,
            since: 0,
            token,
            deadline: 1_764_051_600_000,
        };
        let lock =
            Lock::from_holders(Mode::Exclusive, vec![holder(1_764_048_000_000_001, 1)]).unwrap();
        let state = State::of(&lock, &lock.holders().next().unwrap());
        assert_eq!(
            state.as_bytes(),
            b"exclusive:1:1764048000000001:1764051600000"
        );
        // Redis keeps strings of up to 44 bytes in one allocation.
        assert!(state.as_bytes().len() <= 44);
        let max =
            Lock::from_holders(Kind::Semaphore(1_000_000), vec![holder(u64::MAX, 1)]).unwrap();
        let h = max.holders().next().unwrap();
        let h = HolderRef {
            holds: u32::MAX,
            deadline: u64::MAX,
            ..h
        };
        let state = State::of(&max, &h);
        for n in [0u64, 7, 10, 99, 100, 101, 12345, 1_000_000_007] {
            let one = Lock::from_holders(Mode::Shared, vec![holder(n.max(1), 1)]).unwrap();
            let hr = HolderRef {
                deadline: n,
                ..one.holders().next().unwrap()
            };
            let text = format!("shared:1:{}:{n}", n.max(1));
            assert_eq!(State::of(&one, &hr).as_bytes(), text.as_bytes());
        }
        assert_eq!(
            state.as_bytes(),
            format!("semaphore:{}:{}:{}:1000000", u32::MAX, u64::MAX, u64::MAX).as_bytes()
        );
    }
}
