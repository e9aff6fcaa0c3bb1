package zklock_test

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/zklock"
	"github.com/flashsale/stock/lab/testzk"
)

// A holder's token is above every fence floor that an AdvanceFence of this
// process set before the holder's lease began, also one set while the
// holder was taking its token: the floor read before the token was taken
// is not the last word.

// fenceWhileTaking runs, once armed, AdvanceFence(name, atLeast(token)) in
// the holder's own goroutine, after it took token and before its lease
// begins (SetTokenHook): the AdvanceFence returns before the lease exists.
type fenceWhileTaking struct {
	armed   atomic.Bool
	atLeast func(token int64) int64

	// Set by the hook, read once the holder's Acquire has returned.
	ran   bool
	floor int64
	err   error
}

func (f *fenceWhileTaking) hook(t *testing.T, l *zklock.Locker) func(name string, token int64) {
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

// TestWrittenTokenIsAboveAFloorRaisedWhileItWasTaken: the holder's token
// write lands, then AdvanceFence raises the fence past the batch it began
// and returns; the lease that begins after must not carry the written
// token.
func TestWrittenTokenIsAboveAFloorRaisedWhileItWasTaken(t *testing.T) {
	srv := testzk.Start(t)
	name := uniqueName(t)
	l := newLocker(t, []string{srv.Addr})
	f := &fenceWhileTaking{atLeast: func(token int64) int64 { return token + 2*locking.Places }}
	l.SetTokenHook(f.hook(t, l))
	f.armed.Store(true)
	le := acquire(t, l, t.Context(), name)
	defer release(t, le)
	f.check(t, le.Token())
}

// TestHandedOnTokenIsAboveAFloorRaisedWhileItWasTaken: a local hand-over
// takes the batch's next place, with the floor it read before, then
// AdvanceFence raises the floor above that place and returns; the lease
// that begins after must not carry that place.
func TestHandedOnTokenIsAboveAFloorRaisedWhileItWasTaken(t *testing.T) {
	srv := testzk.Start(t)
	name := uniqueName(t)
	// A long session: the batch's places are trusted for a third of it,
	// so however slow the run, the waiter takes a place, not a write.
	l := newLocker(t, []string{srv.Addr}, zklock.WithSessionTimeout(30*time.Second))
	f := &fenceWhileTaking{atLeast: func(token int64) int64 { return token + 4 }}
	l.SetTokenHook(f.hook(t, l))
	le := acquire(t, l, t.Context(), name)
	next := acquireAsync(t, l, t.Context(), name)
	for l.LocalWaiters(name) != 1 {
		runtime.Gosched()
	}
	f.armed.Store(true)
	first := le.Token()
	release(t, le)
	le = got(t, next)
	defer release(t, le)
	if le.Token() > first+locking.Places {
		t.Logf("the hand-over began a new batch (token %d after %d)", le.Token(), first)
	}
	f.check(t, le.Token())
}
