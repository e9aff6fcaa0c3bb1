package redislock

import "time"

// Option configures a Locker or a Redlock.
type Option func(*config)

type config struct {
	ttl          time.Duration
	renewEvery   time.Duration // 0: ttl/3
	wait         time.Duration // 0: from ctx, else 2*ttl
	nodeTimeout  time.Duration
	pollInterval time.Duration
	retryJitter  time.Duration
	prefix       string
	onRenew      func(key string, err error)
}

func defaultConfig(nodeTimeout time.Duration) config {
	return config{
		ttl:          5 * time.Second,
		nodeTimeout:  nodeTimeout,
		pollInterval: 250 * time.Millisecond,
		retryJitter:  5 * time.Millisecond,
		prefix:       "lock:",
	}
}

// WithTTL sets how long a lock lives in Redis unless renewed; the watchdog
// renews it while the Lease is held, so the TTL only bounds how long a
// crashed holder blocks others. The default is 5s.
func WithTTL(ttl time.Duration) Option {
	return func(c *config) {
		if ttl > 0 {
			c.ttl = ttl
		}
	}
}

// WithRenewEvery sets the watchdog's renewal interval. The default is a third
// of the TTL, so two renewals can fail (or be slow) before the lock expires.
func WithRenewEvery(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.renewEvery = d
		}
	}
}

// WithWait bounds how long Acquire waits for a busy lock (the caller's
// context may end it sooner). By default Acquire waits until the context's
// deadline and, when the context has none, for twice the TTL: long enough to
// outlast a crashed holder, short enough that a stuck key fails loudly.
func WithWait(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.wait = d
		}
	}
}

// WithNodeTimeout bounds each call to one Redis server (acquire round, renewal,
// release). The default is 50ms for a Redlock, where a slow node must not eat
// the lock's validity (the Redlock algorithm wants it small against the TTL),
// and 1s for a single-node Locker, which has no other node to turn to. A
// Redlock's calls that no acquisition waits for (a lease's release, Reset,
// AdvanceFence) are bounded by it but at least 1s.
//
// The bound is a context deadline, which go-redis honours only for clients
// built with redis.Options.ContextTimeoutEnabled; without it a call to a
// server that stopped answering lasts the client's ReadTimeout (3s by
// default). Safety does not depend on it (validity is measured, not
// assumed), but a dead node then slows every round that waits for it.
func WithNodeTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.nodeTimeout = d
		}
	}
}

// WithPollInterval sets the fallback poll of a waiting Acquire. Waiters are
// woken by Redis pub/sub when the lock is released; polling only covers lost
// messages and holders that vanished without releasing (a waiter also polls
// when the holder's TTL runs out). The default is 250ms.
func WithPollInterval(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.pollInterval = d
		}
	}
}

// WithRetryJitter sets the upper bound of the random pause a Redlock
// contender takes after a split vote (no contender reached a majority), so
// that contenders stop colliding. The default is 5ms. A single-node Locker
// never splits votes and ignores it.
func WithRetryJitter(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.retryJitter = d
		}
	}
}

// WithKeyPrefix sets the prefix of every Redis key and channel the lock uses.
// The default is "lock:".
func WithKeyPrefix(p string) Option {
	return func(c *config) { c.prefix = p }
}

// WithRenewalObserver makes the watchdog call f after each renewal attempt,
// with the error that made it fail or nil (for metrics); after a failure,
// the lease's context is already cancelled when f is called. f must be
// quick and safe for concurrent use. Default: none.
func WithRenewalObserver(f func(key string, err error)) Option {
	return func(c *config) { c.onRenew = f }
}

// unhurriedTimeout bounds each node's call of a Redlock's calls that no
// acquisition waits for (a lease's release, Reset, AdvanceFence): the node
// timeout, but at least a second. The node timeout is small for the
// acquisition rounds and renewals, where a slow node must not eat the
// lock's validity; off that path, giving up on a node that answers a
// little later (a durable server under load) only makes the call fail for
// nothing.
func (c *config) unhurriedTimeout() time.Duration { return max(c.nodeTimeout, time.Second) }

func (c *config) renewInterval() time.Duration {
	if c.renewEvery > 0 {
		return c.renewEvery
	}
	return c.ttl / 3
}

// drift is the clock drift allowance of the Redlock algorithm: 1% of the TTL
// plus 2ms for the granularity of Redis expiry. A lock is trusted only until
// start+ttl-drift, where start is taken before the request is sent.
func (c *config) drift() time.Duration {
	return c.ttl/100 + 2*time.Millisecond
}
