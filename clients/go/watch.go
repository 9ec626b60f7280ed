package redislock

import (
	"context"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"
)

// The watcher tells a bound holder, or a lock in a server session, at once
// that its lock changed: one per Client, opened by the first such holder
// and closed after the last. Two
// connections of its own: a subscriber to __redis__:invalidate, and an
// observer whose client tracking is redirected to it (CLIENT TRACKING ON
// REDIRECT <subscriber id>) and which reads each held key with LOCK.INFO.
// Any change of a held key from any connection then makes the server push
// an invalidation to the subscriber: a DEL, a SET over it, FLUSHALL, a
// release elsewhere, and the server freeing the lock because the holder's
// bound connection closed (CLIENT KILL, the server's idle timeout), which
// the holder's own connection, idle between renewals, would not notice.
// The observer reads the key again (tracking it again), and the sessions
// holding it check their locks on their own connections at once (Session.
// verifyLocked: LOCK.INFO, read only), so the cause is told as it is. A
// watcher whose connection fails (the server killed or restarted) makes
// every watched session check (its own connection fails too, or a new
// watcher is opened); so does an observer that fails (it pings after
// pingEvery without a read). The holder's own renewals change the key as
// well: each is followed by one such check. A server session's locks are
// watched the same way (nodeSession.check: LOCK.SESSION INFO and LOCK.INFO
// on a pooled connection), which tells a session closed or ended elsewhere
// at once too: its end changes every key its holders held.
type watcher struct {
	sub redis.Conn
	obs redis.Conn
	// obsMu: the observer's reads (the reader and pinger goroutines, watch).
	obsMu   sync.Mutex
	closing bool // under Client.wmu
	done    chan struct{}
}

const pingEvery = 5 * time.Second

// watched: the keys of the Client's bound and session holders, and who
// holds each (a count per binding or session: one may hold a key twice).
type watched map[string]map[poker]int

// poker: a binding or a server session, told to check its locks.
type poker interface{ poke() }

// watch registers sess's holder of keys with the watcher (opened if there
// is none) and arms tracking on them; it tells sess to check at once when
// a key is not held by (owner, tokens) already. No watcher (an ACL that
// refuses SUBSCRIBE or CLIENT TRACKING, a server gone): the renewals still
// notice a loss.
func (c *Client) watch(ctx context.Context, sess poker, h *Held) {
	c.wmu.Lock()
	if c.keys == nil {
		c.keys = watched{}
	}
	for _, k := range h.keys {
		if c.keys[k] == nil {
			c.keys[k] = map[poker]int{}
		}
		c.keys[k][sess]++
	}
	w := c.w
	if w == nil {
		w = c.openWatcher(ctx)
	}
	c.wmu.Unlock()
	if w == nil {
		return
	}
	for i, k := range h.keys {
		if !w.observe(k, h.owner, h.tokens[i], c) {
			sess.poke()
			return
		}
	}
}

// unwatch: sess no longer holds h's keys; the last holder closes the watcher.
func (c *Client) unwatch(sess poker, keys []string) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for _, k := range keys {
		if m := c.keys[k]; m != nil {
			if m[sess]--; m[sess] <= 0 {
				delete(m, sess)
			}
			if len(m) == 0 {
				delete(c.keys, k)
			}
		}
	}
	if len(c.keys) == 0 && c.w != nil {
		c.w.closing = true
		c.w.sub.Close()
		c.w.obs.Close()
		close(c.w.done)
		c.w = nil
	}
}

// openWatcher (c.wmu held): the subscriber, then the observer redirected
// to it, and the reader goroutine; every key already watched is tracked.
// nil when the server refuses any of it.
func (c *Client) openWatcher(ctx context.Context) *watcher {
	sub, err := c.dial(ctx)
	if err != nil {
		return nil
	}
	id, err := redis.Int64(sub.Do("CLIENT", "ID"))
	if err == nil {
		_, err = sub.Do("SUBSCRIBE", invalidations)
	}
	if err != nil {
		sub.Close()
		return nil
	}
	obs, err := c.dial(ctx)
	if err == nil {
		_, err = obs.Do("CLIENT", "TRACKING", "ON", "REDIRECT", id)
		if err != nil {
			obs.Close()
		}
	}
	if err != nil {
		sub.Close()
		return nil
	}
	w := &watcher{sub: sub, obs: obs, done: make(chan struct{})}
	c.w = w
	go c.read(w)
	go c.ping(w)
	for k := range c.keys {
		w.observe(k, "", 0, c)
	}
	return w
}

const invalidations = "__redis__:invalidate"

// observe reads key on the observer (tracking it); whether owner holds it
// under token there (true when owner is "" or the read failed: the
// sessions' checks decide). An observer whose connection failed ends the
// watcher (its subscriber closed: the reader tells every session).
func (w *watcher) observe(key, owner string, token int64, c *Client) bool {
	w.obsMu.Lock()
	reply, err := redis.DoWithTimeout(w.obs, c.timeout, "LOCK.INFO", key)
	w.obsMu.Unlock()
	if err != nil && !isReplyError(err) {
		w.sub.Close()
		return true
	}
	if err != nil || owner == "" {
		return true
	}
	return holds(reply, owner, token)
}

// ping: the observer is idle between invalidations; a PING every pingEvery
// finds it dead (CLIENT KILL, the server's idle timeout) and ends the
// watcher, so the sessions check and a new one is opened.
func (c *Client) ping(w *watcher) {
	t := time.NewTicker(pingEvery)
	defer t.Stop()
	for {
		select {
		case <-w.done:
			return
		case <-t.C:
		}
		w.obsMu.Lock()
		_, err := redis.DoWithTimeout(w.obs, c.timeout, "PING")
		w.obsMu.Unlock()
		if err != nil {
			w.sub.Close()
			return
		}
	}
}

// rewatch (after a session's check): a new watcher when the last one ended
// and bound holders are left.
func (c *Client) rewatch(ctx context.Context) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.w == nil && len(c.keys) > 0 {
		c.openWatcher(ctx)
	}
}

// read: the reader goroutine. Each invalidation re-arms tracking on the
// keys it names (every watched key for a flush) and pokes their sessions;
// a failed connection pokes every watched session (they check, and the
// first bound holder left opens a new watcher).
func (c *Client) read(w *watcher) {
	for {
		reply, err := redis.Values(redis.ReceiveWithTimeout(w.sub, 0))
		if err != nil {
			c.wmu.Lock()
			if w.closing {
				c.wmu.Unlock()
				return
			}
			if c.w == w {
				c.w = nil
			}
			w.sub.Close()
			w.obs.Close()
			close(w.done)
			sessions := map[poker]bool{}
			for _, m := range c.keys {
				for s := range m {
					sessions[s] = true
				}
			}
			c.wmu.Unlock()
			for s := range sessions {
				s.poke()
			}
			return
		}
		if len(reply) != 3 || string(asBytes(reply[0])) != "message" {
			continue // the subscription's confirmation
		}
		var keys []string
		if changed, ok := reply[2].([]interface{}); ok {
			for _, k := range changed {
				keys = append(keys, string(asBytes(k)))
			}
		} else { // nil: every key (FLUSHALL, FLUSHDB)
			c.wmu.Lock()
			for k := range c.keys {
				keys = append(keys, k)
			}
			c.wmu.Unlock()
		}
		sessions := map[poker]bool{}
		for _, k := range keys {
			c.wmu.Lock()
			m := c.keys[k]
			for s := range m {
				sessions[s] = true
			}
			held := len(m) > 0 // read under wmu: unwatch writes m
			c.wmu.Unlock()
			if held {
				w.observe(k, "", 0, c) // tracked again before the check
			}
		}
		for s := range sessions {
			s.poke()
		}
	}
}

func asBytes(v interface{}) []byte {
	switch b := v.(type) {
	case []byte:
		return b
	case string:
		return []byte(b)
	}
	return nil
}

// holds: whether LOCK.INFO's reply names owner among the holders, under
// token (any token when token is 0).
func holds(reply interface{}, owner string, token int64) bool {
	fields, err := redis.Values(reply, nil)
	if err != nil {
		return false
	}
	for i := 0; i+1 < len(fields); i += 2 {
		if string(asBytes(fields[i])) != "holders" {
			continue
		}
		list, _ := redis.Values(fields[i+1], nil)
		for _, entry := range list {
			h, _ := redis.Values(entry, nil)
			if len(h) < 4 || string(asBytes(h[0])) != owner {
				continue
			}
			t, _ := redis.Int64(h[3], nil)
			if token == 0 || t == token {
				return true
			}
		}
	}
	return false
}
