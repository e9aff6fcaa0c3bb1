package zklock

import (
	"time"

	"github.com/go-zookeeper/zk"
)

// Option configures a Locker.
type Option func(*config)

type config struct {
	sessionTimeout time.Duration
	wait           time.Duration // 0: 2 x sessionTimeout
	prefix         string
	logger         zk.Logger
	dialer         zk.Dialer
	idleNames      int
}

func defaultConfig() config {
	return config{
		sessionTimeout: 5 * time.Second,
		prefix:         "/stock/locks",
		logger:         zk.DefaultLogger,
		idleNames:      4096,
	}
}

// WithIdleNames bounds the lock names nobody uses now whose state (the
// folder exists, the fence base, the token node: a few hundred bytes) the
// Locker keeps, so that a name taken again soon costs no more round trips
// than one in use; past the bound every idle name is forgotten. The
// default is 4096: a catalog's worth of SKUs bought now and then, in well
// under a megabyte. 0 forgets a name as soon as its last user leaves.
func WithIdleNames(n int) Option {
	return func(c *config) { c.idleNames = max(0, n) }
}

// WithSessionTimeout sets the ZooKeeper session timeout the Locker asks
// for (the server clamps it to 2..20 ticks by default). It bounds how long
// a crashed holder keeps the lock: its node goes with its session. The
// client calls the connection lost after two thirds of it without an
// answer, and that suspends every lease. The default is 5s; the service
// sets it from LOCK_TTL.
func WithSessionTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.sessionTimeout = d
		}
	}
}

// WithWait bounds how long Acquire waits for a busy lock when its context
// has no deadline (a deadline of the caller's is used as it is). The
// default is twice the session timeout: long enough to outlast a crashed
// holder, short enough that a stuck lock fails loudly.
func WithWait(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.wait = d
		}
	}
}

// WithPrefix sets the path under which every lock lives: the lock named
// n is the folder <prefix>/n. The default is "/stock/locks".
func WithPrefix(p string) Option {
	return func(c *config) {
		if p != "" {
			c.prefix = p
		}
	}
}

// WithLogger sets the logger of the ZooKeeper client (connections,
// reconnections). The default is the client's own, the standard log
// package's output.
func WithLogger(lg zk.Logger) Option {
	return func(c *config) {
		if lg != nil {
			c.logger = lg
		}
	}
}

// WithDialer sets how the client dials a server. The default is
// net.DialTimeout.
func WithDialer(d zk.Dialer) Option {
	return func(c *config) { c.dialer = d }
}

// Quiet returns a zk.Logger that drops everything, for WithLogger.
func Quiet() zk.Logger { return quiet{} }

type quiet struct{}

func (quiet) Printf(string, ...any) {}

func (c *config) waitBound() time.Duration {
	if c.wait > 0 {
		return c.wait
	}
	return 2 * c.sessionTimeout
}
