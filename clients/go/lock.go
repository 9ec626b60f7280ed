package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Option configures a Lock, a Session or a RedLock.
type Option func(*settings)

type settings struct {
	ttl      time.Duration
	wait     time.Duration
	owner    string
	ownerSet bool
	bind     bool
	bindSet  bool
	session  *Session
	onLost   func(*Held, error) // NewSession only
	// WithReplicas, WithAllowNotDurable, WithOnNotDurable.
	replicas        int
	replicasTimeout time.Duration
	allowNotDurable bool
	onNotDurable    func(error)
	// RedLock only.
	retries    int
	retryDelay time.Duration
	drift      float64
	err        error
}

func defaults() settings {
	return settings{ttl: DefaultTTL, bind: true, retries: 3, retryDelay: 200 * time.Millisecond, drift: 0.01}
}

func (s *settings) checkTTL() error {
	if s.err != nil {
		return s.err
	}
	if s.ttl < time.Millisecond {
		return invalid("ttl %v is below 1 ms", s.ttl)
	}
	return nil
}

// WithTTL sets the lease (DefaultTTL when not given): renewed every third
// of it while held, so a short lease is a fast recovery from a dead holder,
// not a limit on the work. In a Session, the Session's ttl applies.
func WithTTL(d time.Duration) Option { return func(s *settings) { s.ttl = d } }

// WithWait makes Acquire wait in the server (LOCK.* WAIT) up to d for a
// busy lock, or without limit with WaitForever. Without it Acquire tries
// once. The context's deadline, when sooner, bounds the wait too, and
// cancelling the context stops the wait in the server.
func WithWait(d time.Duration) Option {
	return func(s *settings) {
		if d < 0 && d != WaitForever {
			s.err = invalid("wait %v is negative (WaitForever waits without limit)", d)
		}
		s.wait = d
	}
}

// WithOwner gives the holder id (any bytes, non-empty) instead of a fresh
// random one per acquisition. Only for re-entrancy across calls: two
// acquisitions under one owner are one holder in the server.
func WithOwner(owner string) Option {
	return func(s *settings) {
		if owner == "" {
			s.err = invalid("an empty owner")
		}
		s.owner, s.ownerSet = owner, true
	}
}

// WithBind(false) acquires without BIND (through a proxy, or a server that
// refuses it): the lock outlives a dead connection until its lease ends,
// and the keepalive renews it with LOCK.RENEW. Bound by default, except in
// a Session (not given to its locks). NewSession(ctx, WithBind(true)): a
// bound-connection Session (see Session).
func WithBind(bind bool) Option { return func(s *settings) { s.bind, s.bindSet = bind, true } }

// WithSession acquires in sess, with its ttl: a server session's lock is
// granted with `SESSION id` and without BIND, and renewed by nothing but
// the session's keepalive (Extend is refused); a WithBind(true) Session's
// lock is bound to its connection and renewed by its LOCK.KEEPALIVE.
func WithSession(sess *Session) Option {
	return func(s *settings) {
		if sess == nil {
			s.err = invalid("a nil session")
		}
		s.session = sess
	}
}

// Kind is what a Lock takes.
type Kind int

const (
	KindExclusive Kind = iota // LOCK.ACQUIRE
	KindReentrant             // LOCK.RACQUIRE
	KindRead                  // LOCK.READ
	KindWrite                 // LOCK.RACQUIRE, the write side of a read-write lock
	KindSemaphore             // LOCK.SEMAPHORE
	KindMulti                 // LOCK.MACQUIRE
)

func (k Kind) String() string {
	return [...]string{"exclusive", "reentrant", "read", "write", "semaphore", "multi"}[k]
}

// Lock describes what to acquire: a kind, keys, options. Without
// WithOwner it holds no state of a holder: each Acquire is a new holder (a
// fresh owner), so one Lock may be shared by goroutines, each Acquire its
// own hold. WithOwner makes the Lock one holder (the server cannot tell two
// users of one owner name apart): while a Held of it is live (not released,
// not lost), or an Acquire of it is under way, another Acquire of the same
// Lock is refused at once with ErrHeld; add a hold with Held.Reacquire.
type Lock struct {
	c     *Client
	kind  Kind
	keys  []string
	limit int
	s     settings

	mu      sync.Mutex // WithOwner: the one holder
	busy    bool       // an Acquire under way
	current *Held
}

func (c *Client) newLock(kind Kind, keys []string, limit int, opts []Option) *Lock {
	l := &Lock{c: c, kind: kind, keys: keys, limit: limit, s: defaults()}
	for _, o := range opts {
		o(&l.s)
	}
	if l.s.err == nil {
		l.s.err = l.check()
	}
	return l
}

func (l *Lock) check() error {
	if err := l.s.checkTTL(); err != nil {
		return err
	}
	if len(l.keys) == 0 {
		return invalid("no key")
	}
	if len(l.keys) > 1000 {
		return invalid("%d keys (at most 1000)", len(l.keys))
	}
	seen := map[string]bool{}
	for _, k := range l.keys {
		if seen[k] {
			return invalid("key %q repeated", k)
		}
		seen[k] = true
	}
	if l.kind == KindSemaphore && (l.limit < 1 || l.limit > 1000000) {
		return invalid("a semaphore of %d permits (1 to 1000000)", l.limit)
	}
	if sess := l.s.session; sess != nil {
		if sess.bound != nil && sess.c != l.c {
			return invalid("a WithBind(true) session is on another Client")
		}
		if l.s.bindSet {
			return invalid("WithBind is for locks without a Session (or for NewSession)")
		}
	}
	return nil
}

// Exclusive: one holder at a time, not reentrant (LOCK.ACQUIRE).
func (c *Client) Exclusive(key string, opts ...Option) *Lock {
	return c.newLock(KindExclusive, []string{key}, 0, opts)
}

// Reentrant: one holder at a time; Held.Reacquire adds a hold, each Release
// removes one (LOCK.RACQUIRE).
func (c *Client) Reentrant(key string, opts ...Option) *Lock {
	return c.newLock(KindReentrant, []string{key}, 0, opts)
}

// Read: the shared side of a read-write lock (LOCK.READ; reentrant).
func (c *Client) Read(key string, opts ...Option) *Lock {
	return c.newLock(KindRead, []string{key}, 0, opts)
}

// Write: the exclusive side of a read-write lock (LOCK.RACQUIRE on the same
// key as Read; reentrant; writers are preferred to new readers).
func (c *Client) Write(key string, opts ...Option) *Lock {
	return c.newLock(KindWrite, []string{key}, 0, opts)
}

// Semaphore: one permit of limit (LOCK.SEMAPHORE); every holder must give
// the same limit.
func (c *Client) Semaphore(key string, limit int, opts ...Option) *Lock {
	return c.newLock(KindSemaphore, []string{key}, limit, opts)
}

// Multi: every key or none, atomically (LOCK.MACQUIRE); Held.Tokens has a
// token per key. In a cluster the keys must share a hash slot.
func (c *Client) Multi(keys []string, opts ...Option) *Lock {
	return c.newLock(KindMulti, append([]string(nil), keys...), 0, opts)
}

// Kind, Keys: what the Lock takes.
func (l *Lock) Kind() Kind { return l.kind }

// Keys are the lock's keys, in order.
func (l *Lock) Keys() []string { return append([]string(nil), l.keys...) }

// Locked reports whether anyone holds the lock's first key.
func (l *Lock) Locked(ctx context.Context) (bool, error) {
	return l.c.Locked(ctx, l.keys[0])
}

// command: the grant command's name and arguments, without WAIT and BIND.
func (l *Lock) command(owner string, ttl time.Duration) (string, []interface{}) {
	ms := strconv.FormatInt(millis(ttl), 10)
	switch l.kind {
	case KindReentrant, KindWrite:
		return "LOCK.RACQUIRE", []interface{}{l.keys[0], owner, ms}
	case KindRead:
		return "LOCK.READ", []interface{}{l.keys[0], owner, ms}
	case KindSemaphore:
		return "LOCK.SEMAPHORE", []interface{}{l.keys[0], l.limit, owner, ms}
	case KindMulti:
		args := []interface{}{len(l.keys)}
		for _, k := range l.keys {
			args = append(args, k)
		}
		return "LOCK.MACQUIRE", append(args, owner, ms)
	default:
		return "LOCK.ACQUIRE", []interface{}{l.keys[0], owner, ms}
	}
}

// holdsAdd: a repeat of this kind's command adds a hold.
func (l *Lock) holdsAdd() bool {
	return l.kind == KindReentrant || l.kind == KindWrite || l.kind == KindRead
}

// Acquire takes the lock: a *Held, or ErrNotAcquired when it is busy (and
// stayed busy for the wait given WithWait), ErrDeadlock when waiting would
// close a cycle, ctx.Err() when ctx ended the wait (the server's queue is
// left: the waiting connection is closed), ErrHeld for a second Acquire of
// a Lock built WithOwner while its holder is live.
func (l *Lock) Acquire(ctx context.Context) (*Held, error) {
	if l.s.err != nil {
		return nil, l.s.err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	owner := l.s.owner
	if !l.s.ownerSet {
		owner = freshOwner()
	} else {
		if err := l.reserve(); err != nil {
			return nil, err
		}
		h, err := l.acquire(ctx, owner)
		l.mu.Lock()
		l.busy = false
		if err == nil {
			l.current = h
		}
		l.mu.Unlock()
		return h, err
	}
	return l.acquire(ctx, owner)
}

// reserve: the Lock's one holder (WithOwner) is free; marks an Acquire
// under way. ErrHeld otherwise.
func (l *Lock) reserve() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	live := false
	if h := l.current; h != nil {
		select {
		case <-h.lost: // released or lost: over
		default:
			live = true
		}
	}
	if l.busy || live {
		return fmt.Errorf("%w: %s %s, owner %q", ErrHeld, l.kind, showKeys(l.keys), l.s.owner)
	}
	l.busy = true
	return nil
}

func (l *Lock) acquire(ctx context.Context, owner string) (*Held, error) {
	wait := l.s.wait
	if dl, ok := ctx.Deadline(); ok && wait != 0 {
		left := time.Until(dl)
		if left <= 0 {
			return nil, context.DeadlineExceeded
		}
		if wait == WaitForever || left < wait {
			wait = left
		}
	}
	if sess := l.s.session; sess != nil && sess.bound != nil {
		return l.acquireIn(ctx, sess.bound, owner, wait)
	} else if sess != nil {
		return l.acquireSession(ctx, sess, owner, wait)
	}
	sess, err := l.c.newBinding(ctx, l.s.ttl, l.s.bind, true)
	if err != nil {
		return nil, err
	}
	name, args := l.command(owner, sess.ttl)
	if sess.bind {
		args = append(args, "BIND")
	}
	sent := time.Now()
	reply, err := l.waitOn(ctx, sess.conn, wait, owner, sess.bind, name, args)
	if wait != 0 {
		sent = time.Now() // the lease started at the grant, just before the reply
	}
	if err != nil || reply == nil {
		sess.mu.Lock()
		sess.closeLocked()
		sess.mu.Unlock()
		if err == nil {
			err = l.notAcquired()
		}
		return nil, err
	}
	h, err := l.held(sess, owner, reply, sent)
	if err == nil {
		err = l.confirm(sess.conn, h)
	}
	if err != nil {
		sess.mu.Lock()
		sess.closeLocked()
		sess.mu.Unlock()
		return nil, err
	}
	sess.mu.Lock()
	sess.start()
	sess.addLocked(ctx, h)
	sess.mu.Unlock()
	return h, nil
}

func (l *Lock) notAcquired() error {
	return fmt.Errorf("%w: %s %s", ErrNotAcquired, l.kind, showKeys(l.keys))
}

// waitOn sends the grant command on conn, with WAIT when wait != 0; the
// context's end closes conn (the server drops a waiter whose connection
// closes, and frees what a BIND grant gave it).
func (l *Lock) waitOn(ctx context.Context, conn redis.Conn, wait time.Duration, owner string, bound bool,
	name string, args []interface{}) (interface{}, error) {
	to := l.c.timeout
	if wait != 0 {
		if wait == WaitForever {
			args = append(args, "WAIT", 0)
			to = 0 // no read deadline: the context ends this wait
		} else {
			args = append(args, "WAIT", millis(wait))
			to += wait
		}
	}
	type result struct {
		reply interface{}
		err   error
	}
	ch := make(chan result, 1)
	go func() {
		r, err := redis.DoWithTimeout(conn, to, name, args...)
		ch <- result{r, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil && !isReplyError(r.err) && !bound {
			// A grant may have crossed the failure: let it go.
			for _, k := range l.keys {
				_, _ = l.c.do(context.Background(), "LOCK.RELEASE", k, owner)
			}
		}
		return r.reply, serverError(r.err)
	case <-ctx.Done():
		conn.Close()
		<-ch
		if !bound {
			for _, k := range l.keys {
				_, _ = l.c.do(context.Background(), "LOCK.RELEASE", k, owner)
			}
		}
		return nil, ctx.Err()
	}
}

// held makes the Held of a grant's reply (a token, or tokens for Multi).
func (l *Lock) held(sess *binding, owner string, reply interface{}, sent time.Time) (*Held, error) {
	var tokens []int64
	var err error
	if l.kind == KindMulti {
		tokens, err = redis.Int64s(reply, nil)
	} else {
		var t int64
		t, err = redis.Int64(reply, nil)
		tokens = []int64{t}
	}
	if err != nil || len(tokens) != len(l.keys) {
		return nil, fmt.Errorf("redislock: unexpected grant reply %v (%v)", reply, err)
	}
	h := &Held{
		lock: l, sess: sess, owner: owner, keys: l.keys, tokens: tokens, holds: 1,
		lost: make(chan struct{}),
	}
	if sess != nil {
		h.deadline = sent.Add(sess.ttl)
	}
	return h, nil
}

// acquireIn acquires in a shared session: a try on its connection; when
// busy and told to wait, the wait goes on a connection of its own (the
// session's keepalive must not queue behind it), and once granted the
// holder is bound to the session's connection by a repeat with BIND.
func (l *Lock) acquireIn(ctx context.Context, sess *binding, owner string, wait time.Duration) (*Held, error) {
	name, args := l.command(owner, sess.ttl)
	if sess.bind {
		args = append(args, "BIND")
	}
	sess.mu.Lock()
	if sess.closed {
		sess.mu.Unlock()
		return nil, ErrClosed
	}
	sent := time.Now()
	reply, err := redis.DoWithTimeout(sess.conn, sess.c.timeout, name, args...)
	if err == nil && reply != nil {
		h, err := l.held(sess, owner, reply, sent)
		if err == nil {
			err = l.confirm(sess.conn, h)
		}
		if err == nil {
			sess.addLocked(ctx, h)
		}
		sess.mu.Unlock()
		return h, err
	}
	if err != nil && !isReplyError(err) {
		sess.failLocked(fmt.Sprintf("connection failed: %v", err))
	}
	sess.mu.Unlock()
	if err != nil {
		return nil, serverError(err)
	}
	if wait == 0 {
		return nil, l.notAcquired()
	}
	conn, err := l.c.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	reply, err = l.waitOn(ctx, conn, wait, owner, sess.bind, name, args)
	if err != nil {
		return nil, err
	}
	if reply == nil {
		return nil, l.notAcquired()
	}
	sent = time.Now()
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if sess.closed {
		return nil, ErrClosed // the waiting connection's close frees the grant
	}
	if sess.bind {
		// Move the binding to the session's connection (answered at once).
		if _, err := redis.DoWithTimeout(sess.conn, sess.c.timeout, name, args...); err != nil {
			if !isReplyError(err) {
				sess.failLocked(fmt.Sprintf("connection failed: %v", err))
			}
			return nil, serverError(err)
		}
		if l.holdsAdd() { // that repeat added a hold: take it back
			t, _ := redis.Int64(reply, nil)
			if _, err := redis.DoWithTimeout(sess.conn, sess.c.timeout, "LOCK.RELEASE", l.keys[0], owner, "TOKEN", t); err != nil {
				return nil, err
			}
		}
	}
	h, err := l.held(sess, owner, reply, sent)
	if err == nil && sess.bind {
		err = l.confirm(sess.conn, h) // after the repeat that bound it there
	} else if err == nil {
		err = l.confirm(conn, h)
	}
	if err != nil {
		return nil, err
	}
	sess.addLocked(ctx, h)
	return h, nil
}

// Held is one holder of a Lock, from a grant until its release. Its
// methods are safe for concurrent use.
type Held struct {
	lock   *Lock
	sess   *binding     // nil in a server session
	ns     *nodeSession // in a server session (its Session's mu guards below)
	owner  string
	keys   []string
	tokens []int64

	// Under sess.mu.
	holds     int
	deadline  time.Time
	released  bool
	releasing bool // a server session's lock: its RELEASE under way

	lostOnce sync.Once
	lost     chan struct{}
	errMu    sync.Mutex
	err      error
	durable  bool // under errMu
}

// Token is the fencing token of the grant (the first key's for Multi):
// hand it to the resource, which refuses a write with a smaller one.
func (h *Held) Token() int64 { return h.tokens[0] }

func (h *Held) token() int64 { return h.tokens[0] }

// Tokens has a token per key, in key order.
func (h *Held) Tokens() []int64 { return append([]int64(nil), h.tokens...) }

// Owner is the holder's id in the server.
func (h *Held) Owner() string { return h.owner }

// Keys are the held keys.
func (h *Held) Keys() []string { return append([]string(nil), h.keys...) }

// Bound reports whether the holder is bound to its connection (BIND).
func (h *Held) Bound() bool { return h.sess != nil && h.sess.bind }

// Session is the Session the lock was acquired in, nil if none.
func (h *Held) Session() *Session { return h.lock.s.session }

// Lost is closed when the lease is lost (or its session closed): stop the
// work, or cancel it (select on it, or use it to cancel a context).
func (h *Held) Lost() <-chan struct{} { return h.lost }

// Err is nil while the lease holds; then a *LeaseLostError (errors.Is
// ErrLeaseLost), or ErrClosed once released or its Session closed.
func (h *Held) Err() error {
	h.errMu.Lock()
	defer h.errMu.Unlock()
	return h.err
}

// markLost ends the holder with err (the first call only: true).
func (h *Held) markLost(err error) bool {
	first := false
	h.lostOnce.Do(func() {
		first = true
		h.errMu.Lock()
		h.err = err
		h.errMu.Unlock()
		close(h.lost)
	})
	return first
}

// usable: the session's lock held, the holder still registered.
func (h *Held) usable() error {
	if h.released {
		return fmt.Errorf("%w: released", ErrInvalid)
	}
	if err := h.Err(); err != nil {
		return err
	}
	if h.sess.conn == nil {
		return &LeaseLostError{Keys: h.keys, Token: h.token(), Why: "no connection"}
	}
	return nil
}

// Release lets go of one hold (a reentrant lock's last hold, or the lock):
// nil when the server confirmed; an ErrLeaseLost error when the lease was
// already gone (released elsewhere, expired, deleted, overwritten). The
// keepalive stops for it before the release is sent.
func (h *Held) Release(ctx context.Context) error {
	if h.ns != nil {
		return h.releaseSession(ctx)
	}
	s := h.sess
	s.mu.Lock()
	defer func() {
		if s.private && h.released {
			s.closeLocked()
		}
		s.mu.Unlock()
		if s.private && h.released {
			s.stopLoop()
		}
	}()
	if h.released {
		return fmt.Errorf("%w: released twice", ErrInvalid)
	}
	if err := h.usable(); err != nil {
		if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrClosed) {
			h.released = true
		}
		return err
	}
	var lostWhy string
	last := true
	for i, k := range h.keys {
		// Under the grant's token: a stale holder never ends a newer grant
		// to the same owner name (nil, nothing changed).
		n, err := redis.Int(redis.DoWithTimeout(s.conn, s.c.timeout, "LOCK.RELEASE", k, h.owner, "TOKEN", h.tokens[i]))
		switch {
		case err == redis.ErrNil:
			lostWhy = fmt.Sprintf("key %q was no longer held by this grant at the release (released elsewhere, expired, deleted, or granted again under another token)", k)
		case isWrongType(err):
			lostWhy = fmt.Sprintf("key %q overwritten: %v", k, err)
		case err != nil:
			if !isReplyError(err) && s.bind {
				s.failLocked(fmt.Sprintf("release failed: %v", err))
				h.released = true
			}
			return err
		case n == 0:
			last = false
		}
	}
	if lostWhy != "" {
		s.forgetLocked(h)
		h.released = true
		err := &LeaseLostError{Keys: h.keys, Token: h.token(), Why: lostWhy}
		h.markLost(err)
		return err
	}
	if last {
		s.forgetLocked(h)
		h.released = true
		h.markLost(ErrClosed)
	} else {
		h.holds--
	}
	return nil
}

// Reacquire adds a hold to a reentrant, read or write lock (answered at
// once, same token); each Release removes one.
func (h *Held) Reacquire(ctx context.Context) error {
	if !h.lock.holdsAdd() {
		return invalid("a %s lock has one hold", h.lock.kind)
	}
	if h.ns != nil {
		return h.reacquireSession(ctx)
	}
	s := h.sess
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := h.usable(); err != nil {
		return err
	}
	name, args := h.lock.command(h.owner, s.ttl)
	t, err := redis.Int64(redis.DoWithTimeout(s.conn, s.c.timeout, name, args...))
	if err != nil {
		if isWrongType(err) || err == redis.ErrNil {
			// Nil: someone else holds it now; WRONGTYPE: overwritten.
			s.forgetLocked(h)
			lost := &LeaseLostError{Keys: h.keys, Token: h.token(), Why: fmt.Sprintf("at the reacquire: %v", err)}
			h.markLost(lost)
			return lost
		}
		return serverError(err)
	}
	if t != h.token() {
		// A new grant (ours ended; the owner name was free, or granted
		// again to another holder): give back the hold just taken, under
		// its token.
		_, _ = redis.DoWithTimeout(s.conn, s.c.timeout, "LOCK.RELEASE", h.keys[0], h.owner, "TOKEN", t)
		s.dropLost(h, fmt.Sprintf("the reacquire got token %d, not %d: this grant had ended", t, h.token()))
		return h.Err()
	}
	h.holds++
	return nil
}

// Extend sets the lease to ttl from now, and the keepalive renews with ttl
// from then on. A Session's locks share its ttl: Extend on them is refused.
func (h *Held) Extend(ctx context.Context, ttl time.Duration) error {
	s := h.sess
	if s == nil || !s.private {
		return invalid("the locks of a Session share its ttl (its keepalive is their one renewal)")
	}
	if ttl < time.Millisecond {
		return invalid("ttl %v is below 1 ms", ttl)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := h.usable(); err != nil {
		return err
	}
	sent := time.Now()
	for i, k := range h.keys {
		n, err := redis.Int(redis.DoWithTimeout(s.conn, s.c.timeout, "LOCK.RENEW", k, h.owner, millis(ttl), "TOKEN", h.tokens[i]))
		if err == nil && n == 1 {
			continue
		}
		if err != nil && !isReplyError(err) {
			return err
		}
		why := fmt.Sprintf("key %q no longer held by this grant at the extend", k)
		if err != nil {
			why = fmt.Sprintf("key %q: %v", k, err)
		}
		s.dropLost(h, why)
		return h.Err()
	}
	s.ttl = ttl
	h.deadline = sent.Add(ttl)
	s.renewedLocked()
	return nil
}
