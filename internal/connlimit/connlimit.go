// Package connlimit caps the connections an HTTP server holds, well below
// the process's file-descriptor limit, so that no client can make the
// server fail to accept (EMFILE) by holding connections open.
//
// At the cap, a new connection takes the place of the longest-idle
// keep-alive connection, which is closed: an idle connection has had its
// answers, and its client only reconnects. When none is idle, the new
// connection is still accepted up to a small headroom above the cap and
// marked (OverCap) so that the handler serves it the operator's probes
// only; beyond the headroom it is closed as soon as it is accepted.
package connlimit

import (
	"container/list"
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// DefaultHeadroom is how many connections a Listener accepts above its cap
// when none is idle: enough for a kubelet's probes, a Prometheus scrape and
// an operator's curl at once, each connection closed after its answer.
const DefaultHeadroom = 32

// logEvery spaces the log lines about the cap: the first time it is hit is
// logged at once, later events at most once a minute, with their counts
// since the line before. A line per connection would be the flood itself in
// the log; the metrics count every event.
const logEvery = time.Minute

// How a connection over the cap was refused (Observer.ConnRefused).
const (
	// RefusedOperatorOnly: accepted in the headroom, to be served for the
	// operator's paths only.
	RefusedOperatorOnly = "operator_only"
	// RefusedClosed: beyond the headroom, closed as soon as accepted.
	RefusedClosed = "closed"
)

// Observer is told what a Listener does (metrics.Metrics implements it).
// Its methods are called on the accepting and closing goroutines and must
// not block.
type Observer interface {
	// ConnOpened and ConnClosed count the connections held against the
	// cap and its headroom.
	ConnOpened()
	ConnClosed()
	// ConnEvicted: an idle connection was closed to make room for a new
	// one (which takes its place without a ConnOpened).
	ConnEvicted()
	// ConnRefused: a connection arrived at the cap with none idle; how is
	// RefusedOperatorOnly or RefusedClosed.
	ConnRefused(how string)
}

// Option configures New.
type Option func(*Listener)

// WithHeadroom sets how many connections are accepted above the cap, for
// the operator's paths only, when no connection is idle. Default
// DefaultHeadroom (32); 0 closes every connection over the cap at once.
func WithHeadroom(n int) Option {
	return func(l *Listener) { l.headroom = max(n, 0) }
}

// WithLogger sets the logger of the cap's warnings. Default:
// slog.Default().
func WithLogger(log *slog.Logger) Option {
	return func(l *Listener) { l.log = log }
}

// WithObserver sets who is told of connections opened, closed, evicted and
// refused. Default: no one.
func WithObserver(o Observer) Option {
	return func(l *Listener) { l.obs = o }
}

// Listener is a net.Listener that holds at most its cap of connections
// (plus the headroom). Serve an http.Server with it, and set the server's
// ConnState and ConnContext to the Listener's: ConnState is how it knows
// which connections are idle, ConnContext how a handler learns (OverCap)
// that its request came over the cap.
type Listener struct {
	net.Listener
	max, headroom int
	log           *slog.Logger
	obs           Observer

	mu   sync.Mutex
	open int       // connections counted against max+headroom
	idle list.List // of *conn, the longest idle at the front
	// lastLog is when the cap was last logged, since what happened over
	// the cap after that line.
	lastLog time.Time
	since   overCapCounts
}

type overCapCounts struct{ evicted, operatorOnly, closed int }

var _ net.Listener = (*Listener)(nil)

// New wraps inner so that at most maxConns of its connections are open at
// once, plus the headroom (maxConns below 1 counts as 1):
//
//	l := connlimit.New(ln, 10000)
//	srv.ConnState, srv.ConnContext = l.ConnState, l.ConnContext
//	err := srv.Serve(l)
//
// Closing the Listener closes inner; connections already accepted stay
// open until their server closes them.
func New(inner net.Listener, maxConns int, opts ...Option) *Listener {
	l := &Listener{Listener: inner, max: max(maxConns, 1), headroom: DefaultHeadroom, log: slog.Default()}
	for _, o := range opts {
		o(l)
	}
	return l
}

// Accept returns the next connection it admits. Connections beyond the cap
// and its headroom are accepted from inner and closed here, never
// returned: accepting them is what frees the kernel's queue, so their
// clients learn at once instead of waiting for a timeout.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if c := l.admit(nc); c != nil {
			return c, nil
		}
	}
}

// admit decides the fate of a new connection; it returns nil for one it
// closed.
func (l *Listener) admit(nc net.Conn) *conn {
	c := &conn{Conn: nc, l: l}
	var victim *conn
	refused := ""
	l.mu.Lock()
	switch {
	case l.open < l.max:
		l.open++
		c.counted = true
	case l.idle.Len() > 0:
		// The victim's place goes to c: the count does not change, and the
		// victim's Close below does not release a place.
		victim = l.idle.Remove(l.idle.Front()).(*conn)
		victim.elem, victim.counted = nil, false
		c.counted = true
		l.since.evicted++
	case l.open < l.max+l.headroom:
		l.open++
		c.counted, c.overCap = true, true
		refused = RefusedOperatorOnly
		l.since.operatorOnly++
	default:
		refused = RefusedClosed
		l.since.closed++
	}
	var report *overCapCounts
	if (victim != nil || refused != "") && (l.lastLog.IsZero() || time.Since(l.lastLog) >= logEvery) {
		report = &overCapCounts{}
		*report, l.since, l.lastLog = l.since, overCapCounts{}, time.Now()
	}
	l.mu.Unlock()

	if victim != nil {
		// A client that sends a request just as its idle connection is
		// closed sees the connection drop before any answer: HTTP/1.1
		// clients resend on a new connection what they may (Go's
		// transport: idempotent methods and requests with an
		// Idempotency-Key), as they do after the server's idle timeout.
		_ = victim.Close()
	}
	if report != nil {
		l.log.Warn("connection cap reached: the longest-idle connections are closed to make room; with none idle, only the operator paths are served, up to the headroom, and further connections are closed at once",
			"max_conns", l.max, "headroom", l.headroom,
			"evicted", report.evicted, "operator_only", report.operatorOnly, "closed", report.closed)
	}
	if l.obs != nil {
		switch {
		case victim != nil:
			l.obs.ConnEvicted()
		case c.counted:
			l.obs.ConnOpened()
		}
		if refused != "" {
			l.obs.ConnRefused(refused)
		}
	}
	if !c.counted {
		_ = nc.Close()
		return nil
	}
	return c
}

// ConnState keeps the list of idle connections: set it as the server's
// ConnState (call it from there if the server has another). Connections
// that are not this Listener's (a TLS wrapper's) are ignored.
func (l *Listener) ConnState(nc net.Conn, state http.ConnState) {
	c, ok := nc.(*conn)
	if !ok || c.l != l {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if state == http.StateIdle {
		// A connection evicted or closed meanwhile no longer counts and
		// must not come back as a victim.
		if c.counted && c.elem == nil {
			c.elem = l.idle.PushBack(c)
		}
		return
	}
	// New, active, hijacked or closed: not idle. A new connection is not
	// a victim either: its request may be on its way, and the server's
	// ReadHeaderTimeout bounds a client that sends none.
	l.forgetIdle(c)
}

// forgetIdle takes c off the idle list; l.mu is held.
func (l *Listener) forgetIdle(c *conn) {
	if c.elem != nil {
		l.idle.Remove(c.elem)
		c.elem = nil
	}
}

type overCapKey struct{}

// ConnContext marks the context of a connection accepted over the cap: set
// it as the server's ConnContext.
func (l *Listener) ConnContext(ctx context.Context, nc net.Conn) context.Context {
	if c, ok := nc.(*conn); ok && c.l == l && c.overCap {
		return context.WithValue(ctx, overCapKey{}, true)
	}
	return ctx
}

// OverCap reports whether ctx (a request's) belongs to a connection
// accepted over the cap, in the headroom: such a connection should be served
// for the operator's paths only, and closed after its answer to free its
// place.
func OverCap(ctx context.Context) bool {
	over, _ := ctx.Value(overCapKey{}).(bool)
	return over
}

// conn is an accepted connection; it gives its place back when closed.
type conn struct {
	net.Conn
	l       *Listener
	overCap bool // set before Accept returns it; read-only after
	once    sync.Once

	// Guarded by l.mu.
	counted bool          // holds a place (false once closed or evicted)
	elem    *list.Element // in l.idle while idle
}

// Close closes the connection, then gives its place back: counting after
// the descriptor is gone keeps the count at or above the descriptors held.
func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.l.release(c))
	return err
}

// release returns the function that gives c's place back, once.
func (l *Listener) release(c *conn) func() {
	return func() {
		l.mu.Lock()
		l.forgetIdle(c)
		counted := c.counted
		if counted {
			c.counted = false
			l.open--
		}
		l.mu.Unlock()
		if counted && l.obs != nil {
			l.obs.ConnClosed()
		}
	}
}
