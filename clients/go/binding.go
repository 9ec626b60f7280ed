package redislock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"
)

// binding is one connection to one server with one keepalive goroutine on
// it: every lock in it is bound to that connection (BIND), and one
// `LOCK.KEEPALIVE ttl` every ttl/3 renews them all, however many they are.
// When the connection fails, the server frees every lock it held: they are
// all lost, done is closed, and the binding is over.
//
// Without a Session, each acquisition gets a binding of its own (one
// connection, one keepalive goroutine; private), closed with its release:
// a stalled server or a slow renewal holds up nothing but that lock
// (WithBind(false): no BIND, LOCK.RENEW on it, a failed connection
// redialled while the lease lasts). A Session made WithBind(true) is a
// shared binding: many locks on one bound connection.
type binding struct {
	c       *Client
	ttl     time.Duration
	bind    bool
	private bool
	// WithReplicas given to NewSession: its renewals wait for that many.
	replicas        int
	replicasTimeout time.Duration
	// WithOnLost given to NewSession.
	onLost func(*Held, error)

	mu    sync.Mutex // the connection, helds, closed
	conn  redis.Conn // nil when not bound and waiting to reconnect
	helds map[*Held]struct{}

	closed   bool
	stop     chan struct{}
	stopOnce sync.Once
	started  bool
	loopDone chan struct{}
	done     chan struct{}
	doneOnce sync.Once
	// check: the watcher saw a key of this binding change (buffered 1).
	check chan struct{}
}

func (c *Client) newBinding(ctx context.Context, ttl time.Duration, bind, private bool) (*binding, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	return &binding{
		c: c, ttl: ttl, bind: bind, private: private,
		conn:     conn,
		helds:    map[*Held]struct{}{},
		stop:     make(chan struct{}),
		loopDone: make(chan struct{}),
		done:     make(chan struct{}),
		check:    make(chan struct{}, 1),
	}, nil
}

// Close ends the binding: the keepalive stops, the locks still held in it
// are released (a bound connection's close frees them in the server; without
// BIND each gets LOCK.RELEASE), and the connection is closed. The locks'
// Lost channels are closed, their Err is ErrClosed.
func (s *binding) Close() error {
	s.stopLoop()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	var first error
	if !s.bind && s.conn != nil {
		for h := range s.helds {
			for i, k := range h.keys {
				for j := 0; j < 1000; j++ { // every hold of a reentrant lock
					n, err := redis.Int(redis.DoWithTimeout(s.conn, s.c.timeout, "LOCK.RELEASE", k, h.owner, "TOKEN", h.tokens[i]))
					if err != nil || n == 1 {
						if err != nil && err != redis.ErrNil && first == nil {
							first = err
						}
						break
					}
				}
			}
		}
	}
	for h := range s.helds {
		s.forgetLocked(h)
		h.markLost(ErrClosed)
	}
	s.closeLocked()
	return first
}

// closeLocked closes the connection and ends the session (s.mu held).
func (s *binding) closeLocked() {
	s.closed = true
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
	s.doneOnce.Do(func() { close(s.done) })
}

func (s *binding) start() {
	s.started = true
	go s.loop()
}

func (s *binding) stopLoop() {
	s.stopOnce.Do(func() { close(s.stop) })
	if s.started {
		<-s.loopDone
	}
}

func (s *binding) period() time.Duration {
	p := s.ttl / 3
	if p < time.Millisecond {
		p = time.Millisecond
	}
	return p
}

// loop renews every third of the ttl until stopped or the session is over.
func (s *binding) loop() {
	defer close(s.loopDone)
	t := time.NewTimer(s.period())
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-s.done:
			return
		case <-s.check:
			s.mu.Lock()
			s.verifyLocked()
			s.mu.Unlock()
			continue
		case <-t.C:
		}
		// The next renewal a third of the ttl after this one was sent, not
		// after its WAIT for replicas: one that ran its timeout (a replica
		// down) would push it back by as much, past the lease's end for a
		// timeout above two thirds of the ttl.
		sent := time.Now()
		s.mu.Lock()
		if !s.closed {
			s.renewLocked()
		}
		p := s.period() - time.Since(sent)
		s.mu.Unlock()
		if p < 0 {
			p = 0
		}
		t.Reset(p)
	}
}

// poke tells the keepalive goroutine to check the session's locks now
// (the watcher saw one of its keys change, or the watcher failed).
func (s *binding) poke() {
	select {
	case s.check <- struct{}{}:
	default: // a check is already due
	}
}

// verifyLocked (s.mu held): reads every lock of the session on its own
// connection (LOCK.INFO, one round trip: a check changes nothing, so it
// sets off no invalidation of its own) and drops each one its grant no
// longer holds, with the cause: the bound connection closed (CLIENT KILL,
// the server's timeout, a restart), the key overwritten, deleted or freed
// elsewhere, or the owner name granted again under another token.
func (s *binding) verifyLocked() {
	if s.closed || !s.bind || s.conn == nil || len(s.helds) == 0 {
		return
	}
	s.loseExpired(time.Now())
	if s.closed || s.conn == nil {
		return
	}
	type probe struct {
		h     *Held
		key   string
		token int64
	}
	var probes []probe
	for h := range s.helds {
		for i, k := range h.keys {
			if err := s.conn.Send("LOCK.INFO", k); err != nil {
				s.failLocked(fmt.Sprintf("the connection the lock was bound to failed: %v", err))
				return
			}
			probes = append(probes, probe{h, k, h.tokens[i]})
		}
	}
	replies, err := redis.Values(redis.DoWithTimeout(s.conn, s.c.timeout, ""))
	if err != nil || len(replies) != len(probes) {
		s.failLocked(fmt.Sprintf("the connection the lock was bound to was closed or failed (the server frees a bound lock with it): %v", err))
		return
	}
	for i, p := range probes {
		if _, still := s.helds[p.h]; !still {
			continue
		}
		if why := judge(replies[i], p.key, p.h.owner, p.token); why != "" {
			s.dropLost(p.h, why)
		}
	}
	if s.private && len(s.helds) == 0 {
		s.closeLocked()
		return
	}
	if len(s.helds) > 0 {
		s.c.rewatch(context.Background())
	}
}

// judge: why LOCK.INFO's reply on key says that (owner, token) no longer
// holds it; "" when it does (or the reply is another error: the renewals
// decide).
func judge(reply interface{}, key, owner string, token int64) string {
	if re, ok := reply.(redis.Error); ok {
		if isWrongType(re) {
			return fmt.Sprintf("key %q overwritten (no longer a lock: %v)", key, re)
		}
		return ""
	}
	if reply == nil {
		return fmt.Sprintf("key %q deleted, freed or expired (LOCK.INFO: free)", key)
	}
	if holds(reply, owner, token) {
		return ""
	}
	if holds(reply, owner, 0) {
		return fmt.Sprintf("key %q held by the same owner name under a newer grant: this grant (token %d) ended", key, token)
	}
	return fmt.Sprintf("key %q deleted or freed, and held by someone else now", key)
}

// leaseLeft: the shortest lease left among the session's locks, by this
// process's clock (ok false when it holds none).
func (s *binding) leaseLeft(now time.Time) (time.Duration, bool) {
	var left time.Duration
	ok := false
	for h := range s.helds {
		l := h.deadline.Sub(now)
		if !ok || l < left {
			left, ok = l, true
		}
	}
	return left, ok
}

// renewLocked: one keepalive round (s.mu held).
func (s *binding) renewLocked() {
	now := time.Now()
	to := s.c.timeout
	if left, ok := s.leaseLeft(now); ok {
		if left <= 0 {
			s.loseExpired(now)
			if s.bind {
				return
			}
		} else if left < to {
			to = left
		}
	}
	ttl := millis(s.ttl)
	if s.bind {
		n, err := redis.Int(redis.DoWithTimeout(s.conn, to, "LOCK.KEEPALIVE", ttl))
		if err != nil {
			s.failLocked(fmt.Sprintf("the connection the lock was bound to failed at the keepalive: %v", err))
			return
		}
		want := 0
		for h := range s.helds {
			want += len(h.keys)
		}
		if n >= want {
			for h := range s.helds {
				h.deadline = now.Add(s.ttl)
			}
			s.renewedLocked() // WAIT after LOCK.KEEPALIVE on its connection covers it
			return
		}
		// Fewer renewed than held: find which with LOCK.RENEW.
	}
	if s.conn == nil {
		conn, err := s.c.dial(context.Background())
		if err != nil {
			s.loseExpired(time.Now())
			return
		}
		s.conn = conn
	}
	for h := range s.helds {
	keys:
		for i, k := range h.keys {
			n, err := redis.Int(redis.DoWithTimeout(s.conn, to, "LOCK.RENEW", k, h.owner, ttl, "TOKEN", h.tokens[i]))
			switch {
			case err == nil && n == 1:
				continue
			case err == nil:
				s.dropLost(h, fmt.Sprintf("key %q no longer held by this grant (released elsewhere, expired, deleted, or granted again under another token)", k))
			case isWrongType(err):
				s.dropLost(h, fmt.Sprintf("key %q overwritten: %v", k, err))
			case isReplyError(err):
				s.dropLost(h, fmt.Sprintf("renewal refused: %v", err))
			case s.bind:
				s.failLocked(fmt.Sprintf("the connection the lock was bound to failed at the renewal: %v", err))
				return
			default: // not bound: reconnect at the next tick, while the lease lasts
				s.conn.Close()
				s.conn = nil
				s.loseExpired(time.Now())
				return
			}
			break keys
		}
		if _, still := s.helds[h]; still {
			h.deadline = now.Add(s.ttl)
		}
	}
	if s.private && len(s.helds) == 0 {
		s.closeLocked()
		return
	}
	s.renewedLocked()
}

// loseExpired drops the locks whose lease ran out before a renewal answered.
func (s *binding) loseExpired(now time.Time) {
	for h := range s.helds {
		if !h.deadline.After(now) {
			s.dropLost(h, "the lease ran out before a renewal answered")
		}
	}
	if s.private && len(s.helds) == 0 {
		s.closeLocked()
	}
}

func (s *binding) dropLost(h *Held, why string) {
	s.forgetLocked(h)
	err := &LeaseLostError{Keys: h.keys, Token: h.token(), Why: why}
	if h.markLost(err) && s.onLost != nil {
		go s.onLost(h, err) // s.mu is held here
	}
}

// addLocked: h is held in the session from now on (bound: watched).
func (s *binding) addLocked(ctx context.Context, h *Held) {
	s.helds[h] = struct{}{}
	if s.bind {
		s.c.watch(ctx, s, h)
	}
}

// forgetLocked: h is no longer held in the session.
func (s *binding) forgetLocked(h *Held) {
	if _, ok := s.helds[h]; !ok {
		return
	}
	delete(s.helds, h)
	if s.bind {
		s.c.unwatch(s, h.keys)
	}
}

// failLocked: the bound connection failed; the server frees (or freed)
// every lock bound to it, so all are lost and the session is over.
func (s *binding) failLocked(why string) {
	for h := range s.helds {
		s.dropLost(h, why)
	}
	s.closeLocked()
}
