//! The hash of the module's own maps and indexes: [`Keyed`], one folded
//! multiply per eight bytes, keyed at random per process.
//!
//! What they hash is chosen by others: key names and owners by clients,
//! numbers (tokens, client ids, lease ids) by whoever wrote the file a
//! server loads. A fixed hash would let them choose collisions, and a
//! map's look-ups would walk them all; so the hash is keyed at random per
//! process, as std's `RandomState` is. Not by SipHash: every grant and
//! release hashes a key, an owner or a token on its way (a bound grant,
//! a settle's index of 10,000 holders, the waiting registry's maps), and a
//! folded multiply (the 128-bit product of the state xor a word with an
//! odd key, its two halves xored) costs about a tenth of SipHash's
//! instructions on a word, a fifth of `HashMap`'s default hash of a short
//! key. The name filter of the keyspace events (`keys::name_hash` in the
//! shell) mixes with the same [`folded_multiply`].

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::LazyLock;

/// The 128-bit product of `a` and `b`, its halves xored: every bit of the
/// result depends on every bit of `a` (for an odd `b`).
#[inline(always)]
pub const fn folded_multiply(a: u64, b: u64) -> u64 {
    let full = (a as u128).wrapping_mul(b as u128);
    (full as u64) ^ ((full >> 64) as u64)
}

/// The keyed hash (a `BuildHasher`): its two keys, the same for every map
/// of the process ([`Keyed::default`]).
#[derive(Clone, Copy, Debug)]
pub struct Keyed {
    k0: u64,
    k1: u64,
}

static SEEDS: LazyLock<Keyed> = LazyLock::new(|| {
    let s = RandomState::new();
    Keyed {
        k0: s.hash_one(0x6b65_u64),
        k1: s.hash_one(0x6b66_u64) | 1,
    }
});

impl Default for Keyed {
    #[inline]
    fn default() -> Keyed {
        *SEEDS
    }
}

impl BuildHasher for Keyed {
    type Hasher = KeyedHasher;
    #[inline]
    fn build_hasher(&self) -> KeyedHasher {
        KeyedHasher {
            k1: self.k1,
            h: self.k0,
        }
    }
}

/// [`Keyed`]'s hasher: the state starts at the first key, and each word
/// (an integer, eight bytes of a slice) is mixed in by one
/// [`folded_multiply`] with the second. A number is one word, a slice its
/// words and the rest of its bytes as one more.
#[derive(Debug)]
pub struct KeyedHasher {
    k1: u64,
    h: u64,
}

impl KeyedHasher {
    #[inline(always)]
    fn mix(&mut self, x: u64) {
        self.h = folded_multiply(self.h ^ x, self.k1);
    }
}

/// The last `r` bytes of `bytes` (1 to 7 of them), as one word without a
/// copy: of a slice of 8 bytes or more, its last eight, shifted (the
/// word of the bytes zero-padded); of 4 to 7, two overlapping halves; of
/// 1 to 3, its first, middle and last byte. A slice's length is hashed
/// before it (`Hash for [u8]`), so these are never confused with the
/// words of a slice of another length.
#[inline(always)]
fn tail(bytes: &[u8], r: usize) -> u64 {
    let n = bytes.len();
    if n >= 8 {
        let last = bytes
            .get(n - 8..)
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            .map_or(0, u64::from_le_bytes);
        last >> (8 * (8 - r))
    } else if n >= 4 {
        let half = |i: usize| {
            bytes
                .get(i..i + 4)
                .and_then(|w| <[u8; 4]>::try_from(w).ok())
                .map_or(0, |w| u64::from(u32::from_le_bytes(w)))
        };
        half(0) | half(n - 4) << (8 * (n - 4))
    } else {
        let byte = |i: usize| bytes.get(i).map_or(0, |b| u64::from(*b));
        byte(0) | byte(n / 2) << 8 | byte(n - 1) << 16
    }
}

impl Hasher for KeyedHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.mix(u64::from_le_bytes(<[u8; 8]>::try_from(w).unwrap_or([0; 8])));
        }
        let r = words.remainder().len();
        if r > 0 {
            self.mix(tail(bytes, r));
        }
    }

    #[inline]
    fn write_u8(&mut self, x: u8) {
        self.mix(u64::from(x));
    }

    #[inline]
    fn write_u16(&mut self, x: u16) {
        self.mix(u64::from(x));
    }

    #[inline]
    fn write_u32(&mut self, x: u32) {
        self.mix(u64::from(x));
    }

    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.mix(x);
    }

    #[inline]
    fn write_usize(&mut self, x: usize) {
        self.mix(x as u64);
    }

    // The signed writes' defaults call these (`write_i32` is `write_u32`
    // of its bits).

    #[inline]
    fn finish(&self) -> u64 {
        self.h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::hash::Hash;

    fn hash<T: Hash + ?Sized>(k: Keyed, x: &T) -> u64 {
        k.hash_one(x)
    }

    /// The word of `bytes` zero-padded, the plain way.
    fn padded(bytes: &[u8]) -> u64 {
        let mut w = [0u8; 8];
        w[..bytes.len()].copy_from_slice(bytes);
        u64::from_le_bytes(w)
    }

    #[test]
    fn a_number_is_one_multiply_of_its_keys() {
        let k = Keyed::default();
        for x in [0u64, 1, 42, u64::MAX, 1 << 63] {
            assert_eq!(hash(k, &x), folded_multiply(k.k0 ^ x, k.k1));
        }
        // Every integer width is the one word of its value (signed ones as
        // their bits), not a slice of bytes.
        assert_eq!(hash(k, &7u8), hash(k, &7u64));
        assert_eq!(hash(k, &7u16), hash(k, &7u64));
        assert_eq!(hash(k, &7u32), hash(k, &7u64));
        assert_eq!(hash(k, &7usize), hash(k, &7u64));
        assert_eq!(hash(k, &-1i32), hash(k, &u64::from(u32::MAX)));
        assert_eq!(hash(k, &-1i64), hash(k, &u64::MAX));
    }

    #[test]
    fn a_slice_is_its_length_then_its_words() {
        let k = Keyed::default();
        let bytes: Vec<u8> = (1..=40u8).map(|b| b.wrapping_mul(37)).collect();
        for n in 0..=bytes.len() {
            let s = &bytes[..n];
            let mut h = folded_multiply(k.k0 ^ n as u64, k.k1);
            let mut words = s.chunks_exact(8);
            for w in &mut words {
                h = folded_multiply(h ^ padded(w), k.k1);
            }
            let rest = words.remainder();
            if n >= 4 && !rest.is_empty() {
                // Four bytes or more: the rest zero-padded, as read.
                h = folded_multiply(h ^ padded(rest), k.k1);
            } else if !rest.is_empty() {
                let t = u64::from(s[0]) | u64::from(s[n / 2]) << 8 | u64::from(s[n - 1]) << 16;
                h = folded_multiply(h ^ t, k.k1);
            }
            assert_eq!(hash(k, s), h, "length {n}");
        }
    }

    #[test]
    fn slices_that_differ_hash_apart() {
        // Every slice of up to 3 bytes from a small alphabet, and every
        // one-byte change of a 1..=24-byte slice: no two collide.
        let k = Keyed::default();
        let mut seen = HashSet::new();
        let alphabet = [0u8, 1, 2, 0x80, 0xff];
        let mut count = 0;
        for n in 0..=3usize {
            let mut idx = vec![0usize; n];
            loop {
                let s: Vec<u8> = idx.iter().map(|&i| alphabet[i]).collect();
                assert!(seen.insert(hash(k, s.as_slice())), "{s:?}");
                count += 1;
                let Some(p) = idx.iter().position(|&i| i + 1 < alphabet.len()) else {
                    break;
                };
                idx[p] += 1;
                idx[..p].iter_mut().for_each(|i| *i = 0);
            }
        }
        assert_eq!(count, 1 + 5 + 25 + 125);
        for n in 4..=24usize {
            let base = vec![0x5au8; n];
            assert!(seen.insert(hash(k, base.as_slice())));
            for at in 0..n {
                let mut s = base.clone();
                s[at] ^= 1;
                assert!(seen.insert(hash(k, s.as_slice())), "length {n}, byte {at}");
            }
        }
    }

    #[test]
    fn the_keys_are_the_process_ones_and_odd() {
        let (a, b) = (Keyed::default(), Keyed::default());
        assert_eq!((a.k0, a.k1), (b.k0, b.k1));
        assert_eq!(a.k1 & 1, 1);
        assert_eq!(hash(a, b"owner".as_slice()), hash(b, b"owner".as_slice()));
    }
}
