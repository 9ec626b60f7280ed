//! The replicated effect's wire format, encoded and decoded side by side:
//! what `LOCK.SYNC` carries to replicas and the AOF, the exact state of one
//! changed holder with its absolute deadline, so a replica or an AOF replay
//! never recomputes anything from its own clock.
//!
//! ```text
//! LOCK.SYNC key exclusive|shared:holds:token:deadline-unix-ms owner
//! LOCK.SYNC key semaphore:holds:token:deadline-unix-ms:limit owner
//! LOCK.SYNC key exclusive|shared:holds:token:own-deadline-unix-ms:Flease owner
//! LOCK.SYNC key semaphore:holds:token:own-deadline-unix-ms:limit:Flease owner
//! LOCK.SYNC key DROP owner
//! ```
//!
//! `:F<lease>` (0.4): the holder follows connection lease `lease` (`BIND`,
//! `crate::lease`) and the deadline is its own: one effect sets the
//! holder and its place in the lease table. Before it, the same was two
//! effects, `LOCK.LEASESYNC OWN token lease deadline` then the holder with
//! its entry's deadline naming its token ([`crate::lock::session_deadline`]),
//! which replicas and AOF replays still apply.
//!
//! A holder's numbers travel as one argument (a UUID-owned grant's fits a
//! string Redis keeps in one allocation): each argument of an effect costs
//! the server an object to build and free, on every write. The older form
//! of 0.2 and before, `LOCK.SYNC key SET owner mode holds token deadline
//! [limit]`, of AOF files and masters from before 0.3, is still read.
//!
//! Mode names are the mode table's ([`Mode::c_name`]). Owners stay bytes.

use std::ffi::CStr;

use crate::block::HolderRef;
use crate::lock::{Holder, Kind, Lock};
use crate::mode::Mode;

/// The first argument of a drop.
pub const DROP: &CStr = c"DROP";

/// One effect, as the arguments after the key carry it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Effect<'a> {
    /// `owner` holds, in a lock of `kind`, with exactly this state.
    Set {
        kind: Kind,
        owner: &'a [u8],
        holds: u32,
        token: u64,
        deadline: u64,
    },
    /// `owner` holds nothing.
    Drop { owner: &'a [u8] },
}

/// What starts a state's last part when its holder follows a connection
/// lease (`:F<lease>`).
const FOLLOWS: u8 = b'F';

/// Why an effect was not read: its shape (`Syntax`) or its numbers and
/// names (`BadState`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Malformed {
    Syntax,
    BadState,
}

impl<'a> Effect<'a> {
    /// The effect's arguments after the key: its state (or `DROP`) and its
    /// owner.
    pub fn encode(&self) -> (Encoded, &'a [u8]) {
        match *self {
            Effect::Set {
                kind,
                owner,
                holds,
                token,
                deadline,
            } => (Encoded::state(kind, holds, token, deadline), owner),
            Effect::Drop { owner } => {
                let mut e = Encoded::empty();
                e.put(DROP.to_bytes());
                (e, owner)
            }
        }
    }

    /// The effect that the arguments after the key spell: the current form
    /// (`state owner`, `DROP owner`) or the one of 0.2 and before.
    pub fn decode(args: &[&'a [u8]]) -> Result<Effect<'a>, Malformed> {
        match *args {
            [op, owner] if op.eq_ignore_ascii_case(DROP.to_bytes()) => Ok(Effect::Drop { owner }),
            [state, owner] if state.contains(&b':') => decode_state(state, owner),
            // The form of 0.2 and earlier (older AOF files, older masters).
            [op, owner, mode, holds, token, deadline, ref rest @ ..]
                if op.eq_ignore_ascii_case(b"SET") =>
            {
                let mode = Mode::from_name(mode).ok_or(Malformed::BadState)?;
                let limit = match *rest {
                    [] => None,
                    [limit] => Some(decimal(limit)?),
                    _ => return Err(Malformed::Syntax),
                };
                set(mode, limit, owner, [holds, token, deadline].map(decimal))
            }
            _ => Err(Malformed::Syntax),
        }
    }

    /// [`Effect::decode`], and the connection lease the holder follows
    /// when its state ends in `:F<lease>` (its `deadline` is then its own
    /// deadline: a real one, never a session's).
    pub fn decode_following(args: &[&'a [u8]]) -> Result<(Effect<'a>, Option<u64>), Malformed> {
        let follows = match *args {
            [state, owner] => state
                .iter()
                .rposition(|b| *b == b':')
                .and_then(|at| Some((state.get(..at)?, state.get(at + 1..)?, owner))),
            _ => None,
        };
        match follows {
            Some((state, [FOLLOWS, lease @ ..], owner)) => {
                let lease = decimal(lease)?;
                match Effect::decode(&[state, owner])? {
                    Effect::Set { deadline, .. } if crate::lock::session_of(deadline).is_some() => {
                        Err(Malformed::BadState)
                    }
                    set @ Effect::Set { .. } => Ok((set, Some(lease))),
                    Effect::Drop { .. } => Err(Malformed::Syntax),
                }
            }
            _ => Ok((Effect::decode(args)?, None)),
        }
    }

    /// The holder a `Set` puts (`since`: when it counts from, not in the
    /// stream); `None` for a drop.
    pub fn holder(&self, since: u32) -> Option<Holder> {
        match *self {
            Effect::Set {
                owner,
                holds,
                token,
                deadline,
                ..
            } => Some(Holder {
                owner: owner.into(),
                holds,
                since,
                token,
                deadline,
            }),
            Effect::Drop { .. } => None,
        }
    }
}

/// `mode:holds:token:deadline[:limit]`.
fn decode_state<'a>(state: &[u8], owner: &'a [u8]) -> Result<Effect<'a>, Malformed> {
    let mut parts = state.split(|b| *b == b':');
    let mode = parts
        .next()
        .and_then(Mode::from_name)
        .ok_or(Malformed::BadState)?;
    let mut next = || parts.next().map_or(Err(Malformed::BadState), decimal);
    let numbers = [next(), next(), next()];
    let limit = match mode {
        Mode::Semaphore => Some(next()?),
        Mode::Exclusive | Mode::Shared => None,
    };
    if parts.next().is_some() {
        return Err(Malformed::BadState);
    }
    set(mode, limit, owner, numbers)
}

/// A `Set` of a holder's numbers (`holds`, `token`, `deadline`), read.
fn set(
    mode: Mode,
    limit: Option<u64>,
    owner: &[u8],
    [holds, token, deadline]: [Result<u64, Malformed>; 3],
) -> Result<Effect<'_>, Malformed> {
    let (holds, token, deadline) = (holds?, token?, deadline?);
    let limit = match limit {
        Some(limit) => Some(u32::try_from(limit).map_err(|_| Malformed::BadState)?),
        None => None,
    };
    Ok(Effect::Set {
        kind: Kind::of(mode, limit).ok_or(Malformed::Syntax)?,
        owner,
        holds: u32::try_from(holds).map_err(|_| Malformed::BadState)?,
        token,
        deadline,
    })
}

/// A decimal number: digits only, at most `u64::MAX`.
fn decimal(s: &[u8]) -> Result<u64, Malformed> {
    if s.is_empty() {
        return Err(Malformed::BadState);
    }
    s.iter().try_fold(0u64, |n, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d < 10);
        digit
            .and_then(|d| n.checked_mul(10)?.checked_add(u64::from(d)))
            .ok_or(Malformed::BadState)
    })
}

/// The widest mode name: every name is copied as this many bytes whole
/// (no call for a copy of unknown length), then cut to its length.
const WIDTH: usize = {
    let mut width = 0;
    let mut i = 0;
    while i < Mode::COUNT {
        #[allow(clippy::indexing_slicing)] // at compile time
        let n = Mode::ALL[i].row().name.to_bytes().len();
        if n > width {
            width = n;
        }
        i += 1;
    }
    width
};

/// Each mode's name padded to [`WIDTH`], and its length, at its slot.
#[allow(clippy::indexing_slicing)] // built at compile time
const NAMES: [([u8; WIDTH], usize); Mode::COUNT] = {
    let mut t = [([0u8; WIDTH], 0); Mode::COUNT];
    let mut i = 0;
    while i < Mode::COUNT {
        let name = Mode::ALL[i].row().name.to_bytes();
        let mut j = 0;
        while j < name.len() {
            t[i].0[j] = name[j];
            j += 1;
        }
        t[i].1 = name.len();
        i += 1;
    }
    t
};

/// An effect's first argument, built on the stack: a holder's state
/// `mode:holds:token:deadline[:limit]`, or `DROP`.
pub struct Encoded {
    buf: [u8; ENCODED_MAX],
    len: usize,
}

/// The widest name, four numbers of at most 20 digits and their colons,
/// a follower's lease (`:F` and 20 digits), and room for the last 8-byte
/// store of the last number ([`Encoded::put8`]).
const ENCODED_MAX: usize = WIDTH + 4 * 21 + 22 + 8;

impl Encoded {
    /// `h`'s state in `lock`: what the effect of a change to it carries.
    #[inline(always)]
    pub fn of(lock: &Lock, h: &HolderRef<'_>) -> Encoded {
        let mut e = Encoded::empty();
        e.spell(lock.mode(), lock.limit(), h.holds, h.token, h.deadline);
        e
    }

    /// The state of `h`, a follower of connection lease `lease` whose own
    /// deadline is `own` (its entry's names its token): `...:own:F<lease>`,
    /// the holder and its place in the lease table in one effect.
    #[inline(always)]
    pub fn of_follower(lock: &Lock, h: &HolderRef<'_>, own: u64, lease: u64) -> Encoded {
        let mut e = Encoded::empty();
        e.spell(lock.mode(), lock.limit(), h.holds, h.token, own);
        e.colon();
        e.put(&[FOLLOWS]);
        e.number(lease);
        e
    }

    /// The state of a holder in a lock of `kind`.
    pub fn state(kind: Kind, holds: u32, token: u64, deadline: u64) -> Encoded {
        let limit = match kind {
            Kind::Semaphore(limit) => Some(limit),
            Kind::Acquire | Kind::Racquire | Kind::Read => None,
        };
        let mut e = Encoded::empty();
        e.spell(kind.mode(), limit, holds, token, deadline);
        e
    }

    #[inline(always)]
    fn empty() -> Encoded {
        Encoded {
            buf: [0; ENCODED_MAX],
            len: 0,
        }
    }

    #[inline(always)]
    fn spell(&mut self, mode: Mode, limit: Option<u32>, holds: u32, token: u64, deadline: u64) {
        if let (Some(dst), Some((name, len))) = (self.buf.get_mut(..WIDTH), NAMES.get(mode.slot()))
        {
            dst.copy_from_slice(name);
            self.len = *len;
        }
        for n in [u64::from(holds), token, deadline] {
            self.colon();
            self.number(n);
        }
        if let Some(limit) = limit {
            self.colon();
            self.number(u64::from(limit));
        }
    }

    fn put(&mut self, bytes: &[u8]) {
        let at = self.len;
        if let Some(dst) = self.buf.get_mut(at..at + bytes.len()) {
            dst.copy_from_slice(bytes);
            self.len = at + bytes.len();
        }
    }

    #[inline(always)]
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
    /// count (the room past the end is in [`ENCODED_MAX`]).
    #[inline(always)]
    fn put8(&mut self, chunk: u64, len: usize) {
        let at = self.len;
        if let Some(dst) = self.buf.get_mut(at..at + 8) {
            dst.copy_from_slice(&chunk.to_le_bytes());
            self.len = at + len;
        }
    }

    #[inline(always)]
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::MAX_LIMIT;
    use proptest::prelude::*;

    fn spelled(n: u64) -> Vec<u8> {
        let mut s = Encoded::empty();
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

    proptest! {
        #[test]
        fn any_number_is_spelled_as_rust_spells_it(n in proptest::num::u64::ANY) {
            prop_assert_eq!(spelled(n), n.to_string().into_bytes());
        }
    }

    fn kind() -> impl Strategy<Value = Kind> {
        prop_oneof![
            Just(Kind::Racquire),
            Just(Kind::Read),
            (1..=MAX_LIMIT).prop_map(Kind::Semaphore),
        ]
    }

    /// Whether the effect is read back from its arguments as it was.
    fn round_trips(effect: Effect<'_>) -> bool {
        let (first, owner) = effect.encode();
        Effect::decode(&[first.as_bytes(), owner]) == Ok(effect)
    }

    proptest! {
        #[test]
        fn every_effect_is_read_back_as_written(
            kind in kind(),
            owner in proptest::collection::vec(any::<u8>(), 1..60),
            holds in 1..=u32::MAX,
            token in 1..=u64::MAX,
            deadline in any::<u64>(),
        ) {
            let holds = if kind.mode() == Mode::Semaphore { 1 } else { holds };
            let set = Effect::Set { kind, owner: &owner, holds, token, deadline };
            prop_assert!(round_trips(set), "{:?}", set);
            let drop = Effect::Drop { owner: &owner };
            prop_assert!(round_trips(drop), "{:?}", drop);
            // The shell's encoder, from the lock's own state, spells the same.
            let holder = set.holder(0).unwrap();
            let lock = Lock::from_holders(kind, vec![holder]).unwrap();
            let h = lock.holders().next().unwrap();
            let (of_lock, of_effect) = (Encoded::of(&lock, &h), set.encode().0);
            prop_assert_eq!(of_lock.as_bytes(), of_effect.as_bytes());
        }
    }

    #[test]
    fn every_mode_is_spelled_by_its_name() {
        for (kind, name) in [
            (Kind::Racquire, "exclusive"),
            (Kind::Read, "shared"),
            (Kind::Semaphore(3), "semaphore"),
        ] {
            let state = Encoded::state(kind, 1, 5, 6);
            let limit = if name == "semaphore" { ":3" } else { "" };
            assert_eq!(state.as_bytes(), format!("{name}:1:5:6{limit}").as_bytes());
        }
        let (drop, owner) = Effect::Drop { owner: b"o\0" }.encode();
        assert_eq!((drop.as_bytes(), owner), (&b"DROP"[..], &b"o\0"[..]));
    }

    #[test]
    fn a_uuid_grant_fits_one_allocation_and_the_largest_state_fits() {
        let uuid = b"6ba7b810-9dad-11d1-80b4-00c04fd430c8";
        let state = Encoded::state(Kind::Acquire, 1, 1_764_048_000_000_001, 1_764_051_600_000);
        assert_eq!(
            state.as_bytes(),
            b"exclusive:1:1764048000000001:1764051600000"
        );
        // Redis keeps strings of up to 44 bytes in one allocation.
        assert!(state.as_bytes().len() <= 44 && !uuid.is_empty());
        let max = Encoded::state(Kind::Semaphore(MAX_LIMIT), u32::MAX, u64::MAX, u64::MAX);
        assert_eq!(
            max.as_bytes(),
            format!(
                "semaphore:{}:{}:{}:{MAX_LIMIT}",
                u32::MAX,
                u64::MAX,
                u64::MAX
            )
            .as_bytes()
        );
    }

    proptest! {
        #[test]
        fn a_followers_effect_is_read_back_with_its_lease(
            kind in kind(),
            owner in proptest::collection::vec(any::<u8>(), 1..60),
            token in 1..=u64::MAX,
            own in 0..crate::lock::SESSION_BIT,
            lease in any::<u64>(),
        ) {
            let holder = Effect::Set { kind, owner: &owner, holds: 1, token, deadline: own }
                .holder(0)
                .unwrap();
            let lock = Lock::from_holders(kind, vec![holder]).unwrap();
            let h = lock.holders().next().unwrap();
            let state = Encoded::of_follower(&lock, &h, own, lease);
            let set = Effect::Set { kind, owner: &owner, holds: 1, token, deadline: own };
            prop_assert_eq!(
                Effect::decode_following(&[state.as_bytes(), &owner]),
                Ok((set, Some(lease)))
            );
            // Without the lease, the effect as before.
            let (plain, _) = set.encode();
            prop_assert_eq!(
                Effect::decode_following(&[plain.as_bytes(), &owner]),
                Ok((set, None))
            );
        }
    }

    #[test]
    fn a_followers_effect_is_spelled_and_refused_as_the_contract_says() {
        let lock = Lock::from_holders(
            Kind::Semaphore(3),
            vec![Effect::Set {
                kind: Kind::Semaphore(3),
                owner: b"o",
                holds: 1,
                token: 5,
                deadline: 6,
            }
            .holder(0)
            .unwrap()],
        )
        .unwrap();
        let h = lock.holders().next().unwrap();
        assert_eq!(
            Encoded::of_follower(&lock, &h, 1000, 77).as_bytes(),
            b"semaphore:1:5:1000:3:F77"
        );
        let read = |state: &str| {
            Effect::decode_following(&[state.as_bytes(), b"o"]).map(|(_, lease)| lease)
        };
        assert_eq!(read("DROP:F7"), Err(Malformed::Syntax));
        assert_eq!(read("exclusive:1:5:1000:F"), Err(Malformed::BadState));
        assert_eq!(read("exclusive:1:5:1000:Fx"), Err(Malformed::BadState));
        // A follower's deadline is its own, never a session's.
        let marked = format!("exclusive:1:5:{}:F7", crate::lock::session_deadline(5));
        assert_eq!(read(&marked), Err(Malformed::BadState));
        assert_eq!(read("exclusive:1:5:1000:3:F7"), Err(Malformed::BadState));
    }

    #[test]
    fn the_form_of_0_2_is_still_read() {
        let set = |args: &[&'static str]| {
            let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            Effect::decode(&args)
        };
        assert_eq!(
            set(&["SET", "o", "exclusive", "2", "7", "1000"]),
            Ok(Effect::Set {
                kind: Kind::Racquire,
                owner: b"o",
                holds: 2,
                token: 7,
                deadline: 1000
            })
        );
        assert_eq!(
            set(&["set", "o", "semaphore", "1", "8", "1000", "4"]),
            Ok(Effect::Set {
                kind: Kind::Semaphore(4),
                owner: b"o",
                holds: 1,
                token: 8,
                deadline: 1000
            })
        );
        assert_eq!(set(&["drop", "o"]), Ok(Effect::Drop { owner: b"o" }));
        // Both forms of one state are one effect.
        assert_eq!(
            set(&["SET", "o", "shared", "3", "9", "50"]),
            set(&["shared:3:9:50", "o"])
        );
        assert_eq!(
            set(&["SET", "o", "semaphore", "1", "8", "1000"]),
            Err(Malformed::Syntax)
        );
        assert_eq!(
            set(&["SET", "o", "shared", "1", "8", "1000", "2"]),
            Err(Malformed::Syntax)
        );
        assert_eq!(
            set(&["SET", "o", "shared", "1", "8", "1000", "2", "3"]),
            Err(Malformed::Syntax)
        );
        assert_eq!(
            set(&["SET", "o", "Shared", "1", "8", "1000"]),
            Err(Malformed::BadState)
        );
        assert_eq!(
            set(&["SET", "o", "shared", "-1", "8", "1000"]),
            Err(Malformed::BadState)
        );
    }

    #[test]
    fn a_bad_state_is_refused() {
        let state = |s: &'static str| Effect::decode(&[s.as_bytes(), b"o"]);
        for bad in [
            "exclusive:1:2",
            "exclusive:1:2:3:4",
            "semaphore:1:2:3",
            "semaphore:1:2:3:4294967296",
            "shared:4294967296:2:3",
            "shared:1:2:18446744073709551616",
            "shared:1:+2:3",
            "shared:1::3",
            "bogus:1:2:3",
            ":",
        ] {
            assert_eq!(state(bad), Err(Malformed::BadState), "{bad}");
        }
        assert_eq!(Effect::decode(&[b"o"]), Err(Malformed::Syntax));
        assert_eq!(Effect::decode(&[b"nocolon", b"o"]), Err(Malformed::Syntax));
        assert_eq!(
            state("shared:1:18446744073709551615:0"),
            Ok(Effect::Set {
                kind: Kind::Read,
                owner: b"o",
                holds: 1,
                token: u64::MAX,
                deadline: 0
            })
        );
    }
}
