// Package redisconn is the one place the service's Redis clients get their
// options from: every client (the locks', the reservation's, the admission's,
// the job lock's) is built from Options, ClusterOptions or
// FailoverOptions.
package redisconn

import (
	"context"
	"net"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Options returns the options every Redis client of the service
// starts from, for the server at addr; a caller adds what is its own (a
// pool size, read and write timeouts). Defaults, and why:
//
//   - DialTimeout 1s: a connection to a Redis on the same network takes
//     a millisecond; one that takes a second is not going to serve an
//     order in time.
//   - ContextTimeoutEnabled: orders and locks bound each call with a
//     context deadline (the order's, a Redlock node's 50 ms); go-redis
//     honours it only so.
//   - MaxRetries -1: the client never sends a command again by itself.
//     Reserve retries its own script, which is safe to repeat; a lock
//     call must fail within its node timeout, not be retried into it.
//   - Dialer Dialer: a failed dial reaches go-redis as a connection
//     that fails on first use, so that its dial gate never shuts and a
//     Redis that answers again serves the next command. One dial per
//     attempt, then: go-redis' DialerRetries (five dials 100 ms apart)
//     never apply, and a call to a server that refuses connections fails
//     at once instead of lasting a Redlock's whole node timeout.
func Options(addr string) *redis.Options {
	const dialTimeout = time.Second
	return &redis.Options{
		Addr:                  addr,
		DialTimeout:           dialTimeout,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		Dialer:                Dialer(dialTimeout),
	}
}

// ClusterOptions returns Options' defaults for a cluster seeded
// by addrs: each node's client has them.
func ClusterOptions(addrs []string) *redis.ClusterOptions {
	o := Options("")
	return &redis.ClusterOptions{
		Addrs:                 addrs,
		DialTimeout:           o.DialTimeout,
		ContextTimeoutEnabled: o.ContextTimeoutEnabled,
		MaxRetries:            o.MaxRetries,
		Dialer:                o.Dialer,
	}
}

// FailoverOptions returns Options' defaults for the primary that the
// Sentinels at sentinels name master (REDIS_MODE=sentinel). go-redis asks
// the Sentinels for the primary's address at every dial and closes the
// connections to a primary they replaced, so a connection made after a
// failover reaches the new primary; Dialer then dials that address. The
// Sentinels themselves are dialed with the same defaults.
func FailoverOptions(master string, sentinels []string) *redis.FailoverOptions {
	o := Options("")
	return &redis.FailoverOptions{
		MasterName:            master,
		SentinelAddrs:         sentinels,
		DialTimeout:           o.DialTimeout,
		ContextTimeoutEnabled: o.ContextTimeoutEnabled,
		MaxRetries:            o.MaxRetries,
		Dialer:                o.Dialer,
	}
}

// Dialer dials as go-redis does by default (TCP keep-alive probes
// included), except that a dial that fails returns no error: it returns a
// failedDial, a connection whose every use fails with the dial's error.
//
// go-redis (v9.23, internal/pool) counts the dials that fail, and once a
// pool's size of them have failed it stops dialing: every new connection
// fails with the last dial error until a background probe, once a
// second, gets through (the count falls back to zero only then, whatever
// succeeded meanwhile). An outage in which that many dials failed thus
// left every order failing for up to a second after Redis answered
// again. go-redis has no option to turn that off, and its other dial
// options (DialerRetries, a larger pool) only delay it. Here go-redis
// never sees a dial fail: it sends its handshake on the failedDial, gets
// the dial's error back, drops the connection and returns the error to
// the caller, as before (the same *net.OpError, so a caller still tells
// a refused connection, which sent nothing, from a lost answer). The
// cost while Redis is down: each failed dial allocates a connection's
// buffers for nothing (64 KB, 256 KB in go-redis' pipeline pool).
func Dialer(timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	dial := redis.NewDialer(&redis.Options{DialTimeout: timeout})
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return failedDial{err: dialError{err}, addr: dialAddr{network, addr}}, nil
		}
		return c, nil
	}
}

// failedDial is a dial that failed, as a connection: reads and writes
// fail with the dial's error.
type failedDial struct {
	err  error
	addr net.Addr
}

var (
	_ net.Conn     = failedDial{}
	_ syscall.Conn = failedDial{}
)

func (c failedDial) Read([]byte) (int, error)         { return 0, c.err }
func (c failedDial) Write([]byte) (int, error)        { return 0, c.err }
func (c failedDial) Close() error                     { return nil }
func (c failedDial) LocalAddr() net.Addr              { return c.addr }
func (c failedDial) RemoteAddr() net.Addr             { return c.addr }
func (c failedDial) SetDeadline(time.Time) error      { return nil }
func (c failedDial) SetReadDeadline(time.Time) error  { return nil }
func (c failedDial) SetWriteDeadline(time.Time) error { return nil }

// SyscallConn fails: go-redis checks the socket of an idle connection
// through it before handing the connection out, and drops one whose check
// fails. A failedDial parked idle (its caller gave up during the dial)
// is so never handed to a later command.
func (c failedDial) SyscallConn() (syscall.RawConn, error) { return nil, c.err }

// dialError is the dial's error as failedDial returns it. go-redis
// unwraps the error of a connection it could not set up once before
// returning it (pool.Remove, then errors.Unwrap), so the caller gets the
// dial's own error, as from a dial go-redis saw fail.
type dialError struct{ err error }

func (e dialError) Error() string { return e.err.Error() }
func (e dialError) Unwrap() error { return e.err }

// dialAddr is the address a failedDial was dialing.
type dialAddr struct{ network, addr string }

func (a dialAddr) Network() string { return a.network }
func (a dialAddr) String() string  { return a.addr }
