//! Fuzzing the pure core: bytes decoded ([`crate::op::decode`]) into
//! operations on a few keys, with clock jumps forward and backward and
//! replicated effects, run through the one checker ([`crate::check`]).
//!
//! Two drivers:
//! - the libFuzzer target `fuzz/fuzz_targets/core_ops.rs` (`cargo fuzz`;
//!   `make fuzz`), which depends on this crate;
//! - the bounded run of `lock-core/tests/fuzz.rs` (part of `cargo test`),
//!   which feeds pseudo-random inputs from a seeded [`XorShift`] for
//!   `CORE_FUZZ_SECS` seconds (default 10; `CORE_FUZZ_SEED` replays a run).

pub use crate::op::decode;

/// Decodes `data` and runs it through the checker. Panics on the first
/// broken invariant.
pub fn run(data: &[u8]) {
    let (start, ops) = decode(data);
    crate::check::check(start, &ops);
}

/// A small xorshift generator: no dependency, reproducible from its seed.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Random bytes, biased so that decoded inputs reach busy states: short
    /// runs, small numbers, and repeats of recent bytes.
    pub fn input(&mut self) -> Vec<u8> {
        let len = match self.next_u64() % 4 {
            0 => self.next_u64() % 32,
            1 | 2 => self.next_u64() % 256,
            _ => self.next_u64() % 2048,
        } as usize;
        let small = self.next_u64().is_multiple_of(3);
        let mut data = Vec::with_capacity(len);
        for i in 0..len {
            let r = self.next_u64();
            let b = match r % 8 {
                0 if i > 8 => data[i - 1 - (r >> 8) as usize % 8],
                1 | 2 if small => (r >> 8) as u8 % 8,
                _ => (r >> 8) as u8,
            };
            data.push(b);
        }
        data
    }
}
