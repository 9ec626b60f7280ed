package redislock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Guard runs one Redis command if and only if this holder still holds the
// lock, the check and the command one atomic step in the server: it sends
// `LOCK.GUARD key owner TOKEN <Token()> CALL cmd args...` on a pooled
// connection of the Client, within its timeout. The reply is the command's
// (as redigo returns it: use redis.String, redis.Int64, ... on it); the
// command's own error reply is returned as the redis.Error it is. When the
// server answers NOTHELD (released, expired, deleted, taken by another
// owner, or held again by the same owner name under a newer token) nothing
// ran: the lease is marked lost (Lost() closed) and a *LeaseLostError
// returned (errors.Is(err, ErrLeaseLost)), as it is at once, without
// sending, when the lease is already known lost. A Multi lock's guard, or
// a released holder's, is ErrInvalid (LOCK.GUARD checks one key). On a
// cluster node the command's keys must be in the lock key's slot (a hash
// tag), CROSSSLOT otherwise.
func (h *Held) Guard(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	if err := h.guardable(cmd); err != nil {
		return nil, err
	}
	conn, err := h.lock.c.pool.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return h.GuardResult(redis.DoWithTimeout(conn, h.lock.c.timeout, "LOCK.GUARD", h.guardArgs(cmd, args)...))
}

// SendGuard queues the guard of one command on conn, a connection of the
// caller's (redigo's pipelining: SendGuard and other Sends, conn.Flush,
// then one conn.Receive per command); pass the guard's Receive to
// GuardResult. The same checks as Guard before anything is queued.
func (h *Held) SendGuard(conn redis.Conn, cmd string, args ...interface{}) error {
	if err := h.guardable(cmd); err != nil {
		return err
	}
	return conn.Send("LOCK.GUARD", h.guardArgs(cmd, args)...)
}

// GuardResult is a guard's reply as Guard returns it, from what
// conn.Receive gave for a SendGuard: NOTHELD marks the lease lost and is a
// *LeaseLostError; anything else is returned as it is.
func (h *Held) GuardResult(reply interface{}, err error) (interface{}, error) {
	var re redis.Error
	if !errors.As(err, &re) || !strings.HasPrefix(string(re), "NOTHELD") {
		return reply, err
	}
	why := fmt.Sprintf("LOCK.GUARD under token %d answered %q: nothing ran", h.token(), string(re))
	if ns := h.ns; ns != nil {
		ns.s.mu.Lock()
		lost := ns.dropLocked(h, why)
		ns.s.mu.Unlock()
		ns.s.tell(lost)
	} else {
		s := h.sess
		s.mu.Lock()
		if _, held := s.helds[h]; held {
			s.dropLost(h, why)
		}
		s.mu.Unlock()
	}
	if lost := h.Err(); errors.Is(lost, ErrLeaseLost) {
		return nil, lost
	}
	return nil, &LeaseLostError{Keys: h.keys, Token: h.token(), Why: string(re)}
}

// guardable: a command named, one key, and the lease not known lost.
func (h *Held) guardable(cmd string) error {
	if cmd == "" {
		return invalid("Guard takes a command name")
	}
	if len(h.keys) != 1 {
		return invalid("a guard of a %s lock: LOCK.GUARD checks one key", h.lock.kind)
	}
	if ns := h.ns; ns != nil {
		ns.s.mu.Lock()
		defer ns.s.mu.Unlock()
		if h.released {
			return fmt.Errorf("%w: a guard of a released lock", ErrInvalid)
		}
		return h.Err() // the session's deadline timer ends it in time
	}
	s := h.sess
	s.mu.Lock()
	defer s.mu.Unlock()
	if h.released {
		return fmt.Errorf("%w: a guard of a released lock", ErrInvalid)
	}
	if err := h.Err(); err != nil {
		return err
	}
	if !h.deadline.After(time.Now()) {
		s.dropLost(h, "the lease ran out before the guard")
		return h.Err()
	}
	return nil
}

func (h *Held) guardArgs(cmd string, args []interface{}) []interface{} {
	return append([]interface{}{h.keys[0], h.owner, "TOKEN", h.token(), "CALL", cmd}, args...)
}
