package dblock_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/locking/dblock"
	"github.com/flashsale/stock/internal/locking/locktest"
	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testproxy"
)

var engines = []string{"postgres", "mysql"}

// ttl is short so that the suite's expiries take a couple of seconds, and
// long enough that a holder's heartbeat (every third of it) survives a
// loaded machine's stalls: at 1 s a holder lost its lease before its
// release in CI (OwnerCheckedRelease, "no longer … at its release").
const ttl = 2 * time.Second

// proxied returns a Locker on dbURL's database that talks to it through a
// proxy of its own, closed at t's end.
func proxied(t testing.TB, dbURL string, opts ...dblock.Option) (*dblock.Locker, *testproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	p := testproxy.Start(t, u.Host)
	u.Host = p.Addr
	return open(t, u.String(), opts...), p
}

func open(t testing.TB, dbURL string, opts ...dblock.Option) *dblock.Locker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := dblock.Open(ctx, dbURL, append([]dblock.Option{dblock.WithTTL(ttl)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Ping(ctx); err != nil {
		_ = l.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// TestConformance runs the lock suite on each engine. The servers are the
// machine's own, so the suite does not restart them: the tokens live in a
// table, as durable as the stock they fence.
func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out leases")
	}
	for _, engine := range engines {
		t.Run(engine, func(t *testing.T) {
			dbURL := testdb.MigratedURL(t, engine)
			locktest.Run(t, locktest.Backend{
				TTL: ttl,
				Connect: func(t *testing.T) (locktest.Client, locktest.Link) {
					l, p := proxied(t, dbURL)
					return locktest.ClientOf(l.Acquire, l.Close), p
				},
			})
		})
	}
}
