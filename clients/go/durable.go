package redislock

import (
	"errors"
	"fmt"
	"time"

	"github.com/gomodule/redigo/redis"
)

// ErrNotDurable: fewer replicas than WithReplicas asked for acknowledged a
// grant (WAIT) within its timeout. Acquire releases the grant and returns a
// *NotDurableError (errors.Is(err, ErrNotDurable)), unless
// WithAllowNotDurable; a renewal not acknowledged is told to
// WithOnNotDurable's callback (the lease is kept).
var ErrNotDurable = errors.New("redislock: not durable")

// NotDurableError is the ErrNotDurable of one grant or renewal.
type NotDurableError struct {
	Keys         []string
	Token        int64
	Acknowledged int // WAIT's reply
	Replicas     int // asked for
	Renewal      bool
}

func (e *NotDurableError) Error() string {
	what := "grant"
	if e.Renewal {
		what = "renewal"
	}
	return fmt.Sprintf("redislock: %s on %s (token %d) acknowledged by %d of %d replicas within the timeout: a failover may lose it",
		what, showKeys(e.Keys), e.Token, e.Acknowledged, e.Replicas)
}

// Unwrap makes errors.Is(err, ErrNotDurable) true.
func (e *NotDurableError) Unwrap() error { return ErrNotDurable }

// WithReplicas makes every grant, and every renewal, durable or known not
// to be: `WAIT n timeout` right after it on the connection that carried it
// (the grant, LOCK.KEEPALIVE on a bound connection, LOCK.RENEW unbound, an
// Extend), so it covers it; that call's read timeout is the client's plus
// timeout. A grant fewer replicas acknowledged is released and Acquire
// returns a *NotDurableError (or, WithAllowNotDurable, the Held with
// Durable() false); a renewal fewer acknowledged keeps the lease, turns
// Durable() false and calls WithOnNotDurable's callback. In a Session
// (NewSession(ctx, WithReplicas(..))) the session's renewals wait for it.
func WithReplicas(n int, timeout time.Duration) Option {
	return func(s *settings) {
		if n < 0 || (n > 0 && timeout < time.Millisecond) {
			s.err = invalid("WithReplicas(%d, %v): a count >= 0 and a timeout of at least 1 ms", n, timeout)
		}
		s.replicas, s.replicasTimeout = n, timeout
	}
}

// WithAllowNotDurable keeps a grant fewer replicas acknowledged than
// WithReplicas asked for, with Held.Durable() false, instead of releasing
// it with ErrNotDurable.
func WithAllowNotDurable() Option { return func(s *settings) { s.allowNotDurable = true } }

// WithOnNotDurable is called (on the keepalive goroutine) when a renewal of
// the lock is acknowledged by fewer replicas than WithReplicas asked for,
// with a *NotDurableError, or the WAIT's own error.
func WithOnNotDurable(f func(error)) Option { return func(s *settings) { s.onNotDurable = f } }

// Durable: with WithReplicas, whether the grant and the last renewal were
// each acknowledged by that many replicas; false without it.
func (h *Held) Durable() bool {
	h.errMu.Lock()
	defer h.errMu.Unlock()
	return h.durable
}

func (h *Held) setDurable(d bool) {
	h.errMu.Lock()
	h.durable = d
	h.errMu.Unlock()
}

// waitReplicas: `WAIT n timeout` on conn, how many acknowledged.
func (c *Client) waitReplicas(conn redis.Conn, n int, timeout time.Duration) (int, error) {
	return redis.Int(redis.DoWithTimeout(conn, c.timeout+timeout, "WAIT", n, millis(timeout)))
}

// confirm follows h's grant on conn (the one it went on) with WAIT when
// asked: nil when durable (or allowed not to be); else the grant's hold is
// given back on conn and the error returned.
func (l *Lock) confirm(conn redis.Conn, h *Held) error {
	if l.s.replicas == 0 {
		return nil
	}
	n, err := l.c.waitReplicas(conn, l.s.replicas, l.s.replicasTimeout)
	if err == nil && n >= l.s.replicas {
		h.setDurable(true)
		return nil
	}
	if err == nil && l.s.allowNotDurable {
		return nil
	}
	for _, k := range h.keys {
		_, _ = redis.DoWithTimeout(conn, l.c.timeout, "LOCK.RELEASE", k, h.owner)
	}
	if err != nil {
		return err
	}
	return &NotDurableError{Keys: h.keys, Token: h.token(), Acknowledged: n, Replicas: l.s.replicas}
}

// renewedLocked follows a renewal on s.conn with WAIT when one of the
// session's locks (or the session) asked for replicas (s.mu held).
func (s *binding) renewedLocked() {
	n, wait := s.replicas, s.replicasTimeout
	for h := range s.helds {
		if h.lock.s.replicas > n {
			n = h.lock.s.replicas
		}
		if h.lock.s.replicasTimeout > wait {
			wait = h.lock.s.replicasTimeout
		}
	}
	if n == 0 || s.conn == nil || len(s.helds) == 0 {
		return
	}
	acked, err := s.c.waitReplicas(s.conn, n, wait)
	for h := range s.helds {
		want := h.lock.s.replicas
		if want == 0 {
			want = s.replicas
		}
		if want == 0 {
			continue
		}
		if err == nil && acked >= want {
			h.setDurable(true)
			continue
		}
		h.setDurable(false)
		if f := h.lock.s.onNotDurable; f != nil {
			e := err
			if e == nil {
				e = &NotDurableError{Keys: h.keys, Token: h.token(), Acknowledged: acked, Replicas: want, Renewal: true}
			}
			f(e)
		}
	}
}
