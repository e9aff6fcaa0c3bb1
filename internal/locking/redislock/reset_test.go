package redislock_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking/redislock"
)

// TestRedlockResetLosesTheHold: Reset is "free a stuck lock: a holder of
// the key loses it at its next renewal" (Locker.Reset; Redlock.Reset says
// it works like it, and doc.go says a chain of hand-overs notices a lost
// lock after a Reset). On Redlock the next renewal finds the key missing
// on every node and takes it back (redlockExtend re-takes a missing key,
// meant for a node restarted empty): the holder keeps the lock, its
// context is never cancelled, and Reset freed nothing.
func TestRedlockResetLosesTheHold(t *testing.T) {
	ctx := context.Background()
	_, clients := cluster(t, 3)
	renewed := make(chan error, 16)
	r := newRedlock(t, clients, redislock.WithTTL(900*time.Millisecond),
		redislock.WithRenewalObserver(func(_ string, err error) { renewed <- err }))
	key := uniqueKey(t)
	lease := acquire(t, r, ctx, key)
	defer lease.Release(ctx)
	if err := r.Reset(ctx, key); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-renewed:
		if err == nil {
			n := 0
			for _, c := range clients {
				if v, _ := c.Get(ctx, "lock:"+key).Result(); v == lease.Value() {
					n++
				}
			}
			t.Errorf("the renewal after Reset succeeded: the key is the holder's again on %d of %d nodes", n, len(clients))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal")
	}
	if lease.Context().Err() == nil {
		t.Error("the holder's context is not cancelled after Reset and a renewal")
	}
}

// TestResetRetiresTheValue: Locker. Locker's renewal never takes a missing
// key back, but a poll of the holder's value that the client gave up on
// may land after the Reset: it must not set the key again under that
// value, or the holder's next renewal finds it its own and Reset freed
// nothing. The key stays free, the holder loses the lock at its next
// renewal, and another process takes the key at once.
func TestResetRetiresTheValue(t *testing.T) {
	ctx := context.Background()
	c := shared.Client(t)
	const ttl = 900 * time.Millisecond
	l := newLocker(t, c, redislock.WithTTL(ttl))
	key := uniqueKey(t)
	lease := acquire(t, l, ctx, key)
	defer lease.Release(ctx)
	if err := l.Reset(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := redislock.DeliverLate(ctx, c, redislock.LatePoll, key, lease.Value(), ttl); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "lock:"+key).Result(); err == nil {
		t.Errorf("a late poll after Reset set the key again to %q (the holder's: %v)", v, v == lease.Value())
	}
	lostWithin(t, lease.Context(), 5*time.Second)
	other := newLocker(t, c, redislock.WithTTL(ttl))
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	next, err := other.Acquire(wctx, key)
	if err != nil {
		t.Fatalf("the key is not free after Reset: %v", err)
	}
	if next.Token() <= lease.Token() {
		t.Errorf("token after Reset %d, not above %d", next.Token(), lease.Token())
	}
	_ = next.Release(ctx)
}

// resetAllFreesEveryKey: holder holds the first and the 1,200th of 1,500
// keys, in two of ResetAll's pipelines of 1,000; once ResetAll returns,
// other takes both at once, and the holder's leases end at their next
// renewal, as after Reset.
func resetAllFreesEveryKey(t *testing.T, holder, other interface {
	acquirer
	ResetAll(ctx context.Context, keys []string) error
}) {
	ctx := context.Background()
	base := uniqueKey(t)
	keys := make([]string, 1500)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%04d", base, i)
	}
	var held []*redislock.Lease
	for _, i := range []int{0, 1200} {
		held = append(held, acquire(t, holder, ctx, keys[i]))
	}
	if err := holder.ResetAll(ctx, keys); err != nil {
		t.Fatal(err)
	}
	for j, i := range []int{0, 1200} {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		le, err := other.Acquire(actx, keys[i])
		cancel()
		if err != nil {
			t.Fatalf("%s after ResetAll: %v; want it free", keys[i], err)
		}
		select {
		case <-held[j].Context().Done():
		case <-time.After(5 * time.Second):
			t.Errorf("the holder of %s still holds it 5 s after ResetAll", keys[i])
		}
		_ = le.Release(ctx)
		_ = held[j].Release(ctx)
	}
}

// TestResetAllFreesEveryKey: Locker, one server.
func TestResetAllFreesEveryKey(t *testing.T) {
	c := shared.Client(t)
	resetAllFreesEveryKey(t, newLocker(t, c, redislock.WithTTL(900*time.Millisecond)), newLocker(t, c))
}

// TestRedlockResetAllFreesEveryKey: Redlock, three servers.
func TestRedlockResetAllFreesEveryKey(t *testing.T) {
	_, clients := cluster(t, 3)
	resetAllFreesEveryKey(t, newRedlock(t, clients, redislock.WithTTL(900*time.Millisecond)), newRedlock(t, clients))
}

// scriptsLostOnce is a client whose server loses its scripts (a restart)
// right before the first pipeline it sends.
type scriptsLostOnce struct {
	*redis.Client
	lost atomic.Bool
}

func (c *scriptsLostOnce) Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error) {
	if c.lost.CompareAndSwap(false, true) {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			return nil, err
		}
	}
	return c.Client.Pipelined(ctx, fn)
}

// TestResetAllAfterTheServerLostItsScripts: a server that lost the reset
// script between its load and the pipeline (NOSCRIPT) gets it again, and
// ResetAll still frees the keys, as Reset's Script.Run does for one key
// (found by review).
func TestResetAllAfterTheServerLostItsScripts(t *testing.T) {
	c := shared.Client(t)
	lossy := &scriptsLostOnce{Client: c}
	holder := redislock.New(lossy, redislock.WithTTL(900*time.Millisecond))
	t.Cleanup(func() { _ = holder.Close() })
	resetAllFreesEveryKey(t, holder, newLocker(t, c))
	if !lossy.lost.Load() {
		t.Fatal("the scripts were never flushed: the test tested nothing")
	}
}
