package redislock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

	"github.com/gomodule/redigo/redis"
)

// Version of the package (the same for every package of redis-lock).
const Version = "0.3.0"

// DefaultTimeout bounds every connect, read and write of a Client (a
// waiting acquire's reply may take its wait plus this).
const DefaultTimeout = 2 * time.Second

// DefaultTTL is a lease's length when no WithTTL is given.
const DefaultTTL = 30 * time.Second

// WaitForever, given to WithWait, waits without limit (WAIT 0): only the
// context ends such a wait.
const WaitForever time.Duration = -1

// Client is one redis-lock server (or one node of a cluster: redigo has no
// cluster client, so every key of a lock must live on that node's slots).
// It keeps a small pool for short commands; every held lock or Session has
// a connection of its own. Safe for concurrent use.
type Client struct {
	addr     string
	timeout  time.Duration
	dialOpts []redis.DialOption
	pool     *redis.Pool

	wmu  sync.Mutex // w and keys
	w    *watcher   // nil until a bound holder needs it
	keys watched

	// The keeper of the server sessions open on this server.
	kmu      sync.Mutex
	kept     map[*nodeSession]time.Time // next keepalive due
	kwake    chan struct{}
	krunning bool
}

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithTimeout sets the connect, read and write timeout of every connection
// the Client makes (DefaultTimeout when not given). A renewal is given no
// longer than what is left of the lease.
func WithTimeout(d time.Duration) ClientOption {
	return func(c *Client) { c.timeout = d }
}

// WithDialOptions adds redigo dial options (password, database, TLS, client
// name). Timeouts given here are overridden by WithTimeout's.
func WithDialOptions(opts ...redis.DialOption) ClientOption {
	return func(c *Client) { c.dialOpts = append(c.dialOpts, opts...) }
}

// New returns a Client for the server at addr ("host:port"). It connects
// lazily: New itself never fails (a bad address shows at the first call).
func New(addr string, opts ...ClientOption) *Client {
	c := &Client{addr: addr, timeout: DefaultTimeout}
	for _, o := range opts {
		o(c)
	}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout
	}
	c.pool = &redis.Pool{
		MaxIdle:     4,
		IdleTimeout: time.Minute,
		DialContext: c.dial,
	}
	return c
}

// Addr is the server's address as given to New.
func (c *Client) Addr() string { return c.addr }

// Close closes the Client's pool. Held locks and bound Sessions keep their
// own connections until they are released or closed; close the server
// Sessions first (their keeper and Close then use new connections).
func (c *Client) Close() error { return c.pool.Close() }

func (c *Client) dial(ctx context.Context) (redis.Conn, error) {
	opts := append([]redis.DialOption{}, c.dialOpts...)
	opts = append(opts,
		redis.DialConnectTimeout(c.timeout),
		redis.DialReadTimeout(c.timeout),
		redis.DialWriteTimeout(c.timeout))
	return redis.DialContext(ctx, "tcp", c.addr, opts...)
}

// do runs one short command on a pooled connection, within the timeout.
func (c *Client) do(ctx context.Context, cmd string, args ...interface{}) (interface{}, error) {
	conn, err := c.pool.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return redis.DoWithTimeout(conn, c.timeout, cmd, args...)
}

// Locked reports whether anyone holds key (LOCK.INFO answers non-nil).
func (c *Client) Locked(ctx context.Context, key string) (bool, error) {
	r, err := c.do(ctx, "LOCK.INFO", key)
	if err != nil {
		return false, err
	}
	return r != nil, nil
}

// freshOwner: 128 random bits, hex.
func freshOwner() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("redislock: no randomness: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// millis rounds d up to whole milliseconds (a positive d is never 0 ms).
func millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
