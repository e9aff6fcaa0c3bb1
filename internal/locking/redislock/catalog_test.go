package redislock_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking/locktest"
)

// TestNoStateForIdleKeys: a process that locks every SKU of a catalog
// keeps state only for the keys in use, on one server and on a quorum.
// 5,000 keys taken twice each by goroutines that overlap (so some wait,
// subscribe, and are handed the lock), the fence advanced under some holds.
func TestNoStateForIdleKeys(t *testing.T) {
	client := func(s *redisServer) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: s.Addr})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	var quorum []*redis.Client
	for _, s := range append([]*redisServer{shared}, exampleServers[:2]...) {
		quorum = append(quorum, client(s))
	}
	noClose := func() error { return nil }
	single, redlock := newLocker(t, client(shared)), newRedlock(t, quorum)
	for _, c := range []struct {
		name string
		c    locktest.Catalog
	}{
		{"Locker", locktest.Catalog{Client: locktest.ClientOf(single.Acquire, noClose), AdvanceFence: single.AdvanceFence, Kept: single.KeysKept}},
		{"Redlock", locktest.Catalog{Client: locktest.ClientOf(redlock.Acquire, noClose), AdvanceFence: redlock.AdvanceFence, Kept: redlock.KeysKept}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.c.Names, c.c.FenceEvery = 5_000, 100
			locktest.StatePerNameIsBounded(t, c.c)
		})
	}
}
