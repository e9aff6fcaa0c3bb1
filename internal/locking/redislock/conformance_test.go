package redislock_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking/locktest"
	"github.com/flashsale/stock/internal/locking/redislock"
	"github.com/flashsale/stock/lab/testproxy"
	"github.com/flashsale/stock/lab/testredis"
)

// conformanceTTL is short so that the suite's expiries take a second.
const conformanceTTL = time.Second

// durable starts a Redis that keeps its data across a restart (the suite
// checks tokens across one; the service's Redis runs with AOF too).
func durable(t *testing.T) *testredis.Server {
	return testredis.Start(t, "--appendonly", "yes", "--appendfsync", "always")
}

func proxiedClient(t *testing.T, srv *testredis.Server) (*redis.Client, *testproxy.Proxy) {
	p := testproxy.Start(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: p.Addr, DialerRetries: 1, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c, p
}

func TestConformanceLocker(t *testing.T) {
	srv := durable(t)
	locktest.Run(t, locktest.Backend{
		TTL: conformanceTTL,
		Connect: func(t *testing.T) (locktest.Client, locktest.Link) {
			c, p := proxiedClient(t, srv)
			l := redislock.New(c, redislock.WithTTL(conformanceTTL))
			return locktest.ClientOf(l.Acquire, l.Close), p
		},
		Restart: func(t *testing.T) {
			srv.Stop()
			srv.Restart(t)
		},
	})
}

func TestConformanceRedlock(t *testing.T) {
	servers := make([]*testredis.Server, 5)
	for i := range servers {
		servers[i] = durable(t)
	}
	locktest.Run(t, locktest.Backend{
		TTL: conformanceTTL,
		Connect: func(t *testing.T) (locktest.Client, locktest.Link) {
			clients := make([]*redis.Client, len(servers))
			link := make(testproxy.Group, len(servers))
			for i, srv := range servers {
				clients[i], link[i] = proxiedClient(t, srv)
			}
			l, err := redislock.NewRedlock(clients, redislock.WithTTL(conformanceTTL))
			if err != nil {
				t.Fatal(err)
			}
			return locktest.ClientOf(l.Acquire, l.Close), link
		},
		Restart: func(t *testing.T) {
			for _, srv := range servers {
				srv.Stop()
				srv.Restart(t)
			}
		},
	})
}
