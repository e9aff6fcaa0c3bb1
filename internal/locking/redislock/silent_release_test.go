package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/redislock"
)

// TestRedlockLostReleaseStrandsLocalSuccessor: quorum.leave tells the next
// local waiter to wait for the release's announcement (releasedBy, armed)
// even when the release announced nothing: redlockRelease publishes only
// where it deleted its own key, and a lock that was already gone (expired,
// or Reset) is deleted nowhere. The successor then sleeps a whole poll
// interval on a free lock (here 1h: its 2s wait runs out). Any other
// process would take the lock at once.
func TestRedlockLostReleaseStrandsLocalSuccessor(t *testing.T) {
	ctx := context.Background()
	_, clients := cluster(t, 3)
	r := newRedlock(t, clients, redislock.WithTTL(time.Minute), redislock.WithPollInterval(time.Hour),
		redislock.WithWait(2*time.Second))
	key := uniqueKey(t)
	a := acquire(t, r, ctx, key)
	got := acquireAsync(r, ctx, key)
	awaitLocalWaiter(t, r, key, got)
	// The lock goes away under A (an admin's Reset; an expiry does the same).
	if err := r.Reset(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); !errors.Is(err, locking.ErrLockLost) {
		t.Fatalf("A's release: %v, want ErrLockLost", err)
	}
	res := <-got
	if res.err != nil {
		t.Fatalf("the local successor did not get a free lock: %v", res.err)
	}
	_ = res.lease.Release(ctx)
}
