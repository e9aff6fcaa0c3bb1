package redislock_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/redislock"
)

type acquirer interface {
	Acquire(ctx context.Context, key string) (*redislock.Lease, error)
}

type contention struct {
	maxInside int32 // most goroutines seen in the critical section at once
	cycles    int64
	errs      errorSink
}

// contend runs n goroutines, spread over lockers, that take key, enter a
// critical section that yields the processor (so an overlap would show),
// and release, until d has passed. With lockers nil they skip the lock: the
// control run, which must see overlaps, else the test could not fail.
func contend(lockers []acquirer, key string, n int, d time.Duration) *contention {
	res := &contention{}
	var inside atomic.Int32
	var lastToken atomic.Int64
	end := time.Now().Add(d)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			<-start
			for time.Now().Before(end) {
				var lease *redislock.Lease
				if lockers != nil {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					var err error
					lease, err = lockers[g%len(lockers)].Acquire(ctx, key)
					cancel()
					if err != nil {
						res.errs.Addf("goroutine %d: acquire: %w", g, err)
						return
					}
				}
				in := inside.Add(1)
				for {
					m := atomic.LoadInt32(&res.maxInside)
					if in <= m || atomic.CompareAndSwapInt32(&res.maxInside, m, in) {
						break
					}
				}
				if lease != nil {
					if prev := lastToken.Swap(lease.Token()); lease.Token() <= prev {
						res.errs.Addf("token %d after %d: not strictly increasing", lease.Token(), prev)
					}
				}
				runtime.Gosched()
				inside.Add(-1)
				atomic.AddInt64(&res.cycles, 1)
				if lease != nil {
					if err := lease.Release(context.Background()); err != nil {
						res.errs.Addf("goroutine %d: release: %w", g, err)
						return
					}
				}
			}
		})
	}
	close(start)
	wg.Wait()
	return res
}

func TestMutualExclusion(t *testing.T) {
	srv := startRedis(t)
	a := redislock.New(srv.Client(t))
	b := redislock.New(srv.Client(t))
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })

	res := contend([]acquirer{a, b}, uniqueKey(t), 64, time.Second)
	res.errs.Report(t)
	if res.maxInside != 1 {
		t.Fatalf("%d goroutines were in the critical section at once", res.maxInside)
	}
	if res.cycles < 64 {
		t.Fatalf("only %d lock cycles in 1s", res.cycles)
	}
	t.Logf("%d cycles", res.cycles)
}

// TestMutualExclusionControl runs the same critical section without the
// lock: it must see overlaps, which shows TestMutualExclusion can fail.
func TestMutualExclusionControl(t *testing.T) {
	res := contend(nil, uniqueKey(t), 64, 200*time.Millisecond)
	if res.maxInside < 2 {
		t.Fatalf("no overlap without the lock (max %d inside): the harness cannot detect a broken lock", res.maxInside)
	}
}

func newLocker(t *testing.T, c *redis.Client, opts ...redislock.Option) *redislock.Locker {
	t.Helper()
	l := redislock.New(c, opts...)
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	return l
}

func acquire(t *testing.T, l acquirer, ctx context.Context, key string) *redislock.Lease {
	t.Helper()
	lease, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("acquire %s: %v", key, err)
	}
	return lease
}

// lostWithin waits for ctx to be cancelled because the lock was lost.
func lostWithin(t *testing.T, ctx context.Context, d time.Duration) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
		t.Fatalf("the work's context was not cancelled within %v", d)
	}
	if cause := context.Cause(ctx); !errors.Is(cause, locking.ErrLockLost) {
		t.Fatalf("cause %v, want ErrLockLost", cause)
	}
}

// pause blocks the watchdog until the test ends.
func pause(t *testing.T) func(ctx context.Context, key string) error {
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	return func(ctx context.Context, _ string) error {
		select {
		case <-stop:
		case <-ctx.Done():
		}
		return ctx.Err()
	}
}

func TestWatchdogHoldsBeyondTTL(t *testing.T) {
	const ttl = 200 * time.Millisecond
	ctx := context.Background()
	key := uniqueKey(t)
	holder := newLocker(t, shared.Client(t), redislock.WithTTL(ttl))
	other := newLocker(t, shared.Client(t), redislock.WithTTL(ttl))

	lease := acquire(t, holder, ctx, key)
	// The contender waits 5 TTLs and must not get in: the watchdog keeps
	// renewing the lock.
	wctx, cancel := context.WithTimeout(ctx, 5*ttl)
	defer cancel()
	if l, err := other.Acquire(wctx, key); !errors.Is(err, locking.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		if l != nil {
			_ = l.Release(ctx)
		}
		t.Fatalf("contender: err %v, want ErrNotObtained and DeadlineExceeded", err)
	}
	if err := lease.Context().Err(); err != nil {
		t.Fatalf("work context cancelled while held: %v", context.Cause(lease.Context()))
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); !errors.Is(err, locking.ErrNotHeld) {
		t.Fatalf("second release: %v, want ErrNotHeld", err)
	}
	if !errors.Is(context.Cause(lease.Context()), context.Canceled) {
		t.Fatalf("released lease's context: cause %v", context.Cause(lease.Context()))
	}
}

func TestKilledRenewalCancelsWork(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t, shared.Client(t), redislock.WithTTL(time.Second), redislock.WithRenewEvery(50*time.Millisecond))
	boom := errors.New("watchdog killed")
	l.SetRenewHook(func(context.Context, string) error { return boom })
	lease := acquire(t, l, ctx, uniqueKey(t))
	lostWithin(t, lease.Context(), 5*time.Second)
	if !errors.Is(context.Cause(lease.Context()), boom) {
		t.Fatalf("cause %v does not carry the renewal error", context.Cause(lease.Context()))
	}
	if err := lease.Release(ctx); !errors.Is(err, locking.ErrLockLost) {
		t.Fatalf("release of a lost lock: %v, want ErrLockLost", err)
	}
}

func TestPausedRenewalCancelsWork(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t, shared.Client(t), redislock.WithTTL(200*time.Millisecond))
	l.SetRenewHook(pause(t))
	lease := acquire(t, l, ctx, uniqueKey(t))
	// Nothing renews: the validity timer, not the stalled watchdog, must
	// stop the work.
	lostWithin(t, lease.Context(), 5*time.Second)
}

func TestReleaseAfterExpiry(t *testing.T) {
	const ttl = 100 * time.Millisecond
	ctx := context.Background()
	key := uniqueKey(t)
	rdb := shared.Client(t)
	a := newLocker(t, rdb, redislock.WithTTL(ttl))
	b := newLocker(t, shared.Client(t), redislock.WithTTL(ttl))
	a.SetRenewHook(pause(t))

	first := acquire(t, a, ctx, key)
	lostWithin(t, first.Context(), 5*time.Second)
	// Expiry itself is under test: let the key run out in Redis.
	time.Sleep(ttl)

	second := acquire(t, b, ctx, key) // gets in: the first lock expired
	if second.Token() <= first.Token() {
		t.Fatalf("token %d after %d", second.Token(), first.Token())
	}
	if err := first.Release(ctx); !errors.Is(err, locking.ErrLockLost) {
		t.Fatalf("late release: %v, want ErrLockLost", err)
	}
	// The late release must not have deleted the second holder's lock.
	if n, err := rdb.Exists(ctx, "lock:"+key).Result(); err != nil || n != 1 {
		t.Fatalf("second holder's lock gone after the first's late release (exists=%d, %v)", n, err)
	}
	if err := second.Context().Err(); err != nil {
		t.Fatalf("second holder lost its lock: %v", context.Cause(second.Context()))
	}
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestReentrancy(t *testing.T) {
	ctx := context.Background()
	key := uniqueKey(t)
	rdb := shared.Client(t)
	l := newLocker(t, rdb)
	held := func() bool {
		n, err := rdb.Exists(ctx, "lock:"+key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}

	outer := acquire(t, l, ctx, key)
	// Without reentrancy this would wait for ourselves: bound it.
	rctx, cancel := context.WithTimeout(outer.Context(), 2*time.Second)
	defer cancel()
	inner := acquire(t, l, rctx, key)
	if inner.Token() != outer.Token() {
		t.Fatalf("reentrant token %d, want %d", inner.Token(), outer.Token())
	}
	if err := inner.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !held() {
		t.Fatal("lock freed while the outer lease still holds it")
	}
	if outer.Context().Err() != nil {
		t.Fatal("outer context cancelled by the inner release")
	}
	if err := outer.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if held() {
		t.Fatal("lock still held after the last release")
	}
	again := acquire(t, l, ctx, key)
	if again.Token() <= outer.Token() {
		t.Fatalf("token %d after %d", again.Token(), outer.Token())
	}
	_ = again.Release(ctx)
}

// TestWakeOnRelease: a waiter must be woken by the release (pub/sub), not by
// polling: the poll interval and the holder's TTL are far longer than the
// waiter's deadline, so only the wake-up can let it in.
func TestWakeOnRelease(t *testing.T) {
	ctx := context.Background()
	key := uniqueKey(t)
	opts := []redislock.Option{redislock.WithTTL(time.Minute), redislock.WithPollInterval(time.Hour)}
	holder := newLocker(t, shared.Client(t), opts...)
	waiter := newLocker(t, shared.Client(t), opts...)
	waiting := make(chan struct{}, 1)
	waiter.SetWaitHook(func(string) {
		select {
		case waiting <- struct{}{}:
		default:
		}
	})

	first := acquire(t, holder, ctx, key)
	got := make(chan error, 1)
	var second *redislock.Lease
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		var err error
		second, err = waiter.Acquire(wctx, key)
		got <- err
	}()
	<-waiting // the waiter is queued in Redis and blocked
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter not woken by the release: %v", err)
	}
	if redislock.TokenCounter(second.Token()) != redislock.TokenCounter(first.Token())+1 {
		t.Fatalf("token %d after %d: want the next counter", second.Token(), first.Token())
	}
	_ = second.Release(ctx)
}

// TestLocalFIFO: goroutines of one process get the lock in arrival order.
func TestLocalFIFO(t *testing.T) {
	ctx := context.Background()
	key := uniqueKey(t)
	l := newLocker(t, shared.Client(t))
	first := acquire(t, l, ctx, key)

	const n = 8
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	var sink errorSink
	for i := range n {
		queued := make(chan struct{})
		wg.Go(func() {
			close(queued)
			lease, err := l.Acquire(ctx, key)
			if err != nil {
				sink.Add(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			sink.Add(lease.Release(ctx))
		})
		<-queued
		// Acquire queues locally without blocking on Redis: wait until this
		// goroutine is parked before starting the next.
		for l.LocalWaiters(key) != i+1 {
			runtime.Gosched()
		}
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	sink.Report(t)
	for i, g := range order {
		if g != i {
			t.Fatalf("order %v, want FIFO", order)
		}
	}
}

// TestReset: Reset frees a stuck lock (its holder loses it) but never sets
// the fencing counter back: a store that kept the highest token it accepted
// must not refuse every holder after a new sale.
func TestReset(t *testing.T) {
	ctx := context.Background()
	key := uniqueKey(t)
	l := newLocker(t, shared.Client(t), redislock.WithTTL(300*time.Millisecond))
	for range 3 {
		lease := acquire(t, l, ctx, key)
		_ = lease.Release(ctx)
	}
	lease := acquire(t, l, ctx, key)
	if lease.Token() != redislock.ChainStart(4) {
		t.Fatalf("token %d, want %d (counter 4)", lease.Token(), redislock.ChainStart(4))
	}
	if err := l.Reset(ctx, key); err != nil {
		t.Fatal(err)
	}
	lostWithin(t, lease.Context(), 5*time.Second) // the next renewal finds it gone
	_ = lease.Release(ctx)
	again := acquire(t, l, ctx, key)
	if again.Token() <= lease.Token() {
		t.Fatalf("token after reset %d, not above %d before it", again.Token(), lease.Token())
	}
	_ = again.Release(ctx)
}

func TestServerDown(t *testing.T) {
	ctx := context.Background()
	srv := startRedis(t)
	l := newLocker(t, srv.Client(t), redislock.WithTTL(200*time.Millisecond), redislock.WithNodeTimeout(100*time.Millisecond))
	key := uniqueKey(t)
	lease := acquire(t, l, ctx, key)
	srv.Stop()
	lostWithin(t, lease.Context(), 5*time.Second)
	if err := lease.Release(ctx); !errors.Is(err, locking.ErrLockLost) {
		t.Fatalf("release with the server down: %v, want ErrLockLost", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err := l.Acquire(wctx, key)
	var ne *locking.NodeError
	if !errors.Is(err, locking.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &ne) || ne.Node != srv.Addr {
		t.Fatalf("acquire with the server down: %v; want ErrNotObtained, DeadlineExceeded and a NodeError for %s", err, srv.Addr)
	}
	srv.Restart(t)
	lease = acquire(t, l, ctx, key)
	_ = lease.Release(ctx)
}

func TestClose(t *testing.T) {
	ctx := context.Background()
	key := uniqueKey(t)
	l := redislock.New(shared.Client(t))
	other := newLocker(t, shared.Client(t))
	held := acquire(t, other, ctx, key)
	defer held.Release(ctx)

	mine := acquire(t, l, ctx, uniqueKey(t))
	waiting := make(chan struct{}, 1)
	l.SetWaitHook(func(string) {
		select {
		case waiting <- struct{}{}:
		default:
		}
	})
	got := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, key)
		got <- err
	}()
	<-waiting
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, locking.ErrNotObtained) || !errors.Is(err, locking.ErrClosed) {
		t.Fatalf("waiter after Close: %v", err)
	}
	lostWithin(t, mine.Context(), time.Second)
	if !errors.Is(context.Cause(mine.Context()), locking.ErrClosed) {
		t.Fatalf("cause %v, want ErrClosed", context.Cause(mine.Context()))
	}
	if _, err := l.Acquire(ctx, key); !errors.Is(err, locking.ErrClosed) {
		t.Fatalf("acquire after Close: %v", err)
	}
}
