package redislock

// Server sessions (LOCK.SESSION), against the servers of redislock_test.go.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

// lostCounter counts WithOnLost's calls per lock.
type lostCounter struct {
	mu sync.Mutex
	n  map[*Held]int
}

func newLostCounter() *lostCounter { return &lostCounter{n: map[*Held]int{}} }

func (l *lostCounter) onLost(h *Held, err error) {
	if !errors.Is(err, ErrLeaseLost) {
		panic(fmt.Sprintf("onLost with %v", err))
	}
	l.mu.Lock()
	l.n[h]++
	l.mu.Unlock()
}

// onceEach: every one of hs was called back exactly once, and no other.
// The callbacks run on goroutines of their own after a lock is marked lost,
// so they are waited for (a loaded machine may run them late), then counted.
func (l *lostCounter) onceEach(t *testing.T, hs []*Held) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		l.mu.Lock()
		all := true
		for _, h := range hs {
			all = all && l.n[h] >= 1
		}
		l.mu.Unlock()
		if all {
			break
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, h := range hs {
		if l.n[h] != 1 {
			t.Fatalf("lock %q: %d lost callbacks, want 1", h.Keys(), l.n[h])
		}
	}
	if len(l.n) != len(hs) {
		t.Fatalf("%d locks called back, want %d", len(l.n), len(hs))
	}
}

func (l *lostCounter) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.n {
		n += c
	}
	return n
}

// heldOnServer: every one of hs is held on the server by its owner under
// its token (LOCK.INFO of every key, one round trip).
func heldOnServer(t *testing.T, a redis.Conn, hs []*Held) int {
	t.Helper()
	type probe struct {
		h *Held
		i int
	}
	var probes []probe
	for _, h := range hs {
		for i, k := range h.Keys() {
			must(t, a.Send("LOCK.INFO", k))
			probes = append(probes, probe{h, i})
		}
	}
	replies, err := redis.Values(a.Do(""))
	must(t, err)
	n := 0
	for i, p := range probes {
		if holds(replies[i], p.h.Owner(), p.h.Tokens()[p.i]) {
			n++
		}
	}
	return n
}

func sessionLive(t *testing.T, a redis.Conn, id int64) bool {
	t.Helper()
	r, err := a.Do("LOCK.SESSION", "INFO", id)
	must(t, err)
	return r != nil
}

// One server session, locks of every kind, renewed by one LOCK.SESSION
// KEEPALIVE per tick and no LOCK.RENEW; a wait in it; Extend refused;
// Close ends them all on the server (a waiter is granted) and reports them
// released; an Acquire after Close is ErrClosed.
func TestSessionOneKeepaliveForManyLocks(t *testing.T) {
	addr := env(t, "REDIS_LOCK_ADDR")
	c := New(addr)
	defer c.Close()
	a := admin(t, addr)
	ctx := context.Background()
	lost := newLostCounter()
	s, err := c.NewSession(ctx, WithTTL(1*time.Second), WithOnLost(lost.onLost))
	must(t, err)
	if s.ID(c) != 0 {
		t.Fatal("opened lazily: no id before the first lock")
	}
	_, err = a.Do("CONFIG", "RESETSTAT")
	must(t, err)
	var hs []*Held
	for i := 0; i < 200; i++ {
		hs = append(hs, acquired(t, c.Exclusive(fmt.Sprintf("go:ss%d", i), WithSession(s))))
	}
	hs = append(hs,
		acquired(t, c.Multi([]string{"go:ssm1", "go:ssm2"}, WithSession(s))),
		acquired(t, c.Read("go:ssrw", WithSession(s))),
		acquired(t, c.Semaphore("go:sssem", 3, WithSession(s))))
	r := acquired(t, c.Reentrant("go:ssr", WithSession(s)))
	must(t, r.Reacquire(ctx))
	hs = append(hs, r)
	id := s.ID(c)
	if id == 0 || calls(t, a, "lock.session|open") != 1 {
		t.Fatalf("one session opened for all: id %d, %d OPEN", id, calls(t, a, "lock.session|open"))
	}
	time.Sleep(2500 * time.Millisecond) // 2.5 ttls
	for _, h := range hs {
		must(t, h.Err())
		if h.Bound() {
			t.Fatal("a session lock is not bound")
		}
	}
	if n := heldOnServer(t, a, hs); n != 205 {
		t.Fatalf("%d of 205 keys held on the server with their tokens", n)
	}
	ka, rn, kb := calls(t, a, "lock.session|keepalive"), calls(t, a, "lock.renew"), calls(t, a, "lock.keepalive")
	if ka < 2 || ka > 20 || rn != 0 || kb != 0 {
		t.Fatalf("one LOCK.SESSION KEEPALIVE per tick for all: %d of them, %d LOCK.RENEW, %d LOCK.KEEPALIVE", ka, rn, kb)
	}
	t.Logf("205 locks over 2.5 s: %d LOCK.SESSION KEEPALIVE, %d LOCK.RENEW", ka, rn)
	// A guarded write under a session lock's token.
	if v, err := redis.String(hs[2].Guard(ctx, "SET", "go:ss2:data", "v")); err != nil || v != "OK" {
		t.Fatalf("a guard under a session lock: %q %v", v, err)
	}
	// Reentrant holds counted; a release under the token.
	must(t, r.Release(ctx))
	if locked, _ := c.Locked(ctx, "go:ssr"); !locked {
		t.Fatal("one hold left")
	}
	must(t, hs[0].Release(ctx))
	if locked, _ := c.Locked(ctx, "go:ss0"); locked {
		t.Fatal("released")
	}
	if err := hs[0].Release(ctx); !errors.Is(err, ErrInvalid) {
		t.Fatalf("released twice: %v", err)
	}
	if err := hs[1].Extend(ctx, time.Minute); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Extend in a session: %v", err)
	}
	// A wait in a session: granted when the other holder lets go, and
	// renewed by its session from then on. (In a session of its own: the
	// server answers NOSESSION to an unrelated waiter at the end of a
	// session one of whose waiters was granted; reported.)
	sw, err := c.NewSession(ctx, WithTTL(1*time.Second))
	must(t, err)
	other := acquired(t, c.Exclusive("go:ssw"))
	go func() {
		time.Sleep(300 * time.Millisecond)
		other.Release(ctx)
	}()
	w, err := c.Exclusive("go:ssw", WithSession(sw), WithWait(5*time.Second)).Acquire(ctx)
	must(t, err)
	time.Sleep(1 * time.Second)
	must(t, w.Err())
	if heldOnServer(t, a, []*Held{w}) != 1 {
		t.Fatal("the waiter granted in a session is kept by it")
	}
	must(t, sw.Close())
	if !errors.Is(w.Err(), ErrClosed) || heldOnServer(t, a, []*Held{w}) != 0 {
		t.Fatalf("closed with its session: %v", w.Err())
	}
	// Clean exit: a deferred Close ends every lock on the server at once:
	// a waiter for one of them is granted.
	granted := make(chan error, 1)
	go func() {
		h, err := c.Exclusive("go:ss1", WithWait(10*time.Second)).Acquire(ctx)
		if err == nil {
			err = h.Release(ctx)
		}
		granted <- err
	}()
	time.Sleep(100 * time.Millisecond)
	func() {
		defer s.Close()
	}()
	select {
	case err := <-granted:
		must(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not granted at the Close")
	}
	<-s.Done()
	if sessionLive(t, a, id) {
		t.Fatal("closed on the server")
	}
	for _, h := range hs[1:] {
		if !errors.Is(h.Err(), ErrClosed) {
			t.Fatalf("closed: %v", h.Err())
		}
	}
	if n := heldOnServer(t, a, hs[1:]); n != 0 {
		t.Fatalf("%d keys still held after Close", n)
	}
	if lost.total() != 0 {
		t.Fatalf("Close reports released, not lost: %d callbacks", lost.total())
	}
	if _, err := c.Exclusive("go:ssafter", WithSession(s)).Acquire(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("acquire in a closed session: %v", err)
	}
}

// killer: every 100 ms, CLIENT KILL of every connection named name (the
// holder's, from CLIENT LIST), until stop; the count of kills.
func killer(t *testing.T, addr, name string, stop <-chan struct{}) <-chan int {
	done := make(chan int, 1)
	k, err := redis.Dial("tcp", addr, redis.DialReadTimeout(5*time.Second))
	must(t, err)
	go func() {
		defer k.Close()
		kills := 0
		for {
			list, err := redis.String(k.Do("CLIENT", "LIST"))
			if err == nil {
				for _, line := range strings.Split(list, "\n") {
					if !strings.Contains(line, " name="+name+" ") {
						continue
					}
					for _, f := range strings.Fields(line) {
						if strings.HasPrefix(f, "id=") {
							if n, _ := redis.Int(k.Do("CLIENT", "KILL", "ID", strings.TrimPrefix(f, "id="))); n == 1 {
								kills++
							}
						}
					}
				}
			}
			select {
			case <-stop:
				done <- kills
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return done
}

// Issue 42's fault test: 1,000 locks on a session (ttl 1.5 s) while every
// connection of the holder is killed every 100 ms for 3 s (2 ttls): none
// lost, all held with their tokens at the end. The same with BIND (a bound
// Session, one LOCK.KEEPALIVE): all lost at the first kill.
func TestSessionSurvivesKilledConnections(t *testing.T) {
	addr := env(t, "REDIS_LOCK_ADDR")
	a := admin(t, addr)
	ctx := context.Background()
	const n = 1000
	name := "go-fault-holder"
	c := New(addr, WithDialOptions(redis.DialClientName(name)))
	defer c.Close()
	lost := newLostCounter()
	// A session lease a loaded machine keeps while every connection is
	// killed (at 1.5 s, in a .ci/run at load 5, no keepalive got through
	// before its deadline), and kills for two of its leases: the session
	// lives on only by keepalives that got through on new connections.
	const ttl = 3 * time.Second
	s, err := c.NewSession(ctx, WithTTL(ttl), WithOnLost(lost.onLost))
	must(t, err)
	defer s.Close()
	hs := make([]*Held, n)
	for i := range hs {
		hs[i] = acquired(t, c.Exclusive(fmt.Sprintf("go:fault:s%d", i), WithSession(s)))
	}
	stop := make(chan struct{})
	kills := killer(t, addr, name, stop)
	time.Sleep(2 * ttl)
	close(stop)
	killed := <-kills
	if killed < 3 {
		t.Fatalf("only %d connections killed", killed)
	}
	for _, h := range hs {
		must(t, h.Err())
	}
	if lost.total() != 0 {
		t.Fatalf("%d lost callbacks", lost.total())
	}
	if got := heldOnServer(t, a, hs); got != n {
		t.Fatalf("%d of %d held on the server with their tokens after %d kills", got, n, killed)
	}
	t.Logf("session: %d connections killed in %v, %d of %d locks held", killed, 2*ttl, n, n)
	for _, h := range hs[:10] {
		must(t, h.Release(ctx))
	}
	must(t, s.Close())
	if got := heldOnServer(t, a, hs); got != 0 {
		t.Fatalf("%d held after Close", got)
	}

	// The same with BIND: the first kill frees them all.
	b, err := c.NewSession(ctx, WithTTL(1*time.Second), WithBind(true))
	must(t, err)
	defer b.Close()
	bs := make([]*Held, n)
	for i := range bs {
		bs[i] = acquired(t, c.Exclusive(fmt.Sprintf("go:fault:b%d", i), WithSession(b)))
	}
	if got := heldOnServer(t, a, bs); got != n {
		t.Fatalf("bound: %d of %d held", got, n)
	}
	stop = make(chan struct{})
	close(stop) // one round of kills
	if k := <-killer(t, addr, name, stop); k < 1 {
		t.Fatal("the bound connection was not killed")
	}
	waitUntil(t, 5*time.Second, "the bound locks freed by the first kill", func() bool {
		return heldOnServer(t, a, bs) == 0
	})
	for _, h := range bs {
		select {
		case <-h.Lost():
		case <-time.After(5 * time.Second):
			t.Fatal("a bound lock not told lost after the kill")
		}
		if !errors.Is(h.Err(), ErrLeaseLost) {
			t.Fatalf("bound: %v", h.Err())
		}
	}
	t.Logf("BIND: all %d lost at the first kill", n)
}

// A session ended from outside marks every lock lost and calls back once
// per lock: LOCK.SESSION CLOSE from another connection (told at once by
// the watcher: a ttl of 30 s puts the next keepalive 10 s away; without a
// watcher, refused by an ACL, by the next keepalive answered 0), and a
// server asleep past the ttl (the local timer at the deadline: told while
// the server still sleeps). The next lock in the Session opens a new
// session id. A lock deleted or overwritten behind its back is told at
// once too, alone.
func TestSessionEndedFromOutside(t *testing.T) {
	addr := env(t, "REDIS_LOCK_ADDR")
	a := admin(t, addr)
	ctx := context.Background()
	c := New(addr, WithTimeout(5*time.Second))
	defer c.Close()

	closedFromOutside := func(c *Client, ttl time.Duration, prefix, cause string) {
		lost := newLostCounter()
		s, err := c.NewSession(ctx, WithTTL(ttl), WithOnLost(lost.onLost))
		must(t, err)
		defer s.Close()
		var hs []*Held
		for i := 0; i < 50; i++ {
			hs = append(hs, acquired(t, c.Exclusive(fmt.Sprintf("%s%d", prefix, i), WithSession(s))))
		}
		id := s.ID(c)
		time.Sleep(50 * time.Millisecond)
		ended, err := redis.Int(a.Do("LOCK.SESSION", "CLOSE", id))
		must(t, err)
		if ended != 50 {
			t.Fatalf("CLOSE ended %d holders", ended)
		}
		for _, h := range hs {
			lostWithin(t, h, 5*time.Second, "closed from outside", cause)
		}
		lost.onceEach(t, hs)
		h := acquired(t, c.Exclusive(prefix+"after", WithSession(s)))
		if s.ID(c) == id || s.ID(c) == 0 {
			t.Fatalf("a new session after the end: %d, was %d", s.ID(c), id)
		}
		must(t, h.Release(ctx))
	}
	closedFromOutside(c, 30*time.Second, "go:out:c", "ended on the server")
	_, err := a.Do("ACL", "SETUSER", "go-nowatch", "on", "nopass", "+@all", "-subscribe", "~*", "&*")
	must(t, err)
	nowatch := New(addr, WithDialOptions(redis.DialUsername("go-nowatch"), redis.DialPassword("any")))
	defer nowatch.Close()
	closedFromOutside(nowatch, 900*time.Millisecond, "go:out:n", "answered 0")

	// One lock deleted, one overwritten: those two told, the rest kept.
	lost := newLostCounter()
	s1, err := c.NewSession(ctx, WithTTL(30*time.Second), WithOnLost(lost.onLost))
	must(t, err)
	defer s1.Close()
	var hs []*Held
	for i := 0; i < 5; i++ {
		hs = append(hs, acquired(t, c.Exclusive(fmt.Sprintf("go:out:k%d", i), WithSession(s1))))
	}
	_, err = a.Do("DEL", "go:out:k0")
	must(t, err)
	_, err = a.Do("SET", "go:out:k1", "not a lock")
	must(t, err)
	lostWithin(t, hs[0], 5*time.Second, "deleted in a session", "deleted")
	lostWithin(t, hs[1], 5*time.Second, "overwritten in a session", "overwritten")
	lost.onceEach(t, hs[:2])
	for _, h := range hs[2:] {
		must(t, h.Err())
	}
	must(t, s1.Close())
	_, err = a.Do("DEL", "go:out:k1")
	must(t, err)

	// A wait in a session that ends while it waits: ErrNoSession.
	s3, err := c.NewSession(ctx, WithTTL(30*time.Second))
	must(t, err)
	defer s3.Close()
	first := acquired(t, c.Exclusive("go:out:w0", WithSession(s3)))
	busy := acquired(t, c.Exclusive("go:out:w1"))
	waited := make(chan error, 1)
	go func() {
		_, err := c.Exclusive("go:out:w1", WithSession(s3), WithWait(20*time.Second)).Acquire(ctx)
		waited <- err
	}()
	time.Sleep(200 * time.Millisecond)
	_, err = a.Do("LOCK.SESSION", "CLOSE", s3.ID(c))
	must(t, err)
	select {
	case err := <-waited:
		if !errors.Is(err, ErrNoSession) {
			t.Fatalf("a waiter whose session ended: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not answered when its session ended")
	}
	lostWithin(t, first, 5*time.Second, "the session of a waiter closed", "ended")
	must(t, busy.Release(ctx))

	// The server asleep (DEBUG SLEEP 3) past the ttl: the keepalive gets no
	// answer; the locks are told lost by the deadline, before it wakes.
	lost = newLostCounter()
	s2, err := c.NewSession(ctx, WithTTL(900*time.Millisecond), WithOnLost(lost.onLost))
	must(t, err)
	defer s2.Close()
	hs = nil
	for i := 0; i < 50; i++ {
		hs = append(hs, acquired(t, c.Exclusive(fmt.Sprintf("go:out:d%d", i), WithSession(s2))))
	}
	sleeper, err := redis.Dial("tcp", addr, redis.DialReadTimeout(10*time.Second))
	must(t, err)
	defer sleeper.Close()
	var mu sync.Mutex
	awake := false
	slept := make(chan error, 1)
	go func() {
		_, err := sleeper.Do("DEBUG", "SLEEP", "3")
		mu.Lock()
		awake = true
		mu.Unlock()
		slept <- err
	}()
	for _, h := range hs {
		select {
		case <-h.Lost():
		case <-time.After(10 * time.Second):
			t.Fatal("not lost at the deadline")
		}
	}
	mu.Lock()
	told := !awake
	mu.Unlock()
	if !told {
		t.Fatal("the locks were told lost only after the server woke: not by the deadline")
	}
	must(t, <-slept)
	for _, h := range hs {
		if err := h.Err(); !errors.Is(err, ErrLeaseLost) || !strings.Contains(err.Error(), "deadline") {
			t.Fatalf("Err %v, want the deadline's", err)
		}
	}
	time.Sleep(500 * time.Millisecond) // the keepalive answered after the sleep tells nothing twice
	lost.onceEach(t, hs)
}

// Two cluster nodes: one Session, a lock on a key of each node's Client:
// one session id per node, each on its own node.
func TestSessionOnePerClusterNode(t *testing.T) {
	addrs := strings.Split(env(t, "REDIS_LOCK_CLUSTER_ADDRS"), ",")
	ctx := context.Background()
	a0 := admin(t, addrs[0])
	a1 := admin(t, addrs[1])
	// A key of each of the two nodes: its Client is that node.
	keyOn := func(a redis.Conn) string {
		mine, err := redis.Values(a.Do("CLUSTER", "SLOTS"))
		must(t, err)
		myID, err := redis.String(a.Do("CLUSTER", "MYID"))
		must(t, err)
		for i := 0; ; i++ {
			key := fmt.Sprintf("go:node:%d", i)
			slot, err := redis.Int(a.Do("CLUSTER", "KEYSLOT", key))
			must(t, err)
			for _, r := range mine {
				v, _ := redis.Values(r, nil)
				lo, _ := redis.Int(v[0], nil)
				hi, _ := redis.Int(v[1], nil)
				node, _ := redis.Values(v[2], nil)
				id, _ := redis.String(node[2], nil)
				if slot >= lo && slot <= hi && id == myID {
					return key
				}
			}
		}
	}
	k0, k1 := keyOn(a0), keyOn(a1)
	c0, c1 := New(addrs[0]), New(addrs[1])
	defer c0.Close()
	defer c1.Close()
	s, err := c0.NewSession(ctx, WithTTL(2*time.Second))
	must(t, err)
	defer s.Close()
	h0 := acquired(t, c0.Exclusive(k0, WithSession(s)))
	h1 := acquired(t, c1.Exclusive(k1, WithSession(s)))
	id0, id1 := s.ID(c0), s.ID(c1)
	if id0 == 0 || id1 == 0 {
		t.Fatalf("a session per node: %d, %d", id0, id1)
	}
	if !sessionLive(t, a0, id0) || !sessionLive(t, a1, id1) {
		t.Fatal("each session lives on its node")
	}
	time.Sleep(2500 * time.Millisecond) // past the ttl: both kept alive
	must(t, h0.Err())
	must(t, h1.Err())
	if heldOnServer(t, a0, []*Held{h0}) != 1 || heldOnServer(t, a1, []*Held{h1}) != 1 {
		t.Fatal("held on each node")
	}
	must(t, s.Close())
	if sessionLive(t, a0, id0) || sessionLive(t, a1, id1) {
		t.Fatal("Close closes the session on every node")
	}
	if heldOnServer(t, a0, []*Held{h0}) != 0 || heldOnServer(t, a1, []*Held{h1}) != 0 {
		t.Fatal("freed on each node")
	}
}
