package redislock

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gomodule/redigo/redis"
)

var (
	// ErrNotAcquired: the lock was not granted (busy, and the wait, if
	// any, ran out).
	ErrNotAcquired = errors.New("redislock: not acquired")
	// ErrDeadlock: waiting would have closed a cycle of lock waits (the
	// server's DEADLOCK reply); nothing changed. Release what the task
	// holds, back off, and start the unit of work again.
	ErrDeadlock = errors.New("redislock: deadlock")
	// ErrLeaseLost: the lease ended (or may have ended) before the holder
	// let go: released elsewhere, expired, deleted, overwritten (WRONGTYPE),
	// or its bound connection failed. What was done after that point was
	// protected by the fencing token only.
	ErrLeaseLost = errors.New("redislock: lease lost")
	// ErrInvalid: a request that makes no sense, refused before anything
	// was sent (no key, a repeated key, an empty owner, a zero ttl, ...).
	ErrInvalid = errors.New("redislock: invalid request")
	// ErrClosed: the Session (or Client) was closed.
	ErrClosed = errors.New("redislock: closed")
	// ErrHeld: an Acquire of a Lock built WithOwner while a Held of that
	// Lock is live, or another Acquire of it is under way: one owner name
	// is one holder in the server, so a second goroutine would be "inside"
	// too. Refused at once, nothing sent. Use a Lock per holder (no
	// WithOwner), or Held.Reacquire for another hold.
	ErrHeld = errors.New("redislock: already held through this Lock (one owner, one holder)")
)

// LeaseLostError is the ErrLeaseLost of one holder: errors.Is(err,
// ErrLeaseLost) is true for it.
type LeaseLostError struct {
	Keys  []string
	Token int64
	Why   string
}

func (e *LeaseLostError) Error() string {
	return fmt.Sprintf("redislock: lease on %s (token %d) lost: %s", showKeys(e.Keys), e.Token, e.Why)
}

// Unwrap makes errors.Is(err, ErrLeaseLost) true.
func (e *LeaseLostError) Unwrap() error { return ErrLeaseLost }

func showKeys(keys []string) string {
	q := make([]string, len(keys))
	for i, k := range keys {
		q[i] = fmt.Sprintf("%q", k)
	}
	return "[" + strings.Join(q, " ") + "]"
}

func invalid(format string, args ...interface{}) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// serverError turns a DEADLOCK reply into ErrDeadlock (the server's text
// kept), and leaves every other error as it is.
func serverError(err error) error {
	var re redis.Error
	if errors.As(err, &re) && strings.HasPrefix(string(re), "DEADLOCK") {
		return fmt.Errorf("%w: %s", ErrDeadlock, string(re))
	}
	return err
}

// isWrongType: the key now holds something else than a lock.
func isWrongType(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(string(re), "WRONGTYPE")
}

// isReplyError: the server answered with an error (the connection is fine).
func isReplyError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}
