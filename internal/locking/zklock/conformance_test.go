package zklock_test

import (
	"testing"
	"time"

	"github.com/flashsale/stock/internal/locking/locktest"
	"github.com/flashsale/stock/internal/locking/zklock"
	"github.com/flashsale/stock/lab/testproxy"
	"github.com/flashsale/stock/lab/testzk"
)

// sessionTimeout is short so that the suite's expiries take a second (the
// test servers tick every 100ms, so they grant it).
const sessionTimeout = time.Second

// proxied returns a Locker that talks to srv through a proxy of its own,
// closed at t's end.
func proxied(t testing.TB, srv *testzk.Server, opts ...zklock.Option) (*zklock.Locker, *testproxy.Proxy) {
	t.Helper()
	p := testproxy.Start(t, srv.Addr)
	l := newLocker(t, []string{p.Addr}, opts...)
	return l, p
}

func newLocker(t testing.TB, servers []string, opts ...zklock.Option) *zklock.Locker {
	t.Helper()
	l, err := zklock.New(servers, append([]zklock.Option{
		zklock.WithSessionTimeout(sessionTimeout), zklock.WithLogger(zklock.Quiet())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts ZooKeeper and waits out sessions")
	}
	srv := testzk.StartOwn(t) // restarted: never a ZK_SERVERS one
	locktest.Run(t, locktest.Backend{
		TTL: sessionTimeout,
		Connect: func(t *testing.T) (locktest.Client, locktest.Link) {
			l, p := proxied(t, srv)
			return locktest.ClientOf(l.Acquire, l.Close), p
		},
		Restart: func(t *testing.T) { srv.Restart(t) },
	})
}
