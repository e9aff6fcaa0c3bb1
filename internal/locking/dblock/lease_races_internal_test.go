package dblock

// A lease's statements racing its waiters, its re-entries, its heartbeat
// and another process: a waiter that leaves during a hand-over does not
// wedge the name, a re-entry racing the last release either counts or
// waits afresh, Release returns at its own context, and an answer that
// comes back late gives no live lease. Each test drives its schedule
// through a table wrapper (hookTable) that runs a hook at a chosen point
// of one statement, so that the interleaving is exact rather than timed.

import (
	"context"
	"net/url"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testproxy"
)

const scheduleTTL = time.Second

var scheduleEngines = []string{"postgres", "mysql"}

// hookTable runs a hook before or after one of the wrapped table's
// statements. The hooks are set before the schedule starts.
type hookTable struct {
	table
	beforeHandOver atomic.Pointer[func()]
	beforeRenew    atomic.Pointer[func()]
	afterAcquire   atomic.Pointer[func(ok bool)]
}

func (t *hookTable) handOver(ctx context.Context, name, from, to string, ttl time.Duration) (int64, bool, error) {
	if f := t.beforeHandOver.Load(); f != nil {
		(*f)()
	}
	return t.table.handOver(ctx, name, from, to, ttl)
}

func (t *hookTable) renew(ctx context.Context, name, owner string, ttl time.Duration) (bool, error) {
	if f := t.beforeRenew.Load(); f != nil {
		(*f)()
	}
	return t.table.renew(ctx, name, owner, ttl)
}

func (t *hookTable) acquire(ctx context.Context, name, owner string, ttl time.Duration) (int64, bool, error) {
	token, ok, err := t.table.acquire(ctx, name, owner, ttl)
	if f := t.afterAcquire.Load(); f != nil && err == nil {
		(*f)(ok)
	}
	return token, ok, err
}

func scheduleOpen(t *testing.T, dbURL string, opts ...Option) *Locker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := Open(ctx, dbURL, append([]Option{WithTTL(scheduleTTL)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Ping(ctx); err != nil {
		_ = l.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func hooked(l *Locker) *hookTable {
	h := &hookTable{table: l.table}
	l.table = h
	return h
}

type acquired struct {
	le  *Lease
	err error
}

func acquireAsync(l *Locker, ctx context.Context, name string) <-chan acquired {
	got := make(chan acquired, 1)
	go func() {
		le, err := l.Acquire(ctx, name)
		got <- acquired{le, err}
	}()
	return got
}

// waitFor spins (yielding) until cond holds, for at most d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
	}
}

// A cancelled waiter leaves nothing that blocks others. When the last
// lease is released with a local waiter queued, release() hands the lock
// over; if that waiter gave up while the hand-over statement ran,
// queue.Pass reports false and handOver frees the passed hold. The
// process's turn for the name must end with it (queue.Done), or every later
// Acquire of the name in this process waits out its context although the
// row is free. (endTurn has the same shape.)
//
// Schedule: M holds "q". G1 and G2 Acquire "q" on L: one polls, the other
// queues (Waiting 1). M releases; the poller obtains with budget 1 (lease
// A). A.Release: Waiting = 1 -> handOver; before its statement the queued
// goroutine's context ends and it leaves. handOver: the statement passes
// the row to a fresh owner, Pass finds nobody, free() frees the row,
// release returns nil. Another process takes the free row, and then
// L.Acquire("q") gets its turn and the lock.
func TestHandOverToDepartedWaiterFreesTheName(t *testing.T) {
	for _, engine := range scheduleEngines {
		t.Run(engine, func(t *testing.T) {
			dbURL := testdb.MigratedURL(t, engine)
			l := scheduleOpen(t, dbURL)
			m := scheduleOpen(t, dbURL)
			hooks := hooked(l)
			const name = "q"

			held, err := m.Acquire(t.Context(), name)
			if err != nil {
				t.Fatal(err)
			}
			ctx1, cancel1 := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel1()
			ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel2()
			got1 := acquireAsync(l, ctx1, name)
			got2 := acquireAsync(l, ctx2, name)
			waitFor(t, 5*time.Second, "one goroutine queued behind the poller", func() bool { return l.queue.Waiting(name) == 1 })
			if err := held.Release(t.Context()); err != nil {
				t.Fatal(err)
			}

			var a *Lease
			var cancelWaiter context.CancelFunc
			var waiterGot <-chan acquired
			select {
			case r := <-got1:
				a, cancelWaiter, waiterGot = r.le, cancel2, got2
				if r.err != nil {
					t.Fatal(r.err)
				}
			case r := <-got2:
				a, cancelWaiter, waiterGot = r.le, cancel1, got1
				if r.err != nil {
					t.Fatal(r.err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the poller never obtained the freed lock")
			}
			if a.h.budget != 1 {
				t.Fatalf("budget %d, want 1 (one goroutine queued at the acquisition)", a.h.budget)
			}

			var once sync.Once
			hooks.beforeHandOver.Store(ptr(func() {
				once.Do(func() {
					cancelWaiter()
					if r := <-waiterGot; r.err == nil {
						t.Errorf("the waiter that gave up got the lock (token %d)", r.le.Token())
					}
				})
			}))
			if err := a.Release(context.Background()); err != nil {
				t.Fatalf("Release = %v", err)
			}

			// The row is free: another process takes it at once.
			other, err := m.Acquire(t.Context(), name)
			if err != nil {
				t.Fatalf("the row was not freed: %v", err)
			}
			if err := other.Release(t.Context()); err != nil {
				t.Fatal(err)
			}

			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			le, err := l.Acquire(ctx, name)
			if err != nil {
				t.Fatalf("after a hand-over to a waiter that left, this process can no longer take the free lock %q: %v", name, err)
			}
			_ = le.Release(context.Background())
		})
	}
}

// A re-entry racing the last Release never revives a released hold (with
// the count kept in the row, the re-entry's statement could run, the outer
// lease release in between, and the re-entry revive a dead hold whose
// Release then closed a channel twice). The count is the process's own,
// under the hold's mutex: a re-entry either counts before the last release,
// and the lock is released with the re-entered lease, or finds the hold
// released and waits for the lock afresh. Either way it gets a live lease,
// and once every lease is released the row is free.
func TestReenterRacingTheLastReleaseCountsOrWaitsAfresh(t *testing.T) {
	for _, engine := range scheduleEngines {
		t.Run(engine, func(t *testing.T) {
			dbURL := testdb.MigratedURL(t, engine)
			l := scheduleOpen(t, dbURL)
			m := scheduleOpen(t, dbURL)
			const name = "r"
			for range 50 {
				a, err := l.Acquire(t.Context(), name)
				if err != nil {
					t.Fatal(err)
				}
				var wg sync.WaitGroup
				wg.Go(func() {
					if err := a.Release(context.Background()); err != nil {
						t.Errorf("A.Release = %v", err)
					}
				})
				// The hold travels in the context's values; its end must not
				// end the fresh wait when the re-entry comes too late.
				ctx, cancel := context.WithTimeout(context.WithoutCancel(a.Context()), 5*time.Second)
				b, err := l.Acquire(ctx, name)
				cancel()
				wg.Wait()
				if err != nil {
					t.Fatalf("the re-entry (or the fresh acquisition after A's release) failed: %v", err)
				}
				if b.Context().Err() != nil {
					t.Fatalf("Acquire returned a lease already ended (cause %v)", context.Cause(b.Context()))
				}
				if err := b.Release(context.Background()); err != nil {
					t.Fatalf("B.Release = %v", err)
				}
			}
			ctx, cancel := context.WithTimeout(t.Context(), scheduleTTL/2)
			defer cancel()
			c, err := m.Acquire(ctx, name)
			if err != nil {
				t.Fatalf("every lease of %q released, but the row stays held: %v", name, err)
			}
			_ = c.Release(context.Background())
		})
	}
}

// No wait hangs past its context: Release of the last lease stops the
// heartbeat, whose in-flight renewal runs under the lease's deadline, not
// Release's ctx; Release must not wait for that renewal past its own
// context. With the database not answering (a partition, here the proxy
// frozen), Release(ctx 100ms) returns at its context, not when the renewal
// gives up about a TTL later.
func TestReleaseReturnsAtItsContextDuringARenewal(t *testing.T) {
	for _, engine := range scheduleEngines {
		t.Run(engine, func(t *testing.T) {
			dbURL := testdb.MigratedURL(t, engine)
			u, err := url.Parse(dbURL)
			if err != nil {
				t.Fatal(err)
			}
			p := testproxy.Start(t, u.Host)
			u.Host = p.Addr
			l := scheduleOpen(t, u.String(), WithRenewEvery(20*time.Millisecond))
			t.Cleanup(p.Thaw) // runs before the Locker's Close
			hooks := hooked(l)

			le, err := l.Acquire(t.Context(), "hb")
			if err != nil {
				t.Fatal(err)
			}
			renewing := make(chan struct{})
			var once sync.Once
			p.Freeze()
			hooks.beforeRenew.Store(ptr(func() { once.Do(func() { close(renewing) }) }))
			select {
			case <-renewing:
			case <-time.After(5 * time.Second):
				t.Fatal("no renewal started")
			}

			const bound = 100 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			start := time.Now()
			err = le.Release(ctx)
			if took := time.Since(start); took > bound+200*time.Millisecond {
				t.Errorf("Release(ctx %v) returned after %v (err %v): it waited for the heartbeat's renewal, not its context", bound, took.Round(time.Millisecond), err)
			}
		})
	}
}

// A holder's lease context ends no later than the database may give the
// lock to another. obtain() computes the hold's deadline from before the
// statement; when the statement's answer comes back after that deadline (a
// slow network, a long pause), Acquire must not return a lease whose
// context is live although the database has let the lease run out and
// given the lock to another process, leaving it to the heartbeat
// goroutine, once scheduled, to end it.
//
// Schedule: L's acquire statement runs (DB lease until T0+TTL); its answer
// is "delayed" (the hook) until M, polling, has taken the expired lock;
// then L's Acquire returns. GOMAXPROCS(1) keeps the new heartbeat
// goroutine from running before the test looks at the context, which is
// the window any caller's code runs in.
func TestLateAnswerYieldsNoLiveLeaseOnALockHeldElsewhere(t *testing.T) {
	for _, engine := range scheduleEngines {
		t.Run(engine, func(t *testing.T) {
			dbURL := testdb.MigratedURL(t, engine)
			l := scheduleOpen(t, dbURL, WithWait(10*time.Second))
			m := scheduleOpen(t, dbURL)
			hooks := hooked(l)
			const name = "late"

			var theirs *Lease
			var once sync.Once
			hooks.afterAcquire.Store(ptr(func(ok bool) {
				if !ok {
					return
				}
				once.Do(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					le, err := m.Acquire(ctx, name) // polls until L's lease ran out
					if err != nil {
						t.Errorf("M: %v", err)
						return
					}
					theirs = le
				})
			}))
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			// M holds the lock now until the test releases it: L, told
			// late, must not count on its lease, and waits in vain.
			ctx, cancel := context.WithTimeout(context.Background(), scheduleTTL/2)
			defer cancel()
			mine, err := l.Acquire(ctx, name)
			if err != nil {
				if theirs == nil {
					t.FailNow()
				}
				_ = theirs.Release(context.Background())
				return
			}
			mineLive := mine.Context().Err() == nil
			mine.h.mu.Lock()
			deadline := mine.h.deadline
			mine.h.mu.Unlock()
			if theirs == nil {
				t.FailNow()
			}
			if mineLive && theirs.Context().Err() == nil {
				t.Errorf("two live leases of %q: L's token %d (its deadline passed %v before Acquire returned) and M's token %d",
					name, mine.Token(), time.Since(deadline).Round(time.Millisecond), theirs.Token())
			}
			_ = theirs.Release(context.Background())
			_ = mine.Release(context.Background())
		})
	}
}

func ptr[T any](v T) *T { return &v }
