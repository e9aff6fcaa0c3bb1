package dblock

import "time"

// Option configures a Locker.
type Option func(*config)

type config struct {
	ttl         time.Duration
	renewEvery  time.Duration // 0: ttl / 3
	wait        time.Duration // 0: 2 x ttl
	pollMin     time.Duration
	pollMax     time.Duration
	maxConns    int
	ownerPrefix string
	renewed     func(err error)
}

func defaultConfig() config {
	return config{
		ttl:      5 * time.Second,
		pollMin:  time.Millisecond,
		pollMax:  5 * time.Millisecond,
		maxConns: 4,
		renewed:  func(error) {},
	}
}

func (c config) renewInterval() time.Duration {
	if c.renewEvery > 0 {
		return c.renewEvery
	}
	return c.ttl / 3
}

func (c config) waitBound() time.Duration {
	if c.wait > 0 {
		return c.wait
	}
	return 2 * c.ttl
}

// WithTTL sets how long a lock stays held without a renewal: the longest a
// crashed holder keeps it. The database's clock judges it. The default is
// 5s; the service sets it from LOCK_TTL.
func WithTTL(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.ttl = d
		}
	}
}

// WithRenewEvery sets how often a holder's heartbeat extends its lock. The
// default is a third of the TTL, so that two renewals may fail before the
// lock expires; the service sets it from LOCK_RENEW_EVERY when that is set.
func WithRenewEvery(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.renewEvery = d
		}
	}
}

// WithWait bounds how long Acquire waits for a busy lock when its context
// has no deadline (a deadline of the caller's is used as it is). The
// default is twice the TTL: long enough to outlast a crashed holder.
func WithWait(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.wait = d
		}
	}
}

// WithPoll sets how a waiter polls a busy lock: first after least, then
// twice as long each time up to most, each wait jittered. A table has no
// way to wake its waiters, so this is the price of a freed lock noticed
// late; only one goroutine per process polls a name (the others queue
// behind it in the process). The defaults are 1ms and 5ms: a freed lock
// is found within a few milliseconds, and a poll costs the database one
// indexed statement.
func WithPoll(least, most time.Duration) Option {
	return func(c *config) {
		if least > 0 && most >= least {
			c.pollMin, c.pollMax = least, most
		}
	}
}

// WithMaxConns sets the size of the Locker's own connection pool. The
// lock's statements do not queue behind the stock's transactions, and a
// frozen pool of the stock's does not freeze the heartbeats. The default
// is 4.
func WithMaxConns(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.maxConns = n
		}
	}
}

// WithOwnerPrefix sets what the owner column says before each hold's own
// random part, so that an operator reading the table sees which process
// holds a lock. The default is "<hostname>/<pid>".
func WithOwnerPrefix(p string) Option {
	return func(c *config) { c.ownerPrefix = p }
}

// WithRenewalObserver sets a function told of every renewal: nil for one
// that extended the lock, the error for one that failed. The default does
// nothing.
func WithRenewalObserver(f func(err error)) Option {
	return func(c *config) {
		if f != nil {
			c.renewed = f
		}
	}
}
