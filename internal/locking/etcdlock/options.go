package etcdlock

import "time"

// Option configures a Locker.
type Option func(*config)

type config struct {
	ttl       time.Duration
	wait      time.Duration // 0: from ctx, else 2*ttl
	opTimeout time.Duration
	prefix    string
	onRenew   func(err error)
}

func defaultConfig() config {
	return config{ttl: 5 * time.Second, opTimeout: time.Second, prefix: "/stock/locks/"}
}

// WithTTL sets the TTL of the session's etcd lease, in whole seconds
// (rounded up; etcd may raise it to its own minimum, 1.5 election
// timeouts). The session renews it while the Locker is open, so it only
// bounds how long a crashed process keeps its locks. The default is 5s.
func WithTTL(ttl time.Duration) Option {
	return func(c *config) {
		if ttl > 0 {
			c.ttl = ttl
		}
	}
}

// WithWait bounds how long Acquire waits for a busy lock (the caller's
// context may end it sooner). By default Acquire waits until the context's
// deadline and, when the context has none, for twice the TTL.
func WithWait(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.wait = d
		}
	}
}

// WithOpTimeout bounds each call to etcd that cleans up (a release, the
// deletion of an abandoned waiter's key, a revocation): a cancelled request
// never strands a lock, and a dead cluster never stalls a caller past it.
// The default is 1s.
func WithOpTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.opTimeout = d
		}
	}
}

// WithPrefix sets the prefix of every etcd key the locks use. The default
// is "/stock/locks/".
func WithPrefix(p string) Option {
	return func(c *config) { c.prefix = p }
}

// WithRenewalObserver makes the session call f after each renewal of its
// lease, with the error that made it fail or nil (for metrics). After a
// failure the session is already given up and the leases' contexts are
// ending (each on a goroutine of its own, at once). f runs on the renewal
// loop: a slow f delays the next renewal, never a lease's end, which a
// timer of its own watches. Default: none.
func WithRenewalObserver(f func(err error)) Option {
	return func(c *config) { c.onRenew = f }
}

// ttlSeconds is the TTL as etcd takes it.
func (c *config) ttlSeconds() int64 {
	return int64((c.ttl + time.Second - 1) / time.Second)
}
