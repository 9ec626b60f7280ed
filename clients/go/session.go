package redislock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"
)

// ErrNoSession: the server answered NOSESSION: the session a grant named
// has ended (its deadline passed unrenewed, or it was closed), or, for a
// waiter, ended while it waited. Every lock of the Session on that server
// is lost with it; the next Acquire in the Session opens a new one.
var ErrNoSession = errors.New("redislock: session ended")

// Session is a server session (LOCK.SESSION, etcd's lease, ZooKeeper's
// session): one lease that many locks share, renewed by one O(1)
// `LOCK.SESSION KEEPALIVE id ttl` every ttl/3, that outlives connections:
// a killed or reconnected connection loses nothing, since nothing is bound
// to a connection. It is opened lazily, on the server of the Client of the
// first lock acquired in it, and on each other server (cluster node) the
// first time a lock of that server's Client is acquired in it: one session
// id per server.
//
// Every Client has one keeper goroutine for all the sessions open on its
// server, running while there is one: at each session's ttl/3 it sends
// their keepalives (pipelined, one round trip) on the Client's pooled
// connections, never a bound one. A connection error is retried on a new
// connection until the session's deadline (the send time of the last
// acknowledged keepalive plus the ttl) passes unanswered.
//
// A session that ends (a keepalive answered 0, a grant answered NOSESSION,
// or its deadline passed: a local timer at the deadline, not the next
// keepalive) marks every lock in it on that server lost: Lost() closed,
// Err() a *LeaseLostError, and WithOnLost's callback called once per lock.
// The next lock acquired in the Session opens a new session id there.
//
// Close sends LOCK.SESSION CLOSE on every server it opened: its locks end
// at once and are reported released (Err() is ErrClosed, the callback is
// not called); defer it. Its methods are safe for concurrent use.
//
// NewSession(ctx, WithBind(true)) makes the older kind instead: one bound
// connection (BIND) and one LOCK.KEEPALIVE for all its locks, which the
// server frees the moment that connection closes (the process dies, or a
// reconnect): for locks that must not outlive the process's connection,
// or a server without LOCK.SESSION.
type Session struct {
	c      *Client
	ttl    time.Duration
	onLost func(*Held, error)
	bound  *binding // WithBind(true)

	openMu sync.Mutex // one OPEN at a time
	mu     sync.Mutex // nodes, closed, and each node's state
	nodes  map[*Client]*nodeSession
	closed bool
	done   chan struct{}
}

// nodeSession is a Session's session id on one server (s.mu guards it).
type nodeSession struct {
	s        *Session
	c        *Client
	id       int64
	deadline time.Time // last acknowledged send + ttl, by this clock
	timer    *time.Timer
	ended    bool
	helds    map[*Held]struct{}
	// checking: a check goroutine runs; recheck: poked meanwhile.
	checking, recheck bool
}

// WithOnLost, given to NewSession, is called once for each lock of the
// Session that is lost (the session ended, or the lock ended behind its
// back: deleted, overwritten, released elsewhere; WithBind(true): its
// connection failed), with the lock and its *LeaseLostError, on a
// goroutine of the package, after Lost() is closed. Never for a release
// or Close.
func WithOnLost(f func(h *Held, err error)) Option {
	return func(s *settings) { s.onLost = f }
}

// NewSession makes a Session on c's server (and on other Clients' servers
// as their locks join it). Options: WithTTL (the session's lease,
// DefaultTTL when not given; its locks' own WithTTL is not used),
// WithOnLost, WithBind(true) (a bound connection instead, see Session;
// with WithReplicas for its keepalives). Nothing is sent before the first
// lock (WithBind(true): it connects now).
func (c *Client) NewSession(ctx context.Context, opts ...Option) (*Session, error) {
	st := defaults()
	for _, o := range opts {
		o(&st)
	}
	if err := st.checkTTL(); err != nil {
		return nil, err
	}
	if st.session != nil || st.ownerSet || st.wait != 0 {
		return nil, invalid("NewSession takes WithTTL, WithOnLost, WithBind and WithReplicas only")
	}
	bound := st.bindSet && st.bind
	if st.replicas != 0 && !bound {
		return nil, invalid("WithReplicas on a NewSession is for WithBind(true); give it to the locks")
	}
	s := &Session{c: c, ttl: st.ttl, onLost: st.onLost, nodes: map[*Client]*nodeSession{}, done: make(chan struct{})}
	if bound {
		b, err := c.newBinding(ctx, st.ttl, true, false)
		if err != nil {
			return nil, err
		}
		b.replicas, b.replicasTimeout, b.onLost = st.replicas, st.replicasTimeout, st.onLost
		b.start()
		s.bound = b
		s.done = b.done
	}
	return s, nil
}

// TTL is the session's lease.
func (s *Session) TTL() time.Duration { return s.ttl }

// Bound reports whether the Session is a bound connection (WithBind(true)).
func (s *Session) Bound() bool { return s.bound != nil }

// Done is closed when the Session is closed (WithBind(true): or its
// connection failed). A server session that ends is not Done: the next
// lock opens another.
func (s *Session) Done() <-chan struct{} { return s.done }

// ID is the session's id on c's server, 0 when none is open there.
func (s *Session) ID(c *Client) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ns := s.nodes[c]; ns != nil && !ns.ended {
		return ns.id
	}
	return 0
}

// Close ends the Session: LOCK.SESSION CLOSE on every server it opened,
// which ends its locks there at once (waiters are granted); they are
// reported released (Lost() closed, Err() ErrClosed, no WithOnLost call).
// An Acquire in a closed Session is ErrClosed. The first error of a CLOSE
// is returned (the session then ends at its deadline on that server).
func (s *Session) Close() error {
	if s.bound != nil {
		return s.bound.Close()
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	var nodes []*nodeSession
	var helds []*Held
	for _, ns := range s.nodes {
		ns.ended = true
		ns.timer.Stop()
		nodes = append(nodes, ns)
		for h := range ns.helds {
			h.released = true
			helds = append(helds, h)
			ns.c.unwatch(ns, h.keys)
		}
		ns.helds = nil
	}
	s.nodes = nil
	s.mu.Unlock()
	var first error
	for _, ns := range nodes {
		ns.c.unkeep(ns)
		if _, err := ns.c.doRetry(context.Background(), "LOCK.SESSION", "CLOSE", ns.id); err != nil && first == nil {
			first = err
		}
	}
	for _, h := range helds {
		h.markLost(ErrClosed)
	}
	close(s.done)
	return first
}

// period: a keepalive every third of the ttl.
func (s *Session) period() time.Duration {
	p := s.ttl / 3
	if p < time.Millisecond {
		p = time.Millisecond
	}
	return p
}

// retry: how soon a keepalive that met a connection error is sent again.
func (s *Session) retry() time.Duration {
	r := s.ttl / 10
	if r > 100*time.Millisecond {
		r = 100 * time.Millisecond
	}
	if r < 5*time.Millisecond {
		r = 5 * time.Millisecond
	}
	return r
}

// node: the session on c's server, opened (LOCK.SESSION OPEN) if none is.
func (s *Session) node(ctx context.Context, c *Client) (*nodeSession, error) {
	s.openMu.Lock()
	defer s.openMu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	if ns := s.nodes[c]; ns != nil && !ns.ended {
		s.mu.Unlock()
		return ns, nil
	}
	s.mu.Unlock()
	sent := time.Now()
	id, err := redis.Int64(c.doRetry(ctx, "LOCK.SESSION", "OPEN", millis(s.ttl)))
	if err != nil {
		return nil, err
	}
	ns := &nodeSession{s: s, c: c, id: id, deadline: sent.Add(s.ttl), helds: map[*Held]struct{}{}}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_, _ = c.doRetry(context.Background(), "LOCK.SESSION", "CLOSE", id)
		return nil, ErrClosed
	}
	s.nodes[c] = ns
	ns.timer = time.AfterFunc(time.Until(ns.deadline), ns.expire)
	s.mu.Unlock()
	c.keep(ns, sent.Add(s.period()))
	return ns, nil
}

// expire: the deadline timer. Ends the session unless a keepalive moved
// the deadline meanwhile.
func (ns *nodeSession) expire() {
	s := ns.s
	s.mu.Lock()
	if ns.ended {
		s.mu.Unlock()
		return
	}
	if left := time.Until(ns.deadline); left > 0 {
		ns.timer.Reset(left)
		s.mu.Unlock()
		return
	}
	lost := ns.endLocked(fmt.Sprintf("session %d: no keepalive acknowledged before its deadline (ttl %v)", ns.id, s.ttl))
	s.mu.Unlock()
	s.tell(lost)
	// A keepalive still on its way may have renewed it on the server: end
	// it there too, so that nothing stays held that was told lost.
	go func() { _, _ = ns.c.doRetry(context.Background(), "LOCK.SESSION", "CLOSE", ns.id) }()
}

// acked: a keepalive sent at sent was answered 1.
func (ns *nodeSession) acked(sent time.Time) {
	s := ns.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if ns.ended {
		return
	}
	if d := sent.Add(s.ttl); d.After(ns.deadline) {
		ns.deadline = d
		ns.timer.Reset(time.Until(d))
	}
}

// end: the session ended on the server (why); its locks are lost.
func (ns *nodeSession) end(why string) {
	s := ns.s
	s.mu.Lock()
	lost := ns.endLocked(why)
	s.mu.Unlock()
	s.tell(lost)
}

type lostLock struct {
	h   *Held
	err error
}

// endLocked (s.mu held): ends ns, drops it from the Session and the
// keeper, marks its locks lost; the callbacks are for the caller to make
// (tell) once s.mu is let go.
func (ns *nodeSession) endLocked(why string) []lostLock {
	if ns.ended {
		return nil
	}
	ns.ended = true
	ns.timer.Stop()
	s := ns.s
	if s.nodes[ns.c] == ns {
		delete(s.nodes, ns.c)
	}
	ns.c.unkeep(ns)
	var lost []lostLock
	for h := range ns.helds {
		ns.c.unwatch(ns, h.keys)
		err := &LeaseLostError{Keys: h.keys, Token: h.token(), Why: why}
		if h.markLost(err) {
			lost = append(lost, lostLock{h, err})
		}
	}
	ns.helds = map[*Held]struct{}{}
	return lost
}

// dropLocked (s.mu held): h alone is lost (why).
func (ns *nodeSession) dropLocked(h *Held, why string) []lostLock {
	if _, ok := ns.helds[h]; !ok {
		return nil
	}
	ns.forgetLocked(h)
	err := &LeaseLostError{Keys: h.keys, Token: h.token(), Why: why}
	if h.markLost(err) {
		return []lostLock{{h, err}}
	}
	return nil
}

// forgetLocked (s.mu held): h is no longer held in ns.
func (ns *nodeSession) forgetLocked(h *Held) {
	if _, ok := ns.helds[h]; ok {
		delete(ns.helds, h)
		ns.c.unwatch(ns, h.keys)
	}
}

// poke: the watcher saw a key of ns change (or ended): a check, on a
// goroutine of its own (one at a time; a poke during it runs another).
func (ns *nodeSession) poke() {
	s := ns.s
	s.mu.Lock()
	if ns.ended || len(ns.helds) == 0 {
		s.mu.Unlock()
		return
	}
	if ns.checking {
		ns.recheck = true
		s.mu.Unlock()
		return
	}
	ns.checking = true
	s.mu.Unlock()
	go func() {
		for {
			ns.check()
			s.mu.Lock()
			again := ns.recheck && !ns.ended
			ns.recheck = false
			ns.checking = again
			s.mu.Unlock()
			if !again {
				break
			}
		}
		ns.c.rewatch(context.Background())
	}()
}

// check reads, in one round trip on a pooled connection, the session
// (LOCK.SESSION INFO: nil when it ended on the server: closed elsewhere, or
// its deadline passed there) and every key of its locks (LOCK.INFO), and
// tells what ended with its cause. A connection error tells nothing: the
// keeper and the deadline decide.
func (ns *nodeSession) check() {
	s := ns.s
	type probe struct {
		h     *Held
		key   string
		token int64
	}
	var probes []probe
	s.mu.Lock()
	if ns.ended {
		s.mu.Unlock()
		return
	}
	id := ns.id
	for h := range ns.helds {
		if h.releasing {
			continue
		}
		for i, k := range h.keys {
			probes = append(probes, probe{h, k, h.tokens[i]})
		}
	}
	s.mu.Unlock()
	conn, err := ns.c.pool.GetContext(context.Background())
	if err != nil {
		return
	}
	defer conn.Close()
	if err := conn.Send("LOCK.SESSION", "INFO", id); err != nil {
		return
	}
	for _, p := range probes {
		if err := conn.Send("LOCK.INFO", p.key); err != nil {
			return
		}
	}
	replies, err := redis.Values(redis.DoWithTimeout(conn, ns.c.timeout, ""))
	if err != nil || len(replies) != len(probes)+1 {
		return
	}
	if replies[0] == nil {
		ns.end(fmt.Sprintf("session %d ended on the server (closed elsewhere, or its deadline passed there)", id))
		return
	}
	if _, failed := replies[0].(redis.Error); failed {
		return
	}
	var lost []lostLock
	s.mu.Lock()
	for i, p := range probes {
		if _, still := ns.helds[p.h]; !still || p.h.releasing {
			continue
		}
		if why := judge(replies[i+1], p.key, p.h.owner, p.token); why != "" {
			lost = append(lost, ns.dropLocked(p.h, why)...)
		}
	}
	s.mu.Unlock()
	s.tell(lost)
}

// tell calls WithOnLost's callback for each lock lost.
func (s *Session) tell(lost []lostLock) {
	if s.onLost == nil {
		return
	}
	for _, l := range lost {
		s.onLost(l.h, l.err)
	}
}

// isNoSession: the server's NOSESSION error.
func isNoSession(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(string(re), "NOSESSION")
}

// doRetry runs one command on a pooled connection; on a connection error
// (a pooled connection killed while idle) once more on a new connection.
func (c *Client) doRetry(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	r, err := c.do(ctx, cmd, args...)
	if err == nil || isReplyError(err) || err == redis.ErrNil || ctx.Err() != nil {
		return r, err
	}
	conn, derr := c.dial(ctx)
	if derr != nil {
		return nil, err
	}
	defer conn.Close()
	return redis.DoWithTimeout(conn, c.timeout, cmd, args...)
}

// keep adds ns to c's keeper (started if it is not running), its first
// keepalive due at due.
func (c *Client) keep(ns *nodeSession, due time.Time) {
	c.kmu.Lock()
	defer c.kmu.Unlock()
	if c.kept == nil {
		c.kept = map[*nodeSession]time.Time{}
		c.kwake = make(chan struct{}, 1)
	}
	c.kept[ns] = due
	if !c.krunning {
		c.krunning = true
		go c.keepLoop()
		return
	}
	select {
	case c.kwake <- struct{}{}:
	default:
	}
}

// unkeep: ns is no longer kept alive (the keeper stops after the last).
func (c *Client) unkeep(ns *nodeSession) {
	c.kmu.Lock()
	delete(c.kept, ns)
	if len(c.kept) == 0 && c.krunning {
		select { // it exits now, not at its next due time
		case c.kwake <- struct{}{}:
		default:
		}
	}
	c.kmu.Unlock()
}

// keepLoop: the Client's keeper, while it keeps a session.
func (c *Client) keepLoop() {
	for {
		c.kmu.Lock()
		if len(c.kept) == 0 {
			c.krunning = false
			c.kmu.Unlock()
			return
		}
		now := time.Now()
		var due []*nodeSession
		var next time.Time
		for ns, d := range c.kept {
			if !d.After(now) {
				due = append(due, ns)
			} else if next.IsZero() || d.Before(next) {
				next = d
			}
		}
		c.kmu.Unlock()
		if len(due) > 0 {
			c.keepalive(due)
			continue
		}
		t := time.NewTimer(time.Until(next))
		select {
		case <-t.C:
		case <-c.kwake:
			t.Stop()
		}
	}
}

// keepalive sends `LOCK.SESSION KEEPALIVE id ttl` for each of due, in one
// round trip on a pooled connection, and files the answers.
func (c *Client) keepalive(due []*nodeSession) {
	ids := make([]int64, len(due))
	for i, ns := range due {
		ns.s.mu.Lock()
		ids[i] = ns.id
		ns.s.mu.Unlock()
	}
	send := func(conn redis.Conn) ([]interface{}, error) {
		defer conn.Close()
		for i, ns := range due {
			if err := conn.Send("LOCK.SESSION", "KEEPALIVE", ids[i], millis(ns.s.ttl)); err != nil {
				return nil, err
			}
		}
		replies, err := redis.Values(redis.DoWithTimeout(conn, c.timeout, ""))
		if err == nil && len(replies) != len(due) {
			err = fmt.Errorf("redislock: %d keepalive replies for %d", len(replies), len(due))
		}
		return replies, err
	}
	sent := time.Now()
	var replies []interface{}
	conn, err := c.pool.GetContext(context.Background())
	if err == nil {
		replies, err = send(conn)
	}
	if err != nil {
		// A pooled connection killed while idle (or the server's timeout):
		// at once again on a new connection.
		sent = time.Now()
		if conn, err = c.dial(context.Background()); err == nil {
			replies, err = send(conn)
		}
	}
	for i, ns := range due {
		next := sent.Add(ns.s.period())
		switch {
		case err != nil:
			// Reconnect and send again soon, until the deadline ends it.
			next = time.Now().Add(ns.s.retry())
		default:
			n, rerr := redis.Int(replies[i], nil)
			switch {
			case rerr == nil && n == 1:
				ns.acked(sent)
			case rerr == nil:
				ns.end(fmt.Sprintf("session %d ended on the server (LOCK.SESSION KEEPALIVE answered 0)", ids[i]))
				continue
			default: // an error reply (LOADING, READONLY, ...): again soon
				next = time.Now().Add(ns.s.retry())
			}
		}
		c.kmu.Lock()
		if _, ok := c.kept[ns]; ok {
			c.kept[ns] = next
		}
		c.kmu.Unlock()
	}
}

// acquireSession acquires in a server session: the grant with `SESSION id`
// and no BIND (a try on a pooled connection, a wait on a connection of its
// own); nothing renews it but the session.
func (l *Lock) acquireSession(ctx context.Context, s *Session, owner string, wait time.Duration) (*Held, error) {
	ns, err := s.node(ctx, l.c)
	if err != nil {
		return nil, err
	}
	name, args := l.command(owner, s.ttl)
	args = append(args, "SESSION", ns.id)
	var conn redis.Conn
	if wait == 0 {
		conn, err = l.c.pool.GetContext(ctx)
	} else {
		conn, err = l.c.dial(ctx)
	}
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var reply interface{}
	if wait == 0 {
		reply, err = redis.DoWithTimeout(conn, l.c.timeout, name, args...)
		if err != nil && !isReplyError(err) {
			// A grant may have crossed the failure: let it go.
			for _, k := range l.keys {
				_, _ = l.c.doRetry(context.Background(), "LOCK.RELEASE", k, owner)
			}
		}
		err = serverError(err)
	} else {
		reply, err = l.waitOn(ctx, conn, wait, owner, false, name, args)
	}
	if isNoSession(err) {
		ns.end(fmt.Sprintf("session %d ended (a grant in it was answered %v)", ns.id, err))
		return nil, fmt.Errorf("%w: %v", ErrNoSession, err)
	}
	if err != nil {
		return nil, err
	}
	if reply == nil {
		return nil, l.notAcquired()
	}
	h, err := l.held(nil, owner, reply, time.Time{})
	if err != nil {
		return nil, err
	}
	h.ns = ns
	if err := l.confirm(conn, h); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed // its CLOSE ended the grant
	}
	if ns.ended {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: session %d ended at the grant", ErrNoSession, ns.id)
	}
	ns.helds[h] = struct{}{}
	s.mu.Unlock()
	// Watched: a key changed elsewhere, or the session ended elsewhere, is
	// told at once (unwatched as it leaves ns.helds).
	l.c.watch(ctx, ns, h)
	s.mu.Lock()
	if _, still := ns.helds[h]; !still {
		l.c.unwatch(ns, h.keys) // it left while the watch was set up
	}
	s.mu.Unlock()
	return h, nil
}

// releaseSession: Release of a lock in a server session.
func (h *Held) releaseSession(ctx context.Context) error {
	ns := h.ns
	s := ns.s
	s.mu.Lock()
	if h.released {
		s.mu.Unlock()
		return fmt.Errorf("%w: released twice", ErrInvalid)
	}
	if err := h.Err(); err != nil {
		h.released = true
		s.mu.Unlock()
		return err
	}
	h.releasing = true // the watcher's check leaves it alone
	s.mu.Unlock()
	var lostWhy string
	last := true
	for i, k := range h.keys {
		n, err := redis.Int(h.lock.c.doRetry(ctx, "LOCK.RELEASE", k, h.owner, "TOKEN", h.tokens[i]))
		switch {
		case err == redis.ErrNil:
			lostWhy = fmt.Sprintf("key %q was no longer held by this grant at the release (its session ended, or released elsewhere, deleted, or granted again under another token)", k)
		case isWrongType(err):
			lostWhy = fmt.Sprintf("key %q overwritten: %v", k, err)
		case err != nil:
			s.mu.Lock()
			h.releasing = false
			s.mu.Unlock()
			return err
		case n == 0:
			last = false
		}
	}
	s.mu.Lock()
	h.releasing = false
	if err := h.Err(); err != nil { // the session ended meanwhile
		h.released = true
		s.mu.Unlock()
		return err
	}
	if lostWhy != "" {
		h.released = true
		lost := ns.dropLocked(h, lostWhy)
		s.mu.Unlock()
		s.tell(lost)
		return h.Err()
	}
	defer s.mu.Unlock()
	if last {
		ns.forgetLocked(h)
		h.released = true
		h.markLost(ErrClosed)
	} else {
		h.holds--
	}
	return nil
}

// reacquireSession: Reacquire of a lock in a server session (the grant
// again, with SESSION: answered at once, the same token).
func (h *Held) reacquireSession(ctx context.Context) error {
	ns := h.ns
	s := ns.s
	s.mu.Lock()
	if h.released {
		s.mu.Unlock()
		return fmt.Errorf("%w: released", ErrInvalid)
	}
	if err := h.Err(); err != nil {
		s.mu.Unlock()
		return err
	}
	s.mu.Unlock()
	name, args := h.lock.command(h.owner, s.ttl)
	args = append(args, "SESSION", ns.id)
	t, err := redis.Int64(h.lock.c.do(ctx, name, args...))
	if isNoSession(err) {
		ns.end(fmt.Sprintf("session %d ended (the reacquire was answered %v)", ns.id, err))
		return h.Err()
	}
	if err != nil && !isWrongType(err) && err != redis.ErrNil {
		return serverError(err)
	}
	s.mu.Lock()
	var lost []lostLock
	switch {
	case err != nil:
		lost = ns.dropLocked(h, fmt.Sprintf("at the reacquire: %v", err))
	case t != h.token():
		_, _ = h.lock.c.do(ctx, "LOCK.RELEASE", h.keys[0], h.owner, "TOKEN", t)
		lost = ns.dropLocked(h, fmt.Sprintf("the reacquire got token %d, not %d: this grant had ended", t, h.token()))
	default:
		h.holds++
	}
	s.mu.Unlock()
	s.tell(lost)
	if lost != nil {
		return h.Err()
	}
	return nil
}
