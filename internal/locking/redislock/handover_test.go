package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/redislock"
)

// TestHandOverTakesPlacesWithoutRedis: a process that takes the lock while
// two of its goroutines wait for it hands it to them in turn without going
// back to Redis; their tokens are the next places of the first holder's
// counter, the counter in Redis stays as it was, and another process's
// later token (the next counter) is greater than all of them.
func TestHandOverTakesPlacesWithoutRedis(t *testing.T) {
	ctx := context.Background()
	key := uniqueKey(t)
	client := shared.Client(t)
	other := newLocker(t, client)
	l := newLocker(t, client)
	blocked, hook := blockedSignal()
	l.SetWaitHook(hook)

	holder := acquire(t, other, ctx, key)
	leases := make(chan *redislock.Lease, 3)
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
	if counter != redislock.TokenCounter(first.Token()) || first.Token() != redislock.ChainStart(counter) {
		t.Fatalf("counter %d while the first holds %d: the first of a chain holds its counter's first place", counter, first.Token())
	}
	current := first
	for range 2 {
		if err := current.Release(ctx); err != nil {
			t.Fatal(err)
		}
		current = <-leases
		tokens = append(tokens, current.Token())
		after, err := client.Get(ctx, "lock:"+key+":fence").Int64()
		if err != nil {
			t.Fatal(err)
		}
		if after != counter {
			t.Fatalf("counter %d after hand-over to token %d, was %d: a hand-over wrote to Redis", after, current.Token(), counter)
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
	opts := []redislock.Option{redislock.WithPollInterval(time.Hour), redislock.WithWait(20 * time.Second)}
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

// batchAcquirer is a Locker or a Redlock, with the test hooks.
type batchAcquirer interface {
	acquirer
	SetWaitHook(func(string))
	LocalWaiters(key string) int
}

// startBatch makes p take key while n more of its goroutines wait for it
// locally, so that p hands the lock over n times. other holds key first and
// is released by the caller; the leases arrive on the channel in turn.
func startBatch(t *testing.T, p, other batchAcquirer, key string, n int) (<-chan *redislock.Lease, *redislock.Lease) {
	t.Helper()
	ctx := context.Background()
	holder := acquire(t, other, ctx, key)
	blocked, hook := blockedSignal()
	p.SetWaitHook(hook)
	t.Cleanup(func() { p.SetWaitHook(nil) })
	leases := make(chan *redislock.Lease, n+1)
	for i := range n + 1 {
		go func() {
			lease, err := p.Acquire(ctx, key)
			if err != nil {
				t.Error(err)
				close(leases)
				return
			}
			leases <- lease
		}()
		if i == 0 {
			<-blocked // the slot owner waits in Redis
			continue
		}
		for p.LocalWaiters(key) != i {
			runtime.Gosched()
		}
	}
	return leases, holder
}

func nextLease(t *testing.T, leases <-chan *redislock.Lease) *redislock.Lease {
	t.Helper()
	lease, ok := <-leases
	if !ok {
		t.Fatal("a goroutine of the batch failed to acquire")
	}
	return lease
}

// TestHandOverNeverRevivesAnExpiredLock: a holder whose lock expired while
// its process was paused (its timers had not run yet) must not hand the
// lock on when it releases: Redlock's renewal would put the key back on
// every node, and the successor would hold a token below the one of the
// process that held the lock meanwhile.
func TestHandOverNeverRevivesAnExpiredLock(t *testing.T) {
	ctx := context.Background()
	_, clients := cluster(t, 3)
	key := uniqueKey(t)
	const ttl = 300 * time.Millisecond
	// The successor's wait outlasts the pause (the default is 2 TTLs).
	p := newRedlock(t, clients, redislock.WithTTL(ttl), redislock.WithWait(10*time.Second))
	other := newRedlock(t, clients, redislock.WithTTL(ttl))
	leases, holder := startBatch(t, p, other, key, 1)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	paused := nextLease(t, leases)
	paused.StopTimers()
	time.Sleep(ttl + 100*time.Millisecond) // the expiry under test
	meanwhile := acquire(t, other, ctx, key)
	if err := meanwhile.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := paused.Release(ctx); !errors.Is(err, locking.ErrLockLost) {
		t.Errorf("release of an expired lock: %v, want ErrLockLost", err)
	}
	successor := nextLease(t, leases)
	defer successor.Release(ctx)
	if successor.Token() <= meanwhile.Token() {
		t.Errorf("successor's token %d is not above %d, the token of the holder in between", successor.Token(), meanwhile.Token())
	}
}

// secondOfLockerBatch starts a batch of three in a Locker and returns once
// the second goroutine holds the lock by hand-over, with the Locker, another process's Locker, the key
// and the channel the third lease will arrive on.
func secondOfLockerBatch(t *testing.T) (p, other *redislock.Locker, key string, leases <-chan *redislock.Lease, second *redislock.Lease) {
	t.Helper()
	ctx := context.Background()
	key = uniqueKey(t)
	client := shared.Client(t)
	p, other = newLocker(t, client), newLocker(t, client)
	leases, holder := startBatch(t, p, other, key, 2)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	first := nextLease(t, leases)
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	return p, other, key, leases, nextLease(t, leases)
}

// TestHandOverStopsAtReset: after Reset, the chain of hand-overs stops; the
// next goroutine of the process gets the lock from Redis, never while
// another process holds it.
func TestHandOverStopsAtReset(t *testing.T) {
	ctx := context.Background()
	p, other, key, leases, second := secondOfLockerBatch(t)
	if err := p.Reset(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := second.Release(ctx); !errors.Is(err, locking.ErrLockLost) {
		t.Errorf("release after Reset: %v, want ErrLockLost", err)
	}
	third := nextLease(t, leases)
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if o, err := other.Acquire(wctx, key); err == nil {
		_ = o.Release(ctx)
		if third.Context().Err() == nil {
			t.Fatalf("two holders: the third goroutine (token %d) and another process (token %d)", third.Token(), o.Token())
		}
	}
	_ = third.Release(ctx)
}

// TestHandOverHonoursAdvanceFence: AdvanceFence during a batch raises the
// tokens the rest of the batch is handed: within the chain's places when
// some are above what it was given, else by going back to Redis. Another
// process's AdvanceFence does not reach a chain begun before it (the
// documented exception): the store refuses that chain's token, and the
// process advances the fence in turn, which does.
func TestHandOverHonoursAdvanceFence(t *testing.T) {
	for _, tc := range []struct {
		name       string
		above      func(second int64) int64 // what AdvanceFence is given
		otherFirst bool                     // another process advanced it first
	}{
		{"within the chain", func(second int64) int64 { return second + 5 }, false},
		{"past the chain", func(second int64) int64 {
			return redislock.ChainStart(redislock.TokenCounter(second)+3) + 7
		}, false},
		{"another process, then this one", func(second int64) int64 { return second + 5 }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			p, other, key, leases, second := secondOfLockerBatch(t)
			atLeast := tc.above(second.Token())
			if tc.otherFirst {
				if err := other.AdvanceFence(ctx, key, atLeast); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.AdvanceFence(ctx, key, atLeast); err != nil {
				t.Fatal(err)
			}
			if err := second.Release(ctx); err != nil {
				t.Fatal(err)
			}
			third := nextLease(t, leases)
			defer third.Release(ctx)
			if third.Token() <= atLeast {
				t.Errorf("token %d handed over after AdvanceFence(%d)", third.Token(), atLeast)
			}
		})
	}
}

// TestRedlockGateSkipsACrashedWaiter: a waiter that crashed while first in
// the gate's line does not keep others from a free lock, even when nothing
// polls (poll interval 1h).
func TestRedlockGateSkipsACrashedWaiter(t *testing.T) {
	ctx := context.Background()
	_, clients := cluster(t, 3)
	key := uniqueKey(t)
	r := newRedlock(t, clients, redislock.WithPollInterval(time.Hour), redislock.WithWait(2*time.Second))
	gate := clients[r.GateNode(key)]
	now, err := gate.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	crashed := fmt.Sprintf("%d:%d:redlock:%s", now.Add(time.Minute).UnixMilli(), 5000, "crashed-waiter")
	if err := gate.RPush(ctx, "lock:"+key+":queue", crashed).Err(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		lease := acquire(t, r, ctx, key)
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := gate.LLen(ctx, "lock:"+key+":queue").Result(); err != nil || n != 1 {
		t.Errorf("gate queue holds %d entries (%v), want only the crashed one", n, err)
	}
}

// TestHandOverRefusesAnExpiredGrant: a goroutine that is handed the lock
// but pauses before it takes it (until the lock's validity, and the key in
// Redis, are gone) must not hold a lock nobody holds in Redis: it refuses
// the expired grant and takes the lock from Redis, so another process is
// kept out.
func TestHandOverRefusesAnExpiredGrant(t *testing.T) {
	const ttl = 300 * time.Millisecond
	opts := []redislock.Option{redislock.WithTTL(ttl), redislock.WithWait(10 * time.Second)}
	t.Run("locker", func(t *testing.T) {
		client := shared.Client(t)
		refuseExpiredGrant(t, newLocker(t, client, opts...), newLocker(t, client, opts...), []*redis.Client{client})
	})
	t.Run("redlock", func(t *testing.T) {
		_, clients := cluster(t, 3)
		refuseExpiredGrant(t, newRedlock(t, clients, opts...), newRedlock(t, clients, opts...), clients)
	})
}

func refuseExpiredGrant(t *testing.T, p, other interface {
	batchAcquirer
	SetGrantHook(func(string))
}, clients []*redis.Client) {
	ctx := context.Background()
	key := uniqueKey(t)
	var paused sync.Once
	p.SetGrantHook(func(string) {
		paused.Do(func() { time.Sleep(400 * time.Millisecond) }) // past the TTL: the expiry under test
	})
	leases, holder := startBatch(t, p, other, key, 1)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	first := nextLease(t, leases)
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := nextLease(t, leases)
	defer second.Release(ctx)
	held := 0
	for _, c := range clients {
		if n, err := c.Exists(ctx, "lock:"+key).Result(); err == nil && n == 1 {
			held++
		}
	}
	if held < len(clients)/2+1 {
		t.Fatalf("the lease's key is on %d of %d servers: a lease without a lock", held, len(clients))
	}
	if second.Token() <= first.Token() {
		t.Errorf("token %d after %d", second.Token(), first.Token())
	}
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if o, err := other.Acquire(wctx, key); err == nil {
		_ = o.Release(ctx)
		t.Fatalf("another process took the lock (token %d) while the second goroutine holds it (token %d)", o.Token(), second.Token())
	}
}

// TestHandOverLeavesNoInbox: goroutines of one process that take a key in
// turn (batches of hand-overs, each batch's first holder woken through
// Redis) leave no inbox behind in the key's subscription: the map the
// message dispatch scans holds at most one inbox per goroutine, however
// many batches ran.
func TestHandOverLeavesNoInbox(t *testing.T) {
	for _, tc := range []struct {
		name string
		new  func(t *testing.T) interface {
			acquirer
			ArmedInboxes(key string) int
		}
	}{
		{"locker", func(t *testing.T) interface {
			acquirer
			ArmedInboxes(key string) int
		} {
			return newLocker(t, shared.Client(t))
		}},
		{"redlock", func(t *testing.T) interface {
			acquirer
			ArmedInboxes(key string) int
		} {
			_, clients := cluster(t, 3)
			return newRedlock(t, clients)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			key := uniqueKey(t)
			p := tc.new(t)
			const goroutines, cycles = 4, 40
			var most atomic.Int64
			var sink errorSink
			var wg sync.WaitGroup
			for range goroutines {
				wg.Go(func() {
					for range cycles {
						lease, err := p.Acquire(ctx, key)
						if err != nil {
							sink.Add(err)
							return
						}
						n := int64(p.ArmedInboxes(key))
						for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
						}
						runtime.Gosched()
						sink.Add(lease.Release(ctx))
					}
				})
			}
			wg.Wait()
			sink.Report(t)
			if m := most.Load(); m > goroutines {
				t.Fatalf("up to %d inboxes armed for %d goroutines: the map grows with the batches", m, goroutines)
			}
		})
	}
}
