package locking_test

import (
	"context"
	"testing"

	"github.com/flashsale/stock/internal/locking"
)

// fenceAdvancer is what both lock types offer for a counter that went back.
type fenceAdvancer interface {
	acquirer
	AdvanceFence(ctx context.Context, key string, atLeast int64) error
}

// TestAdvanceFence: after the servers lost their data the counter starts
// again from 1; AdvanceFence puts later tokens above what a store has seen,
// and never lowers the counter.
func TestAdvanceFence(t *testing.T) {
	ctx := context.Background()
	build := map[string]func(t *testing.T) (fenceAdvancer, []*redisServer){
		"single": func(t *testing.T) (fenceAdvancer, []*redisServer) {
			srv := startRedis(t)
			return newLocker(t, srv.Client(t)), []*redisServer{srv}
		},
		"redlock": func(t *testing.T) (fenceAdvancer, []*redisServer) {
			srvs, clients := cluster(t, 3)
			return newRedlock(t, clients), srvs
		},
	}
	for name, b := range build {
		t.Run(name, func(t *testing.T) {
			l, srvs := b(t)
			key := uniqueKey(t)
			var last int64
			for range 3 {
				lease := acquire(t, l, ctx, key)
				last = lease.Token()
				if err := lease.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for _, s := range srvs {
				s.Stop()
				s.Restart(t)
			}
			lease := acquire(t, l, ctx, key)
			if lease.Token() > last {
				t.Fatalf("token %d after the wipe: the test needs a counter that went back", lease.Token())
			}
			_ = lease.Release(ctx)

			if err := l.AdvanceFence(ctx, key, 100); err != nil {
				t.Fatal(err)
			}
			if err := l.AdvanceFence(ctx, key, 50); err != nil { // never lowers
				t.Fatal(err)
			}
			lease = acquire(t, l, ctx, key)
			if lease.Token() <= 100 {
				t.Errorf("token %d after AdvanceFence(100)", lease.Token())
			}
			_ = lease.Release(ctx)
		})
	}
	var _ fenceAdvancer = (*locking.Locker)(nil)
	var _ fenceAdvancer = (*locking.Redlock)(nil)
}
