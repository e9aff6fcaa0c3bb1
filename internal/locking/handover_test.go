package locking_test

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/locking"
)

// TestHandOverReservesTokens: a process that takes the lock while two of
// its goroutines wait for it hands it to them in turn without going back
// to Redis; their tokens follow on, and the counter in Redis is raised past
// them before the first hand-over, so another process's later token is
// greater than all of them.
func TestHandOverReservesTokens(t *testing.T) {
	ctx := context.Background()
	key := uniqueKey(t)
	client := shared.Client(t)
	other := newLocker(t, client)
	l := newLocker(t, client)
	blocked, hook := blockedSignal()
	l.SetWaitHook(hook)

	holder := acquire(t, other, ctx, key)
	leases := make(chan *locking.Lease, 3)
	var sink errorSink
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			lease, err := l.Acquire(ctx, key)
			if err != nil {
				sink.Add(err)
				return
			}
			leases <- lease
		})
		if i == 0 {
			<-blocked // the first talks to Redis and waits there
			continue
		}
		for l.LocalWaiters(key) != i {
			runtime.Gosched()
		}
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}

	first := <-leases
	tokens := []int64{first.Token()}
	counter, err := client.Get(ctx, "lock:"+key+":fence").Int64()
	if err != nil {
		t.Fatal(err)
	}
	if counter != first.Token() {
		t.Fatalf("counter %d while the first holds %d: nothing should be reserved before a hand-over", counter, first.Token())
	}
	current := first
	for range 2 {
		if err := current.Release(ctx); err != nil {
			t.Fatal(err)
		}
		current = <-leases
		tokens = append(tokens, current.Token())
		counter, err := client.Get(ctx, "lock:"+key+":fence").Int64()
		if err != nil {
			t.Fatal(err)
		}
		if counter < tokens[0]+2 {
			t.Fatalf("counter %d after hand-over to token %d: the batch's tokens up to %d are not reserved", counter, current.Token(), tokens[0]+2)
		}
	}
	if err := current.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	sink.Report(t)
	if tokens[1] != tokens[0]+1 || tokens[2] != tokens[0]+2 {
		t.Fatalf("tokens %v, want consecutive", tokens)
	}
	later := acquire(t, other, ctx, key)
	defer later.Release(ctx)
	if later.Token() <= tokens[2] {
		t.Fatalf("another process's token %d after the batch %v", later.Token(), tokens)
	}
}

// TestRedlockTurnsInWaitingOrder: two processes that wait for a held
// Redlock get it in the order they started waiting (the gate node's
// queue), not in whichever order their rounds happen to land.
func TestRedlockTurnsInWaitingOrder(t *testing.T) {
	ctx := context.Background()
	_, clients := cluster(t, 5)
	key := uniqueKey(t)
	// Only announcements wake a waiter: no poll can hide the order.
	opts := []locking.Option{locking.WithPollInterval(time.Hour), locking.WithWait(20 * time.Second)}
	holder := newRedlock(t, clients, opts...)
	first := acquire(t, holder, ctx, key)

	order := make(chan string, 2)
	var sink errorSink
	var wg sync.WaitGroup
	for i := range 2 {
		name := "waiter-" + strconv.Itoa(i)
		r := newRedlock(t, clients, opts...)
		blocked, hook := blockedSignal()
		r.SetWaitHook(hook)
		wg.Go(func() {
			lease, err := r.Acquire(ctx, key)
			if err != nil {
				sink.Add(err)
				return
			}
			order <- name
			sink.Add(lease.Release(ctx))
		})
		<-blocked
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	sink.Report(t)
	close(order)
	var got []string
	for name := range order {
		got = append(got, name)
	}
	if len(got) != 2 || got[0] != "waiter-0" || got[1] != "waiter-1" {
		t.Fatalf("turns %v, want waiter-0 then waiter-1", got)
	}
}

// blockedSignal returns a wait hook and the channel it signals (without
// blocking) each time the acquirer blocks in Redis.
func blockedSignal() (<-chan struct{}, func(string)) {
	blocked := make(chan struct{}, 1)
	return blocked, func(string) {
		select {
		case blocked <- struct{}{}:
		default:
		}
	}
}
