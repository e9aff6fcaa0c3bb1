package etcdlock_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/etcdlock"
	"github.com/flashsale/stock/lab/testetcd"
)

// A holder's token is above every fence floor that an AdvanceFence of this
// process set before the holder's lease began, also one set while the
// holder was taking its token: the floor read before the token was taken
// is not the last word.

// fenceWhileTaking runs, once armed, AdvanceFence(name, atLeast(token)) in
// the holder's own goroutine, after it took token and before its lease
// begins (OnToken): the AdvanceFence returns before the lease exists.
type fenceWhileTaking struct {
	armed   atomic.Bool
	atLeast func(token int64) int64

	// Set by the hook, read once the holder's Acquire has returned.
	ran   bool
	floor int64
	err   error
}

func (f *fenceWhileTaking) hook(t *testing.T, l *etcdlock.Locker) func(name string, token int64) {
	return func(name string, token int64) {
		if !f.armed.CompareAndSwap(true, false) {
			return
		}
		f.ran, f.floor = true, f.atLeast(token)
		f.err = l.AdvanceFence(t.Context(), name, f.floor)
	}
}

// check fails t unless the fence was advanced and token is above it.
func (f *fenceWhileTaking) check(t *testing.T, token int64) {
	t.Helper()
	if !f.ran {
		t.Fatal("no holder took a token after the hook was armed")
	}
	if f.err != nil {
		t.Fatal(f.err)
	}
	if token <= f.floor {
		t.Errorf("lease with token %d, begun after AdvanceFence(%d) returned", token, f.floor)
	}
}

// TestReadTokenIsAboveAFloorRaisedWhileItWasTaken: the holder finds no
// predecessor and takes its token from that read, then AdvanceFence raises
// the fence past the batch it began and returns; the lease that begins
// after must not carry the token read.
func TestReadTokenIsAboveAFloorRaisedWhileItWasTaken(t *testing.T) {
	cluster := testetcd.Start(t)
	l := newLocker(t, cluster.Client(t))
	f := &fenceWhileTaking{atLeast: func(token int64) int64 { return token + 2*locking.Places }}
	l.OnToken(f.hook(t, l))
	f.armed.Store(true)
	le, err := l.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(context.Background())
	f.check(t, le.Token())
}

// TestHandedOnTokenIsAboveAFloorRaisedWhileItWasTaken: a local hand-over
// takes the batch's next place, with the floor it read before, then
// AdvanceFence raises the floor above that place and returns; the lease
// that begins after must not carry that place.
func TestHandedOnTokenIsAboveAFloorRaisedWhileItWasTaken(t *testing.T) {
	cluster := testetcd.Start(t)
	cli := cluster.Client(t)
	// A long TTL: the batch's places are trusted for a third of it, so
	// however slow the run, the waiter takes a place, not a write.
	p := newLocker(t, cluster.Client(t), etcdlock.WithTTL(30*time.Second))
	q := newLocker(t, cluster.Client(t))
	f := &fenceWhileTaking{atLeast: func(token int64) int64 { return token + 4 }}
	p.OnToken(f.hook(t, p))

	// P's first holder takes the lock from etcd with a local waiter behind
	// it: a batch with a place to hand on.
	blocker, err := q.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	first := acquireAsync(p, t.Context(), "k")
	queueKeys(t, cli, p, "k", 2)
	second := acquireAsync(p, t.Context(), "k")
	for p.LocalWaiting("k") < 1 {
		runtime.Gosched()
	}
	if err := blocker.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	r := <-first
	if r.err != nil {
		t.Fatal(r.err)
	}
	f.armed.Store(true)
	if err := r.le.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	r = <-second
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.le.Release(context.Background())
	f.check(t, r.le.Token())
}
