package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking/redislock"
)

// TestRedlockReleaseOnNodesSlowerThanTheNodeTimeoutSucceeds: a release is
// not on an acquisition's critical path, so it waits for nodes that answer
// later than the node timeout (durable servers under load: appendfsync
// always) instead of giving up on every one of them and reporting the lock
// lost. Each node here holds its clients back for three node timeouts
// (CLIENT PAUSE, in force once it has answered) while the lock is
// released.
func TestRedlockReleaseOnNodesSlowerThanTheNodeTimeoutSucceeds(t *testing.T) {
	ctx := context.Background()
	srvs, clients := cluster(t, 3)
	const nodeTimeout = 100 * time.Millisecond
	// A long TTL: no renewal runs while the nodes are paused.
	r := newRedlock(t, clients, redislock.WithNodeTimeout(nodeTimeout), redislock.WithTTL(time.Minute))
	key := uniqueKey(t)
	lease := acquire(t, r, ctx, key)

	for _, srv := range srvs {
		admin := srv.Client(t)
		if err := admin.Do(ctx, "CLIENT", "PAUSE", (3 * nodeTimeout).Milliseconds(), "ALL").Err(); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	err := lease.Release(ctx)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("release on nodes answering after %v (node timeout %v), took %v: %v", 3*nodeTimeout, nodeTimeout, took, err)
	}
	// The release returned with a majority; Close joins its calls to the
	// others, which must not have given up either.
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	for i, c := range clients {
		if v, err := c.Get(ctx, "lock:"+key).Result(); !errors.Is(err, redis.Nil) {
			t.Errorf("node %d still holds %q after the release (err %v): the next holder waits for its TTL", i, v, err)
		}
	}
}
