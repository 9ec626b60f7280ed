package redislock

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"
)

// WithRetries sets how many more times RedLock.Acquire asks after a failed
// round (3 when not given).
func WithRetries(n int) Option {
	return func(s *settings) {
		if n < 0 {
			s.err = invalid("%d retries", n)
		}
		s.retries = n
	}
}

// WithRetryDelay sets the most RedLock waits between rounds (a random part
// of it; 200 ms when not given).
func WithRetryDelay(d time.Duration) Option {
	return func(s *settings) {
		if d <= 0 {
			s.err = invalid("retry delay %v", d)
		}
		s.retryDelay = d
	}
}

// RedLock is the RedLock algorithm over independent redis-lock servers:
// LOCK.ACQUIRE (no WAIT) on every server at once, held when a majority
// granted it with validity left (ttl minus the time spent asking minus
// drift); otherwise released everywhere and retried after a random delay.
// Each server asks within its Client's timeout, on a goroutine of its own:
// a stalled server costs that timeout once. Tokens are per server and not
// comparable across servers. No keepalive: Extend before Remaining runs out.
type RedLock struct {
	clients []*Client
	s       settings
}

// NewRedLock: options WithTTL, WithOwner, WithRetries, WithRetryDelay.
func NewRedLock(clients []*Client, opts ...Option) *RedLock {
	r := &RedLock{clients: append([]*Client(nil), clients...), s: defaults()}
	for _, o := range opts {
		o(&r.s)
	}
	return r
}

// RedLease is a quorum's grant.
type RedLease struct {
	Key   string
	Owner string
	TTL   time.Duration
	// Tokens: server index -> its token, for the servers that granted.
	Tokens     map[int]int64
	validUntil time.Time
	r          *RedLock
}

// Remaining is the validity left, on this process's monotonic clock.
func (l *RedLease) Remaining() time.Duration {
	d := time.Until(l.validUntil)
	if d < 0 {
		return 0
	}
	return d
}

func (r *RedLock) quorum() int { return len(r.clients)/2 + 1 }

// each runs cmd on every server at once.
func (r *RedLock) each(ctx context.Context, cmd string, args ...interface{}) []interface{} {
	out := make([]interface{}, len(r.clients))
	var wg sync.WaitGroup
	for i, c := range r.clients {
		wg.Add(1)
		go func(i int, c *Client) {
			defer wg.Done()
			reply, err := c.do(ctx, cmd, args...)
			if err != nil {
				out[i] = err
			} else {
				out[i] = reply
			}
		}(i, c)
	}
	wg.Wait()
	return out
}

// Acquire asks every server, up to 1 + retries rounds: a *RedLease, or
// ErrNotAcquired (what any server granted was released).
func (r *RedLock) Acquire(ctx context.Context, key string) (*RedLease, error) {
	if err := r.s.checkTTL(); err != nil {
		return nil, err
	}
	if len(r.clients) == 0 {
		return nil, invalid("no servers")
	}
	owner := r.s.owner
	if !r.s.ownerSet {
		owner = freshOwner()
	}
	ttl := millis(r.s.ttl)
	for round := 0; ; round++ {
		started := time.Now()
		replies := r.each(ctx, "LOCK.ACQUIRE", key, owner, ttl)
		tokens := map[int]int64{}
		for i, rep := range replies {
			if t, err := redis.Int64(rep, nil); err == nil {
				tokens[i] = t
			}
		}
		drift := time.Duration(float64(r.s.ttl)*r.s.drift) + 2*time.Millisecond
		validity := r.s.ttl - time.Since(started) - drift
		if len(tokens) >= r.quorum() && validity > 0 {
			return &RedLease{Key: key, Owner: owner, TTL: r.s.ttl, Tokens: tokens,
				validUntil: started.Add(validity), r: r}, nil
		}
		// Everywhere, also where the reply was lost.
		r.each(context.Background(), "LOCK.RELEASE", key, owner)
		if round >= r.s.retries {
			return nil, fmt.Errorf("%w: %q on %d of %d servers (quorum %d)",
				ErrNotAcquired, key, len(tokens), len(r.clients), r.quorum())
		}
		delay := time.Duration(rand.Int63n(int64(r.s.retryDelay)) + 1)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
	}
}

// Extend renews the lease on every server for ttl; an ErrLeaseLost error
// when fewer than a majority renewed it (it is then released everywhere).
func (l *RedLease) Extend(ctx context.Context, ttl time.Duration) error {
	if ttl < time.Millisecond {
		return invalid("ttl %v is below 1 ms", ttl)
	}
	started := time.Now()
	replies := l.r.each(ctx, "LOCK.RENEW", l.Key, l.Owner, millis(ttl))
	n := 0
	for _, rep := range replies {
		if v, err := redis.Int(rep, nil); err == nil && v == 1 {
			n++
		}
	}
	drift := time.Duration(float64(ttl)*l.r.s.drift) + 2*time.Millisecond
	validity := ttl - time.Since(started) - drift
	if n < l.r.quorum() || validity <= 0 {
		l.r.each(context.Background(), "LOCK.RELEASE", l.Key, l.Owner)
		return &LeaseLostError{Keys: []string{l.Key}, Token: 0,
			Why: fmt.Sprintf("renewed on %d of %d servers (quorum %d)", n, len(l.r.clients), l.r.quorum())}
	}
	l.TTL = ttl
	l.validUntil = started.Add(validity)
	return nil
}

// Release releases on every server; an ErrLeaseLost error when fewer than
// a majority still held it.
func (l *RedLease) Release(ctx context.Context) error {
	replies := l.r.each(ctx, "LOCK.RELEASE", l.Key, l.Owner)
	n := 0
	for _, rep := range replies {
		if v, err := redis.Int(rep, nil); err == nil && v >= 0 {
			n++
		}
	}
	if n < l.r.quorum() {
		return &LeaseLostError{Keys: []string{l.Key},
			Why: fmt.Sprintf("held on %d of %d servers at the release (quorum %d)", n, len(l.r.clients), l.r.quorum())}
	}
	return nil
}
