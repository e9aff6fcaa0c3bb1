package semaphore_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flashsale/stock/internal/locking/semaphore"
	"github.com/flashsale/stock/lab/testredis"
)

// processes returns n semaphores of limit places on srv, each with a
// client of its own, as n instances of the service would have.
func processes(t *testing.T, srv *testredis.Server, n, limit int, opts ...semaphore.Option) []*semaphore.Semaphore {
	t.Helper()
	sems := make([]*semaphore.Semaphore, n)
	for i := range sems {
		s, err := semaphore.New(srv.Client(t), limit, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		sems[i] = s
	}
	return sems
}

// inside counts holders at once and remembers the most.
type inside struct{ now, most atomic.Int64 }

func (in *inside) enter() {
	n := in.now.Add(1)
	for m := in.most.Load(); n > m && !in.most.CompareAndSwap(m, n); m = in.most.Load() {
	}
}

func (in *inside) leave() { in.now.Add(-1) }

// TestAtMostLimitHolders: 24 goroutines over three processes take a place
// of one name 20 times each; never more than the limit hold at once, and
// the limit is reached (a semaphore that admitted one at a time would pass
// the first check alone).
func TestAtMostLimitHolders(t *testing.T) {
	const limit = 4
	srv := testredis.Start(t)
	sems := processes(t, srv, 3, limit)
	var in inside
	var wg sync.WaitGroup
	errs := make(chan error, 24)
	for g := range 24 {
		wg.Go(func() {
			for range 20 {
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				p, err := sems[g%3].Acquire(ctx, "sku")
				cancel()
				if err != nil {
					errs <- err
					return
				}
				in.enter()
				time.Sleep(time.Millisecond) // the holder's work: overlap is what is measured
				in.leave()
				if ok, err := p.Release(context.Background()); err != nil || !ok {
					errs <- errors.Join(err, errors.New("a held permit's release found no place"))
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if most := in.most.Load(); most != limit {
		t.Fatalf("at most %d held at once, want exactly the limit %d", most, limit)
	}
	if n, _ := sems[0].Holders(t.Context(), "sku"); n != 0 {
		t.Fatalf("%d places still held after every release", n)
	}
}

// queued waits until name's queue has n waiters (each has asked once).
func queued(t *testing.T, srv *testredis.Server, n int64) {
	t.Helper()
	rdb := srv.Client(t)
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := rdb.ZCard(t.Context(), "sem:{sku}:queue").Result()
		if err != nil {
			t.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond) // polling Redis's state: there is no event to wait on
	}
}

// TestFirstComeFirstAdmitted: with every place taken, three waiters from
// three processes queue one after another; as places free one by one, they
// are admitted in the order they asked.
func TestFirstComeFirstAdmitted(t *testing.T) {
	srv := testredis.Start(t)
	sems := processes(t, srv, 4, 1)
	held, err := sems[3].Acquire(t.Context(), "sku")
	if err != nil {
		t.Fatal(err)
	}
	admitted := make(chan int, 3)
	permits := make(chan *semaphore.Permit, 3)
	for w := range 3 {
		go func() {
			p, err := sems[w].Acquire(t.Context(), "sku")
			if err != nil {
				t.Error(err)
				return
			}
			admitted <- w
			permits <- p
		}()
		queued(t, srv, int64(w+1))
	}
	if _, err := held.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	for want := range 3 {
		if got := <-admitted; got != want {
			t.Fatalf("waiter %d admitted in place %d", got, want)
		}
		if _, err := (<-permits).Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDeadHolderFreesItsPlaceAtItsLease: a holder that never releases
// keeps its place until its lease ends, and not longer.
func TestDeadHolderFreesItsPlaceAtItsLease(t *testing.T) {
	const lease = 300 * time.Millisecond
	srv := testredis.Start(t)
	sems := processes(t, srv, 2, 1, semaphore.WithLease(lease))
	if _, err := sems[0].Acquire(t.Context(), "sku"); err != nil { // dies holding it
		t.Fatal(err)
	}
	began := time.Now()
	p, err := sems[1].Acquire(t.Context(), "sku")
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(began)
	if waited < lease*9/10 || waited > lease+time.Second {
		t.Fatalf("the dead holder's place freed after %v, lease %v", waited, lease)
	}
	_, _ = p.Release(t.Context())
}

// TestCancelledWaiterLeavesTheQueue: a wait that ends returns
// ErrNotAdmitted with the context's error, and the waiter is no longer in
// line ahead of the next one.
func TestCancelledWaiterLeavesTheQueue(t *testing.T) {
	srv := testredis.Start(t)
	sems := processes(t, srv, 2, 1)
	held, err := sems[0].Acquire(t.Context(), "sku")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := sems[1].Acquire(ctx, "sku")
		done <- err
	}()
	queued(t, srv, 1)
	cancel()
	if err := <-done; !errors.Is(err, semaphore.ErrNotAdmitted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled wait returned %v", err)
	}
	queued(t, srv, 0)
	_, _ = held.Release(t.Context())
}

// TestCloseEndsTheSubscription: a semaphore's subscription reader ends
// with Close; nothing is left behind.
func TestCloseEndsTheSubscription(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client(t)
	opt := goleak.IgnoreCurrent()
	s, err := semaphore.New(rdb, 2)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Acquire(t.Context(), "sku")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := goleak.Find(opt); err != nil {
		t.Fatal(err)
	}
}
