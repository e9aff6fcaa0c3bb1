package getsetlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/getsetlock"
	"github.com/flashsale/stock/lab/testredis"
)

// TestExclusiveWhileNothingGoesWrong: with no pause, no skew and no race,
// the recipe does exclude: a second client waits out its wait while the
// first holds, and gets the lock once it is released.
func TestExclusiveWhileNothingGoesWrong(t *testing.T) {
	rdb := testredis.Start(t).Client(t)
	a := getsetlock.New(rdb)
	b := getsetlock.New(rdb, getsetlock.WithWait(50*time.Millisecond))
	ctx := context.Background()
	held, err := a.Acquire(ctx, "sku")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "sku"); !errors.Is(err, locking.ErrNotObtained) {
		t.Fatalf("second client while held: %v, want not obtained", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "sku"); err != nil {
		t.Fatalf("second client after the release: %v", err)
	}
}

// TestExpiredHolderDeletesItsSuccessorsLock: A's lock expires while A is
// still at work (a pause); B takes it over with GETSET; A finishes and
// releases with DEL, which deletes B's lock: C then takes the lock while B
// holds it. Two holders at once, as the articles' critics describe.
func TestExpiredHolderDeletesItsSuccessorsLock(t *testing.T) {
	rdb := testredis.Start(t).Client(t)
	ctx := context.Background()
	ttl := 100 * time.Millisecond
	a := getsetlock.New(rdb, getsetlock.WithTTL(ttl))
	leaseA, err := a.Acquire(ctx, "sku")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl + 50*time.Millisecond) // the expiry is what is under test
	b := getsetlock.New(rdb, getsetlock.WithTTL(time.Minute))
	if _, err := b.Acquire(ctx, "sku"); err != nil {
		t.Fatalf("B takes over the expired lock: %v", err)
	}
	if leaseA.Context().Err() != nil {
		t.Fatal("the recipe has no loss signal, yet A's context ended")
	}
	if err := leaseA.Release(ctx); err != nil { // A, late: DEL, no owner check
		t.Fatal(err)
	}
	c := getsetlock.New(rdb, getsetlock.WithWait(50*time.Millisecond))
	if _, err := c.Acquire(ctx, "sku"); err != nil {
		t.Fatalf("C should get the lock B still holds (A deleted it): %v", err)
	}
}

// TestSkewedClockTakesAHeldLock: expiry is judged by each client's clock. A
// client whose clock runs ten seconds ahead finds a lock taken a moment ago
// with a five-second TTL expired, and takes it: two holders.
func TestSkewedClockTakesAHeldLock(t *testing.T) {
	rdb := testredis.Start(t).Client(t)
	ctx := context.Background()
	if _, err := getsetlock.New(rdb).Acquire(ctx, "sku"); err != nil {
		t.Fatal(err)
	}
	ahead := getsetlock.New(rdb, getsetlock.WithWait(50*time.Millisecond),
		getsetlock.WithClock(func() time.Time { return time.Now().Add(10 * time.Second) }))
	if _, err := ahead.Acquire(ctx, "sku"); err != nil {
		t.Fatalf("a client with its clock 10s ahead should take the held lock: %v", err)
	}
}

// beforeGetSet runs f once, before the first GETSET sent through a client.
type beforeGetSet struct{ f func() }

func (h *beforeGetSet) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *beforeGetSet) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *beforeGetSet) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "getset" && h.f != nil {
			f := h.f
			h.f = nil
			f()
		}
		return next(ctx, cmd)
	}
}

// TestLosingGetSetOverwritesTheWinnersExpiry: B and C both read the same
// expired value; B's GETSET wins; C's, sent after, loses (it reads B's
// value back) but has already replaced B's expiry with its own. The lock
// B holds now expires when C said, not when B did.
func TestLosingGetSetOverwritesTheWinnersExpiry(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	// An expired lock: its time is a second in the past.
	if err := rdb.Set(ctx, "legacy-lock:sku", time.Now().Add(-time.Second).UnixMilli(), 0).Err(); err != nil {
		t.Fatal(err)
	}
	b := getsetlock.New(rdb, getsetlock.WithTTL(time.Minute))
	cClient := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = cClient.Close() })
	bTook := make(chan error, 1)
	cClient.AddHook(&beforeGetSet{f: func() {
		// C has read the expired value; B completes its takeover first.
		_, err := b.Acquire(ctx, "sku")
		bTook <- err
	}})
	c := getsetlock.New(cClient, getsetlock.WithTTL(time.Hour), getsetlock.WithWait(50*time.Millisecond))
	if _, err := c.Acquire(ctx, "sku"); !errors.Is(err, locking.ErrNotObtained) {
		t.Fatalf("C after losing the race: %v, want not obtained", err)
	}
	if err := <-bTook; err != nil {
		t.Fatalf("B's takeover: %v", err)
	}
	v, err := rdb.Get(ctx, "legacy-lock:sku").Int64()
	if err != nil {
		t.Fatal(err)
	}
	if until := time.Until(time.UnixMilli(v)); until < 50*time.Minute {
		t.Fatalf("the lock B holds expires in %s: C's losing GETSET should have written its own hour", until)
	}
}
