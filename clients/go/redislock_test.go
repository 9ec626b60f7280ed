package redislock

// Integration tests against servers started by tests/it/go_package.rs:
//   REDIS_LOCK_ADDR            a server with the module
//   REDIS_LOCK_STALL_ADDR/PID  a second server, SIGSTOPped by TestStall
//   REDIS_LOCK_CLUSTER_ADDRS   the nodes of a cluster (comma-separated)
//   REDIS_LOCK_KILL_ADDR/PID   a server killed (kill -9) by TestKilledServer
//   REDLOCK_ADDRS, REDLOCK_DOWN  five servers, the last DOWN of them stopped
// A test whose servers are not given is skipped; the Rust test checks that
// none was.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
)

func env(t *testing.T, name string) string {
	v := os.Getenv(name)
	if v == "" {
		t.Skipf("%s not set", name)
	}
	return v
}

func admin(t *testing.T, addr string) redis.Conn {
	c, err := redis.Dial("tcp", addr, redis.DialReadTimeout(5*time.Second))
	if err != nil {
		t.Fatalf("admin connection to %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func acquired(t *testing.T, l *Lock) *Held {
	t.Helper()
	h, err := l.Acquire(context.Background())
	if err != nil {
		t.Fatalf("%s %q: %v", l.Kind(), l.Keys(), err)
	}
	return h
}

func refused(t *testing.T, l *Lock) {
	t.Helper()
	h, err := l.Acquire(context.Background())
	if !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("%s %q: want ErrNotAcquired, got %v, %v", l.Kind(), l.Keys(), h, err)
	}
}

// calls: cmdstat_<cmd> calls since the last CONFIG RESETSTAT.
func calls(t *testing.T, c redis.Conn, cmd string) int {
	t.Helper()
	info, err := redis.String(c.Do("INFO", "commandstats"))
	must(t, err)
	for _, line := range strings.Split(info, "\r\n") {
		if strings.HasPrefix(line, "cmdstat_"+strings.ToLower(cmd)+":calls=") {
			v := strings.TrimPrefix(line, "cmdstat_"+strings.ToLower(cmd)+":calls=")
			n, _ := strconv.Atoi(v[:strings.IndexByte(v, ',')])
			return n
		}
	}
	return 0
}

func waitUntil(t *testing.T, d time.Duration, what string, f func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !f() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// everyKind on one server (or one cluster node, keys in its slots).
func everyKind(t *testing.T, c *Client, k func(string) string, opts ...Option) {
	ctx := context.Background()
	// Exclusive: a second holder refused; tokens increase.
	x := acquired(t, c.Exclusive(k("x"), opts...))
	refused(t, c.Exclusive(k("x"), opts...))
	t1 := x.Token()
	must(t, x.Release(ctx))
	x2 := acquired(t, c.Exclusive(k("x"), opts...))
	if x2.Token() <= t1 {
		t.Fatalf("tokens increase: %d then %d", t1, x2.Token())
	}
	must(t, x2.Release(ctx))
	if locked, err := c.Locked(ctx, k("x")); err != nil || locked {
		t.Fatalf("released: locked=%v err=%v", locked, err)
	}
	// Reentrant: holds counted.
	r := acquired(t, c.Reentrant(k("r"), opts...))
	must(t, r.Reacquire(ctx))
	must(t, r.Release(ctx))
	if locked, _ := c.Locked(ctx, k("r")); !locked {
		t.Fatal("one hold left")
	}
	must(t, r.Release(ctx))
	if locked, _ := c.Locked(ctx, k("r")); locked {
		t.Fatal("both holds released")
	}
	if err := r.Release(ctx); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a third release: %v", err)
	}
	// Read-write: readers share, a writer is refused; then the other way.
	ra := acquired(t, c.Read(k("rw"), opts...))
	rb := acquired(t, c.Read(k("rw"), opts...))
	refused(t, c.Write(k("rw"), opts...))
	must(t, ra.Release(ctx))
	must(t, rb.Release(ctx))
	w := acquired(t, c.Write(k("rw"), opts...))
	refused(t, c.Read(k("rw"), opts...))
	must(t, w.Release(ctx))
	// Semaphore: two permits.
	p0 := acquired(t, c.Semaphore(k("sem"), 2, opts...))
	p1 := acquired(t, c.Semaphore(k("sem"), 2, opts...))
	refused(t, c.Semaphore(k("sem"), 2, opts...))
	must(t, p0.Release(ctx))
	p2 := acquired(t, c.Semaphore(k("sem"), 2, opts...))
	if p1.Token() == p2.Token() {
		t.Fatal("a token per permit")
	}
	must(t, p1.Release(ctx))
	must(t, p2.Release(ctx))
	// Multi: all or none, a token per key.
	m := acquired(t, c.Multi([]string{k("m1"), k("m2")}, opts...))
	if len(m.Tokens()) != 2 {
		t.Fatalf("tokens %v", m.Tokens())
	}
	refused(t, c.Exclusive(k("m2"), opts...))
	refused(t, c.Multi([]string{k("m0"), k("m2")}, opts...))
	if locked, _ := c.Locked(ctx, k("m0")); locked {
		t.Fatal("none taken when one is busy")
	}
	must(t, m.Release(ctx))
	must(t, acquired(t, c.Exclusive(k("m2"), opts...)).Release(ctx))
	// A given owner is honoured by every kind.
	for _, l := range []*Lock{
		c.Exclusive(k("o1"), append(opts, WithOwner("me\x00\xff"))...),
		c.Reentrant(k("o2"), append(opts, WithOwner("me\x00\xff"))...),
		c.Read(k("o3"), append(opts, WithOwner("me\x00\xff"))...),
		c.Write(k("o4"), append(opts, WithOwner("me\x00\xff"))...),
		c.Semaphore(k("o5"), 3, append(opts, WithOwner("me\x00\xff"))...),
		c.Multi([]string{k("o6"), k("o7")}, append(opts, WithOwner("me\x00\xff"))...),
	} {
		h := acquired(t, l)
		if h.Owner() != "me\x00\xff" {
			t.Fatalf("owner %q", h.Owner())
		}
		must(t, h.Release(ctx))
	}
}

func TestEveryKindBoundAndNot(t *testing.T) {
	addr := env(t, "REDIS_LOCK_ADDR")
	c := New(addr)
	defer c.Close()
	for _, bind := range []bool{true, false} {
		everyKind(t, c, func(n string) string { return fmt.Sprintf("go:%v:%s", bind, n) }, WithBind(bind))
	}
	// Binary-safe keys: NUL and non-UTF-8 bytes, kept apart from their prefix.
	a := admin(t, addr)
	h := acquired(t, c.Exclusive("go:bin\x00\xff\xfe"))
	defer h.Release(context.Background())
	if n, _ := redis.Int(a.Do("EXISTS", "go:bin\x00\xff\xfe")); n != 1 {
		t.Fatal("the key with NUL and 0xff exists as given")
	}
	if n, _ := redis.Int(a.Do("EXISTS", "go:bin")); n != 0 {
		t.Fatal("no truncated key")
	}
	if !h.Bound() {
		t.Fatal("bound by default")
	}
}

func TestWaitsInTheServerWithoutPolling(t *testing.T) {
	addr := env(t, "REDIS_LOCK_ADDR")
	c := New(addr)
	defer c.Close()
	a := admin(t, addr)
	holder := acquired(t, c.Exclusive("go:w"))
	_, err := a.Do("CONFIG", "RESETSTAT")
	must(t, err)
	go func() {
		time.Sleep(400 * time.Millisecond)
		holder.Release(context.Background())
	}()
	start := time.Now()
	h, err := c.Exclusive("go:w", WithWait(5*time.Second)).Acquire(context.Background())
	must(t, err)
	if el := time.Since(start); el < 350*time.Millisecond || el > 3*time.Second {
		t.Fatalf("granted after %v, at the release", el)
	}
	if n := calls(t, a, "lock.acquire"); n != 1 {
		t.Fatalf("one LOCK.ACQUIRE for the whole wait, not polling: %d", n)
	}
	must(t, h.Release(context.Background()))
	// A wait that runs out is ErrNotAcquired, on time.
	holder = acquired(t, c.Exclusive("go:w"))
	start = time.Now()
	_, err = c.Exclusive("go:w", WithWait(300*time.Millisecond)).Acquire(context.Background())
	if !errors.Is(err, ErrNotAcquired) || time.Since(start) < 290*time.Millisecond {
		t.Fatalf("ran out after %v: %v", time.Since(start), err)
	}
	// The context's deadline bounds WaitForever, in the server.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = c.Exclusive("go:w", WithWait(WaitForever)).Acquire(ctx)
	if !errors.Is(err, ErrNotAcquired) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("bounded by the context: %v", err)
	}
	must(t, holder.Release(context.Background()))
}

// A cancelled context stops the wait in the server: the waiter leaves the
// queue and is never granted.
func TestCancelledContextLeavesTheQueue(t *testing.T) {
	addr := env(t, "REDIS_LOCK_ADDR")
	c := New(addr)
	defer c.Close()
	a := admin(t, addr)
	for _, bind := range []bool{true, false} {
		key := fmt.Sprintf("go:cancel:%v", bind)
		holder := acquired(t, c.Exclusive(key))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := c.Exclusive(key, WithWait(WaitForever), WithBind(bind)).Acquire(ctx)
			done <- err
		}()
		waiters := func() int64 {
			v, err := redis.Values(a.Do("LOCK.INFO", key))
			must(t, err)
			for i := 0; i+1 < len(v); i += 2 {
				if s, _ := redis.String(v[i], nil); s == "waiters" {
					n, _ := redis.Int64(v[i+1], nil)
					return n
				}
			}
			return -1
		}
		waitUntil(t, 3*time.Second, "the waiter in the queue", func() bool { return waiters() == 1 })
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled: %v", err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("the cancelled acquire did not return")
		}
		waitUntil(t, 2*time.Second, "the queue to empty", func() bool { return waiters() == 0 })
		must(t, holder.Release(context.Background()))
		time.Sleep(50 * time.Millisecond)
		if locked, _ := c.Locked(context.Background(), key); locked {
			t.Fatal("the cancelled waiter was granted")
		}
	}
}

func TestKeepaliveRenewsBoundWithKeepaliveElseRenew(t *testing.T) {
	addr := env(t, "REDIS_LOCK_ADDR")
	c := New(addr)
	defer c.Close()
	a := admin(t, addr)
	for _, bind := range []bool{true, false} {
		key := fmt.Sprintf("go:ka:%v", bind)
		_, err := a.Do("CONFIG", "RESETSTAT")
		must(t, err)
		h := acquired(t, c.Exclusive(key, WithTTL(2000*time.Millisecond), WithBind(bind)))
		time.Sleep(3000 * time.Millisecond) // renewals every 667 ms
		if h.Err() != nil {
			t.Fatalf("renewed: %v", h.Err())
		}
		ka, rn := calls(t, a, "lock.keepalive"), calls(t, a, "lock.renew")
		if bind && (ka < 3 || rn != 0) || !bind && (rn < 3 || ka != 0) {
			t.Fatalf("bind=%v: %d KEEPALIVE, %d RENEW", bind, ka, rn)
		}
		must(t, h.Extend(context.Background(), 20*time.Second))
		// The holder's ttl (LOCK.INFO): a bound lock's key has no Redis
		// TTL (it follows its connection's lease).
		info, _ := redis.Values(a.Do("LOCK.INFO", key))
		holders, _ := redis.Values(info[3], nil)
		holder, _ := redis.Values(holders[0], nil)
		if left, _ := redis.Int(holder[2], nil); left < 10000 {
			t.Fatalf("extended: ttl %d", left)
		}
		must(t, h.Release(context.Background()))
		select {
		case <-h.Lost():
		default:
			t.Fatal("Lost is closed after the release")
		}
		if errors.Is(h.Err(), ErrLeaseLost) {
			t.Fatal("a release is not a lost lease")
		}
		// No renewal after the release.
		before := calls(t, a, "lock.keepalive") + calls(t, a, "lock.renew")
		time.Sleep(500 * time.Millisecond)
		if after := calls(t, a, "lock.keepalive") + calls(t, a, "lock.renew"); after != before {
			t.Fatalf("renewals after the release: %d then %d", before, after)
		}
	}
}

// Lost leases: deleted, overwritten (WRONGTYPE), the bound connection killed.
func TestLostLease(t *testing.T) {
	addr := env(t, "REDIS_LOCK_ADDR")
	c := New(addr)
	defer c.Close()
	a := admin(t, addr)
	ctx := context.Background()
	for _, bind := range []bool{true, false} {
		for _, how := range []string{"DEL", "SET"} {
			key := fmt.Sprintf("go:lost:%v:%s", bind, how)
			h := acquired(t, c.Exclusive(key, WithTTL(600*time.Millisecond), WithBind(bind)))
			args := []interface{}{key}
			if how == "SET" {
				args = append(args, "a string")
			}
			_, err := a.Do(how, args...)
			must(t, err)
			select {
			case <-h.Lost():
			case <-time.After(2 * time.Second):
				t.Fatalf("%s bind=%v: not seen lost", how, bind)
			}
			var lost *LeaseLostError
			if !errors.Is(h.Err(), ErrLeaseLost) || !errors.As(h.Err(), &lost) || lost.Token != h.Token() {
				t.Fatalf("%s: Err %v", how, h.Err())
			}
			if err := h.Release(ctx); !errors.Is(err, ErrLeaseLost) {
				t.Fatalf("%s: release %v", how, err)
			}
		}
		// Found at the release, before any renewal.
		for _, how := range []string{"DEL", "SET"} {
			key := fmt.Sprintf("go:lostrel:%v:%s", bind, how)
			h := acquired(t, c.Exclusive(key, WithBind(bind)))
			args := []interface{}{key}
			if how == "SET" {
				args = append(args, "x")
			}
			_, err := a.Do(how, args...)
			must(t, err)
			if err := h.Release(ctx); !errors.Is(err, ErrLeaseLost) {
				t.Fatalf("%s at release: %v", how, err)
			}
		}
	}
	// A bound holder's connection killed: the lock is free at once.
	h := acquired(t, c.Exclusive("go:killed", WithTTL(10*time.Second)))
	_, err := a.Do("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
	must(t, err)
	other, err := c.Exclusive("go:killed", WithWait(500*time.Millisecond)).Acquire(ctx)
	must(t, err)
	select {
	case <-h.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the killed holder not told")
	}
	if err := h.Release(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("release after kill: %v", err)
	}
	must(t, other.Release(ctx))
}

// A bound Session (WithBind(true)): many locks on one connection, one
// LOCK.KEEPALIVE; closing it frees them.
func TestBoundSessionOneKeepaliveForManyLocks(t *testing.T) {
	addr := env(t, "REDIS_LOCK_ADDR")
	c := New(addr)
	defer c.Close()
	a := admin(t, addr)
	ctx := context.Background()
	lost := newLostCounter()
	s, err := c.NewSession(ctx, WithTTL(600*time.Millisecond), WithBind(true), WithOnLost(lost.onLost))
	must(t, err)
	_, err = a.Do("CONFIG", "RESETSTAT")
	must(t, err)
	var hs []*Held
	for i := 0; i < 5; i++ {
		hs = append(hs, acquired(t, c.Exclusive(fmt.Sprintf("go:s%d", i), WithSession(s))))
	}
	hs = append(hs, acquired(t, c.Multi([]string{"go:sm1", "go:sm2"}, WithSession(s))))
	time.Sleep(1500 * time.Millisecond)
	for _, h := range hs {
		must(t, h.Err())
	}
	if ka, rn := calls(t, a, "lock.keepalive"), calls(t, a, "lock.renew"); ka < 5 || ka > 9 || rn != 0 {
		t.Fatalf("one KEEPALIVE per tick for all: %d KEEPALIVE, %d RENEW", ka, rn)
	}
	// One deleted: that one lost, the others kept.
	_, err = a.Do("DEL", "go:s0")
	must(t, err)
	select {
	case <-hs[0].Lost():
	case <-time.After(2 * time.Second):
		t.Fatal("the deleted one not seen lost")
	}
	waitUntil(t, 2*time.Second, "the lost callback", func() bool { return lost.total() == 1 })
	lost.onceEach(t, hs[:1])
	time.Sleep(500 * time.Millisecond)
	for _, h := range hs[1:] {
		must(t, h.Err())
	}
	// A waiting acquire in the session waits on a connection of its own
	// (the keepalive goes on), and is bound to the session once granted.
	holder := acquired(t, c.Exclusive("go:sw"))
	go func() {
		time.Sleep(1 * time.Second)
		holder.Release(ctx)
	}()
	w, err := c.Exclusive("go:sw", WithSession(s), WithWait(5*time.Second)).Acquire(ctx)
	must(t, err)
	for _, h := range hs[1:] {
		must(t, h.Err()) // renewed while the acquire waited
	}
	rw, err := c.Write("go:srw", WithSession(s)).Acquire(ctx)
	must(t, err)
	if err := w.Extend(ctx, time.Minute); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Extend in a session: %v", err)
	}
	must(t, hs[1].Release(ctx))
	// Closing the session frees all the rest at once.
	must(t, s.Close())
	<-s.Done()
	for _, k := range []string{"go:s2", "go:sm1", "go:sw", "go:srw"} {
		if locked, _ := c.Locked(ctx, k); locked {
			t.Fatalf("%s freed with the session", k)
		}
	}
	if !errors.Is(rw.Err(), ErrClosed) {
		t.Fatalf("closed: %v", rw.Err())
	}
	if _, err := c.Exclusive("go:after", WithSession(s)).Acquire(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("acquire in a closed session: %v", err)
	}
}

func TestDeadlockIsAnError(t *testing.T) {
	addr := env(t, "REDIS_LOCK_ADDR")
	c := New(addr)
	defer c.Close()
	a := admin(t, addr)
	ctx := context.Background()
	a1 := acquired(t, c.Exclusive("go:d1", WithOwner("A")))
	b2 := acquired(t, c.Exclusive("go:d2", WithOwner("B")))
	var wg sync.WaitGroup
	var aErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		var h *Held
		h, aErr = c.Exclusive("go:d2", WithOwner("A"), WithWait(5*time.Second)).Acquire(ctx)
		if aErr == nil {
			aErr = h.Release(ctx)
		}
	}()
	waitUntil(t, 3*time.Second, "A to wait", func() bool {
		info, _ := redis.String(a.Do("INFO", "lock"))
		return strings.Contains(info, "lock_waiters:1")
	})
	_, err := c.Exclusive("go:d1", WithOwner("B"), WithWait(5*time.Second)).Acquire(ctx)
	if !errors.Is(err, ErrDeadlock) || !strings.Contains(err.Error(), "DEADLOCK") {
		t.Fatalf("want ErrDeadlock, got %v", err)
	}
	must(t, b2.Release(ctx))
	wg.Wait()
	must(t, aErr)
	must(t, a1.Release(ctx))
}

func TestBadInputIsErrInvalid(t *testing.T) {
	c := New("127.0.0.1:1") // nothing is sent
	defer c.Close()
	many := make([]string, 1001)
	for i := range many {
		many[i] = strconv.Itoa(i)
	}
	for name, l := range map[string]*Lock{
		"empty owner":   c.Exclusive("k", WithOwner("")),
		"zero ttl":      c.Exclusive("k", WithTTL(0)),
		"sub-ms ttl":    c.Exclusive("k", WithTTL(time.Microsecond)),
		"negative wait": c.Exclusive("k", WithWait(-5*time.Second)),
		"no keys":       c.Multi(nil),
		"repeated key":  c.Multi([]string{"a", "a"}),
		"1001 keys":     c.Multi(many),
		"0 permits":     c.Semaphore("k", 0),
		"nil session":   c.Exclusive("k", WithSession(nil)),
	} {
		if _, err := l.Acquire(context.Background()); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: want ErrInvalid, got %v", name, err)
		}
	}
	if _, err := NewRedLock(nil).Acquire(context.Background(), "k"); !errors.Is(err, ErrInvalid) {
		t.Errorf("RedLock without servers: %v", err)
	}
	if _, err := c.NewSession(context.Background(), WithTTL(0)); !errors.Is(err, ErrInvalid) {
		t.Errorf("session with ttl 0: %v", err)
	}
	// A server that is not there: a connection error, within the timeout.
	start := time.Now()
	if _, err := c.Exclusive("k").Acquire(context.Background()); err == nil || errors.Is(err, ErrNotAcquired) {
		t.Errorf("no server: %v", err)
	}
	if time.Since(start) > 3*time.Second {
		t.Errorf("took %v", time.Since(start))
	}
}

// A SIGSTOPped server: its lock is lost within the lease, calls to it end
// within the timeout, and the lock on the other server is kept.
func TestStalledServerStallsNothingElse(t *testing.T) {
	addr := env(t, "REDIS_LOCK_ADDR")
	stallAddr := env(t, "REDIS_LOCK_STALL_ADDR")
	pid, err := strconv.Atoi(env(t, "REDIS_LOCK_STALL_PID"))
	must(t, err)
	good := New(addr, WithTimeout(300*time.Millisecond))
	bad := New(stallAddr, WithTimeout(300*time.Millisecond))
	defer good.Close()
	defer bad.Close()
	ctx := context.Background()
	s, err := good.NewSession(ctx, WithTTL(3000*time.Millisecond))
	must(t, err)
	defer s.Close()
	g1 := acquired(t, good.Exclusive("go:stall:g1", WithTTL(3000*time.Millisecond)))
	g2 := acquired(t, good.Exclusive("go:stall:g2", WithSession(s)))
	b1 := acquired(t, bad.Exclusive("go:stall:b1", WithTTL(900*time.Millisecond)))
	b2 := acquired(t, bad.Exclusive("go:stall:b2", WithTTL(900*time.Millisecond), WithBind(false)))
	must(t, syscall.Kill(pid, syscall.SIGSTOP))
	defer syscall.Kill(pid, syscall.SIGCONT)
	start := time.Now()
	if _, err := bad.Exclusive("go:stall:b3").Acquire(ctx); err == nil || time.Since(start) > 2*time.Second {
		t.Fatalf("an acquire on the stalled server: %v after %v", err, time.Since(start))
	}
	for _, h := range []*Held{b1, b2} {
		select {
		case <-h.Lost():
		case <-time.After(3 * time.Second):
			t.Fatal("the stalled server's lock (a lease of 0.9 s) not lost within 3 s")
		}
	}
	time.Sleep(1 * time.Second)
	must(t, g1.Err())
	must(t, g2.Err())
	start = time.Now()
	if err := b1.Release(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("release on the stalled server: %v", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("release took %v", time.Since(start))
	}
	must(t, syscall.Kill(pid, syscall.SIGCONT))
	must(t, g1.Release(ctx))
	must(t, g2.Release(ctx))
}

// redigo has no cluster client: a Client is one node, and a lock's keys
// must be in that node's slots. Every kind against the node that owns the
// slot of {go}; a key elsewhere is the server's MOVED error.
func TestClusterNodeSingleSlot(t *testing.T) {
	addrs := strings.Split(env(t, "REDIS_LOCK_CLUSTER_ADDRS"), ",")
	a := admin(t, addrs[0])
	slotOf := func(key string) int {
		n, err := redis.Int(a.Do("CLUSTER", "KEYSLOT", key))
		must(t, err)
		return n
	}
	slots, err := redis.Values(a.Do("CLUSTER", "SLOTS"))
	must(t, err)
	owner := func(slot int) string {
		for _, r := range slots {
			v, _ := redis.Values(r, nil)
			lo, _ := redis.Int(v[0], nil)
			hi, _ := redis.Int(v[1], nil)
			if slot >= lo && slot <= hi {
				node, _ := redis.Values(v[2], nil)
				host, _ := redis.String(node[0], nil)
				port, _ := redis.Int(node[1], nil)
				return fmt.Sprintf("%s:%d", host, port)
			}
		}
		t.Fatalf("no owner of slot %d", slot)
		return ""
	}
	node := owner(slotOf("{go}"))
	c := New(node)
	defer c.Close()
	everyKind(t, c, func(n string) string { return "{go}:" + n })
	g := acquired(t, c.Exclusive("{go}:guard"))
	if v, err := redis.String(g.Guard(context.Background(), "SET", "{go}:guarded", "v")); err != nil || v != "OK" {
		t.Fatalf("a guarded SET in the lock key's slot: %q %v", v, err)
	}
	must(t, g.Release(context.Background()))
	h := acquired(t, c.Exclusive("{go}:renewed", WithTTL(2000*time.Millisecond)))
	time.Sleep(2500 * time.Millisecond)
	must(t, h.Err())
	must(t, h.Release(context.Background()))
	for i := 0; ; i++ {
		key := fmt.Sprintf("elsewhere%d", i)
		if owner(slotOf(key)) == node {
			continue
		}
		_, err := c.Exclusive(key).Acquire(context.Background())
		if err == nil || !strings.HasPrefix(err.Error(), "MOVED") {
			t.Fatalf("a key of another node: %v", err)
		}
		break
	}
}

func TestRedLock(t *testing.T) {
	addrs := strings.Split(env(t, "REDLOCK_ADDRS"), ",")
	down, err := strconv.Atoi(env(t, "REDLOCK_DOWN"))
	must(t, err)
	var clients []*Client
	for _, a := range addrs {
		c := New(a, WithTimeout(200*time.Millisecond))
		defer c.Close()
		clients = append(clients, c)
	}
	ctx := context.Background()
	key := fmt.Sprintf("go:redlock:%d", down)
	rl := NewRedLock(clients, WithTTL(5*time.Second), WithRetries(1), WithRetryDelay(50*time.Millisecond))
	lease, err := rl.Acquire(ctx, key)
	if down >= 3 {
		if !errors.Is(err, ErrNotAcquired) {
			t.Fatalf("%d of 5 down: want ErrNotAcquired, got %v", down, err)
		}
		for _, c := range clients[:5-down] {
			if locked, err := c.Locked(ctx, key); err != nil || locked {
				t.Fatalf("what the live servers granted is released: %v %v", locked, err)
			}
		}
		return
	}
	must(t, err)
	if len(lease.Tokens) != 5-down || lease.Remaining() <= 0 || lease.Remaining() > 5*time.Second {
		t.Fatalf("tokens %v, remaining %v", lease.Tokens, lease.Remaining())
	}
	if _, err := NewRedLock(clients, WithRetries(0)).Acquire(ctx, key); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("a second RedLock holder: %v", err)
	}
	must(t, lease.Extend(ctx, 10*time.Second))
	must(t, lease.Release(ctx))
	for _, c := range clients[:5-down] {
		if locked, _ := c.Locked(ctx, key); locked {
			t.Fatal("released")
		}
	}
	if err := lease.Release(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("a second release: %v", err)
	}
}

// TestDurableGrants: a master (REDIS_LOCK_DURABLE_ADDR) with one replica
// whose process (REDIS_LOCK_DURABLE_REPLICA_PID) is SIGSTOPped here to
// withhold its acknowledgements (SIGCONT again whatever happens). Bound and
// not: a grant and its renewals acknowledged with the replica up; with it
// paused, a grant released with ErrNotDurable, or kept with Durable() false
// WithAllowNotDurable, and a renewal told to WithOnNotDurable.
func TestDurableGrants(t *testing.T) {
	addr := env(t, "REDIS_LOCK_DURABLE_ADDR")
	pid, err := strconv.Atoi(env(t, "REDIS_LOCK_DURABLE_REPLICA_PID"))
	must(t, err)
	paused := false
	pause := func() { must(t, syscall.Kill(pid, syscall.SIGSTOP)); paused = true }
	resume := func() { must(t, syscall.Kill(pid, syscall.SIGCONT)); paused = false }
	defer func() {
		if paused {
			resume()
		}
	}()
	c := New(addr)
	defer c.Close()
	ctx := context.Background()
	for _, bind := range []bool{true, false} {
		var mu sync.Mutex
		var told []error
		record := func(e error) { mu.Lock(); told = append(told, e); mu.Unlock() }
		toldNow := func() []error { mu.Lock(); defer mu.Unlock(); return append([]error(nil), told...) }

		l := c.Exclusive(fmt.Sprintf("durable-ok-%v", bind), WithBind(bind), WithTTL(6000*time.Millisecond),
			WithReplicas(1, 2*time.Second), WithOnNotDurable(record))
		t0 := time.Now()
		h := acquired(t, l)
		t.Logf("bind %v: grant + WAIT 1 in %v", bind, time.Since(t0))
		if !h.Durable() || h.Bound() != bind {
			t.Fatalf("bind %v: durable %v, bound %v", bind, h.Durable(), h.Bound())
		}
		time.Sleep(2500 * time.Millisecond) // a renewal at 2000 ms
		if !h.Durable() || h.Err() != nil || len(toldNow()) != 0 {
			t.Fatalf("bind %v: renewals acknowledged: durable %v, err %v, told %v", bind, h.Durable(), h.Err(), toldNow())
		}
		must(t, h.Release(ctx))

		// Refused and released; kept and flagged when allowed.
		pause()
		key := fmt.Sprintf("durable-refused-%v", bind)
		t0 = time.Now()
		h, err := c.Exclusive(key, WithBind(bind), WithReplicas(1, 200*time.Millisecond)).Acquire(ctx)
		took := time.Since(t0)
		var nd *NotDurableError
		if !errors.Is(err, ErrNotDurable) || !errors.As(err, &nd) || nd.Acknowledged != 0 || nd.Replicas != 1 || h != nil {
			resume()
			t.Fatalf("bind %v: want ErrNotDurable 0 of 1, got %v, %v", bind, h, err)
		}
		if took < 190*time.Millisecond || took > 5*time.Second {
			resume()
			t.Fatalf("bind %v: took %v, not the WAIT's 200 ms", bind, took)
		}
		locked, err := c.Exclusive(key).Locked(ctx)
		if err != nil || locked {
			resume()
			t.Fatalf("bind %v: released on the master: locked %v, %v", bind, locked, err)
		}
		kept, err := c.Exclusive(fmt.Sprintf("durable-kept-%v", bind), WithBind(bind),
			WithReplicas(1, 200*time.Millisecond), WithAllowNotDurable()).Acquire(ctx)
		resume()
		if err != nil || kept.Durable() {
			t.Fatalf("bind %v: kept and flagged: %v, %v", bind, kept, err)
		}
		must(t, kept.Release(ctx))

		// A renewal not acknowledged: told, the lease kept.
		told = nil
		h = acquired(t, c.Exclusive(fmt.Sprintf("durable-renew-%v", bind), WithBind(bind), WithTTL(3000*time.Millisecond),
			WithReplicas(1, 100*time.Millisecond), WithOnNotDurable(record)))
		pause()
		// The renewal at 1000 ms waits 100 ms for the paused replica (later
		// on a loaded machine, but before the lease's end at 3000 ms).
		for until := time.Now().Add(2800 * time.Millisecond); len(toldNow()) == 0 && time.Now().Before(until); {
			time.Sleep(20 * time.Millisecond)
		}
		flag, lostErr := h.Durable(), h.Err()
		resume()
		got := toldNow()
		if len(got) == 0 || !errors.Is(got[0], ErrNotDurable) || flag || lostErr != nil {
			t.Fatalf("bind %v: renewal told: %v, durable %v, err %v", bind, got, flag, lostErr)
		}
		t.Logf("bind %v: told %v", bind, got[0])
		time.Sleep(2200 * time.Millisecond)
		if !h.Durable() {
			t.Fatalf("bind %v: acknowledged again after the replica resumed", bind)
		}
		must(t, h.Release(ctx))
	}

	// Renewals whose WAIT runs its 4.5 s timeout (the replica paused) on a
	// 6 s lease, bound and not (at once, under one pause): each next one is
	// due a third of the ttl after the last was sent (at once when its WAIT
	// ends), so the lease is kept; counted from the WAIT's end, the first
	// one's successor came at 8.5 s, past the lease's end at 8 s.
	binds := []bool{true, false}
	longs := make([]*Held, len(binds))
	for i, bind := range binds {
		longs[i] = acquired(t, c.Exclusive(fmt.Sprintf("durable-long-%v", bind), WithBind(bind),
			WithTTL(6000*time.Millisecond), WithReplicas(1, 4500*time.Millisecond), WithOnNotDurable(func(error) {})))
	}
	pause()
	time.Sleep(10 * time.Second)
	errs := make([]error, len(binds))
	for i, h := range longs {
		errs[i] = h.Err()
	}
	resume()
	for i, bind := range binds {
		if errs[i] != nil {
			t.Fatalf("bind %v: a 6 s lease lost under 4.5 s WAITs: %v", bind, errs[i])
		}
		if locked, err := c.Exclusive(fmt.Sprintf("durable-long-%v", bind)).Locked(ctx); err != nil || !locked {
			t.Fatalf("bind %v: still held on the server: %v, %v", bind, locked, err)
		}
		must(t, longs[i].Release(ctx))
	}
}

// Guard: the command runs while held, on every kind but Multi; refused
// (ErrLeaseLost, nothing run) once the lease is lost, under another owner,
// and under a stale token of the same owner name; pipelined with SendGuard.
func TestGuard(t *testing.T) {
	addr := env(t, "REDIS_LOCK_ADDR")
	c := New(addr)
	defer c.Close()
	a := admin(t, addr)
	ctx := context.Background()
	get := func(key string) string {
		t.Helper()
		v, err := redis.String(a.Do("GET", key))
		if err == redis.ErrNil {
			return "(nil)"
		}
		must(t, err)
		return v
	}
	_, err := a.Do("DEL", "go:guard:n")
	must(t, err)
	for i, lock := range []*Lock{
		c.Exclusive("go:guard:x"),
		c.Reentrant("go:guard:r"),
		c.Read("go:guard:rw"),
		c.Write("go:guard:w"),
		c.Semaphore("go:guard:s", 2),
		c.Exclusive("go:guard:unbound", WithBind(false)),
	} {
		h := acquired(t, lock)
		data := "go:guard:data:" + lock.Keys()[0]
		v, err := redis.String(h.Guard(ctx, "SET", data, "done"))
		if err != nil || v != "OK" || get(data) != "done" {
			t.Fatalf("%s: guarded SET: %q %v, %s", lock.Kind(), v, err, get(data))
		}
		n, err := redis.Int64(h.Guard(ctx, "INCR", "go:guard:n"))
		if err != nil || n != int64(i+1) {
			t.Fatalf("%s: guarded INCR: %d %v", lock.Kind(), n, err)
		}
		_, err = h.Guard(ctx, "INCR", data)
		var re redis.Error
		if !errors.As(err, &re) || errors.Is(err, ErrLeaseLost) || !strings.Contains(err.Error(), "not an integer") {
			t.Fatalf("%s: the command's own error: %v", lock.Kind(), err)
		}
		must(t, h.Err())
		must(t, h.Release(ctx))
		if _, err := h.Guard(ctx, "SET", data, "late"); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%s: a guard after the release: %v", lock.Kind(), err)
		}
	}
	m := acquired(t, c.Multi([]string{"{go:guard}:m1", "{go:guard}:m2"}))
	if _, err := m.Guard(ctx, "SET", "{go:guard}:data", "x"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a Multi lock's guard: %v", err)
	}
	must(t, m.Release(ctx))

	refusedGuard := func(what string, h *Held, data, want string) {
		t.Helper()
		_, err := h.Guard(ctx, "SET", data, "from the lost holder")
		var lost *LeaseLostError
		if !errors.Is(err, ErrLeaseLost) || !errors.As(err, &lost) || lost.Token != h.Token() {
			t.Fatalf("%s: %v", what, err)
		}
		select {
		case <-h.Lost():
		default:
			t.Fatalf("%s: Lost() not closed", what)
		}
		if got := get(data); got != want {
			t.Fatalf("%s: the data is %q, not %q", what, got, want)
		}
	}

	// Released behind its back (unbound, long ttl: only the server's check knows).
	_, err = a.Do("SET", "go:guard:lost:data", "before")
	must(t, err)
	h := acquired(t, c.Exclusive("go:guard:lost", WithBind(false)))
	n, err := redis.Int(a.Do("LOCK.RELEASE", "go:guard:lost", h.Owner()))
	if err != nil || n != 1 {
		t.Fatalf("released behind its back: %d %v", n, err)
	}
	must(t, h.Err())
	refusedGuard("lost", h, "go:guard:lost:data", "before")
	if err := h.Release(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("release after the refused guard: %v", err)
	}

	// Another owner holds the key: its data stands.
	h = acquired(t, c.Exclusive("go:guard:other", WithBind(false)))
	_, err = a.Do("DEL", "go:guard:other") // as if the lease ran out while this holder paused
	must(t, err)
	other := acquired(t, c.Exclusive("go:guard:other"))
	_, err = other.Guard(ctx, "SET", "go:guard:other:data", "other")
	must(t, err)
	refusedGuard("another owner", h, "go:guard:other:data", "other")
	must(t, other.Err())
	must(t, other.Release(ctx))

	// The lock's token is sent: the same owner name holding again refuses the stale holder.
	stale := acquired(t, c.Exclusive("go:guard:tok", WithOwner("go-worker"), WithBind(false)))
	_, err = a.Do("LOCK.RELEASE", "go:guard:tok", "go-worker")
	must(t, err)
	fresh := acquired(t, c.Exclusive("go:guard:tok", WithOwner("go-worker")))
	if fresh.Token() <= stale.Token() {
		t.Fatalf("tokens %d then %d", stale.Token(), fresh.Token())
	}
	_, err = fresh.Guard(ctx, "SET", "go:guard:tok:data", "fresh")
	must(t, err)
	refusedGuard("stale token", stale, "go:guard:tok:data", "fresh")

	// Pipelined on a connection of the caller's: the fresh holder's guard runs, the stale one's is refused.
	stale2 := acquired(t, c.Exclusive("go:guard:pipe", WithOwner("go-worker"), WithBind(false)))
	_, err = a.Do("LOCK.RELEASE", "go:guard:pipe", "go-worker")
	must(t, err)
	fresh2 := acquired(t, c.Exclusive("go:guard:pipe", WithOwner("go-worker")))
	conn, err := redis.Dial("tcp", addr)
	must(t, err)
	defer conn.Close()
	must(t, fresh2.SendGuard(conn, "SET", "go:guard:pipe:data", "fresh"))
	must(t, stale2.SendGuard(conn, "SET", "go:guard:pipe:data", "stale"))
	must(t, fresh2.SendGuard(conn, "GET", "go:guard:pipe:data"))
	must(t, conn.Flush())
	if v, err := redis.String(fresh2.GuardResult(conn.Receive())); err != nil || v != "OK" {
		t.Fatalf("pipelined guarded SET: %q %v", v, err)
	}
	if _, err := stale2.GuardResult(conn.Receive()); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("pipelined stale guard: %v", err)
	}
	if v, err := redis.String(fresh2.GuardResult(conn.Receive())); err != nil || v != "fresh" {
		t.Fatalf("pipelined guarded GET: %q %v", v, err)
	}
	if err := stale2.SendGuard(conn, "SET", "go:guard:pipe:data", "stale"); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("SendGuard of a lease known lost: %v", err)
	}
	must(t, fresh.Release(ctx))
	must(t, fresh2.Release(ctx))
}

// boundID: the server's client id of h's bound connection.
func boundID(t *testing.T, h *Held) int64 {
	t.Helper()
	h.sess.mu.Lock()
	defer h.sess.mu.Unlock()
	id, err := redis.Int64(h.sess.conn.Do("CLIENT", "ID"))
	must(t, err)
	return id
}

// lostWithin: h told lost within d (the test's keepalive is further away),
// its error an ErrLeaseLost whose text names the cause.
func lostWithin(t *testing.T, h *Held, d time.Duration, what, cause string) {
	t.Helper()
	start := time.Now()
	select {
	case <-h.Lost():
	case <-time.After(d):
		t.Fatalf("%s: not told within %v (before the next keepalive)", what, d)
	}
	t.Logf("%s: told after %v", what, time.Since(start))
	if err := h.Err(); !errors.Is(err, ErrLeaseLost) || !strings.Contains(err.Error(), cause) {
		t.Fatalf("%s: Err %v, want an ErrLeaseLost saying %q", what, err, cause)
	}
	if err := h.Release(context.Background()); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("%s: release %v", what, err)
	}
}

// Issue 40: a bound lock lost behind its holder's back (DEL, SET over it,
// CLIENT KILL of its connection) is told at once through the watcher, not
// at the next keepalive (a ttl of 30 s: the keepalive is 10 s away), each
// with its own cause; in a Session too. One watcher per Client, closed
// with the last bound holder.
func TestLostBoundLockToldBeforeTheNextKeepalive(t *testing.T) {
	addr := env(t, "REDIS_LOCK_ADDR")
	c := New(addr)
	defer c.Close()
	a := admin(t, addr)
	ctx := context.Background()
	subscribers := func() int {
		v, err := redis.Values(a.Do("PUBSUB", "NUMSUB", "__redis__:invalidate"))
		must(t, err)
		n, _ := redis.Int(v[1], nil)
		return n
	}
	before := subscribers()
	ttl := WithTTL(30 * time.Second)
	keep := acquired(t, c.Exclusive("go:told:keep", ttl))
	if subscribers() != before+1 {
		t.Fatalf("one watcher: %d subscribers, %d before", subscribers(), before)
	}
	cases := []struct{ how, cause string }{
		{"DEL", "deleted"}, {"SET", "overwritten"}, {"KILL", "connection"},
		{"RELEASE", "deleted, freed"},
	}
	for _, session := range []bool{false, true} {
		for _, cs := range cases {
			key := fmt.Sprintf("go:told:%v:%s", session, cs.how)
			opts := []Option{ttl}
			var s *Session
			if session {
				var err error
				s, err = c.NewSession(ctx, ttl, WithBind(true))
				must(t, err)
				opts = append(opts, WithSession(s))
			}
			h := acquired(t, c.Reentrant(key, opts...))
			must(t, h.Reacquire(ctx)) // a write of its own: still watched after it
			time.Sleep(50 * time.Millisecond)
			must(t, h.Err())
			var err error
			switch cs.how {
			case "DEL":
				_, err = a.Do("DEL", key)
			case "SET":
				_, err = a.Do("SET", key, "not a lock")
			case "KILL":
				_, err = a.Do("CLIENT", "KILL", "ID", boundID(t, h))
			case "RELEASE":
				_, err = a.Do("LOCK.RELEASE", key, h.Owner())
				if err == nil {
					_, err = a.Do("LOCK.RELEASE", key, h.Owner())
				}
			}
			must(t, err)
			lostWithin(t, h, 5*time.Second, fmt.Sprintf("%s (session %v)", cs.how, session), cs.cause)
			if s != nil {
				if cs.how == "KILL" {
					<-s.Done()
				}
				s.Close()
			}
		}
	}
	must(t, keep.Err())
	must(t, keep.Release(ctx))
	waitUntil(t, 2*time.Second, "the watcher to close with the last bound lock", func() bool {
		return subscribers() == before
	})
}

// Issue 40: kill -9 of the server is told at once (the watcher's
// connection ends), not at the next keepalive.
func TestKilledServerToldBeforeTheNextKeepalive(t *testing.T) {
	addr := env(t, "REDIS_LOCK_KILL_ADDR")
	pid, err := strconv.Atoi(env(t, "REDIS_LOCK_KILL_PID"))
	must(t, err)
	c := New(addr, WithTimeout(500*time.Millisecond))
	defer c.Close()
	h := acquired(t, c.Exclusive("go:kill9", WithTTL(30*time.Second)))
	s, err := c.NewSession(context.Background(), WithTTL(30*time.Second), WithBind(true))
	must(t, err)
	defer s.Close()
	hs := acquired(t, c.Exclusive("go:kill9:s", WithSession(s)))
	// A server session outlives connections, not its server: its locks
	// are lost at its deadline (1 s), by the local timer.
	ss, err := c.NewSession(context.Background(), WithTTL(1*time.Second))
	must(t, err)
	defer ss.Close()
	hss := acquired(t, c.Exclusive("go:kill9:ss", WithSession(ss)))
	time.Sleep(50 * time.Millisecond)
	must(t, syscall.Kill(pid, syscall.SIGKILL))
	lostWithin(t, h, 5*time.Second, "kill -9", "connection")
	lostWithin(t, hs, 5*time.Second, "kill -9 (bound session)", "connection")
	lostWithin(t, hss, 5*time.Second, "kill -9 (server session)", "deadline")
}

// Issue 40: a stale holder (its lease lost behind its back, the owner name
// granted again to a newer holder) never ends or renews the newer grant:
// its Release, Extend and renewals go with its token, and are told lost.
func TestStaleHolderNeverEndsANewerGrant(t *testing.T) {
	addr := env(t, "REDIS_LOCK_ADDR")
	c := New(addr)
	defer c.Close()
	a := admin(t, addr)
	ctx := context.Background()
	pttl := func(key string) int {
		n, err := redis.Int(a.Do("PTTL", key))
		must(t, err)
		return n
	}
	for _, kind := range []string{"exclusive", "reentrant", "read", "semaphore", "multi"} {
		for _, op := range []string{"release", "extend", "renewal"} {
			key := "go:stale:" + kind + ":" + op
			mk := func(ttl time.Duration) *Lock {
				opts := []Option{WithOwner("worker-1"), WithBind(false), WithTTL(ttl)}
				switch kind {
				case "reentrant":
					return c.Reentrant(key, opts...)
				case "read":
					return c.Read(key, opts...)
				case "semaphore":
					return c.Semaphore(key, 2, opts...)
				case "multi":
					return c.Multi([]string{key}, opts...)
				}
				return c.Exclusive(key, opts...)
			}
			staleTTL := 30 * time.Second
			if op == "renewal" {
				staleTTL = 600 * time.Millisecond // renewed every 200 ms
			}
			stale := acquired(t, mk(staleTTL))
			_, err := a.Do("DEL", key) // lost behind its back
			must(t, err)
			fresh := acquired(t, mk(20*time.Second))
			if fresh.Token() <= stale.Token() {
				t.Fatalf("tokens %d then %d", stale.Token(), fresh.Token())
			}
			switch op {
			case "release":
				if err := stale.Release(ctx); !errors.Is(err, ErrLeaseLost) {
					t.Fatalf("%s: the stale release: %v", key, err)
				}
			case "extend":
				if err := stale.Extend(ctx, time.Second); !errors.Is(err, ErrLeaseLost) {
					t.Fatalf("%s: the stale extend: %v", key, err)
				}
			case "renewal":
				select {
				case <-stale.Lost():
				case <-time.After(3 * time.Second):
					t.Fatalf("%s: the stale holder's renewal not told lost", key)
				}
				if !errors.Is(stale.Err(), ErrLeaseLost) {
					t.Fatalf("%s: %v", key, stale.Err())
				}
			}
			if locked, err := c.Locked(ctx, key); err != nil || !locked || fresh.Err() != nil {
				t.Fatalf("%s: the newer grant kept: locked %v %v, %v", key, locked, err, fresh.Err())
			}
			if n := pttl(key); n < 15000 {
				t.Fatalf("%s: the newer grant's lease shortened by the stale holder: pttl %d", key, n)
			}
			must(t, fresh.Release(ctx))
		}
	}
}

// Issue 40: one Lock built WithOwner shared by goroutines is one holder:
// a second Acquire while it is held is refused at once (ErrHeld), so no
// two goroutines are ever inside; without WithOwner each Acquire is its
// own holder and they exclude one another through the server.
func TestSharedLockWithOwnerLetsOneIn(t *testing.T) {
	addr := env(t, "REDIS_LOCK_ADDR")
	c := New(addr)
	defer c.Close()
	ctx := context.Background()
	for _, named := range []bool{true, false} {
		opts := []Option{WithWait(5 * time.Second)}
		if named {
			opts = append(opts, WithOwner("worker-7"))
		}
		shared := c.Exclusive(fmt.Sprintf("go:shared:%v", named), opts...)
		var mu sync.Mutex
		inside, overlaps, refusals, rounds := 0, 0, 0, 0
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 10; i++ {
					h, err := shared.Acquire(ctx)
					if errors.Is(err, ErrHeld) {
						mu.Lock()
						refusals++
						mu.Unlock()
						time.Sleep(time.Millisecond)
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					inside++
					rounds++
					if inside > 1 {
						overlaps++
					}
					mu.Unlock()
					time.Sleep(2 * time.Millisecond)
					mu.Lock()
					inside--
					mu.Unlock()
					if err := h.Release(ctx); err != nil {
						t.Error(err)
					}
				}
			}()
		}
		wg.Wait()
		if overlaps != 0 || rounds == 0 {
			t.Fatalf("named %v: %d overlaps in %d rounds", named, overlaps, rounds)
		}
		if named && refusals == 0 || !named && refusals != 0 {
			t.Fatalf("named %v: %d refusals (ErrHeld)", named, refusals)
		}
	}
	// Refused while held, clearly; free again once released or lost.
	l := c.Reentrant("go:shared:r", WithOwner("worker-8"))
	h := acquired(t, l)
	if _, err := l.Acquire(ctx); !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), "worker-8") {
		t.Fatalf("second Acquire: %v", err)
	}
	must(t, h.Reacquire(ctx)) // another hold: through the Held
	must(t, h.Release(ctx))
	must(t, h.Release(ctx))
	must(t, acquired(t, l).Release(ctx))
}
