//! What a lock knows of its current acquisition, the same in the blocking
//! and the tokio API: owner, lease, tokens, whether it is lost, and the
//! callbacks to tell; and what each reply of a renewal, an extend, a
//! re-acquire or a release means for it (the decisions: each API only
//! carries the commands and applies [`After`]). Each API keeps it behind a
//! mutex never held across I/O.

use std::time::{Duration, Instant};

use crate::commands::{Released, NOT_HELD};
use crate::{bound_failed, fresh_owner, tick, Error, Kind, OnLost, Options, RAN_OUT};

/// A callback to call (outside any lock), with its error.
pub(crate) type News = Option<(OnLost, Error)>;

/// What the API does after a decision: tell (outside the locks), close the
/// holder's connection (a bound lock is freed with it), wake the watchdog.
#[derive(Default)]
pub(crate) struct After {
    pub(crate) news: News,
    /// A renewal fewer replicas acknowledged ([`Holding::renewed`]).
    pub(crate) notice: News,
    pub(crate) close: bool,
    pub(crate) wake: bool,
}

/// What a re-acquire's reply means.
pub(crate) enum Reacquired {
    /// One more hold of this grant.
    Held,
    /// Not granted (busy).
    Refused,
    /// A new grant (this one had ended): the hold just taken is given back
    /// under these tokens; the lease is lost.
    Stale(Vec<i64>, News),
}

/// One `Lock`'s state: its owner and options, and its current acquisition.
pub(crate) struct Holding {
    pub(crate) owner: Vec<u8>,
    /// The owner was set by [`crate::Lock::owner`]: kept for every acquisition
    /// (else a fresh UUID per acquisition).
    pub(crate) fixed: bool,
    pub(crate) ttl: Duration,
    pub(crate) timeout: Duration,
    pub(crate) bound: bool,
    /// Guards alive (nested by [`crate::Guard::reacquire`]).
    pub(crate) holds: u32,
    pub(crate) tokens: Vec<i64>,
    pub(crate) lost: Option<String>,
    /// A lower bound of the server's deadline (the lease began after we asked).
    pub(crate) valid_until: Instant,
    pub(crate) next_renewal: Instant,
    /// One per acquisition: a watchdog or a guard of an earlier one is stale.
    pub(crate) generation: u64,
    pub(crate) on_lost: Option<OnLost>,
    /// Told when a renewal is acknowledged by fewer replicas than asked.
    pub(crate) on_not_durable: Option<OnLost>,
    /// `WAIT` after each grant and renewal: how many replicas, how long.
    pub(crate) replicas: u32,
    pub(crate) replicas_timeout: Duration,
    /// Whether the last grant and the last renewal were acknowledged (`None`: not asked).
    pub(crate) durable: Option<bool>,
    /// The watcher heard that a key changed (or a write of our own dropped
    /// the keys from tracking): the watchdog reads them now.
    pub(crate) verify: bool,
    /// The session id the grant follows (`SESSION id`): its keeper renews it.
    pub(crate) session: Option<i64>,
    /// Ended by its session's `close()`: released, nothing left to send.
    pub(crate) released: bool,
}

impl Holding {
    /// Nothing held yet: a fresh owner, the default lease.
    pub(crate) fn new(opts: &Options) -> Holding {
        Holding {
            owner: fresh_owner(),
            fixed: false,
            ttl: opts.ttl,
            timeout: opts.timeout,
            bound: false,
            holds: 0,
            tokens: Vec::new(),
            lost: None,
            valid_until: Instant::now(),
            next_renewal: Instant::now(),
            generation: 0,
            on_lost: None,
            on_not_durable: None,
            replicas: 0,
            replicas_timeout: Duration::ZERO,
            durable: None,
            verify: false,
            session: None,
            released: false,
        }
    }

    /// The session's keepalive was acknowledged: the lease lasts until
    /// `until`. False once `generation`'s acquisition is over.
    pub(crate) fn session_renewed(&mut self, generation: u64, until: Instant) -> bool {
        if !self.current(generation) {
            return false;
        }
        if self.lost.is_none() {
            self.valid_until = until;
        }
        true
    }

    /// The session ended: lost for good; the lock's callback (if any) and
    /// its error, if this is news.
    pub(crate) fn session_ended(
        &mut self,
        kind: &Kind,
        generation: u64,
        why: &str,
    ) -> Option<(Option<OnLost>, Error)> {
        if !self.current(generation) || self.lost.is_some() {
            return None;
        }
        self.lost = Some(why.to_string());
        Some((self.on_lost.clone(), self.lost_error(kind)))
    }

    /// The session was closed: the grant is over (released, not lost by
    /// surprise: no callback; a release sends nothing).
    pub(crate) fn session_closed(&mut self, generation: u64, why: &str) {
        if self.current(generation) {
            self.released = true;
            if self.lost.is_none() {
                self.lost = Some(why.to_string());
            }
        }
    }

    /// The fencing token: the highest of the tokens (a multi-key lock's).
    pub(crate) fn token(&self) -> i64 {
        self.tokens.iter().copied().max().unwrap_or(0)
    }

    /// Whether `generation`'s acquisition is still held.
    pub(crate) fn current(&self, generation: u64) -> bool {
        self.generation == generation && self.holds > 0
    }

    /// Marks the lease lost (for good, until the acquisition ends); the
    /// callback to call, with its error, if this is news.
    pub(crate) fn set_lost(&mut self, kind: &Kind, why: &str) -> Option<(OnLost, Error)> {
        if self.lost.is_some() {
            return None;
        }
        self.lost = Some(why.to_string());
        let err = self.lost_error(kind);
        self.on_lost.clone().map(|f| (f, err))
    }

    /// The `LeaseLost` error a holder gets.
    pub(crate) fn lost_error(&self, kind: &Kind) -> Error {
        Error::LeaseLost {
            keys: kind.keys(),
            token: self.token(),
            why: self.lost.clone().unwrap_or_else(|| RAN_OUT.into()),
        }
    }

    /// Lost, or the lease may have run out (then lost for good).
    pub(crate) fn check_lost(&mut self, kind: &Kind) -> Option<(OnLost, Error)> {
        if self.lost.is_none() && Instant::now() >= self.valid_until {
            return self.set_lost(kind, RAN_OUT);
        }
        None
    }

    /// A guarded call of `generation`'s acquisition was answered `NOTHELD`:
    /// the lease is lost for good (if that acquisition is still this one).
    /// The `LeaseLost` error, and the callback to call if this is news.
    pub(crate) fn not_held(
        &mut self,
        kind: &Kind,
        generation: u64,
    ) -> (Error, Option<(OnLost, Error)>) {
        let news = if self.current(generation) {
            self.set_lost(kind, NOT_HELD)
        } else {
            None
        };
        let mut err = self.lost_error(kind);
        if let Error::LeaseLost { why, .. } = &mut err {
            NOT_HELD.clone_into(why);
        }
        (err, news)
    }

    /// After a renewal acknowledged by `acks` (a `WAIT`'s outcome): sets
    /// `durable`, and the callback to tell when it was not.
    pub(crate) fn renewed(
        &mut self,
        kind: &Kind,
        acks: redis::RedisResult<i64>,
    ) -> Option<(OnLost, Error)> {
        let err = match acks {
            Ok(n) if n >= i64::from(self.replicas) => {
                self.durable = Some(true);
                return None;
            }
            Ok(n) => Error::NotDurable {
                keys: kind.keys(),
                token: self.token(),
                acknowledged: n,
                replicas: self.replicas,
            },
            Err(e) => Error::Redis(e),
        };
        self.durable = Some(false);
        self.on_not_durable.clone().map(|f| (f, err))
    }
}

impl Holding {
    /// After a watchdog's pass (`renew`: `LOCK.KEEPALIVE` or `LOCK.RENEW`
    /// sent; else a check) sent at `sent`: `result` is `None` while held,
    /// else why not; `acks` a `WAIT`'s outcome. `news` set: the watchdog ends.
    pub(crate) fn after_pass(
        &mut self,
        kind: &Kind,
        result: redis::RedisResult<Option<&'static str>>,
        renew: bool,
        sent: Instant,
        acks: Option<redis::RedisResult<i64>>,
    ) -> After {
        let mut after = After::default();
        match result {
            Ok(None) if !renew => {}
            Ok(None) => {
                self.valid_until = sent + self.ttl;
                // From the send, not from now: a `WAIT` for replicas that
                // ran its timeout (a replica down) does not push the next
                // renewal back (a timeout above two thirds of the ttl lost
                // the lease).
                self.next_renewal = sent + tick(self.ttl);
                after.notice = acks.and_then(|a| self.renewed(kind, a));
            }
            Ok(Some(why)) => after.news = self.set_lost(kind, why),
            Err(e) if self.bound => {
                after.close = true;
                after.news = self.set_lost(kind, &bound_failed(&e));
            }
            Err(e) => {
                after.close = true;
                if Instant::now() + Duration::from_millis(1) >= self.valid_until {
                    let why = format!("renewals failed until the lease ran out ({e})");
                    after.news = self.set_lost(kind, &why);
                } else {
                    // Unbound: reconnect and try again soon, while the lease lasts.
                    let soon = tick(self.ttl).min(Duration::from_secs(1));
                    self.next_renewal = Instant::now() + soon;
                }
            }
        }
        after
    }

    /// After an extend to `ttl` sent at `sent`: `Ok` with what to do, or the
    /// error to return (with what to do first).
    pub(crate) fn after_extend(
        &mut self,
        kind: &Kind,
        result: redis::RedisResult<Option<&'static str>>,
        ttl: Duration,
        sent: Instant,
        acks: Option<redis::RedisResult<i64>>,
    ) -> (After, Result<(), Error>) {
        let mut after = After::default();
        match result {
            Ok(None) => {
                after.notice = acks.and_then(|a| self.renewed(kind, a));
                self.ttl = ttl;
                self.valid_until = sent + ttl;
                self.next_renewal = sent + tick(ttl); // (as after a renewal)
                after.wake = true;
                return (after, Ok(()));
            }
            Ok(Some(why)) => after.news = self.set_lost(kind, why),
            Err(e) if self.bound => {
                after.close = true;
                after.news = self.set_lost(kind, &bound_failed(&e));
            }
            Err(e) if Instant::now() >= self.valid_until => {
                after.close = true;
                after.news = self.set_lost(kind, &format!("the renewal failed ({e})"));
            }
            Err(e) => return (after, Err(e.into())),
        }
        (after, Err(self.lost_error(kind)))
    }

    /// A re-acquire's reply (the tokens granted, `None` when refused), sent
    /// at `sent`.
    pub(crate) fn reacquired(
        &mut self,
        kind: &Kind,
        tokens: Option<Vec<i64>>,
        sent: Instant,
    ) -> Reacquired {
        match tokens {
            Some(t) if t == self.tokens => {
                self.holds += 1;
                if self.session.is_none() {
                    // (a session's lock: the session's deadline stands)
                    self.valid_until = sent + self.ttl;
                }
                Reacquired::Held
            }
            Some(other) => Reacquired::Stale(
                other,
                self.set_lost(kind, "the lease ended before the re-acquire"),
            ),
            None => Reacquired::Refused,
        }
    }

    /// After a release was sent: its outcome; the error it is, if any.
    pub(crate) fn after_release(
        &mut self,
        kind: &Kind,
        outcome: redis::RedisResult<Released>,
    ) -> (After, Result<(), Error>) {
        let mut after = After::default();
        let mut result = Ok(());
        match outcome {
            Ok(Released::Gone(why)) => {
                after.news = self.set_lost(kind, why);
                self.holds = 0;
                after.close = true;
            }
            Ok(Released::All) => self.holds = 0,
            Ok(Released::OneHold) => after.wake = true,
            Err(e) => {
                self.holds = 0;
                after.close = true; // closing it frees a bound lock
                if self.lost.is_none() {
                    result = Err(e.into());
                }
            }
        }
        (after, result)
    }
}

/// Calls the callback, if any, with its error (outside any lock).
pub(crate) fn tell(news: Option<(OnLost, Error)>) {
    if let Some((f, err)) = news {
        f(&err);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Options;

    /// A renewal sent 2.5 s ago whose `WAIT` for a replica (down) ran a
    /// 2.5 s timeout, on a 3 s lease: the next renewal is due now (a third
    /// of the ttl after the send), before the lease ends; counted from the
    /// `WAIT`'s end, it came after the lease had ended.
    #[test]
    fn a_long_wait_for_replicas_does_not_push_the_next_renewal_back() {
        let ttl = Duration::from_millis(3000);
        let opts = Options {
            ttl,
            replicas: 1,
            replicas_timeout: Duration::from_millis(2500),
            ..Options::default()
        };
        let mut h = Holding::new(&opts);
        h.holds = 1;
        h.tokens = vec![7];
        h.replicas = 1;
        h.replicas_timeout = opts.replicas_timeout;
        h.durable = Some(true);
        let kind = Kind::Exclusive(b"k".to_vec());
        let sent = Instant::now()
            .checked_sub(Duration::from_millis(2500))
            .expect("the monotonic clock is past 2.5 s");
        let after = h.after_pass(&kind, Ok(None), true, sent, Some(Ok(0)));
        assert!(after.news.is_none() && h.lost.is_none(), "not lost");
        assert_eq!(h.durable, Some(false), "not acknowledged");
        assert_eq!(h.valid_until, sent + ttl);
        assert_eq!(h.next_renewal, sent + tick(ttl));
        assert!(h.next_renewal <= Instant::now(), "due at once");
        assert!(h.next_renewal < h.valid_until);
        // An extend's the same way.
        let (after, r) = h.after_extend(&kind, Ok(None), ttl, sent, Some(Ok(1)));
        assert!(r.is_ok() && after.news.is_none());
        assert_eq!(h.durable, Some(true));
        assert_eq!(h.next_renewal, sent + tick(ttl));
    }
}
