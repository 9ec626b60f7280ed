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
/// jumps (a minute by default, at most a day), which never compound where
/// nothing new arrived and never pass this horizon, so ten years is far
/// beyond anything a server issues, while the token space left above it
/// lasts for about 290,000 years of the clock.
pub const HORIZON_MS: u64 = 10 * 365 * 24 * 3600 * 1000;

/// What a load (RDB, AOF, a replica's full sync or stream) allows past the
/// horizon that `RESTORE` enforces: a day, the largest skew margin. So
/// whatever a `RESTORE` accepted, and every token issued since (jumps stop
/// at the horizon), still loads after the clock stepped back by less than
/// a day, or on a replica whose clock is up to a day behind its master's.
pub const LOAD_SLACK_MS: u64 = 24 * 3600 * 1000;

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

    /// Jumps past the last token issued or seen and past the clock `now_ms`
    /// by `margin_ms` of tokens (a thousand a millisecond): at start-up
    /// after loading and at promotion, so that tokens issued elsewhere (an
    /// earlier run, the old master) but never received are below the next
    /// one, as long as the clocks involved are less than `margin_ms` apart.
    /// The base is what was issued or seen, never an earlier jump's floor
    /// (the caller keeps that apart), so jumps with nothing new in between
    /// land in the same place, moved only by the clock. Never past the
    /// horizon ([`Tokens::horizon`]) nor half the token space, and never
    /// down.
    pub fn jump(&mut self, now_ms: u64, margin_ms: u64) {
        let base = self.last.max(Tokens::from_clock(now_ms).last);
        let jumped = base.saturating_add(margin_ms.saturating_mul(1000));
        let cap = Tokens::horizon(now_ms).min(MAX_TOKEN / 2);
        self.last = self.last.max(jumped.min(cap));
    }

    /// The highest token a server whose clock reads `now_ms` can have issued:
    /// `(now_ms + HORIZON_MS) * 1000`, within the token space.
    pub fn horizon(now_ms: u64) -> u64 {
        now_ms
            .saturating_add(HORIZON_MS)
            .saturating_mul(1000)
            .min(MAX_TOKEN)
    }

    /// Whether `token` can have been issued by a server whose clock reads
    /// `now_ms`: at least 1 and at most [`Tokens::horizon`]. `RESTORE`
    /// refuses a payload carrying another: accepting it would let one value
    /// use up the token space for good.
    pub fn plausible(token: u64, now_ms: u64) -> bool {
        (1..=Tokens::horizon(now_ms)).contains(&token)
    }

    /// Whether a load (a file, the replication stream) at `now_ms` takes
    /// `token`: as [`Tokens::plausible`], [`LOAD_SLACK_MS`] later. What it
    /// does not take is dropped or clamped there, never a reason to fail.
    pub fn loadable(token: u64, now_ms: u64) -> bool {
        Tokens::plausible(token, now_ms.saturating_add(LOAD_SLACK_MS))
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
        // Ahead of the clock (tokens issued from an earlier jump): past them.
        let mut t = Tokens::starting_after(2_000_000);
        t.jump(1_000, 60);
        assert_eq!(t.last(), 2_060_000);
        // Behind the clock: past the clock.
        let mut t = Tokens::starting_after(5);
        t.jump(1_000, 60);
        assert_eq!(t.last(), 1_060_000);
        // Never past the horizon, and never down.
        let now = 1_800_000_000_000;
        let mut t = Tokens::starting_after(Tokens::horizon(now) - 5);
        t.jump(now, 60_000);
        assert_eq!(t.last(), Tokens::horizon(now));
        let mut t = Tokens::starting_after(MAX_TOKEN - 1);
        t.jump(u64::MAX, u64::MAX);
        assert_eq!(t.last(), MAX_TOKEN - 1);
    }

    #[test]
    fn jumps_from_one_base_do_not_compound() {
        // The base is what was issued: jumping again with nothing issued
        // in between lands where the clock says, not a margin further.
        let (now, margin) = (1_800_000_000_000, 86_400_000);
        let issued = Tokens::from_clock(now);
        let mut floor = 0;
        for step in 0..10_000 {
            let mut t = issued;
            t.jump(now + step, margin);
            floor = floor.max(t.last());
        }
        assert_eq!(floor, (now + 9_999 + margin) * 1000);
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
        // A load takes a day more.
        let edge = (now + HORIZON_MS + LOAD_SLACK_MS) * 1000;
        assert!(Tokens::loadable(edge, now) && !Tokens::loadable(edge + 1, now));
        assert!(!Tokens::loadable(0, now) && !Tokens::loadable(MAX_TOKEN, now));
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
