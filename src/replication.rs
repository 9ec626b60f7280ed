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

use redis_module::{raw, Context};

use crate::ffi::{api, call, Str};
use lock_core::{Changes, HolderRef, Lock, Mode};

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

/// Whether no effect can reach anyone: this server is a master with no AOF,
/// no replication backlog and no replica, and no fork is under way. Redis
/// drops its own commands' propagation then (`shouldPropagate`), but
/// `RM_Replicate` builds and frees the effect's arguments first (a command
/// look-up and an object per argument: about 3,000 instructions, a fifth of
/// a `LOCK.ACQUIRE`); while this holds, effects are not built at all.
///
/// It starts false, and only [`check_listeners`] makes it true. Everything
/// that can give effects a listener sets it false before the next command
/// runs: a fork (a full sync's snapshot, an AOF rewrite: Redis creates a
/// backlog for a first replica, or turns the AOF on, in the same call that
/// forks, and whatever ran before the fork is in the snapshot), a role
/// change, a load. A fork's end, the end of a load and the cron look again
/// (`events`).
static QUIET: AtomicBool = AtomicBool::new(false);

/// Effects may have a listener from now on (see [`QUIET`]).
pub fn listeners_may_appear() {
    QUIET.store(false, Ordering::Relaxed);
}

/// Looks whether anything can receive effects now (see [`QUIET`]).
pub fn check_listeners(ctx: &Context) {
    QUIET.store(nobody_listens(ctx), Ordering::Relaxed);
}

fn nobody_listens(ctx: &Context) -> bool {
    let Some(flags) = api!(RedisModule_GetContextFlags(ctx.ctx)) else {
        return false;
    };
    let flags = u32::try_from(flags).unwrap_or(0);
    let master = flags & raw::REDISMODULE_CTX_FLAGS_MASTER != 0;
    let busy = raw::REDISMODULE_CTX_FLAGS_AOF
        | raw::REDISMODULE_CTX_FLAGS_ACTIVE_CHILD
        | raw::REDISMODULE_CTX_FLAGS_LOADING;
    if !master || flags & busy != 0 {
        return false;
    }
    let Some(info) =
        api!(RedisModule_GetServerInfo(ctx.ctx, c"replication".as_ptr())).filter(|i| !i.is_null())
    else {
        return false;
    };
    let field = |name: &CStr| {
        let mut err: std::os::raw::c_int = 0;
        let v = api!(RedisModule_ServerInfoGetFieldSigned(
            info,
            name.as_ptr(),
            &mut err
        ));
        v.filter(|_| err == 0)
    };
    let quiet = field(c"repl_backlog_active") == Some(0) && field(c"connected_slaves") == Some(0);
    api!(RedisModule_FreeServerInfo(ctx.ctx, info));
    quiet
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

/// `semaphore`, four numbers of at most 20 digits and their colons, and
/// room for the last 8-byte store of the last number ([`State::put8`]).
const STATE_MAX: usize = 9 + 4 * 21 + 8;

impl State {
    pub fn of(lock: &Lock, h: &HolderRef<'_>) -> State {
        let mut s = State::empty();
        s.spell(lock, h);
        s
    }

    fn empty() -> State {
        State {
            buf: [0; STATE_MAX],
            len: 0,
        }
    }

    /// Spells `h`'s state in place (an effect's state is built where it is
    /// sent from: no copy of the buffer).
    #[inline(always)]
    fn spell(&mut self, lock: &Lock, h: &HolderRef<'_>) {
        // Nine bytes copied whole (no call for a copy of unknown length),
        // then the length that counts.
        let (name, len): (&[u8; 9], usize) = match lock.mode() {
            Mode::Exclusive => (b"exclusive", 9),
            Mode::Shared => (b"shared:::", 6),
            Mode::Semaphore => (b"semaphore", 9),
        };
        if let Some(dst) = self.buf.get_mut(..9) {
            dst.copy_from_slice(name);
            self.len = len;
        }
        for n in [u64::from(h.holds), h.token, h.deadline] {
            self.colon();
            self.number(n);
        }
        if let Some(limit) = lock.limit() {
            self.colon();
            self.number(u64::from(limit));
        }
    }

    fn colon(&mut self) {
        if let Some(b) = self.buf.get_mut(self.len) {
            *b = b':';
            self.len += 1;
        }
    }

    /// `n` in decimal: below 100 from a table, otherwise in chunks of eight
    /// digits, each spelled by one multiplication and a pair of digits per
    /// step after it ([`eight_digits`]), the first chunk without its leading
    /// zeros. Every chunk is stored as 8 bytes whole (a fixed-size store, no
    /// copy of the digits' own length: every effect spells three numbers).
    #[inline(always)]
    fn number(&mut self, n: u64) {
        const E8: u64 = 100_000_000;
        if n < 10 {
            self.put8(u64::from(b'0') + n, 1);
            return;
        }
        if n < 100 {
            let pair = PAIRS.get(n as usize).copied().unwrap_or(0);
            self.put8(u64::from(pair), 2);
            return;
        }
        // At most three chunks of eight digits: a u64 has at most 20. Each
        // `as u32` is of a value below 10^8.
        if n < E8 {
            self.lead(n as u32);
        } else if n < E8 * E8 {
            self.lead((n / E8) as u32);
            self.put8(eight_digits((n % E8) as u32), 8);
        } else {
            let high = n / E8;
            self.lead((high / E8) as u32);
            self.put8(eight_digits((high % E8) as u32), 8);
            self.put8(eight_digits((n % E8) as u32), 8);
        }
    }

    /// A number's first chunk of digits (`lead` below 10^8), without its
    /// leading zeros: they are its first bytes, the u64's low ones, whose
    /// digit values are the trailing zero bytes (at least one digit stays).
    #[inline(always)]
    fn lead(&mut self, lead: u32) {
        let digits = eight_digits(lead);
        let zeros = ((digits - ASCII_ZEROS).trailing_zeros() / 8).min(7);
        self.put8(digits >> (8 * zeros), 8 - zeros as usize);
    }

    /// Stores the 8 bytes of `chunk` at the end, of which the first `len`
    /// count (the room past the end is in [`STATE_MAX`]).
    #[inline(always)]
    fn put8(&mut self, chunk: u64, len: usize) {
        let at = self.len;
        if let Some(dst) = self.buf.get_mut(at..at + 8) {
            dst.copy_from_slice(&chunk.to_le_bytes());
            self.len = at + len;
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }
}

/// `PAIRS[p]`: the two ASCII digits of `p`, in memory order.
#[allow(clippy::indexing_slicing)] // a constant, built at compile time
const PAIRS: [u16; 100] = {
    let mut t = [0u16; 100];
    let mut p = 0;
    while p < 100 {
        t[p] = u16::from_le_bytes([b'0' + (p / 10) as u8, b'0' + (p % 10) as u8]);
        p += 1;
    }
    t
};

/// Eight ASCII '0's, as [`eight_digits`] packs them.
const ASCII_ZEROS: u64 = u64::from_le_bytes(*b"00000000");

/// The digits of `y` (below 10^8) as eight ASCII bytes, leading zeros
/// included, in a u64 whose bytes in memory (little-endian) read in order.
///
/// One multiplication turns `y` into a fixed-point fraction of 10^6 with
/// 57 bits after the point: its integer part is the first pair of digits;
/// each further pair is the integer part of the fraction times 100. The
/// multiplier is rounded up, so the fraction is never below the true one,
/// and is above it by less than `10^8 / 2^57` (about 7e-10): even a
/// hundred times a hundred times a hundred that (the last pair) stays
/// below 1e-3, short of the next integer, and the true fraction is at most
/// `1 - 10^-6` before the first pair: every pair comes out exact (every
/// `y` was checked once; the tests check three million of them).
#[allow(clippy::indexing_slicing)]
#[inline(always)]
fn eight_digits(y: u32) -> u64 {
    const SHIFT: u32 = 57;
    const MASK: u64 = (1 << SHIFT) - 1;
    // ceil(2^57 / 10^6); y * this stays below 2^64 for y < 10^8.
    const SCALE: u64 = (1 << SHIFT) / 1_000_000 + 1;
    // Every index is an integer part below 100 (the fraction is below 1,
    // times 100): no input reaches past the table.
    let mut t = u64::from(y) * SCALE;
    let mut out = u64::from(PAIRS[(t >> SHIFT) as usize]);
    for shift in [16, 32, 48] {
        t = (t & MASK) * 100;
        out |= u64::from(PAIRS[(t >> SHIFT) as usize]) << shift;
    }
    out
}

/// With nobody listening there is nothing to send: only what Redis counts
/// for its save points (`server.dirty`) moves, as `RM_Replicate` would move
/// it (with nobody listening, `RM_ReplicateVerbatim` only does that). True
/// then; false when the effect must be built and sent.
#[inline]
fn counted_only(ctx: &Context) -> bool {
    let quiet = QUIET.load(Ordering::Relaxed);
    if quiet {
        call!(RedisModule_ReplicateVerbatim(ctx.ctx));
    }
    quiet
}

/// Sends the effect of one transition to replicas and the AOF, straight
/// through `RedisModule_Replicate` (no argument strings are built here).
pub fn replicate(ctx: &Context, key: Str<'_>, lock: &Lock, changes: &Changes) {
    if counted_only(ctx) {
        return;
    }
    let mut owners = changes.owners();
    // Most transitions change one holder: one look-up. With several, drops
    // go first.
    if let (Some(owner), None) = (owners.next(), owners.next()) {
        match lock.holder(owner) {
            Some(holder) => replicate_set(ctx, key, lock, &holder),
            None => replicate_drop(ctx, key, owner),
        }
        return;
    }
    // Each changed owner found once (a refresh lists every holder: linear
    // time in them, not quadratic).
    let found = lock.look_up(changes.owners());
    for (owner, holder) in &found {
        if holder.is_none() {
            replicate_drop(ctx, key, owner);
        }
    }
    for (_, holder) in &found {
        if let Some(holder) = holder {
            replicate_set(ctx, key, lock, holder);
        }
    }
}

/// Sends the effect of a transition that leaves the lock one holder, the
/// one it changed (a grant that made the lock, `Lock::first`; a renewal of
/// its only holder, `Lock::renew_sole`): that holder's state.
pub fn replicate_sole(ctx: &Context, key: Str<'_>, lock: &Lock) {
    if counted_only(ctx) {
        return;
    }
    if let Some(holder) = lock.holders().next() {
        replicate_set(ctx, key, lock, &holder);
    }
}

/// Sends the effect of a transition whose one change is that `owner` no
/// longer holds (`Lock::release_sole`).
pub fn replicate_dropped(ctx: &Context, key: Str<'_>, owner: &[u8]) {
    if counted_only(ctx) {
        return;
    }
    replicate_drop(ctx, key, owner);
}

fn replicate_drop(ctx: &Context, key: Str<'_>, owner: &[u8]) {
    call!(RedisModule_Replicate(
        ctx.ctx,
        SYNC_COMMAND.as_ptr(),
        DROP_FORMAT.as_ptr(),
        key.raw(),
        c"DROP".as_ptr(),
        owner.as_ptr(),
        owner.len()
    ));
}

fn replicate_set(ctx: &Context, key: Str<'_>, lock: &Lock, holder: &HolderRef<'_>) {
    let mut state = State::empty();
    state.spell(lock, holder);
    let state = state.as_bytes();
    call!(RedisModule_Replicate(
        ctx.ctx,
        SYNC_COMMAND.as_ptr(),
        SET_FORMAT.as_ptr(),
        key.raw(),
        state.as_ptr(),
        state.len(),
        holder.owner.as_ptr(),
        holder.owner.len()
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::{Holder, Kind};

    fn spelled(n: u64) -> Vec<u8> {
        let mut s = State::empty();
        s.number(n);
        s.as_bytes().to_vec()
    }

    #[test]
    fn numbers_are_spelled_as_rust_spells_them_at_every_digit_count() {
        let mut edges = vec![0, u64::MAX, u64::MAX - 1];
        let mut p = 1u64;
        while let Some(next) = p.checked_mul(10) {
            edges.extend([p - 1, p, p + 1, next - 1]);
            p = next;
        }
        edges.push(p);
        for n in edges {
            assert_eq!(spelled(n), n.to_string().into_bytes(), "{n}");
        }
    }

    #[test]
    fn eight_digits_are_exact_across_the_range() {
        // Every y below 10^6 and in the top 10^6 (the largest products and
        // fractions), and one in 101 between; the doc's bound covers all.
        let low = 0..1_000_000u32;
        let top = 99_000_000..100_000_000u32;
        let between = (1_000_000..99_000_000u32).step_by(101);
        for y in low.chain(top).chain(between) {
            let want = y.to_string().into_bytes();
            let mut padded = *b"00000000";
            for (d, w) in padded.iter_mut().rev().zip(want.iter().rev()) {
                *d = *w;
            }
            if eight_digits(y) != u64::from_le_bytes(padded) {
                panic!("{y}: {:?}", eight_digits(y).to_le_bytes());
            }
        }
    }

    #[test]
    fn every_mode_is_spelled_by_its_name() {
        for (kind, name) in [
            (Kind::from(Mode::Exclusive), "exclusive"),
            (Kind::from(Mode::Shared), "shared"),
            (Kind::Semaphore(3), "semaphore"),
        ] {
            let holder = Holder {
                owner: b"o"[..].into(),
                holds: 1,
                since: 0,
                token: 5,
                deadline: 6,
            };
            let lock = Lock::from_holders(kind, vec![holder]).unwrap();
            assert_eq!(lock.mode().name(), name);
            let state = State::of(&lock, &lock.holders().next().unwrap());
            let limit = if name == "semaphore" { ":3" } else { "" };
            assert_eq!(state.as_bytes(), format!("{name}:1:5:6{limit}").as_bytes());
        }
    }

    proptest::proptest! {
        #[test]
        fn any_number_is_spelled_as_rust_spells_it(n in proptest::num::u64::ANY) {
            proptest::prop_assert_eq!(spelled(n), n.to_string().into_bytes());
        }
    }

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
