package redislock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking/redislock"
)

// TestNoStateForIdleKeys: a process that locks every SKU of a catalog
// keeps state only for the keys in use, on one server and on a quorum.
// 5,000 keys taken twice each by goroutines that overlap (so some wait,
// subscribe, and are handed the lock), the fence advanced under some holds.
func TestNoStateForIdleKeys(t *testing.T) {
	type locker interface {
		Acquire(ctx context.Context, key string) (*redislock.Lease, error)
		AdvanceFence(ctx context.Context, key string, atLeast int64) error
		KeysKept() int
	}
	client := func(s *redisServer) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: s.Addr})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	var quorum []*redis.Client
	for _, s := range append([]*redisServer{shared}, exampleServers[:2]...) {
		quorum = append(quorum, client(s))
	}
	for _, c := range []struct {
		name string
		l    locker
	}{
		{"Locker", newLocker(t, client(shared))},
		{"Redlock", newRedlock(t, quorum)},
	} {
		t.Run(c.name, func(t *testing.T) {
			const keys, workers = 5_000, 16
			prefix := uniqueKey(t)
			var (
				next atomic.Int64
				most atomic.Int64
				errs errorSink
			)
			var wg sync.WaitGroup
			for range workers {
				wg.Go(func() {
					for {
						i := next.Add(1) - 1
						if i >= 2*keys {
							return
						}
						key := fmt.Sprintf("%s-%d", prefix, i/2)
						ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
						lease, err := c.l.Acquire(ctx, key)
						if err != nil {
							cancel()
							errs.Addf("acquire %s: %v", key, err)
							continue
						}
						if i%100 == 1 {
							errs.Add(c.l.AdvanceFence(ctx, key, lease.Token()))
						}
						kept := int64(c.l.KeysKept())
						errs.Add(lease.Release(ctx))
						cancel()
						for m := most.Load(); kept > m && !most.CompareAndSwap(m, kept); m = most.Load() {
						}
					}
				})
			}
			wg.Wait()
			errs.Report(t)
			if m := most.Load(); m > workers {
				t.Errorf("kept state for %d keys at once, want at most one per worker (%d)", m, workers)
			}
			if kept := c.l.KeysKept(); kept != 0 {
				t.Errorf("kept state for %d keys once none was in use, want 0", kept)
			}
		})
	}
}
