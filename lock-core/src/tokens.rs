//! Fencing tokens: unique and strictly increasing per server.
//!
//! The counter starts above both the wall clock (`now_ms * 1000`, so a server
//! that lost its files still starts above what it issued before, unless it
//! issued more than a thousand tokens a millisecond on average) and every token
//! it has seen in its RDB, AOF or replication stream ([`Tokens::observe`]).

/// The largest token: replies are signed 64-bit integers.
pub const MAX_TOKEN: u64 = i64::MAX as u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tokens {
    last: u64,
}

impl Tokens {
    /// A counter whose next token is `last + 1`.
    pub fn starting_after(last: u64) -> Tokens {
        Tokens { last }
    }

    /// A counter seeded from the wall clock, in unix milliseconds.
    pub fn from_clock(now_ms: u64) -> Tokens {
        Tokens::starting_after(now_ms.saturating_mul(1000).min(MAX_TOKEN / 2))
    }

    /// The last token issued or observed.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// Issues the next token; `None` once the token space is exhausted.
    pub fn issue(&mut self) -> Option<u64> {
        let next = self.last.checked_add(1).filter(|&t| t <= MAX_TOKEN)?;
        self.last = next;
        Some(next)
    }

    /// Raises the counter to a token issued elsewhere (a file, a master).
    pub fn observe(&mut self, token: u64) {
        self.last = self.last.max(token.min(MAX_TOKEN));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strictly_increasing_and_above_everything_observed() {
        let mut t = Tokens::from_clock(1_700_000_000_000);
        let a = t.issue();
        t.observe(5);
        let b = t.issue();
        assert!(b > a);
        t.observe(1_800_000_000_000_000);
        assert_eq!(t.issue(), Some(1_800_000_000_000_001));
    }

    #[test]
    fn exhaustion_is_reported_not_wrapped() {
        let mut t = Tokens::starting_after(MAX_TOKEN - 1);
        assert_eq!(t.issue(), Some(MAX_TOKEN));
        assert_eq!(t.issue(), None);
        t.observe(u64::MAX);
        assert_eq!(t.last(), MAX_TOKEN);
    }
}
