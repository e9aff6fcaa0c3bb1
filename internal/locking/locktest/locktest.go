// Package locktest is the conformance suite that every lock backend of
// internal/locking passes against its real server: mutual exclusion (beside
// a control without the lock that must see overlap), fencing tokens that
// grow across holders, in hold order across three processes when a batch of
// local hand-overs outlives its trust window, and across a server restart, a crashed holder's lock
// freed within its TTL, loss signalled through the lease's context,
// cancellation while waiting, reentrancy, owner-checked release, a paused
// holder fenced off, and no goroutine left behind.
//
// A backend's test calls Run with a Backend that connects clients to its
// server through a testproxy, so that the suite can pause one client (as a
// stopped process or a partition would) or cut it off (as kill -9 would)
// without touching the server or the other clients.
package locktest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flashsale/stock/internal/locking"
)

// Lease is one holding of a lock, as every backend hands it out.
type Lease interface {
	Token() int64
	Context() context.Context
	Release(ctx context.Context) error
}

// Client is one process's client of a lock service.
type Client interface {
	Acquire(ctx context.Context, key string) (Lease, error)
	Close() error
}

// Link is the network between one client and its server(s): a
// testproxy.Proxy or testproxy.Group.
type Link interface {
	// Freeze holds the client's traffic, as a paused process's.
	Freeze()
	// Thaw delivers it again.
	Thaw()
	// Cut closes the client's connections, as a crash would.
	Cut()
}

// Backend is what the suite needs of one lock service.
type Backend struct {
	// TTL is the longest a holder that stopped answering keeps the lock:
	// the lock's TTL or the session timeout the clients are made with.
	TTL time.Duration
	// Connect returns a new client, as another process would have, and
	// the link it talks through. The suite closes the client; Connect
	// registers whatever else it started for cleanup with t.
	Connect func(t *testing.T) (Client, Link)
	// Restart restarts the server(s), keeping their data. Nil skips the
	// check of tokens across a restart.
	Restart func(t *testing.T)
}

// ClientOf makes a Client of a backend whose Acquire returns its own lease
// type.
func ClientOf[L Lease](acquire func(ctx context.Context, key string) (L, error), closeFn func() error) Client {
	return client[L]{acquire, closeFn}
}

type client[L Lease] struct {
	acquire func(ctx context.Context, key string) (L, error)
	closeFn func() error
}

func (c client[L]) Acquire(ctx context.Context, key string) (Lease, error) {
	l, err := c.acquire(ctx, key)
	if err != nil {
		return nil, err // never a typed nil in the interface
	}
	return l, nil
}

func (c client[L]) Close() error { return c.closeFn() }

// slack is what the suite allows on top of the TTL for a loaded 2-core
// machine: scheduling, a server's expiry sweep, a reconnect.
const slack = 3 * time.Second

var keySeq atomic.Int64

// newKey returns a key no other test uses.
func newKey(t *testing.T) string {
	return fmt.Sprintf("locktest-%d-%d", time.Now().UnixNano(), keySeq.Add(1))
}

// Run runs the suite against b.
func Run(t *testing.T, b Backend) {
	t.Run("MutualExclusion", func(t *testing.T) { mutualExclusion(t, b) })
	t.Run("TokensGrow", func(t *testing.T) { tokensGrow(t, b) })
	t.Run("TokensGrowInHoldOrderPastTheTrustWindow", func(t *testing.T) { tokensGrowInHoldOrderPastTheTrustWindow(t, b) })
	t.Run("CrashedHolderFreesWithinTTL", func(t *testing.T) { crashedHolder(t, b) })
	t.Run("LossEndsTheLeaseContext", func(t *testing.T) { lossSignalled(t, b) })
	t.Run("CancelWhileWaiting", func(t *testing.T) { cancelWhileWaiting(t, b) })
	t.Run("Reentrancy", func(t *testing.T) { reentrancy(t, b) })
	t.Run("OwnerCheckedRelease", func(t *testing.T) { ownerCheckedRelease(t, b) })
	t.Run("PausedHolderIsFencedOff", func(t *testing.T) { pausedHolderFenced(t, b) })
	if b.Restart != nil {
		t.Run("TokensGrowAcrossRestart", func(t *testing.T) { tokensAcrossRestart(t, b) })
	}
}

// noLeaks checks, when t's cleanups are done, that t left no goroutine
// behind. Call it first in a test, so that its cleanup runs last.
func noLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		if err := goleak.Find(opt); err != nil {
			t.Error(err)
		}
	})
}

// connect returns a client closed at the end of t, before noLeaks checks.
func connect(t *testing.T, b Backend) (Client, Link) {
	t.Helper()
	c, link := b.Connect(t)
	t.Cleanup(func() {
		link.Thaw()
		if err := c.Close(); err != nil && !errors.Is(err, locking.ErrClosed) {
			t.Logf("close: %v", err)
		}
	})
	return c, link
}

// acquire takes key through c or fails t after within. The lease's context
// derives from ctx (reentrancy passes a lease's): the bound is a timer that
// cancels only a wait, never the lease it gave.
func acquire(t *testing.T, c Client, ctx context.Context, key string, within time.Duration) Lease {
	t.Helper()
	actx, cancel := context.WithCancelCause(ctx)
	t.Cleanup(func() { cancel(nil) })
	errWait := fmt.Errorf("not obtained within %v", within)
	timer := time.AfterFunc(within, func() { cancel(errWait) })
	l, err := c.Acquire(actx, key)
	timer.Stop()
	if err != nil {
		t.Fatalf("acquire %s: %v (%v)", key, err, context.Cause(actx))
	}
	return l
}

func release(t *testing.T, l Lease) {
	t.Helper()
	if err := l.Release(context.Background()); err != nil {
		t.Errorf("release: %v", err)
	}
}

// busy reports whether c cannot take key within d (someone holds it).
func busy(t *testing.T, c Client, key string, d time.Duration) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	l, err := c.Acquire(ctx, key)
	if err == nil {
		release(t, l)
		return false
	}
	if !errors.Is(err, locking.ErrNotObtained) {
		t.Errorf("a busy lock's Acquire failed with %v, want ErrNotObtained", err)
	}
	return true
}

// criticalSection counts who is inside; it yields in the middle so that
// an unprotected caller is overtaken.
type criticalSection struct {
	inside, most atomic.Int64
}

func (cs *criticalSection) enter() {
	n := cs.inside.Add(1)
	for {
		m := cs.most.Load()
		if n <= m || cs.most.CompareAndSwap(m, n) {
			break
		}
	}
	for range 3 {
		runtime.Gosched()
	}
	cs.inside.Add(-1)
}

// contend runs workers goroutines over clients, each taking key rounds
// times and calling inside under the lock.
func contend(t *testing.T, clients []Client, key string, workers, rounds int, inside func(Lease)) {
	t.Helper()
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		c := clients[w%len(clients)]
		wg.Go(func() {
			for range rounds {
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				l, err := c.Acquire(ctx, key)
				cancel()
				if err != nil {
					errs <- err
					return
				}
				inside(l)
				if err := l.Release(context.Background()); err != nil {
					errs <- fmt.Errorf("release: %w", err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func mutualExclusion(t *testing.T, b Backend) {
	noLeaks(t)
	c1, _ := connect(t, b)
	c2, _ := connect(t, b)
	key := newKey(t)

	// The control: without the lock the same workers must be seen
	// overlapping, or the check below could not fail.
	var control criticalSection
	var wg sync.WaitGroup
	for range 200 {
		for range 8 {
			wg.Go(control.enter)
		}
		wg.Wait()
		if control.most.Load() > 1 {
			break
		}
	}
	if control.most.Load() < 2 {
		t.Fatal("control: unprotected workers never overlapped; the check cannot see a broken lock")
	}

	var cs criticalSection
	contend(t, []Client{c1, c2}, key, 8, 10, func(Lease) { cs.enter() })
	if most := cs.most.Load(); most != 1 {
		t.Fatalf("%d holders were inside at once", most)
	}
}

func tokensGrow(t *testing.T, b Backend) {
	noLeaks(t)
	c1, _ := connect(t, b)
	c2, _ := connect(t, b)
	key := newKey(t)
	var mu sync.Mutex
	var tokens []int64
	contend(t, []Client{c1, c2}, key, 6, 8, func(l Lease) {
		mu.Lock()
		tokens = append(tokens, l.Token())
		mu.Unlock()
	})
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("holder %d got token %d after %d: tokens must grow strictly (%v)", i, tokens[i], tokens[i-1], tokens)
		}
	}
	if len(tokens) != 48 {
		t.Fatalf("%d holds, want 48", len(tokens))
	}
}

// tokensAcrossRestart checks no goroutine leaks: the restarted server's
// own helpers outlive the test.
func tokensAcrossRestart(t *testing.T, b Backend) {
	c, _ := connect(t, b)
	key := newKey(t)
	l := acquire(t, c, t.Context(), key, 10*time.Second)
	before := l.Token()
	release(t, l)
	b.Restart(t)
	// The client reconnects by itself; give it the time a restart takes.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for {
		l, err := c.Acquire(ctx, key)
		if err == nil {
			after := l.Token()
			_ = l.Release(context.Background())
			if after <= before {
				t.Fatalf("token %d after the restart, %d before: tokens must grow across a restart", after, before)
			}
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("no lock after the restart: %v", err)
		}
	}
}

func crashedHolder(t *testing.T, b Backend) {
	noLeaks(t)
	crashed, link := connect(t, b)
	other, _ := connect(t, b)
	key := newKey(t)
	acquire(t, crashed, t.Context(), key, 10*time.Second)
	// kill -9: its connections close and nothing more comes from it.
	link.Freeze()
	link.Cut()
	began := time.Now()
	l := acquire(t, other, t.Context(), key, b.TTL+slack)
	if waited := time.Since(began); waited > b.TTL+slack {
		t.Fatalf("the crashed holder's lock freed after %v, TTL %v", waited, b.TTL)
	}
	release(t, l)
}

func lossSignalled(t *testing.T, b Backend) {
	noLeaks(t)
	c, link := connect(t, b)
	key := newKey(t)
	l := acquire(t, c, t.Context(), key, 10*time.Second)
	link.Freeze()
	select {
	case <-l.Context().Done():
	case <-time.After(b.TTL + slack):
		t.Fatalf("the lease's context was not ended %v after its client lost the server (TTL %v)", b.TTL+slack, b.TTL)
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, locking.ErrLockLost) {
		t.Fatalf("the lease's context ended with %v, want ErrLockLost", cause)
	}
	link.Thaw()
	if err := l.Release(context.Background()); !errors.Is(err, locking.ErrLockLost) {
		t.Fatalf("Release of a lost lock = %v, want ErrLockLost", err)
	}
}

func cancelWhileWaiting(t *testing.T, b Backend) {
	noLeaks(t)
	holder, _ := connect(t, b)
	waiter, _ := connect(t, b)
	key := newKey(t)
	l := acquire(t, holder, t.Context(), key, 10*time.Second)

	// A waiter from the holder's own process and one from another: both
	// must come back at their cancellation, not when the lock frees.
	for _, c := range []Client{holder, waiter} {
		ctx, cancel := context.WithCancel(t.Context())
		stop := time.AfterFunc(300*time.Millisecond, cancel)
		began := time.Now()
		_, err := c.Acquire(ctx, key)
		stop.Stop()
		cancel()
		if !errors.Is(err, locking.ErrNotObtained) || !errors.Is(err, context.Canceled) {
			t.Fatalf("a cancelled wait returned %v, want ErrNotObtained and context.Canceled", err)
		}
		if waited := time.Since(began); waited > 300*time.Millisecond+slack {
			t.Fatalf("a cancelled wait came back after %v", waited)
		}
	}
	release(t, l)
	// The cancelled waiters left nothing behind that would hold the next
	// one up until a TTL or a session ran out.
	next, _ := connect(t, b)
	release(t, acquire(t, next, t.Context(), key, b.TTL/2+time.Second))
}

func reentrancy(t *testing.T, b Backend) {
	noLeaks(t)
	c, _ := connect(t, b)
	other, _ := connect(t, b)
	key := newKey(t)
	outer := acquire(t, c, t.Context(), key, 10*time.Second)
	inner := acquire(t, c, outer.Context(), key, 2*time.Second)
	if inner.Token() != outer.Token() {
		t.Fatalf("reentered lease has token %d, the holder %d", inner.Token(), outer.Token())
	}
	release(t, inner)
	if outer.Context().Err() != nil {
		t.Fatal("releasing the inner lease ended the outer one")
	}
	if !busy(t, other, key, 300*time.Millisecond) {
		t.Fatal("releasing the inner lease freed the lock")
	}
	release(t, outer)
	release(t, acquire(t, other, t.Context(), key, 10*time.Second))
}

func ownerCheckedRelease(t *testing.T, b Backend) {
	noLeaks(t)
	old, link := connect(t, b)
	current, _ := connect(t, b)
	third, _ := connect(t, b)
	key := newKey(t)
	stale := acquire(t, old, t.Context(), key, 10*time.Second)
	link.Freeze()
	holder := acquire(t, current, t.Context(), key, b.TTL+slack)
	link.Thaw()
	// The old holder comes back and releases: the lock is not its own any
	// more, and the release must not free it.
	if err := stale.Release(context.Background()); !errors.Is(err, locking.ErrLockLost) {
		t.Errorf("a stale holder's Release = %v, want ErrLockLost", err)
	}
	if err := stale.Release(context.Background()); !errors.Is(err, locking.ErrNotHeld) {
		t.Errorf("a second Release = %v, want ErrNotHeld", err)
	}
	if holder.Context().Err() != nil {
		t.Fatalf("the stale release ended the current holder's lease: %v", context.Cause(holder.Context()))
	}
	if !busy(t, third, key, 300*time.Millisecond) {
		t.Fatal("the stale holder's release freed the current holder's lock")
	}
	release(t, holder)
}

// fencedResource is what a lock protects: it refuses a write whose token is
// not above the highest it has seen.
type fencedResource struct {
	mu    sync.Mutex
	fence int64
}

func (r *fencedResource) write(token int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if token <= r.fence {
		return false
	}
	r.fence = token
	return true
}

func pausedHolderFenced(t *testing.T, b Backend) {
	noLeaks(t)
	paused, link := connect(t, b)
	next, _ := connect(t, b)
	key := newKey(t)
	var resource fencedResource
	a := acquire(t, paused, t.Context(), key, 10*time.Second)
	link.Freeze() // the holder stops, its write already decided
	n := acquire(t, next, t.Context(), key, b.TTL+slack)
	if n.Token() <= a.Token() {
		t.Fatalf("the next holder's token %d is not above the paused one's %d", n.Token(), a.Token())
	}
	if !resource.write(n.Token()) {
		t.Fatal("the current holder's write was refused")
	}
	link.Thaw()
	if resource.write(a.Token()) {
		t.Fatal("the paused holder's late write was accepted")
	}
	release(t, n)
	_ = a.Release(context.Background())
}
