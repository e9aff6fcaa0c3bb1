package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking/redislock"
)

// TestLateCallsAfterRelease: a call the client gave up on (a poll, a failed
// round's acquire, a renewal's re-take, a gate call) that reaches a server
// after the release of its value must not create the lock again under a
// value nobody will delete, which would block the key for a TTL. The calls
// are delivered deterministically: their scripts run after the release.
func TestLateCallsAfterRelease(t *testing.T) {
	const ttl = 5 * time.Second
	t.Run("locker", func(t *testing.T) {
		client := shared.Client(t)
		l := newLocker(t, client, redislock.WithTTL(ttl))
		lateCallsAfterRelease(t, l, []*redis.Client{client}, redislock.LatePoll)
	})
	t.Run("redlock", func(t *testing.T) {
		_, clients := cluster(t, 3)
		r := newRedlock(t, clients, redislock.WithTTL(ttl))
		lateCallsAfterRelease(t, r, clients, redislock.LateRound, redislock.LateExtend, redislock.LateGate)
	})
}

func lateCallsAfterRelease(t *testing.T, l acquirer, clients []*redis.Client, calls ...redislock.LateCall) {
	ctx := context.Background()
	key := uniqueKey(t)
	lease := acquire(t, l, ctx, key)
	value := lease.Value()
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, call := range calls {
		for i, c := range clients {
			if err := redislock.DeliverLate(ctx, c, call, key, value, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if v, err := c.Get(ctx, "lock:"+key).Result(); !errors.Is(err, redis.Nil) {
				t.Errorf("late call %d on server %d: the key holds %q (%v), want it free", call, i, v, err)
			}
			if n, err := c.LLen(ctx, "lock:"+key+":queue").Result(); err != nil || n != 0 {
				t.Errorf("late call %d on server %d: %d queued (%v), want none", call, i, n, err)
			}
			if t.Failed() {
				// Free the key, so that the other calls show their own effect.
				if err := c.Del(ctx, "lock:"+key, "lock:"+key+":queue").Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	next, err := l.Acquire(wctx, key)
	if err != nil {
		t.Fatalf("the key is blocked after late calls: %v", err)
	}
	_ = next.Release(ctx)
}
