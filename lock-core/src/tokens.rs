//! Fencing tokens: unique and strictly increasing per server.
//!
//! The counter starts above both the wall clock (`now_ms * 1000`, so a server
//! that lost its files still starts above what it issued before, unless it
//! issued more than a thousand tokens a millisecond on average) and every token
//! it has seen in its RDB, AOF or replication stream ([`Tokens::observe`]).

/// The largest token: replies are signed 64-bit integers.
pub const MAX_TOKEN: u64 = i64::MAX as u64;

/// How far past the clock a real token can be, in ms of tokens: the counter
/// follows `now_ms * 1000` and runs ahead of it only by the skew-margin
/// jumps (a minute each by default, at most a day each), so ten years of
/// them is far beyond anything a server issues, while the token space left
/// above it lasts for about 290,000 years of the clock.
pub const HORIZON_MS: u64 = 10 * 365 * 24 * 3600 * 1000;

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

    /// Jumps past everything this counter knows of, and past the clock
    /// `now_ms`, by `margin_ms` of tokens (a thousand a millisecond): at
    /// start-up after loading and at promotion, so that tokens issued
    /// elsewhere (an earlier run, the old master) but never received are
    /// below the next one, as long as the clocks involved are less than
    /// `margin_ms` apart. Never past half the token space.
    pub fn jump(&mut self, now_ms: u64, margin_ms: u64) {
        let base = self.last.max(Tokens::from_clock(now_ms).last);
        let jumped = base.saturating_add(margin_ms.saturating_mul(1000));
        self.last = self.last.max(jumped.min(MAX_TOKEN / 2));
    }

    /// Whether `token` can have been issued by a server whose clock reads
    /// `now_ms`: at least 1 and at most `(now_ms + HORIZON_MS) * 1000`. A file,
    /// a RESTORE payload or a replicated effect carrying another is refused:
    /// accepting it would let one value use up the token space for good.
    pub fn plausible(token: u64, now_ms: u64) -> bool {
        let limit = now_ms.saturating_add(HORIZON_MS).saturating_mul(1000);
        (1..=limit.min(MAX_TOKEN)).contains(&token)
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
    fn a_jump_clears_the_counter_and_the_clock_by_the_margin() {
        // Ahead of the clock (an earlier jump): past the counter.
        let mut t = Tokens::starting_after(2_000_000);
        t.jump(1_000, 60);
        assert_eq!(t.last(), 2_060_000);
        // Behind the clock: past the clock.
        let mut t = Tokens::starting_after(5);
        t.jump(1_000, 60);
        assert_eq!(t.last(), 1_060_000);
        // Never past half the token space, and never down.
        let mut t = Tokens::starting_after(MAX_TOKEN - 1);
        t.jump(u64::MAX, u64::MAX);
        assert_eq!(t.last(), MAX_TOKEN - 1);
    }

    #[test]
    fn only_tokens_a_server_can_have_issued_are_plausible() {
        let now = 1_800_000_000_000;
        assert!(Tokens::plausible(1, now));
        assert!(Tokens::plausible(now * 1000, now));
        assert!(Tokens::plausible((now + HORIZON_MS) * 1000, now));
        assert!(!Tokens::plausible((now + HORIZON_MS) * 1000 + 1, now));
        assert!(!Tokens::plausible(0, now));
        for t in [MAX_TOKEN, MAX_TOKEN + 1, u64::MAX] {
            assert!(!Tokens::plausible(t, now), "{t}");
        }
        // Room left above the horizon: hundreds of thousands of years.
        let room_ms = (MAX_TOKEN - (now + HORIZON_MS) * 1000) / 1000;
        assert!(room_ms / (365 * 24 * 3600 * 1000) > 200_000);
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
